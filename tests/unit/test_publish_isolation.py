"""One bad publish never fails its neighbours, and a failed commit leaves no hole.

* Header values are checked before a publish joins a commit: a value the store could
  not hold (a priority beyond 64 bits) or that is not a number (``²``) is refused to
  that publisher alone, with a JetStream API error.
* A write the store refuses anyway (here: a subject holding a lone surrogate, which
  the broker does not check; the NATS front door refuses such subjects before) is
  refused alone: the writer finds it, the broker takes back every later message of
  its stream and stores them again at the next sequences.
* Commits that fail whole (a full disk) give every sequence back, whatever order the
  failures arrive in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from headers_support import hdrs

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.storage.base import StorageError, StoredMessage
from tether.storage.group_commit import APPEND, Batch, Op, Settled, ThreadCommitter
from tether.storage.sqlite import SqliteStore

BAD_SUBJECT = "s.\udcff"  # the byte 0xFF as the NATS parser decodes it; SQLite refuses it


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


class Sink:
    """A PubAckSink: what each reply subject was told."""

    def __init__(self) -> None:
        self.told: dict[str, PubAck | ApiError] = {}

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        for i, reply in enumerate(replies):
            if reply:
                self.told[reply] = PubAck(stream, first_seq + i, duplicate)

    def pub_failed(self, stream: str, replies: list[str], error: ApiError) -> None:
        for reply in replies:
            if reply:
                self.told[reply] = error


@contextlib.contextmanager
def held(store: SqliteStore) -> Iterator[None]:
    """Keep the writer busy, so that the batches of several ticks queue up behind it."""
    started, release = threading.Event(), threading.Event()

    def block(_conn: object) -> None:
        started.set()
        release.wait(10)

    store.call_in_writer(block)
    assert started.wait(10)
    try:
        yield
    finally:
        release.set()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "store")
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def broker(store: SqliteStore) -> AsyncIterator[Broker]:
    broker = Broker(store, FakeClock())
    await broker.load()
    await broker.create_stream("S", body(name="S", subjects=["s.>"]))
    await broker.create_stream("T", body(name="T", subjects=["t.>"]))
    yield broker
    broker.close()


async def settle(broker: Broker) -> None:
    for _ in range(3):  # a refused write is taken back, then the rest is committed
        with contextlib.suppress(StorageError):
            await broker.store.flush()
        await asyncio.sleep(0)


async def stored(store: SqliteStore, stream: str) -> list[tuple[int, bytes]]:
    index = await store.load_index(stream)
    msgs = await store.read_many(stream, [m.seq for m in index])
    return [(m.seq, m.data) for m in msgs]


# -- hostile header values ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "value", "code", "err_code", "words"),
    [
        ("Tether-Priority", "99999999999999999999", 400, 10003, "Tether-Priority"),
        ("Tether-Priority", "-9223372036854775809", 400, 10003, "Tether-Priority"),
        ("Tether-Priority", "²", 400, 10003, "Tether-Priority"),
        ("Tether-Priority", "1_0", 400, 10003, "Tether-Priority"),
        ("Nats-TTL", "²", 400, 10165, "invalid per-message TTL"),
        ("Nats-TTL", "٣s", 400, 10165, "invalid per-message TTL"),
        ("Nats-TTL", "99999999999999999999", 400, 10165, "invalid per-message TTL"),
        ("Nats-Expected-Last-Sequence", "²", 400, 10071, "wrong last sequence"),
        ("Nats-Expected-Last-Sequence", "+2", 400, 10071, "wrong last sequence"),
        ("Nats-Expected-Last-Sequence", "99999999999999999999", 400, 10071, "wrong last"),
        ("Nats-Expected-Last-Subject-Sequence", "²", 400, 10071, "wrong last sequence"),
    ],
)
async def test_a_hostile_header_is_refused_alone_and_leaves_no_hole(
    broker: Broker, header: str, value: str, code: int, err_code: int, words: str
) -> None:
    stream = broker.get_stream("S")
    sink = Sink()
    block = f"NATS/1.0\r\n{header}: {value}\r\n\r\n".encode()
    # One tick: good publishes around the bad one, from other "clients" too.
    broker.publish_reply(stream, "s.a", None, b"1", sink, "good-1")
    broker.publish_many(stream, "s.b", [b"2", b"3"], ["good-2", "good-3"], sink)
    broker.publish_reply(stream, "s.c", block, b"bad", sink, "bad")
    broker.publish_reply(stream, "s.d", hdrs(Tether_Priority="-7"), b"4", sink, "good-4")
    broker.publish_many(broker.get_stream("T"), "t.x", [b"t1"], ["good-t"], sink)
    await settle(broker)

    refused = sink.told.pop("bad")
    assert isinstance(refused, ApiError)
    assert (refused.code, refused.err_code) == (code, err_code)
    assert words in refused.description
    assert sink.told == {
        "good-1": PubAck("S", 1),
        "good-2": PubAck("S", 2),
        "good-3": PubAck("S", 3),
        "good-4": PubAck("S", 4),
        "good-t": PubAck("T", 1),
    }
    broker.publish_reply(stream, "s.e", None, b"5", sink, "next")
    await settle(broker)
    assert sink.told["next"] == PubAck("S", 5)  # the next sequence: no hole
    assert [seq for seq, _ in await stored(broker.store, "S")] == [1, 2, 3, 4, 5]


async def test_extreme_priorities_that_fit_are_stored(broker: Broker, store: SqliteStore) -> None:
    stream = broker.get_stream("S")
    sink = Sink()
    for i, value in enumerate(("9223372036854775807", "-9223372036854775808", "0")):
        broker.publish_reply(stream, "s.p", hdrs(Tether_Priority=value), b"p", sink, f"r{i}")
    await settle(broker)
    assert sink.told == {"r0": PubAck("S", 1), "r1": PubAck("S", 2), "r2": PubAck("S", 3)}
    assert [m.priority for m in await store.load_index("S")] == [2**63 - 1, -(2**63), 0]


async def test_a_msg_id_that_is_not_utf8_is_refused(broker: Broker) -> None:
    stream = broker.get_stream("S")
    sink = Sink()
    broker.publish_reply(
        stream, "s.a", b"NATS/1.0\r\nNats-Msg-Id: \xff\xfe\r\n\r\n", b"x", sink, "bad"
    )
    broker.publish_reply(stream, "s.a", hdrs(Nats_Msg_Id="fine"), b"y", sink, "good")
    await settle(broker)
    refused = sink.told["bad"]
    assert isinstance(refused, ApiError) and refused.err_code == 10003
    assert "Nats-Msg-Id" in refused.description
    assert sink.told["good"] == PubAck("S", 1)


async def test_a_ttl_of_zero_is_no_ttl(broker: Broker) -> None:
    sink = Sink()
    broker.publish_reply(broker.get_stream("S"), "s.a", hdrs(Nats_TTL="00"), b"x", sink, "r")
    await settle(broker)
    assert sink.told["r"] == PubAck("S", 1)


# -- a write the store refuses: only it fails --------------------------------------------


async def test_a_write_the_store_refuses_fails_alone_and_the_others_move_up(
    broker: Broker, store: SqliteStore, tmp_path: Path
) -> None:
    s, t = broker.get_stream("S"), broker.get_stream("T")
    sink = Sink()
    done: list[PubAck | ApiError] = []
    broker.publish_many(s, "s.a", [b"1", b"2"], ["r1", "r2"], sink)
    broker.publish_reply(s, BAD_SUBJECT, None, b"bad", sink, "bad")  # seq 3: refused
    broker.publish_many(s, "s.a", [b"4", b"5"], ["r4", ""], sink)  # "": nobody asked
    broker.publish(s, "s.b", hdrs(Nats_Msg_Id="m6"), b"6", done.append)
    broker.publish_many(t, "t.a", [b"t1"], ["rt"], sink)
    await settle(broker)

    refused = sink.told.pop("bad")
    assert isinstance(refused, ApiError)
    assert (refused.code, refused.err_code) == (503, 10077)
    assert "surrogates not allowed" in refused.description
    # The ones after it on its stream were stored again, one sequence earlier.
    assert sink.told == {
        "r1": PubAck("S", 1),
        "r2": PubAck("S", 2),
        "r4": PubAck("S", 3),
        "rt": PubAck("T", 1),
    }
    assert done == [PubAck("S", 5)]
    assert await stored(store, "S") == [(1, b"1"), (2, b"2"), (3, b"4"), (4, b"5"), (5, b"6")]
    assert s.last_seq == 5 and len(s) == 5
    # The msg id went with its message to its new sequence.
    broker.publish(s, "s.b", hdrs(Nats_Msg_Id="m6"), b"again", done.append)
    broker.publish_reply(s, "s.c", None, b"7", sink, "r7")
    await settle(broker)
    assert done[1:] == [PubAck("S", 5, duplicate=True)]
    assert sink.told["r7"] == PubAck("S", 6)

    # What a restart sees is what was acknowledged.
    await store.close()
    again = SqliteStore(tmp_path / "store")
    await again.open()
    try:
        assert await stored(again, "S") == [
            (1, b"1"),
            (2, b"2"),
            (3, b"4"),
            (4, b"5"),
            (5, b"6"),
            (6, b"7"),
        ]
        assert await again.load_last_seq("S") == 6
    finally:
        await again.close()


async def test_later_commits_in_flight_are_taken_back_too(
    broker: Broker, store: SqliteStore
) -> None:
    s, t = broker.get_stream("S"), broker.get_stream("T")
    sink = Sink()
    with held(store):
        broker.publish_many(s, "s.a", [b"1"], ["r1"], sink)
        broker.publish_reply(s, BAD_SUBJECT, None, b"bad", sink, "bad")
        await asyncio.sleep(0)  # the next tick: another batch, queued behind
        broker.publish_many(s, "s.a", [b"3", b"4"], ["r3", "r4"], sink)
        broker.publish_many(t, "t.a", [b"t1"], ["rt"], sink)
        await asyncio.sleep(0)
        broker.publish_many(s, "s.a", [b"5"], ["r5"], sink)
    await settle(broker)
    assert isinstance(sink.told.pop("bad"), ApiError)
    assert sink.told == {
        "r1": PubAck("S", 1),
        "r3": PubAck("S", 2),
        "r4": PubAck("S", 3),
        "r5": PubAck("S", 4),
        "rt": PubAck("T", 1),
    }
    assert await stored(store, "S") == [(1, b"1"), (2, b"3"), (3, b"4"), (4, b"5")]


async def test_commits_that_fail_whole_give_every_sequence_back(
    broker: Broker, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = broker.get_stream("S")
    sink = Sink()
    broker.publish_many(s, "s.a", [b"1"], ["r1"], sink)
    await settle(broker)
    real_commit = store._writer.commit
    full = True

    def commit(batches: Sequence[list[Op]]) -> None:
        if full and any(op[0] == APPEND for ops in batches for op in ops):
            raise StorageError("database or disk is full")
        real_commit(batches)

    monkeypatch.setattr(store._writer, "commit", commit)
    with held(store):  # two ticks in flight at once, both failing
        broker.publish_many(s, "s.a", [b"2", b"3"], ["r2", "r3"], sink)
        await asyncio.sleep(0)
        broker.publish_many(s, "s.a", [b"4"], ["r4"], sink)
    await settle(broker)
    for reply in ("r2", "r3", "r4"):
        failed = sink.told[reply]
        assert isinstance(failed, ApiError) and failed.err_code == 10077
    assert s.last_seq == 1
    full = False
    broker.publish_many(s, "s.a", [b"again"], ["r5"], sink)
    await settle(broker)
    assert sink.told["r5"] == PubAck("S", 2)  # not 4 or 5: no hole
    assert await stored(store, "S") == [(1, b"1"), (2, b"again")]


async def test_a_commit_that_fails_whole_leaves_no_hole_below_later_ones(
    broker: Broker, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big message does not fit (the disk is nearly full) but the next, smaller one
    would: it must not be stored above the gap the first one leaves."""
    s = broker.get_stream("S")
    sink = Sink()
    real_commit = store._writer.commit

    def commit(batches: Sequence[list[Op]]) -> None:
        if any(op[0] == APPEND and op[2].data == b"big" for ops in batches for op in ops):
            raise StorageError("database or disk is full")
        real_commit(batches)

    monkeypatch.setattr(store._writer, "commit", commit)
    with held(store):
        broker.publish_many(s, "s.a", [b"1"], ["r1"], sink)
        await asyncio.sleep(0)
        broker.publish_many(s, "s.a", [b"big"], ["big"], sink)
        await asyncio.sleep(0)
        broker.publish_many(s, "s.a", [b"small"], ["small"], sink)
    await settle(broker)
    failed = sink.told.pop("big")
    assert isinstance(failed, ApiError) and (failed.code, failed.err_code) == (503, 10077)
    assert "disk is full" in failed.description
    assert sink.told == {"r1": PubAck("S", 1), "small": PubAck("S", 2)}
    assert await stored(store, "S") == [(1, b"1"), (2, b"small")]
    broker.publish_many(s, "s.a", [b"next"], ["next"], sink)
    await settle(broker)
    assert sink.told["next"] == PubAck("S", 3)


