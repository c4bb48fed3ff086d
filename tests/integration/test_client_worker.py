"""The worker against nats-server and Tether: attempts, give-up, backoff timing, and one
``max_in_flight`` shared by two servers."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tether.client import (
    AckPolicy,
    Backoff,
    ConsumerConfig,
    JetStream,
    JsMsg,
    PullSubscription,
    Worker,
    connect,
)
from tether.client.testing import PeerServer, Progress

_names = itertools.count(1)


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(kind: str) -> Iterator[PeerServer]:
    with PeerServer(kind) as srv:
        yield srv


@pytest.fixture
async def js(server: PeerServer) -> AsyncIterator[JetStream]:
    nc = await connect(server.url)
    yield nc.jetstream()
    await nc.close()


async def consumer_on(js: JetStream, name: str, count: int) -> PullSubscription:
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    for i in range(count):
        await js.publish_async(f"{name.lower()}.job", b"%d" % i)
    await js.publish_async_completed(timeout=10)
    await js.add_consumer(
        name, ConsumerConfig(durable_name="W", ack_policy=AckPolicy.EXPLICIT, ack_wait=5)
    )
    return await js.pull_subscribe(name, "W")


async def test_attempts_and_give_up(js: JetStream) -> None:
    name = f"W{next(_names)}"
    sub = await consumer_on(js, name, 60)
    calls: dict[int, int] = {}
    given_up: list[int] = []
    settled = Progress()

    async def handler(msg: JsMsg) -> None:
        n = int(msg.data)
        calls[n] = calls.get(n, 0) + 1
        if n % 20 == 3:
            raise RuntimeError("poison")
        settled.add()

    def give_up(msg: JsMsg) -> None:
        given_up.append(int(msg.data))
        settled.add()

    worker = Worker(
        sub,
        handler,
        max_in_flight=10,
        max_attempts=3,
        on_give_up=give_up,
        backoff=None,
        requeue_delay=0.05,
        heartbeat=None,
    )
    async with worker:
        await settled.reach(60, 20)
    assert sorted(given_up) == [3, 23, 43]
    assert all(calls[n] == 3 for n in given_up)
    assert all(c == 1 for n, c in calls.items() if n not in given_up)
    info = await js.consumer_info(name, "W")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_backoff_timing(js: JetStream) -> None:
    name = f"W{next(_names)}"
    sub = await consumer_on(js, name, 20)
    calls: list[float] = []
    failures = 3
    progress = Progress()

    async def handler(msg: JsMsg) -> None:
        calls.append(time.monotonic())
        progress.add()
        if len(calls) <= failures:
            raise RuntimeError("downstream is down")

    base = 0.15
    worker = Worker(
        sub,
        handler,
        max_in_flight=1,
        backoff=Backoff(base, 5.0, 2.0, 0.0),
        requeue_delay=0,
        heartbeat=None,
    )
    async with worker:
        await progress.reach(20 + failures, 20)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # Fail, fail, fail: windows of base, 2*base, 4*base; then success shrinks: 2*base, base.
    expected = [base, 2 * base, 4 * base, 2 * base, base]
    for gap, want in zip(gaps, expected, strict=False):
        assert want * 0.9 <= gap <= want + 0.5, (gaps, expected)
    assert max(gaps[len(expected) :], default=0) < base  # then full speed again
    assert worker.acked == 20 and worker.retried == failures


async def test_sync_handler_runs_in_threads(js: JetStream) -> None:
    name = f"W{next(_names)}"
    sub = await consumer_on(js, name, 30)
    done: list[int] = []
    progress = Progress()
    loop = asyncio.get_running_loop()

    def handler(msg: object) -> None:
        time.sleep(0.005)
        done.append(int(msg.data))  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(progress.add)

    async with Worker(sub, handler, max_in_flight=5, threads=5, heartbeat=None) as worker:
        await progress.reach(30, 20)
    assert sorted(done) == list(range(30)) and worker.acked == 30


async def test_max_in_flight_is_shared_by_two_servers(kind: str) -> None:
    with PeerServer(kind) as other, PeerServer(kind) as first:
        conns = [await connect(first.url), await connect(other.url)]
        try:
            subs = [await consumer_on(c.jetstream(), "JOBS", 40) for c in conns]
            current = peak = 0
            progress = Progress()

            async def handler(msg: JsMsg) -> None:
                nonlocal current, peak
                current += 1
                peak = max(peak, current)
                await asyncio.sleep(0.002)
                current -= 1
                progress.add()

            worker = Worker(subs, handler, max_in_flight=4, heartbeat=None)
            async with worker:
                await progress.reach(80, 20)
            assert worker.acked == 80 and peak <= 4
            assert all(s.delivered == 40 for s in worker.ready.sources)

            # Fewer slots than servers: RDY moves between them, both get drained.
            for c in conns:
                for i in range(10):
                    await c.jetstream().publish("jobs.job", b"%d" % i)
            starved = Worker(
                subs, handler, max_in_flight=1, heartbeat=None, low_rdy_idle_timeout=0.2
            )
            async with starved:
                await progress.reach(100, 20)
            assert starved.acked == 20 and peak <= 4
        finally:
            for c in conns:
                await c.close()
