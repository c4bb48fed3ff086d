"""Atomic batch publish in the engine: staged until the commit, then stored in one group
commit (one storage transaction), with nats-server's limits and errors. Time is a
FakeClock."""

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
from tether.engine.streams.batches import BatchLimits, with_commit_header
from tether.storage.base import StorageError
from tether.storage.group_commit import APPEND, Batch
from tether.storage.memory import MemoryStore


class RecordingStore(MemoryStore):
    """Remembers the appends of each group commit; fails commits while ``full``."""

    full = False

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[list[int]] = []

    def _hand_off(self, batch: Batch) -> None:
        appends = [op[2].seq for op in batch.ops if op[0] == APPEND]
        if self.full:
            self._group.settle(batch, StorageError("database or disk is full"))
            return
        if appends:
            self.commits.append(appends)
        super()._hand_off(batch)


def batch_hdrs(batch: str, seq: int, commit: str = "", **more: str) -> bytes:
    extra = {"Nats_Batch_Commit": commit} if commit else {}
    return hdrs(Nats_Batch_Id=batch, Nats_Batch_Sequence=str(seq), **extra, **more)


@pytest.fixture
async def store() -> AsyncIterator[RecordingStore]:
    store = RecordingStore()
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def broker(store: RecordingStore, clock: FakeClock) -> AsyncIterator[Broker]:
    broker = Broker(store, clock)
    await broker.load()
    await broker.create_stream(
        "A", json.dumps({"name": "A", "subjects": ["a.>"], "allow_atomic": True}).encode()
    )
    yield broker
    broker.close()


class Pub:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.results: list[PubAck | ApiError] = []

    def __call__(
        self, subject: str, headers: bytes, payload: bytes = b"x", stream: str = "A"
    ) -> None:
        self.broker.publish(
            self.broker.get_stream(stream), subject, headers, payload, self.results.append
        )

    async def settle(self) -> list[Any]:
        with contextlib.suppress(StorageError):
            await self.broker.store.flush()
        out, self.results = self.results, []
        return [r.err_code if isinstance(r, ApiError) else r for r in out]


async def test_a_batch_is_stored_only_at_its_commit_in_one_transaction(
    broker: Broker, store: RecordingStore
) -> None:
    pub = Pub(broker)
    for i in range(1, 5):
        pub("a.x", batch_hdrs("b1", i), b"m%d" % i)
    assert await pub.settle() == [PubAck("A", 0, staged=True)] * 4
    assert broker.get_stream("A").last_seq == 0 and store.commits == []
    pub("a.y", batch_hdrs("b1", 5, "1"), b"m5")
    assert await pub.settle() == [PubAck("A", 5, batch="b1", count=5)]
    assert store.commits == [[1, 2, 3, 4, 5]]
    stored = await store.read_range("A", 1, 10)
    assert [m.data for m in stored] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert b"Nats-Batch-Id: b1" in stored[0].headers  # kept, as nats-server does


async def test_eob_commits_without_storing_and_marks_the_last_message(
    broker: Broker, store: RecordingStore
) -> None:
    pub = Pub(broker)
    pub("a.x", batch_hdrs("b", 1))
    pub("a.x", batch_hdrs("b", 2))
    pub("a.x", batch_hdrs("b", 3, "eob"))
    results = await pub.settle()
    assert results[-1] == PubAck("A", 2, batch="b", count=2)
    last = await store.read("A", 2)
    assert last is not None and last.headers.endswith(b"Nats-Batch-Commit: 1\r\n\r\n")
    assert with_commit_header(b"") == b"NATS/1.0\r\nNats-Batch-Commit: 1\r\n\r\n"


async def test_errors_in_nats_servers_order(broker: Broker) -> None:
    await broker.create_stream("N", json.dumps({"name": "N", "subjects": ["n.>"]}).encode())
    pub = Pub(broker)
    pub("n.x", batch_hdrs("x", 1), stream="N")  # disabled
    pub("a.x", batch_hdrs("x" * 65, 1))  # id too long
    pub("a.x", hdrs(Nats_Batch_Id="b"))  # no sequence
    pub("a.x", batch_hdrs("b", 2))  # unknown batch, not at 1
    pub("a.x", batch_hdrs("b", 1001))  # unknown batch, past the max size
    pub("a.x", batch_hdrs("b", 1, "yes"))  # bad commit value
    pub("a.x", batch_hdrs("b", 1, "eob"))  # eob at 1
    assert await pub.settle() == [10174, 10179, 10175, 10176, 10199, 10200, 10176]


