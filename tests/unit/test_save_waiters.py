"""Saving a consumer's state: a waiter (what ack replies and HTTP job changes ride on)
is told only once the commit holding the state lands, told the error when it fails,
and a failed save is saved again; changes nobody waits for (acks without a reply,
NSQ's FIN, deliveries) are saved within :data:`SAVE_INTERVAL`, a clean shutdown saves
everything, and a crash before the save costs a redelivery, never a message."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tether.engine.broker import Broker
from tether.engine.clock import FakeClock
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.delivery_state import decode_state
from tether.engine.consumers.registry import SAVE_INTERVAL, SAVE_RETRY_SECONDS, ConsumerRegistry
from tether.storage.base import MessageMeta, StorageError
from tether.storage.group_commit import PUT_CONSUMER_STATE, Batch
from tether.storage.memory import MemoryStore


class HeldStore(MemoryStore):
    """A memory store whose commits wait while ``held`` and fail while ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False
        self.failing = False
        self.waiting: list[Batch] = []
        self.state_writes = 0

    def _hand_off(self, batch: Batch) -> None:
        self.state_writes += sum(1 for op in batch.ops if op[0] == PUT_CONSUMER_STATE)
        if self.held:
            self.waiting.append(batch)
        elif self.failing:
            self._group.settle(batch, StorageError("database or disk is full"))
        else:
            super()._hand_off(batch)

    def release(self) -> None:
        self.held = False
        waiting, self.waiting = self.waiting, []
        for batch in waiting:
            self._hand_off(batch)


class Sink:
    """A front door that takes every delivery (and drops it)."""

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        pass

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        pass

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        pass

    def has_interest(self, subject: str) -> bool:
        return True

    def backlog(self, consumer: Consumer) -> int:
        return 0