# -- the writer: culprits are refused, the rest of their batch is committed ---------------


class FakeCommitter:
    """Commits into a list; a transaction holding a ``poison`` op fails."""

    def __init__(self) -> None:
        self.committed: list[Op] = []
        self.transactions = 0

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def commit(self, batches: Sequence[list[Op]]) -> None:
        self.transactions += 1
        ops = [op for batch in batches for op in batch]
        if any(_poisoned(op) for op in ops):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        self.committed.extend(ops)

    def find_culprits(self, ops: list[Op], error: BaseException) -> list[tuple[int, str]]:
        return [(i, str(error)) for i, op in enumerate(ops) if _poisoned(op)]


def _poisoned(op: Op) -> bool:
    return op[0] == APPEND and op[2].data == b"poison"


def _msg(seq: int, data: bytes = b"x") -> StoredMessage:
    return StoredMessage(seq, "s", b"", data, 1)


async def test_the_writer_commits_a_batch_without_its_culprit() -> None:
    committer = FakeCommitter()
    settled: list[Settled] = []
    refusals: list[list[tuple[Op, str]]] = []

    def on_refused(batch: Batch, refused: list[tuple[Op, str]]) -> bool:
        refusals.append(refused)
        gone = {id(op) for op, _ in refused}
        batch.ops[:] = [op for op in batch.ops if id(op) not in gone]
        return True

    writer = ThreadCommitter(
        committer, name="test-writer", on_settled=settled.extend, on_refused=on_refused
    )
    await writer.start()
    loop = asyncio.get_running_loop()
    batches = [Batch(loop.create_future()) for _ in range(3)]
    batches[0].ops += [(APPEND, "s", _msg(1)), (APPEND, "s", _msg(2))]
    batches[1].ops += [(APPEND, "s", _msg(3)), (APPEND, "s", _msg(4, b"poison"))]
    batches[1].ops += [(APPEND, "t", _msg(1))]
    batches[2].ops += [(APPEND, "s", _msg(5))]
    for batch in batches:
        writer.submit(batch)
    await writer.stop()
    assert [error for _, error in settled] == [None, None, None]
    assert [len(r) for r in refusals] == [1]
    assert refusals[0][0][1] == "Python int too large to convert to SQLite INTEGER"
    kept = [(op[1], op[2].seq) for op in committer.committed if op[0] == APPEND]
    assert kept == [("s", 1), ("s", 2), ("s", 3), ("t", 1), ("s", 5)]


async def test_without_anyone_to_take_it_back_the_batch_fails_alone() -> None:
    committer = FakeCommitter()
    settled: list[Settled] = []
    writer = ThreadCommitter(committer, name="test-writer", on_settled=settled.extend)
    await writer.start()
    loop = asyncio.get_running_loop()
    good, bad = Batch(loop.create_future()), Batch(loop.create_future())
    good.ops.append((APPEND, "s", _msg(1)))
    bad.ops.append((APPEND, "s", _msg(2, b"poison")))
    writer.submit(bad)
    writer.submit(good)
    await writer.stop()
    outcome = {id(batch): error for batch, error in settled}
    assert outcome[id(good)] is None
    assert isinstance(outcome[id(bad)], StorageError)
