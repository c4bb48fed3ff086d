"""The consumer registry with a real broker on the memory store: rules, storage, retention."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tether.engine.broker import Broker
from tether.engine.clock import LoopClock
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.registry import SAVE_INTERVAL, ConsumerRegistry
from tether.engine.errors import ApiError
from tether.storage.base import MessageMeta
from tether.storage.memory import MemoryStore


class Sink:
    def __init__(self) -> None:
        self.delivered: list[tuple[str, int]] = []

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        self.delivered.append((consumer.name, meta.seq))

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        pass

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        pass

    def has_interest(self, subject: str) -> bool:
        return True

    def backlog(self, consumer: Consumer) -> int:
        return 0


async def settle() -> None:
    """Let group commits land and the per-tick flush run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def open_broker(store: MemoryStore) -> tuple[Broker, ConsumerRegistry, Sink]:
    broker = Broker(store, LoopClock())
    await broker.load()
    sink = Sink()
    registry = ConsumerRegistry(broker, sink)
    await registry.load()
    return broker, registry, sink


async def stream(broker: Broker, name: str, **config: Any) -> None:
    await broker.create_stream(name, json.dumps({"name": name, **config}).encode())


async def publish(broker: Broker, name: str, subject: str, n: int) -> None:
    stream = broker.get_stream(name)
    for i in range(n):
        broker.publish(stream, subject, None, b"m%d" % i, None)
    await settle()


def config(name: str, **fields: Any) -> ConsumerConfig:
    fields.setdefault("ack_policy", "explicit")
    return ConsumerConfig(durable_name=name, **fields)


@pytest.fixture
async def store() -> MemoryStore:
    memory = MemoryStore()
    await memory.open()
    return memory


async def test_create_update_and_refusals(store: MemoryStore) -> None:
    broker, registry, _ = await open_broker(store)
    await stream(broker, "S", subjects=["s.>"], max_consumers=2)
    c, created = await registry.create("S", config("C"))
    assert created and c.config.max_ack_pending == 1000
    same, created = await registry.create("S", config("C"))
    assert same is c and not created
    with pytest.raises(ApiError) as exc:
        await registry.create("S", config("C", max_ack_pending=5), action="create")
    assert exc.value.err_code == 10148
    updated, _ = await registry.create("S", config("C", max_ack_pending=5))
    assert updated is c and c.max_ack_pending == 5
    with pytest.raises(ApiError) as exc:
        await registry.create("S", config("C", ack_policy="all"))
    assert (exc.value.code, exc.value.err_code) == (500, 10012)
    with pytest.raises(ApiError) as exc:
        await registry.create("S", config("X"), action="update")
    assert exc.value.err_code == 10149
    await registry.create("S", config("D"))
    with pytest.raises(ApiError) as exc:
        await registry.create("S", config("E"))
    assert exc.value.err_code == 10026
    assert broker.get_stream("S").consumer_count == 2
    await registry.delete("S", "D")
    assert [x.name for x in registry.consumers_of("S")] == ["C"]


async def test_workqueue_rules(store: MemoryStore) -> None:
    broker, registry, _ = await open_broker(store)
    await stream(broker, "W", subjects=["w.>"], retention="workqueue")
    with pytest.raises(ApiError) as exc:
        await registry.create("W", ConsumerConfig(durable_name="A", ack_policy="none"))
    assert exc.value.err_code == 10084
    await registry.create("W", config("A", filter_subject="w.a"))
    with pytest.raises(ApiError) as exc:
        await registry.create("W", config("B"))
    assert exc.value.err_code == 10099
    with pytest.raises(ApiError) as exc:
        await registry.create("W", config("B", filter_subject="w.*"))
    assert exc.value.err_code == 10100
    await registry.create("W", config("B", filter_subject="w.b"))


async def test_state_is_saved_within_the_interval_and_reloaded(store: MemoryStore) -> None:
    broker, registry, sink = await open_broker(store)
    await stream(broker, "S", subjects=["s.>"])
    c, _ = await registry.create("S", config("C"))
    await publish(broker, "S", "s.a", 5)
    c.pull("_INBOX.x", b"4")
    c.ack(1)
    c.ack(2)
    c.nak(3)
    await asyncio.sleep(SAVE_INTERVAL * 1.5)  # nothing waits for these acks
    assert sink.delivered == [("C", 1), ("C", 2), ("C", 3), ("C", 4)]
    # A second broker on the same store (what a restart sees).
    _, registry2, sink2 = await open_broker(store)
    c2 = registry2.get("S", "C")
    assert c2.ack_floor == (2, 2) and c2.num_ack_pending == 2 and c2.num_pending == 1
    c2.pull("_INBOX.y", b'{"batch": 5, "no_wait": true}')
    assert sink2.delivered == [("C", 3), ("C", 5)]
    await registry.close()
    await registry2.close()


async def test_interest_and_workqueue_retention(store: MemoryStore) -> None:
    broker, registry, _ = await open_broker(store)
    await stream(broker, "I", subjects=["i.>"], retention="interest")
    a, _ = await registry.create("I", config("A"))
    b, _ = await registry.create("I", config("B", filter_subject="i.b"))
    await publish(broker, "I", "i.a", 2)
    await publish(broker, "I", "i.b", 1)
    await publish(broker, "I", "i.c", 1)
    a.pull("_INBOX.a", b"4")
    b.pull("_INBOX.b", b"1")
    for seq in (1, 3):
        a.ack(seq)
    await settle()
    info = broker.get_stream("I")
    assert [s for s in range(1, 5) if info.meta(s)] == [2, 3, 4]  # 3 waits for B
    b.ack(3)
    await settle()
    assert [s for s in range(1, 5) if info.meta(s)] == [2, 4]
    await registry.delete("I", "A")
    await settle()
    assert [s for s in range(1, 5) if info.meta(s)] == []  # nobody else wanted 2 and 4

    await stream(broker, "W", subjects=["w.>"], retention="workqueue")
    w, _ = await registry.create("W", config("W"))
    await publish(broker, "W", "w.a", 3)
    w.pull("_INBOX.w", b"3")
    w.ack(2)
    w.term(3)
    await settle()
    wq = broker.get_stream("W")
    assert [s for s in range(1, 4) if wq.meta(s)] == [1]
    assert w.num_ack_pending == 1 and w.dead_messages() == []


async def test_stream_delete_drops_consumers(store: MemoryStore) -> None:
    broker, registry, _ = await open_broker(store)
    await stream(broker, "S", subjects=["s.>"])
    c, _ = await registry.create("S", config("C"))
    await broker.delete_stream("S")
    assert c.deleted and registry.find("S", "C") is None
    assert await store.load_consumers("S") == []
