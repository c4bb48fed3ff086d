"""Counter streams in the engine: totals of any size, nats-server's refusals, and totals
that survive a restart."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from headers_support import hdrs

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.streams import counters
from tether.storage.base import StorageError
from tether.storage.memory import MemoryStore


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def broker(store: MemoryStore) -> AsyncIterator[Broker]:
    broker = Broker(store, FakeClock())
    await broker.load()
    config = {"name": "C", "subjects": ["c.>"], "allow_msg_counter": True}
    await broker.create_stream("C", json.dumps(config).encode())
    yield broker
    broker.close()


class Pub:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.results: list[PubAck | ApiError] = []

    def __call__(self, subject: str, headers: bytes | None, payload: bytes = b"") -> None:
        stream = self.broker.get_stream(subject.split(".")[0].upper())
        self.broker.publish(stream, subject, headers, payload, self.results.append)

    async def settle(self) -> list[Any]:
        with contextlib.suppress(StorageError):
            await self.broker.store.flush()
        out, self.results = self.results, []
        return [r.err_code if isinstance(r, ApiError) else (r.seq, r.val) for r in out]


def test_increments_are_read_as_go_big_ints() -> None:
    assert counters.parse_increment(b"+5") == 5
    assert counters.parse_increment(b"-10") == -10
    assert counters.parse_increment(b"9" * 40) == int("9" * 40)
    for bad in (b"1_0", b"", b"x", b"1.5", b" 1", b"+", b"0x10"):
        assert counters.parse_increment(bad) is None
    assert counters.read_value(b'{"val":"-12"}') == -12
    assert counters.read_value(b"not json") is None


async def test_totals_of_any_size(broker: Broker, store: MemoryStore) -> None:
    pub = Pub(broker)
    pub("c.x", hdrs(Nats_Incr="1"))
    pub("c.x", hdrs(Nats_Incr="+5"))
    pub("c.y", hdrs(Nats_Incr="-10"))
    pub("c.x", hdrs(Nats_Incr="9" * 30))
    assert await pub.settle() == [(1, "1"), (2, "6"), (3, "-10"), (4, str(int("9" * 30) + 6))]
    msg = await store.read("C", 4)
    assert msg is not None and msg.data == b'{"val":"%s"}' % str(int("9" * 30) + 6).encode()
    assert b"Nats-Incr: " in msg.headers  # every header is kept


async def test_nats_servers_refusals(broker: Broker) -> None:
    await broker.create_stream("N", json.dumps({"name": "N", "subjects": ["n.>"]}).encode())
    pub = Pub(broker)
    pub("c.x", None)  # no increment
    pub("c.x", hdrs(Nats_Incr="1"), b"body")
    pub("c.x", hdrs(Nats_Incr="x"), b"body")  # invalid before payload
    pub("c.x", hdrs(Nats_Incr="1", Nats_Rollup="sub"))
    pub("c.x", hdrs(Nats_Incr="1", Nats_Expected_Stream="C"))
    pub("c.x", hdrs(Nats_Incr="1", Nats_TTL="5s"))  # TTLs first
    pub("n.x", hdrs(Nats_Incr="1"))
    pub("n.x", hdrs(Nats_Incr="zz"))
    assert await pub.settle() == [10169, 10170, 10171, 10171, 10171, 10166, 10168, 10171]
    # A run of header-less publishes is refused message by message.
    replies: list[Any] = []

    class Sink:
        def pub_acked(self, *args: Any) -> None:
            replies.append("ack")

        def pub_failed(self, stream: str, rs: list[str], error: ApiError) -> None:
            replies.append(error.err_code)

    broker.publish_many(broker.get_stream("C"), "c.x", [b"", b""], ["r1", "r2"], Sink())
    assert replies == [10169, 10169]


async def test_a_counter_starts_from_its_last_live_message(broker: Broker) -> None:
    pub = Pub(broker)
    pub("c.x", hdrs(Nats_Incr="2"))
    pub("c.x", hdrs(Nats_Incr="3"))
    await pub.settle()
    await broker.delete_message("C", 2)
    pub("c.x", hdrs(Nats_Incr="10"))
    assert await pub.settle() == [(3, "12")]


async def test_totals_survive_a_restart(broker: Broker, store: MemoryStore) -> None:
    pub = Pub(broker)
    pub("c.x", hdrs(Nats_Incr="41"))
    pub("c.y", hdrs(Nats_Incr="-1"))
    await pub.settle()
    broker.close()
    again = Broker(store, FakeClock())
    await again.load()
    pub = Pub(again)
    pub("c.x", hdrs(Nats_Incr="1"))
    pub("c.y", hdrs(Nats_Incr="-1"))
    assert await pub.settle() == [(3, "42"), (4, "-2")]
    again.close()


async def test_counters_in_an_atomic_batch_add_up(broker: Broker, store: MemoryStore) -> None:
    config = {"name": "B", "subjects": ["b.>"], "allow_msg_counter": True, "allow_atomic": True}
    await broker.create_stream("B", json.dumps(config).encode())
    pub = Pub(broker)
    for i in range(1, 4):
        extra = {"Nats_Batch_Commit": "1"} if i == 3 else {}
        pub("b.x", hdrs(Nats_Batch_Id="k", Nats_Batch_Sequence=str(i), Nats_Incr="5", **extra))
    await pub.settle()
    assert [m.data for m in await store.read_range("B", 1, 5)] == [
        b'{"val":"5"}',
        b'{"val":"10"}',
        b'{"val":"15"}',
    ]


async def test_config_rules(broker: Broker) -> None:
    for extra, text in (
        ({"allow_msg_ttl": True}, "counter stream cannot use message TTLs"),
        ({"discard": "new"}, "counter stream cannot use discard new"),
        ({"retention": "workqueue"}, "counter stream can only use limits retention"),
        ({"allow_msg_schedules": True}, "counter stream cannot use message schedules"),
    ):
        config = {"name": "X", "subjects": ["x"], "allow_msg_counter": True, **extra}
        with pytest.raises(ApiError) as excinfo:
            await broker.create_stream("X", json.dumps(config).encode())
        assert (excinfo.value.err_code, excinfo.value.description) == (10052, text)
    with pytest.raises(ApiError) as excinfo:
        await broker.update_stream("C", json.dumps({"name": "C", "subjects": ["c.>"]}).encode())
    assert excinfo.value.description == (
        "stream configuration update can not change message counter setting"
    )


async def test_sourced_copies_add_up_and_broken_sources_are_refused(
    broker: Broker, store: MemoryStore
) -> None:
    pub = Pub(broker)
    source = "O 1 > > c.x"
    pub("c.x", hdrs(Nats_Incr="5", Nats_Stream_Source=source), b'{"val":"5"}')
    pub("c.x", hdrs(Nats_Incr="2", Nats_Stream_Source="O 2 > > c.x"), b'{"val":"7"}')
    pub("c.x", hdrs(Nats_Incr="10"))
    assert await pub.settle() == [(1, "5"), (2, "7"), (3, "17")]
    last = await store.read("C", 3)
    assert last is not None
    assert b'Nats-Counter-Sources: {"O":{"c.x":"7"}}' in last.headers  # carried forward
    # A message whose Nats-Counter-Sources is not JSON breaks the next sourced copy.
    pub("c.y", hdrs(Nats_Incr="1", Nats_Counter_Sources="nope"))
    await pub.settle()
    broker.close()
    again = Broker(store, FakeClock())
    await again.load()
    pub = Pub(again)
    pub("c.y", hdrs(Nats_Incr="1", Nats_Stream_Source="O 3 > > c.y"), b'{"val":"1"}')
    assert await pub.settle() == [10172]
    again.close()
