"""One client's bad publish fails only that publish, over the wire (SQLite store).

Several publishes written together are read in one go and share one commit: a bad
header value, or a subject the store cannot hold, must not take the others with it,
nor leave a hole in the stream's numbering.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js.errors import APIError

from tether.server.app import Tether
from tether.server.config import ServerConfig
from tether.testing import RawClient


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Tether]:
    app = Tether(ServerConfig(port=0, http_port=0, nsq_port=0, store=f"sqlite:{tmp_path}"))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def url(app: Tether) -> str:
    assert app.nats is not None
    return f"nats://127.0.0.1:{app.nats.port}"


async def test_hostile_headers_fail_only_their_own_publishes(app: Tether) -> None:
    clients = [await nats.connect(url(app)) for _ in range(4)]
    try:
        await clients[0].jetstream().add_stream(name="S", subjects=["s.>"])
        hostile = {"Tether-Priority": "99999999999999999999"}

        async def good(i: int) -> int:
            js = clients[i].jetstream()
            acks = await asyncio.gather(*(js.publish(f"s.{i}", b"%d" % n) for n in range(50)))
            return len(acks)

        async def bad() -> list[BaseException | object]:
            js = clients[3].jetstream()
            sends = (js.publish("s.bad", b"x", headers=hostile) for _ in range(50))
            return await asyncio.gather(*sends, return_exceptions=True)

        *counts, refused = await asyncio.gather(good(0), good(1), good(2), bad())
        assert counts == [50, 50, 50]
        for exc in refused:
            assert isinstance(exc, APIError), exc
            assert (exc.code, exc.err_code) == (400, 10003)
            assert "Tether-Priority" in (exc.description or "")
        js = clients[0].jetstream()
        assert (await js.publish("s.last", b"last")).seq == 151  # no hole
        assert (await js.stream_info("S")).state.messages == 151
    finally:
        for nc in clients:
            await nc.close()


async def test_a_subject_that_is_not_utf8_fails_alone(app: Tether) -> None:
    nc = await nats.connect(url(app))
    try:
        await nc.jetstream().add_stream(name="S", subjects=["s.>"])
    finally:
        await nc.close()
    assert app.nats is not None
    raw = await RawClient.connect("127.0.0.1", app.nats.port)
    try:
        await raw.send(b'CONNECT {"verbose":false,"headers":true}\r\nSUB r.> 1\r\n')
        # One write, so one read and one commit: the byte 0xFF is not UTF-8.
        await raw.send(
            b"PUB s.a r.1 1\r\na\r\nPUB s.\xff r.2 1\r\nb\r\nPUB s.c r.3 1\r\nc\r\n"
            b"HPUB s.d r.4 12 13\r\nNATS/1.0\r\n\r\nd\r\n"
        )
        await raw.wait_for(lambda: raw.unread.count(b"MSG r.") >= 4)
        replies: dict[str, dict[str, object]] = {}
        for block in raw.take().split(b"MSG r.")[1:]:
            head, _, rest = block.partition(b"\r\n")
            size = int(head.split()[-1])
            replies["r." + head.split()[0].decode()] = json.loads(rest[:size])
    finally:
        await raw.close()
    assert replies["r.1"] == {"stream": "S", "seq": 1}
    # Refused at the front door (400) or, failing that, by the store (503/10077).
    error = replies["r.2"]["error"]
    assert isinstance(error, dict) and error["err_code"] in (10003, 10077), error
    assert replies["r.3"] == {"stream": "S", "seq": 2}  # moved up: no hole
    assert replies["r.4"] == {"stream": "S", "seq": 3}
    nc = await nats.connect(url(app))
    try:
        js = nc.jetstream()
        assert (await js.publish("s.e", b"e")).seq == 4
        assert [(await nc.jsm().get_msg("S", seq)).data for seq in (1, 2, 3, 4)] == [
            b"a",
            b"c",
            b"d",
            b"e",
        ]
    finally:
        await nc.close()
