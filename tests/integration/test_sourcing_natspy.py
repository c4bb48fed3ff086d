"""Mirrors, sources and subject transforms through nats-py against a Tether process:
what is copied, how it is stamped, what stream info says, and catching up after a
kill -9 without copying anything twice or skipping anything."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)
from nats.js.errors import BadRequestError
from nats.js.manager import JetStreamManager

from tether.testing import RunningServer, run_server

SOURCE = "Nats-Stream-Source"


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def has_messages(jsm: JetStreamManager, name: str, count: int) -> bool:
    return bool((await jsm.stream_info(name)).state.messages == count)


async def test_a_mirror_keeps_sequences_times_and_headers(
    nc: Client, js: JetStreamContext, jsm: JetStreamManager
) -> None:
    await jsm.add_stream(name="O", subjects=["o.>"])
    for i in range(5):
        await js.publish(f"o.{i}", f"m{i}".encode(), headers={"Nats-Msg-Id": f"id{i}"})
    await jsm.delete_msg("O", 2)
    await jsm.add_stream(StreamConfig(name="M", mirror=StreamSource(name="O")))

    async def copied() -> bool:  # the whole copy: four messages, up to the source's last
        state = (await jsm.stream_info("M")).state
        return (state.messages, state.last_seq) == (4, 5)

    await eventually(copied)
    for seq in (1, 3, 4, 5):
        original = await jsm.get_msg("O", seq)
        copy = await jsm.get_msg("M", seq)
        assert (copy.subject, copy.data, copy.headers) == (
            original.subject,
            original.data,
            original.headers,
        )
        assert copy.time == original.time
    info = await jsm.stream_info("M")
    assert info.config.subjects in (None, [])
    assert info.mirror is not None and info.mirror.name == "O" and info.mirror.lag == 0
    # Nothing captures for a mirror: a publish finds no responders, as on nats-server.
    with pytest.raises(NoRespondersError):
        await nc.request("M", b"x", timeout=1)
    # Later messages follow.
    await js.publish("o.9", b"late")
    await eventually(lambda: has_messages(jsm, "M", 5))
    assert (await jsm.get_msg("M", 6)).data == b"late"


async def test_sources_stamp_where_each_copy_came_from(
    js: JetStreamContext, jsm: JetStreamManager
) -> None:
    origin = await jsm.add_stream(name="A", subjects=["a.>"])
    await jsm.add_stream(name="B", subjects=["b.>"])
    for i in range(3):
        await js.publish(f"a.{i}.x", b"a", headers={"Nats-Expected-Stream": "A", "K": "v"})
    await js.publish("b.1", b"b")
    await jsm.add_stream(
        StreamConfig(
            name="S",
            subjects=["s.>"],
            sources=[
                StreamSource(name="A", opt_start_seq=2),
                StreamSource(name="B", filter_subject="b.*"),
            ],
        )
    )
    await eventually(lambda: has_messages(jsm, "S", 3))
    stamps = []
    for seq in (1, 2, 3):
        msg = await jsm.get_msg("S", seq)
        assert msg.headers is not None
        assert "Nats-Expected-Stream" not in msg.headers
        stamps.append(msg.headers[SOURCE].rsplit(" ", 1)[0])
    assert sorted(stamps) == ["A 2 > > a.1.x", "A 3 > > a.2.x", "B 1 b.* > b.1"]
    identity = (await jsm.get_msg("S", 1)).headers[SOURCE].rsplit(" ", 1)[1]  # type: ignore[index]
    assert len(identity) == 8 and origin.created is not None
    info = await jsm.stream_info("S")
    assert info.sources is not None
    assert [(s.name, s.lag, s.active is not None) for s in info.sources] == [
        ("A", 0, True),
        ("B", 0, True),
    ]


async def test_source_transforms_and_start_time(
    js: JetStreamContext, jsm: JetStreamManager
) -> None:
    await jsm.add_stream(name="O", subjects=["o.>"])
    await js.publish("o.old.x", b"before")
    await asyncio.sleep(0.05)
    start = datetime.now(UTC)
    await js.publish("o.new.x", b"after")
    await js.publish("o.new.y", b"other")
    await jsm.add_stream(
        StreamConfig(
            name="T",
            subjects=["t.>"],
            sources=[
                StreamSource(
                    name="O",
                    opt_start_time=start,  # type: ignore[arg-type]
                    subject_transforms=[SubjectTransform(src="o.*.x", dest="t.{{wildcard(1)}}")],
                )
            ],
        )
    )
    await eventually(lambda: has_messages(jsm, "T", 1))
    msg = await jsm.get_msg("T", 1)
    assert (msg.subject, msg.data) == ("t.new", b"after")
    assert msg.headers is not None
    assert msg.headers[SOURCE].startswith("O 2 o.*.x t.{{wildcard(1)}} o.new.x ")


async def test_the_input_transform_renames_what_is_stored(
    js: JetStreamContext, jsm: JetStreamManager
) -> None:
    await jsm.add_stream(
        StreamConfig(
            name="P",
            subjects=["in.*"],
            subject_transform=SubjectTransform(src="in.*", dest="out.{{partition(10,1)}}.$1"),
        )
    )
    ack = await js.publish("in.foo", b"x")
    assert (await jsm.get_msg("P", ack.seq)).subject == "out.3.foo"
    # A consumer filters on the stored subject.
    sub = await js.pull_subscribe("out.3.>", "d", stream="P")
    (msg,) = await sub.fetch(1, timeout=2)
    assert msg.subject == "out.3.foo"


async def test_bad_configurations_get_nats_servers_errors(jsm: JetStreamManager) -> None:
    cases = [
        (
            StreamConfig(name="X", subjects=["x"], mirror=StreamSource(name="O")),
            10034,
        ),
        (
            StreamConfig(
                name="X",
                subjects=["x"],
                subject_transform=SubjectTransform(src="x", dest="{{wildcard(1)}}"),
            ),
            10156,
        ),
        (
            StreamConfig(
                name="X",
                subjects=["x"],
                sources=[StreamSource(name="O"), StreamSource(name="O")],
            ),
            10140,
        ),
    ]
    for cfg, err_code in cases:
        with pytest.raises(BadRequestError) as caught:
            await jsm.add_stream(cfg)
        assert caught.value.err_code == err_code


async def test_an_update_adds_a_source_and_keeps_the_others_place(
    js: JetStreamContext, jsm: JetStreamManager
) -> None:
    await jsm.add_stream(name="A", subjects=["a"])
    await jsm.add_stream(name="B", subjects=["b"])
    await js.publish("a", b"1")
    cfg = StreamConfig(name="S", subjects=["s"], sources=[StreamSource(name="A")])
    await jsm.add_stream(cfg)
    await eventually(lambda: has_messages(jsm, "S", 1))
    await js.publish("b", b"2")
    cfg.sources = [StreamSource(name="A"), StreamSource(name="B")]
    await jsm.update_stream(cfg)
    await eventually(lambda: has_messages(jsm, "S", 2))
    await js.publish("a", b"3")
    await eventually(lambda: has_messages(jsm, "S", 3))
    await asyncio.sleep(0.2)
    assert (await jsm.stream_info("S")).state.messages == 3


async def test_catching_up_after_kill_9_copies_each_message_once() -> None:
    total = 3000
    with run_server() as srv:
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        jsm = nc.jsm()
        await jsm.add_stream(name="O", subjects=["o.*"])
        acks = [js.publish(f"o.{i % 7}", str(i).encode()) for i in range(total)]
        for i in range(0, total, 500):
            await asyncio.gather(*acks[i : i + 500])
        await jsm.add_stream(StreamConfig(name="S", subjects=["s"], sources=[StreamSource("O")]))
        await jsm.add_stream(StreamConfig(name="M", mirror=StreamSource(name="O")))
        copied = 0
        while not copied:
            copied = (await jsm.stream_info("S")).state.messages
        srv.kill()  # in the middle of catching up
        await nc.close()
        srv.start()
        nc = await nats.connect(srv.url)
        jsm = nc.jsm()
        try:
            await eventually(lambda: has_messages(jsm, "S", total), within=60)
            await eventually(lambda: has_messages(jsm, "M", total), within=60)
            await asyncio.sleep(0.3)  # nothing more arrives
            assert (await jsm.stream_info("S")).state.messages == total
            sub = await nc.jetstream().pull_subscribe(
                "o.*", "check", stream="S", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
            )
            seen: list[int] = []
            while len(seen) < total:
                for msg in await sub.fetch(1000, timeout=5):
                    assert msg.headers is not None
                    seen.append(int(msg.headers[SOURCE].split(" ")[1]))
            assert seen == list(range(1, total + 1))
            mirror = await jsm.stream_info("M")
            assert (mirror.state.first_seq, mirror.state.last_seq) == (1, total)
        finally:
            await nc.close()
        assert 0 < copied <= total
