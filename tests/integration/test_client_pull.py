"""Pulling with the SDK against nats-server and Tether: fetch, timeouts, heartbeats,
settling, continuous consumption, and a server restart in the middle of the stream."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from tether.client import (
    AckPolicy,
    Backoff,
    ConsumerConfig,
    JetStream,
    MsgAlreadyAcked,
    Timeout,
    connect,
)
from tether.client.testing import PeerServer

_names = itertools.count(1)


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def server(request: pytest.FixtureRequest) -> Iterator[PeerServer]:
    with PeerServer(request.param) as srv:
        yield srv


@pytest.fixture
async def js(server: PeerServer) -> AsyncIterator[JetStream]:
    nc = await connect(server.url)
    yield nc.jetstream()
    await nc.close()


async def stream_with(js: JetStream, count: int, **consumer: object) -> str:
    name = f"P{next(_names)}"
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    for i in range(count):
        await js.publish_async(f"{name.lower()}.m", b"%d" % i)
    await js.publish_async_completed(timeout=10)
    config = ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT, **consumer)  # type: ignore[arg-type]
    await js.add_consumer(name, config)
    return name


async def test_fetch_available_then_time_out(js: JetStream) -> None:
    name = await stream_with(js, 7)
    sub = await js.pull_subscribe(name, "C")
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await sub.fetch(5, timeout=2)
    assert [m.data for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert loop.time() - started < 1  # already there: no lingering
    rest = await sub.fetch(5, timeout=2)
    assert [m.data for m in rest] == [b"5", b"6"]
    for m in got + rest:
        await m.ack()
    started = loop.time()
    with pytest.raises(Timeout):
        await sub.fetch(5, timeout=0.6)
    assert 0.4 < loop.time() - started < 1.5
    with pytest.raises(Timeout):
        await sub.fetch(1, timeout=0.4)
    assert await sub.fetch(3, timeout=1, no_wait=True) == []
    await sub.unsubscribe()


async def test_lingering_fetch_wakes_on_publish(js: JetStream) -> None:
    name = await stream_with(js, 0)
    sub = await js.pull_subscribe(name, "C")
    waiting = asyncio.create_task(sub.fetch(2, timeout=5))
    await asyncio.sleep(0.3)
    await js.publish(f"{name.lower()}.m", b"a")
    await js.publish(f"{name.lower()}.m", b"b")
    got = await asyncio.wait_for(waiting, 5)
    assert [m.data for m in got] == [b"a", b"b"]
    single = asyncio.create_task(sub.fetch(1, timeout=5))
    await asyncio.sleep(0.3)
    await js.publish(f"{name.lower()}.m", b"c")
    assert [m.data for m in await asyncio.wait_for(single, 5)] == [b"c"]


async def test_fetch_with_heartbeats_times_out_normally(js: JetStream) -> None:
    name = await stream_with(js, 0)
    sub = await js.pull_subscribe(name, "C")
    with pytest.raises(Timeout):  # heartbeats arrive, so this is a plain timeout
        await sub.fetch(3, timeout=1.2, heartbeat=0.2)


async def test_settling_messages(js: JetStream) -> None:
    name = await stream_with(js, 3, ack_wait=5.0)
    sub = await js.pull_subscribe(name, "C")
    first, second, third = await sub.fetch(3, timeout=2)
    await first.ack_sync()
    with pytest.raises(MsgAlreadyAcked):
        await first.ack()
    await second.in_progress()
    await second.nak(delay=0.3)
    await third.term()
    loop = asyncio.get_running_loop()
    started = loop.time()
    again = await sub.fetch(1, timeout=3)
    assert again[0].data == b"1" and again[0].metadata.num_delivered == 2
    assert loop.time() - started >= 0.2
    await again[0].ack()
    with pytest.raises(Timeout):
        await sub.fetch(1, timeout=0.5)  # acked and terminated messages are gone
    info = await js.consumer_info(name, "C")
    assert info.num_ack_pending == 0


async def test_continuous_consumption(js: JetStream) -> None:
    total = 1500
    name = await stream_with(js, total)
    sub = await js.pull_subscribe(name, "C")
    seen = []
    async with sub.messages(batch=200, expires=5, heartbeat=1) as stream:
        async for msg in stream:
            seen.append(msg.metadata.stream_seq)
            msg.ack_nowait()
            if len(seen) == total:
                break
    assert seen == list(range(1, total + 1))
    await js.conn.flush()
    info = await js.consumer_info(name, "C")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def consume_across_restart(server: PeerServer, restart: str) -> dict[int, list[int]]:
    """Consume a stream, restarting the server a third of the way through."""
    nc = await connect(
        server.url, max_reconnect_attempts=-1, reconnect_backoff=Backoff(0.05, 0.5, 2, 0.1)
    )
    async with nc:
        js = nc.jetstream()
        total = 400
        name = await stream_with(js, total, ack_wait=1.0)
        sub = await js.pull_subscribe(name, "C")
        seen: dict[int, list[int]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        async with sub.messages(batch=50, expires=2, heartbeat=0.5) as stream:
            async for msg in stream:
                meta = msg.metadata
                seen.setdefault(meta.stream_seq, []).append(meta.num_delivered)
                msg.ack_nowait()
                if len(seen) == total // 3 and not nc.reconnects:
                    if restart == "kill":
                        await asyncio.to_thread(lambda: (server.kill(), server.start()))
                    else:
                        await asyncio.to_thread(server.restart)
                    await nc.wait_connected(10)
                if len(seen) == total or loop.time() > deadline:
                    break
        assert nc.reconnects >= 1
        assert sorted(seen) == list(range(1, total + 1)), "messages were lost"
        return seen


async def test_server_restart_while_pulling_loses_nothing(server: PeerServer) -> None:
    """Stop the server mid-stream and start it again: every message still arrives, and a
    message seen twice is a redelivery (a higher delivery count), never a client repeat."""
    seen = await consume_across_restart(server, "stop")
    for seq, deliveries in seen.items():
        assert deliveries == sorted(set(deliveries)), (seq, deliveries)


async def test_server_crash_while_pulling_loses_nothing(server: PeerServer) -> None:
    """SIGKILL mid-stream: nothing is lost. (Delivery counts may restart where the server
    had not persisted them, so repeats are only counted, not checked.)"""
    seen = await consume_across_restart(server, "kill")
    assert sum(len(d) for d in seen.values()) >= len(seen)
