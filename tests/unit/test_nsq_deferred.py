"""Deferred NSQ messages (DPUB, REQ with a delay) whose release fails — a full store, a
topic that cannot be made — stay kept and are tried again; while releases fail, one due
message a second is tried, not the whole backlog, and when one goes through the rest
follow at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tether.engine.clock import FakeClock
from tether.engine.nsq.deferred import DEFERRED_STREAM, DeferredPublishes
from tether.storage.memory import MemoryStore

NS = 1_000_000_000


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_failing_backlog_is_probed_one_message_a_second(clock: FakeClock) -> None:
    store = MemoryStore()
    await store.open()
    attempts: list[bytes] = []
    published: list[bytes] = []
    full = True

    async def publish(topic: str, body: bytes) -> Callable[[], None]:
        def go() -> None:
            attempts.append(body)
            if full:
                raise RuntimeError("insufficient resources")
            published.append(body)

        return go

    deferred = DeferredPublishes(store, clock, publish)
    for i in range(50):
        await deferred.add("t", b"m%d" % i, NS)
    clock.advance(1)  # all 50 due: the first failure stops the rest
    await settle()
    assert 1 <= len(attempts) <= 50
    first_round = len(attempts)
    for _ in range(5):  # full for five more seconds: one try a second
        clock.advance(1)
        await settle()
    assert len(attempts) - first_round <= 5 + 1
    assert published == [] and len(deferred) == 50

    full = False
    clock.advance(1)
    await settle()
    clock.advance(0)
    await settle()
    assert sorted(published) == sorted(b"m%d" % i for i in range(50))
    assert len(deferred) == 0
    assert await store.load_consumers(DEFERRED_STREAM) == []
    deferred.stop()
    await store.close()
