"""The broker's stream side: group-committed publishes, limits on storage, max_age timers,
dedup across restarts and what a failed commit leaves behind. Time is a FakeClock."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from headers_support import hdrs
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.streams.stream import Stream
from tether.storage.base import StorageError, Store
from tether.storage.group_commit import Batch
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore

NS = 1_000_000_000


class FlakyStore(MemoryStore):
    """A memory store whose commits fail while ``full`` is set (a full disk)."""

    full = False

    def _hand_off(self, batch: Batch) -> None:
        if self.full:
            self._group.settle(batch, StorageError("database or disk is full"))
        else:
            super()._hand_off(batch)


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


class Publisher:
    """Publishes through the broker and collects what each publisher is told."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.results: list[PubAck | ApiError] = []

    def __call__(
        self, stream: str, subject: str, payload: bytes = b"x", headers: bytes | None = None
    ) -> None:
        self.broker.publish(
            self.broker.get_stream(stream), subject, headers, payload, self.results.append
        )

    async def settle(self) -> list[PubAck | ApiError]:
        with contextlib.suppress(StorageError):  # a failed commit is what some tests want
            await self.broker.store.flush()
        out, self.results = self.results, []
        return out


@pytest.fixture
async def store() -> AsyncIterator[FlakyStore]:
    store = FlakyStore()
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def broker(store: Store, clock: FakeClock) -> AsyncIterator[Broker]:
    broker = Broker(store, clock)
    await broker.load()
    yield broker
    broker.close()