async def test_a_gap_ends_the_batch(broker: Broker) -> None:
    pub = Pub(broker)
    pub("a.x", batch_hdrs("g", 1))
    pub("a.x", batch_hdrs("g", 3))
    pub("a.x", batch_hdrs("g", 2, "1"))
    results = await pub.settle()
    assert results[1:] == [10176, 10176]
    assert broker.get_stream("A").last_seq == 0 and len(broker.batches) == 0


async def test_commit_time_checks_refuse_the_whole_batch(broker: Broker) -> None:
    pub = Pub(broker)
    pub("a.x", batch_hdrs("d", 1, Nats_Msg_Id="m"))
    pub("a.x", batch_hdrs("d", 2, "1", Nats_Msg_Id="m"))
    pub("a.x", batch_hdrs("e", 1, "1", Nats_Expected_Last_Msg_Id="m"))
    pub("a.y", batch_hdrs("f", 1, Nats_Expected_Last_Subject_Sequence="0"))
    pub("a.y", batch_hdrs("f", 2, "1", Nats_Expected_Last_Subject_Sequence="0"))
    pub("a.z", batch_hdrs("h", 1, Nats_Expected_Last_Sequence="7"))
    pub("a.z", batch_hdrs("h", 2, "1"))
    results = await pub.settle()
    assert [r for r in results if not isinstance(r, PubAck)] == [10201, 10177, 10164, 10071]
    assert broker.get_stream("A").last_seq == 0


async def test_inflight_and_size_limits(broker: Broker) -> None:
    broker.batches.limits = BatchLimits(max_size=3, inflight_per_stream=2, inflight_total=10)
    pub = Pub(broker)
    pub("a.x", batch_hdrs("one", 1))
    pub("a.x", batch_hdrs("two", 1))
    pub("a.x", batch_hdrs("three", 1))
    for i in range(2, 5):
        pub("a.x", batch_hdrs("one", i))
    results = await pub.settle()
    assert results[2] == 10210
    assert results[-1] == 10199  # the fourth message of a batch of at most 3
    assert broker.batches.inflight("A") == 1  # "one" is gone, "two" is still open


async def test_an_idle_batch_is_abandoned_after_the_timeout(
    broker: Broker, clock: FakeClock
) -> None:
    dropped: list[tuple[str, str]] = []
    broker.batches.on_abandoned = lambda batch, reason: dropped.append((batch.id, reason))
    pub = Pub(broker)
    pub("a.x", batch_hdrs("slow", 1))
    clock.advance(6)
    pub("a.x", batch_hdrs("slow", 2))  # activity: the batch lives on
    clock.advance(6)
    assert len(broker.batches) == 1
    clock.advance(5)
    assert len(broker.batches) == 0
    assert dropped == [("slow", "timeout")]
    pub("a.x", batch_hdrs("slow", 3, "1"))
    assert (await pub.settle())[-1] == 10176


async def test_a_failed_commit_stores_nothing_and_gives_the_sequences_back(
    broker: Broker, store: RecordingStore
) -> None:
    pub = Pub(broker)
    pub("a.x", hdrs(Plain="1"))
    await pub.settle()
    store.full = True
    for i in range(1, 4):
        pub("a.x", batch_hdrs("f", i, "1" if i == 3 else ""))
    results = await pub.settle()
    assert results[-1] == 10077
    store.full = False
    stream = broker.get_stream("A")
    assert (stream.last_seq, stream.state.msgs) == (1, 1)
    for i in range(1, 3):
        pub("a.x", batch_hdrs("f2", i, "1" if i == 2 else ""))
    assert (await pub.settle())[-1] == PubAck("A", 3, batch="f2", count=2)


async def test_a_deleted_stream_drops_its_open_batches(broker: Broker) -> None:
    pub = Pub(broker)
    pub("a.x", batch_hdrs("b", 1))
    await pub.settle()
    await broker.delete_stream("A")
    assert len(broker.batches) == 0


async def test_a_batch_the_store_refuses_part_of_is_refused_whole(
    broker: Broker, store: RecordingStore
) -> None:
    """The store can never hold one message of a batch (a value it cannot take): the
    whole batch is refused, and a message published after it is stored again in its
    place, as for any refused append."""
    pub = Pub(broker)
    for i in range(1, 4):
        pub("a.x", batch_hdrs("w", i, "1" if i == 3 else ""), b"m%d" % i)
    pub("a.y", hdrs(After="1"), b"after")
    broker._take_back({"A": {2: "a value the store cannot hold"}})  # as the committer would
    results = await pub.settle()
    refused = [r for r in results if r == 10077]
    assert len(refused) == 1  # the batch's commit publisher hears it
    assert PubAck("A", 1) in results  # the later message, stored again at seq 1
    assert [m.data for m in await store.read_range("A", 1, 10)] == [b"after"]
