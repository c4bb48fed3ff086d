"""Catch-up subscriptions against nats-server and Tether: pull to catch up, switch to
push, and fall back to pull after a restart, while a publisher keeps publishing."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tether.client import Backoff, CatchUpSubscription, JetStream, JsMsg, connect
from tether.client.testing import PeerServer, Progress

_names = itertools.count(1)


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def server(request: pytest.FixtureRequest) -> Iterator[PeerServer]:
    with PeerServer(request.param) as srv:
        yield srv


class Publisher:
    """Publishes numbered messages until stopped; survives reconnects."""

    def __init__(self, js: JetStream, subject: str, start: int) -> None:
        self.js = js
        self.subject = subject
        self.next = start
        self.stopped = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.stopped:
            try:
                await self.js.publish(self.subject, b"%d" % self.next, msg_id=str(self.next))
            except Exception:  # a restart in progress: publish the same number again
                await asyncio.sleep(0.05)
                continue
            self.next += 1
            if self.next % 20 == 0:
                await asyncio.sleep(0.005)

    async def stop(self) -> int:
        self.stopped = True
        await self.task
        return self.next - 1  # the last sequence published


class Seen:
    """Stream sequences handed to a handler, with a way to wait for a count."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.progress = Progress()

    def __call__(self, msg: JsMsg) -> None:
        self.seqs.append(msg.metadata.stream_seq)
        self.progress.add()

    async def reach(self, count: int, within: float) -> None:
        await self.progress.reach(count, within)


async def test_catch_up_then_live_with_a_busy_publisher(server: PeerServer) -> None:
    async with await connect(server.url) as nc:
        js = nc.jetstream()
        name = f"C{next(_names)}"
        subject = f"{name.lower()}.events"
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        for i in range(1, 1501):
            await js.publish_async(subject, b"%d" % i, msg_id=str(i))
        await js.publish_async_completed(timeout=10)
        seen = Seen()
        checkpoints: list[int] = []
        publisher = Publisher(js, subject, 1501)
        catchup = CatchUpSubscription(
            js, name, seen, checkpoint=checkpoints.append, checkpoint_every=250, batch=200
        )
        async with catchup:
            await catchup.wait_live(20)  # caught up with the backlog and the publisher
            assert len(seen.seqs) >= 1500
            last = await publisher.stop()
            await seen.reach(last, 10)
        assert seen.seqs == list(range(1, last + 1))  # each sequence once, in order
        assert checkpoints and checkpoints == sorted(checkpoints) and checkpoints[-1] == last


async def test_start_from_a_sequence_or_a_time(server: PeerServer) -> None:
    async with await connect(server.url) as nc:
        js = nc.jetstream()
        name = f"C{next(_names)}"
        subject = f"{name.lower()}.events"
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        for i in range(1, 11):
            await js.publish(subject, b"%d" % i)
        await asyncio.sleep(0.05)
        middle = datetime.now(UTC)
        await asyncio.sleep(0.05)
        for i in range(11, 21):
            await js.publish(subject, b"%d" % i)
        from_seq = Seen()
        async with CatchUpSubscription(js, name, from_seq, start_seq=15):
            await from_seq.reach(6, 10)
        assert from_seq.seqs == [15, 16, 17, 18, 19, 20]
        from_time = Seen()
        async with CatchUpSubscription(js, name, from_time, start_time=middle):
            await from_time.reach(10, 10)
        assert from_time.seqs == list(range(11, 21))


async def test_restart_falls_back_to_pull_without_gaps(server: PeerServer) -> None:
    nc = await connect(
        server.url, max_reconnect_attempts=-1, reconnect_backoff=Backoff(0.05, 0.5, 2, 0.1)
    )
    async with nc:
        js = nc.jetstream()
        name = f"C{next(_names)}"
        subject = f"{name.lower()}.events"
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        seen = Seen()
        catchup = CatchUpSubscription(js, name, seen, heartbeat=0.5)
        publisher = Publisher(js, subject, 1)
        async with catchup:
            await seen.reach(300, 20)
            await catchup.wait_live(10)
            await asyncio.to_thread(server.restart)
            await nc.wait_connected(10)
            await seen.reach(len(seen.seqs) + 300, 20)
            last = await publisher.stop()
            await seen.reach(last, 20)
        assert catchup.resyncs >= 1
        assert seen.seqs == list(range(1, last + 1))


async def test_a_failing_handler_ends_the_subscription(server: PeerServer) -> None:
    async with await connect(server.url) as nc:
        js = nc.jetstream()
        name = f"C{next(_names)}"
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        for i in range(1, 11):
            await js.publish(f"{name.lower()}.e", b"%d" % i)

        def handler(msg: JsMsg) -> None:
            if msg.metadata.stream_seq == 5:
                raise ValueError("cannot handle 5")

        catchup = CatchUpSubscription(js, name, handler)
        await catchup.start()
        with pytest.raises(ValueError, match="cannot handle 5"):
            await asyncio.wait_for(catchup.wait(), 10)
        assert catchup.last_seq == 4 and catchup.phase == "failed"
        await catchup.stop()  # resume later from catchup.last_seq + 1