async def test_a_pub_ack_waits_for_the_commit(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S", subjects=["s.>"]))
    pub = Publisher(broker)
    pub("S", "s.a", b"one")
    pub("S", "s.b", b"two")
    assert pub.results == []  # nothing is acknowledged before its commit is durable
    assert await pub.settle() == [PubAck("S", 1), PubAck("S", 2)]
    stored = await broker.store.read("S", 2)
    assert stored is not None and stored.data == b"two"


async def test_identical_create_is_not_a_second_stream(broker: Broker) -> None:
    _, created = await broker.create_stream("S", body(name="S"))
    again, created_again = await broker.create_stream("S", body(name="S"))
    assert (created, created_again) == (True, False)
    assert again is broker.get_stream("S")
    with pytest.raises(ApiError) as excinfo:
        await broker.create_stream("S", body(name="S", max_msgs=1))
    assert excinfo.value.err_code == 10058
    with pytest.raises(ApiError) as excinfo:
        await broker.create_stream("T", body(name="T", subjects=["S"]))
    assert excinfo.value.err_code == 10065


async def test_limits_delete_from_storage_too(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S", max_msgs=2))
    pub = Publisher(broker)
    for _ in range(4):
        pub("S", "S")
    await pub.settle()
    assert [m.seq for m in await broker.store.read_range("S", 1, 10)] == [3, 4]
    await broker.update_stream("S", body(name="S", max_msgs=1))
    await broker.store.flush()
    assert [m.seq for m in await broker.store.read_range("S", 1, 10)] == [4]


async def test_sealed_deny_delete_and_deny_purge(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S", deny_delete=True, deny_purge=True))
    pub = Publisher(broker)
    pub("S", "S")
    await pub.settle()
    with pytest.raises(ApiError) as excinfo:
        await broker.delete_message("S", 1)
    assert (excinfo.value.err_code, excinfo.value.description) == (
        10057,
        "message delete not permitted",
    )
    with pytest.raises(ApiError) as excinfo:
        await broker.purge_stream("S", "", 0, 0)
    assert excinfo.value.err_code == 10110
    await broker.update_stream("S", body(name="S", deny_delete=True, deny_purge=True, sealed=True))
    pub("S", "S")
    (result,) = await pub.settle()
    assert isinstance(result, ApiError) and result.err_code == 10109
    with pytest.raises(ApiError) as excinfo:
        await broker.delete_message("S", 1)
    assert excinfo.value.err_code == 10109


async def test_message_delete_tells_apart_every_kind_of_missing(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S"))
    pub = Publisher(broker)
    for _ in range(4):
        pub("S", "S")
    await pub.settle()
    await broker.purge_stream("S", "", 2, 0)  # removes 1
    await broker.delete_message("S", 3)
    cases = {0: 10057, 1: 10057, 3: 10043, 9: 10057}
    for seq, err_code in cases.items():
        with pytest.raises(ApiError) as excinfo:
            await broker.delete_message("S", seq)
        assert excinfo.value.err_code == err_code, seq
    assert await broker.store.read("S", 3) is None


async def test_rollup_needs_permission_and_purges_in_storage(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S", subjects=["s.>"]))
    await broker.create_stream("R", body(name="R", subjects=["r.>"], allow_rollup_hdrs=True))
    pub = Publisher(broker)
    pub("S", "s.a", headers=hdrs(Nats_Rollup="sub"))
    for _ in range(3):
        pub("R", "r.a")
    pub("R", "r.b")
    pub("R", "r.a", b"latest", hdrs(Nats_Rollup="sub"))
    results = await pub.settle()
    assert isinstance(results[0], ApiError) and results[0].err_code == 10111
    assert [m.seq for m in await broker.store.read_range("R", 1, 10)] == [4, 5]


async def test_max_age_expires_on_the_timer(broker: Broker, clock: FakeClock) -> None:
    await broker.create_stream("S", body(name="S", max_age=2 * NS))
    pub = Publisher(broker)
    pub("S", "S", b"old")
    await pub.settle()
    clock.advance(1)
    pub("S", "S", b"new")
    await pub.settle()
    clock.advance(1.5)  # the first is 2.5 s old, the second 1.5 s
    stream = broker.get_stream("S")
    assert list(stream.seqs(0)) == [2]
    clock.advance(1)
    assert len(stream) == 0
    await broker.store.flush()
    assert await broker.store.read_range("S", 1, 10) == []


async def test_dedup_window_runs_on_the_clock(broker: Broker, clock: FakeClock) -> None:
    await broker.create_stream("S", body(name="S", duplicate_window=NS))
    pub = Publisher(broker)
    pub("S", "S", headers=hdrs(Nats_Msg_Id="a"))
    pub("S", "S", headers=hdrs(Nats_Msg_Id="a"))
    assert await pub.settle() == [PubAck("S", 1), PubAck("S", 1, duplicate=True)]
    clock.advance(1.5)
    pub("S", "S", headers=hdrs(Nats_Msg_Id="a"))
    assert await pub.settle() == [PubAck("S", 2)]


async def test_a_failed_commit_is_reported_and_leaves_nothing_behind(
    broker: Broker, store: FlakyStore
) -> None:
    await broker.create_stream("S", body(name="S"))
    pub = Publisher(broker)
    pub("S", "S", b"kept", hdrs(Nats_Msg_Id="a"))
    await pub.settle()
    store.full = True
    pub("S", "S", b"lost", hdrs(Nats_Msg_Id="b"))
    pub("S", "S", b"lost", hdrs(Nats_Msg_Id="b"))  # a duplicate of a message being lost
    failed, failed_dup = await pub.settle()
    assert isinstance(failed_dup, ApiError)
    assert isinstance(failed, ApiError)
    assert (failed.code, failed.err_code) == (503, 10077)
    assert "disk is full" in failed.description
    stream = broker.get_stream("S")
    assert list(stream.seqs(0)) == [1]
    store.full = False
    pub("S", "S", b"retried", hdrs(Nats_Msg_Id="b"))  # not a duplicate of the lost one
    (ack,) = await pub.settle()
    assert ack == PubAck("S", 2)  # the failed message gave its sequence back
    stored = await store.read("S", ack.seq)
    assert stored is not None and stored.data == b"retried"
    kept = await store.read("S", 1)
    assert kept is not None and kept.data == b"kept"


async def test_a_failed_stream_create_does_not_linger(broker: Broker, store: FlakyStore) -> None:
    store.full = True
    with pytest.raises(ApiError) as excinfo:
        await broker.create_stream("S", body(name="S"))
    assert excinfo.value.err_code == 10077
    assert "S" not in broker.streams


async def test_restart_restores_dedup_sequences_and_expiry(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteStore(tmp_path)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    await broker.create_stream("S", body(name="S", subjects=["s.>"], max_age=60 * NS))
    await broker.create_stream("F", body(name="F", first_seq=10))
    pub = Publisher(broker)
    pub("S", "s.a", b"1", hdrs(Nats_Msg_Id="a"))
    clock.advance(30)
    pub("S", "s.b", b"2", hdrs(Nats_Msg_Id="b"))
    pub("S", "s.b", b"3")
    await pub.settle()
    await broker.delete_message("S", 3)  # the tail: last_seq must survive it
    broker.close()
    await store.close()

    clock.advance(40)  # the first message is now past max_age
    store = SqliteStore(tmp_path)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    try:
        stream = broker.get_stream("S")
        assert list(stream.seqs(0)) == [2]
        assert stream.last_seq == 3
        assert stream.duplicate_of("b", clock.now()) == 2
        assert broker.get_stream("F").first_seq == 10
        await store.flush()
        assert [m.seq for m in await store.read_range("S", 1, 10)] == [2]
        pub = Publisher(broker)
        pub("S", "s.c")
        pub("F", "F")
        assert await pub.settle() == [PubAck("S", 4), PubAck("F", 10)]
    finally:
        broker.close()
        await store.close()


async def test_numbering_moved_forward_by_a_purge_survives_a_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    for expected in (1, 20):
        store = SqliteStore(tmp_path)
        await store.open()
        broker = Broker(store, clock)
        await broker.load()
        try:
            if expected == 1:
                await broker.create_stream("S", body(name="S"))
            pub = Publisher(broker)
            pub("S", "S")
            assert await pub.settle() == [PubAck("S", expected)]
            await broker.purge_stream("S", "", 20 if expected == 1 else 0, 0)
        finally:
            broker.close()
            await store.close()


# -- a run of publishes (publish_many) is the same as publishing one by one ---------------


class RecordingSink:
    """A PubAckSink and broker listener writing down, in order, everything it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        for i, reply in enumerate(replies):
            if reply:
                self.events.append(("ack", stream, first_seq + (0 if duplicate else i), reply))

    def pub_failed(self, stream: str, replies: list[str], error: ApiError) -> None:
        for reply in replies:
            if reply:
                self.events.append(("failed", stream, reply, error.to_dict()))

    def on_stream_changed(self, stream: Stream) -> None:
        pass

    def on_stream_deleted(self, stream: Stream) -> None:
        pass

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        self.events.append(("committed", stream.name, tuple(seqs)))

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        self.events.append(("removed", stream.name, tuple(seqs)))


limit_configs = st.fixed_dictionaries(
    {},
    optional={
        "max_msgs": st.integers(1, 6),
        "max_bytes": st.integers(40, 400),
        "max_msgs_per_subject": st.integers(1, 3),
        "max_msg_size": st.integers(0, 40),
        "discard": st.sampled_from(["old", "new"]),
        "discard_new_per_subject": st.booleans(),
        "no_ack": st.booleans(),
    },
)
# A run: (subject, [(payload length, with a reply)]); a tick: runs, and whether its
# commit fails (a full disk); then whether the stream is sealed before the next tick.
runs = st.tuples(
    st.sampled_from(["s.a", "s.b"]),
    st.lists(st.tuples(st.integers(0, 50), st.booleans()), min_size=1, max_size=8),
)
ticks = st.lists(
    st.tuples(st.lists(runs, min_size=1, max_size=3), st.booleans(), st.booleans()),
    min_size=1,
    max_size=4,
)


async def _publish_ticks(
    config: dict[str, Any], plan: list[Any], mode: str
) -> tuple[list[tuple[Any, ...]], list[Any], dict[str, Any]]:
    """Publish the plan one message at a time (``one``), a run per subject (``runs``,
    :meth:`Broker.publish_many`) or a tick's runs as one (``mixed``, ``publish_mixed``)."""
    store = FlakyStore()
    await store.open()
    broker = Broker(store, FakeClock())
    await broker.load()
    sink = RecordingSink()
    broker.listeners.append(sink)
    if config.get("discard") != "new" or "max_msgs_per_subject" not in config:
        config = {k: v for k, v in config.items() if k != "discard_new_per_subject"}
    await broker.create_stream("S", body(name="S", subjects=["s.*"], **config))
    stream = broker.get_stream("S")
    n = 0
    for tick_runs, fails, seal_after in plan:
        store.full = fails
        sink_or_none = None if stream.config.no_ack else sink
        mixed: tuple[list[str], list[bytes], list[str]] = ([], [], [])
        for subject, msgs in tick_runs:
            payloads, replies = [], []
            for size, with_reply in msgs:
                n += 1
                payloads.append(b"%d" % n * size)
                replies.append(f"_INBOX.{n}" if with_reply else "")
            if mode == "mixed":
                mixed[0].extend([subject] * len(payloads))
                mixed[1].extend(payloads)
                mixed[2].extend(replies)
            elif mode == "runs":
                broker.publish_many(stream, subject, payloads, replies, sink_or_none)
            else:  # what the front door does for each message
                for payload, reply in zip(payloads, replies, strict=True):
                    if not reply or stream.config.no_ack:
                        broker.publish(stream, subject, None, payload, None)
                    else:
                        broker.publish_reply(stream, subject, None, payload, sink, reply)
        if mode == "mixed":
            broker.publish_mixed(stream, *mixed, sink_or_none)
        with contextlib.suppress(StorageError):
            await store.flush()
        store.full = False
        if seal_after and not stream.config.sealed:
            await broker.update_stream("S", body(name="S", subjects=["s.*"], sealed=True, **config))
    stored = [(m.seq, m.subject, m.data, m.ts) for m in await store.read_range("S", 1, 1000)]
    state = {
        "seqs": list(stream.seqs(0)),
        "metas": [stream.meta(seq) for seq in stream.seqs(0)],
        "info": stream.info_state(),
        "subjects": stream.subjects_state(">"),
    }
    broker.close()
    await store.close()
    return sink.events, stored, state


@settings(max_examples=200, deadline=None)
@given(limit_configs, ticks)
def test_publish_many_is_publish_one_by_one(config: dict[str, Any], plan: list[Any]) -> None:
    one_by_one = asyncio.run(_publish_ticks(config, plan, "one"))
    assert asyncio.run(_publish_ticks(config, plan, "runs")) == one_by_one
    assert asyncio.run(_publish_ticks(config, plan, "mixed")) == one_by_one


class CallCountingSink(RecordingSink):
    """Also writes down each ``pub_acked`` call as (first seq, number of replies)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        self.calls.append((first_seq, len(replies)))
        super().pub_acked(stream, first_seq, replies, duplicate)


async def test_runs_that_continue_each_other_are_acknowledged_together() -> None:
    """A publisher alternating between subjects makes runs of one message; the runs of
    one commit that follow each other for one sink get one PubAck call, in order."""
    store = MemoryStore()
    await store.open()
    broker = Broker(store, FakeClock())
    await broker.load()
    await broker.create_stream("S", body(name="S", subjects=["s.*"]))
    await broker.create_stream("T", body(name="T", subjects=["t.*"]))
    s, t = broker.get_stream("S"), broker.get_stream("T")
    a, b = CallCountingSink(), CallCountingSink()
    plan = [(s, "s.a", a), (s, "s.b", a), (s, "s.a", a), (t, "t.a", a), (s, "s.b", a)]
    plan += [(s, "s.b", b), (s, "s.a", a), (s, "s.b", a)]
    for i, (stream, subject, sink) in enumerate(plan):
        broker.publish_many(stream, subject, [b"x"], [f"r{i}"], sink)
    await store.flush()
    await asyncio.sleep(0)
    assert a.calls == [(1, 3), (1, 1), (4, 1), (6, 2)]
    assert b.calls == [(5, 1)]
    assert [e[2:] for e in a.events if e[0] == "ack"] == [
        (1, "r0"),
        (2, "r1"),
        (3, "r2"),
        (1, "r3"),
        (4, "r4"),
        (6, "r6"),
        (7, "r7"),
    ]
    broker.close()
    await store.close()
