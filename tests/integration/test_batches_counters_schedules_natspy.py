"""Atomic batches, counters and message schedules through nats-py (stream configs from
its ``StreamConfig``, headers through ``js.publish``/``nc.request``) against a real
``tether serve`` (SQLite store), including what survives a restart."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator

import nats
import pytest
from nats.js.api import Header, StreamConfig
from nats.js.errors import BadRequestError

from tether.testing import RunningServer, run_server


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def test_atomic_batch_through_nats_py(server: RunningServer) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        info = await js.add_stream(StreamConfig(name="B", subjects=["b.>"], allow_atomic=True))
        assert info.config.allow_atomic is True
        for i in range(1, 4):
            headers = {Header.BATCH_ID: "uuid-1", Header.BATCH_SEQUENCE: str(i)}
            if i == 3:
                headers[Header.BATCH_COMMIT] = "1"
            reply = await nc.request(f"b.{i}", b"m%d" % i, headers=headers, timeout=2)
            if i < 3:
                assert reply.data == b""  # staged: an empty reply, as nats-server sends
        assert json.loads(reply.data) == {"stream": "B", "seq": 3, "batch": "uuid-1", "count": 3}
        msg = await js.get_msg("B", 2)
        assert msg.data == b"m2" and msg.headers is not None
        assert msg.headers[Header.BATCH_ID] == "uuid-1"
        # js.publish raises the batch errors as nats-server's API errors.
        with pytest.raises(BadRequestError) as excinfo:
            await js.publish(
                "b.x", b"x", headers={Header.BATCH_ID: "u", Header.BATCH_SEQUENCE: "2"}
            )
        assert excinfo.value.err_code == 10176
    finally:
        await nc.close()


async def test_counters_survive_a_restart(server: RunningServer) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="C", subjects=["c.>"], allow_msg_counter=True))
        big = 10**40
        for incr in ("1", str(big), "-2"):
            reply = await nc.request("c.hits", b"", headers={Header.INCR: incr}, timeout=2)
        assert json.loads(reply.data)["val"] == str(big - 1)
        with pytest.raises(BadRequestError) as excinfo:
            await js.publish("c.hits", b"body", headers={Header.INCR: "1"})
        assert excinfo.value.err_code == 10170
    finally:
        await nc.close()
    server.restart()
    nc = await nats.connect(server.url)
    try:
        reply = await nc.request("c.hits", b"", headers={Header.INCR: "+1"}, timeout=2)
        assert json.loads(reply.data) == {"stream": "C", "seq": 4, "val": str(big)}
        last = await nc.jetstream().get_last_msg("C", "c.hits")
        assert last.data == b'{"val":"%d"}' % big
    finally:
        await nc.close()


async def test_schedules_through_nats_py(server: RunningServer) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        info = await js.add_stream(
            StreamConfig(name="S", subjects=["s.>"], allow_msg_schedules=True)
        )
        assert info.config.allow_rollup_hdrs is True  # what schedules need, turned on
        due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        ack = await js.publish(
            "s.sched.once",
            b"hello",
            headers={
                Header.SCHEDULE: "@at " + due.strftime("%Y-%m-%dT%H:%M:%SZ"),
                Header.SCHEDULE_TARGET: "s.out",
            },
        )
        assert ack.seq == 1
        await js.publish(
            "s.sched.tick",
            b"tick",
            headers={Header.SCHEDULE: "@every 1s", Header.SCHEDULE_TARGET: "s.ticks"},
        )
        sub = await js.subscribe("s.out")
        msg = await sub.next_msg(timeout=5)
        assert msg.data == b"hello"
        assert msg.headers is not None
        assert msg.headers["Nats-Scheduler"] == "s.sched.once"
        assert msg.headers["Nats-Schedule-Next"] == "purge"
        with pytest.raises(BadRequestError) as excinfo:
            await js.publish("s.bad", b"", headers={Header.SCHEDULE: "@every 1s"})
        assert excinfo.value.err_code == 10190
    finally:
        await nc.close()
    server.restart()  # the repeating schedule goes on, from what the store holds
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        before = (await js.stream_info("S", subjects_filter="s.ticks")).state.subjects or {}
        await asyncio.sleep(2.5)
        after = (await js.stream_info("S", subjects_filter="s.ticks")).state.subjects or {}
        assert after.get("s.ticks", 0) >= before.get("s.ticks", 0) + 2
        # Stopping it: a purge of its subject.
        await js.publish(
            "s.stop",
            b"",
            headers={Header.SCHEDULE_NEXT: "purge", "Nats-Scheduler": "s.sched.tick"},
        )
        await asyncio.sleep(0.2)
        stopped = (await js.stream_info("S", subjects_filter="s.ticks")).state.subjects or {}
        await asyncio.sleep(1.5)
        final = (await js.stream_info("S", subjects_filter="s.ticks")).state.subjects or {}
        assert final == stopped
    finally:
        await nc.close()
