"""Waiting for a consumer's state to be committed (what ack replies and HTTP job changes
ride on): told only once the commit holding the state lands, told the error when it
fails, and a failed save is saved again."""

from __future__ import annotations

import asyncio
import json

from tether.engine.broker import Broker
from tether.engine.clock import LoopClock
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.registry import ConsumerRegistry
from tether.storage.base import StorageError
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


async def ticks(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def setup() -> tuple[HeldStore, ConsumerRegistry]:
    store = HeldStore()
    await store.open()
    broker = Broker(store, LoopClock())
    await broker.load()
    await broker.create_stream("S", json.dumps({"name": "S"}).encode())
    registry = ConsumerRegistry(broker)
    await registry.create("S", ConsumerConfig(durable_name="c", ack_policy="explicit"))
    return store, registry


async def test_the_waiter_is_told_only_once_the_state_is_committed() -> None:
    store, registry = await setup()
    consumer = registry.get("S", "c")
    told: list[StorageError | None] = []
    store.held = True
    registry.after_save(consumer, told.append)
    registry.after_save(consumer, told.append)  # two acks of one tick: one save
    await ticks()
    assert told == []  # the commit is held: no answer yet
    assert store.state_writes == 1
    store.release()
    await ticks()
    assert told == [None, None]


async def test_a_failed_save_is_told_and_saved_again() -> None:
    store, registry = await setup()
    consumer = registry.get("S", "c")
    told: list[StorageError | None] = []
    store.failing = True
    registry.after_save(consumer, told.append)
    await ticks()
    assert len(told) == 1 and isinstance(told[0], StorageError)
    assert "disk is full" in str(told[0])
    writes = store.state_writes
    store.failing = False
    registry.flush()  # the retry (a timer in real life): the state is written again
    await ticks()
    assert store.state_writes == writes + 1
    registry.after_save(consumer, told.append)
    await ticks()
    assert told[1:] == [None]


async def test_a_consumer_kept_in_memory_only_is_answered_at_once() -> None:
    store, registry = await setup()
    await registry.create(
        "S", ConsumerConfig(durable_name="m", ack_policy="explicit", mem_storage=True)
    )
    told: list[StorageError | None] = []
    store.held = True
    registry.after_save(registry.get("S", "m"), told.append)
    assert told == [None]
    store.release()