async def ticks(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def turn(clock: FakeClock, seconds: float = 0.0) -> None:
    """Let ``seconds`` pass: the registry's timers fire and the commits they start land."""
    await ticks()
    clock.advance(seconds)
    await ticks()


async def setup(
    clock: FakeClock, store: HeldStore | None = None
) -> tuple[HeldStore, ConsumerRegistry]:
    if store is None:
        store = HeldStore()
        await store.open()
    broker = Broker(store, clock)
    await broker.load()
    if "S" not in broker.streams:
        await broker.create_stream("S", json.dumps({"name": "S", "subjects": ["s"]}).encode())
    registry = ConsumerRegistry(broker, Sink())
    await registry.load()
    if registry.find("S", "c") is None:
        await registry.create("S", ConsumerConfig(durable_name="c", ack_policy="explicit"))
    await turn(clock)
    return store, registry


async def delivered(clock: FakeClock, registry: ConsumerRegistry, n: int) -> None:
    """Publish ``n`` messages and hand them all out to ``c``."""
    broker = registry.broker
    stream = broker.get_stream("S")
    for i in range(n):
        broker.publish(stream, "s", None, b"m%d" % i, None)  # type: ignore[attr-defined]
    await turn(clock)
    registry.get("S", "c").pull("_INBOX.x", b"%d" % n)
    await turn(clock)


async def stored_pending(store: HeldStore) -> list[int]:
    """The stream sequences the stored state of ``c`` still waits an ack for."""
    (record,) = await store.load_consumers("S")
    return decode_state(record.state).pending[0::3]


async def test_the_waiter_is_told_only_once_the_state_is_committed(clock: FakeClock) -> None:
    store, registry = await setup(clock)
    consumer = registry.get("S", "c")
    told: list[StorageError | None] = []
    store.held = True
    writes = store.state_writes
    registry.after_save(consumer, told.append)
    registry.after_save(consumer, told.append)  # two acks of one tick: one save
    await turn(clock)
    assert told == []  # the commit is held: no answer yet
    assert store.state_writes == writes + 1
    store.release()
    await ticks()
    assert told == [None, None]


async def test_a_failed_save_is_told_and_saved_again(clock: FakeClock) -> None:
    store, registry = await setup(clock)
    consumer = registry.get("S", "c")
    told: list[StorageError | None] = []
    store.failing = True
    registry.after_save(consumer, told.append)
    await turn(clock)
    assert len(told) == 1 and isinstance(told[0], StorageError)
    assert "disk is full" in str(told[0])
    writes = store.state_writes
    store.failing = False
    await turn(clock, SAVE_RETRY_SECONDS)  # the retry: the state is written again
    assert store.state_writes == writes + 1
    registry.after_save(consumer, told.append)
    await turn(clock)
    assert told[1:] == [None]


async def test_a_consumer_kept_in_memory_only_is_answered_at_once(clock: FakeClock) -> None:
    store, registry = await setup(clock)
    await registry.create(
        "S", ConsumerConfig(durable_name="m", ack_policy="explicit", mem_storage=True)
    )
    told: list[StorageError | None] = []
    store.held = True
    registry.after_save(registry.get("S", "m"), told.append)
    assert told == [None]
    store.release()


async def test_unconfirmed_acks_are_saved_within_the_interval_once(clock: FakeClock) -> None:
    store, registry = await setup(clock)
    await delivered(clock, registry, 10)
    consumer = registry.get("S", "c")
    await turn(clock, SAVE_INTERVAL)
    assert await stored_pending(store) == list(range(1, 11))
    writes = store.state_writes
    # Acks without a reply over many ticks (NSQ's FINs a hundred to a read): not one
    # write per tick, one write for all of them, within the interval of the first.
    for seq in range(1, 6):
        consumer.ack(seq)
        await turn(clock, SAVE_INTERVAL / 10)
    assert store.state_writes == writes
    await turn(clock, SAVE_INTERVAL / 2)
    assert store.state_writes == writes + 1
    assert await stored_pending(store) == list(range(6, 11))
    await turn(clock, 10 * SAVE_INTERVAL)  # nothing changed: nothing written
    assert store.state_writes == writes + 1


async def test_a_confirmed_ack_is_saved_before_its_reply_not_at_the_interval(
    clock: FakeClock,
) -> None:
    store, registry = await setup(clock)
    await delivered(clock, registry, 4)
    consumer = registry.get("S", "c")
    await turn(clock, SAVE_INTERVAL)
    consumer.ack(1)  # no reply: waits for the interval
    consumer.ack(2)  # with a reply: saved in this tick, with the ack before it
    told: list[StorageError | None] = []
    store.held = True
    registry.after_save(consumer, told.append)
    await turn(clock)
    assert told == []  # not before the commit
    store.release()
    await ticks()
    assert told == [None]
    assert await stored_pending(store) == [3, 4]
    writes = store.state_writes
    await turn(clock, SAVE_INTERVAL)  # already saved: the interval has nothing left
    assert store.state_writes == writes


async def test_a_crash_before_the_save_redelivers_and_a_clean_shutdown_saves(
    clock: FakeClock,
) -> None:
    store, registry = await setup(clock)
    await delivered(clock, registry, 3)
    await turn(clock, SAVE_INTERVAL)
    registry.get("S", "c").ack(1)
    await turn(clock)
    # Killed now (the registry is dropped unsaved): the ack is not stored, so the
    # message is delivered again; it is never lost.
    assert await stored_pending(store) == [1, 2, 3]
    _, after_crash = await setup(clock, store)
    assert after_crash.get("S", "c").num_ack_pending == 3
    after_crash.get("S", "c").ack(2)
    await after_crash.close()  # a clean shutdown saves what nobody waited for
    assert await stored_pending(store) == [1, 3]


async def test_a_waiter_is_never_told_by_a_save_without_its_consumer(clock: FakeClock) -> None:
    store, registry = await setup(clock)
    await registry.create("S", ConsumerConfig(durable_name="d", ack_policy="explicit"))
    await delivered(clock, registry, 2)
    await turn(clock, SAVE_INTERVAL)
    registry.get("S", "c").ack(1)  # c waits for the interval
    d = registry.get("S", "d")
    d.pull("_INBOX.d", b"1")
    told: list[StorageError | None] = []
    writes = store.state_writes
    registry.after_save(d, told.append)
    # The interval's timer runs in the same loop pass, before this tick's flush: the
    # save it makes carries the waiter, so it carries the waiter's consumer too.
    registry._save_dirty()
    await ticks()
    assert told == [None] and store.state_writes == writes + 2  # c and d
    assert [r.name for r in await store.load_consumers("S")] == ["c", "d"]
    (d_state,) = [decode_state(r.state) for r in await store.load_consumers("S") if r.name == "d"]
    assert d_state.pending[0::3] == [1]  # its delivery, as it was when the waiter came
    await turn(clock)  # this tick's flush: nothing left to save
    assert store.state_writes == writes + 2
