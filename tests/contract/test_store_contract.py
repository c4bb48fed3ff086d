"""The storage contract: one suite, run against every backend.

Tests taking ``store``/``make_store`` run on memory, sqlite(sync=always) and
sqlite(sync=os); tests taking ``make_sqlite`` cover what only a durable backend can
promise (reopening, a second instance on the same directory, failing commits).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tether.storage import (
    FILE_SIZING,
    MEMORY_SIZING,
    ConsumerRecord,
    MessageColumns,
    MessageMeta,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
)
from tether.storage.sqlite import SqliteStore

MakeStore = Callable[..., Awaitable[Store]]
MakeSqlite = Callable[..., Awaitable[SqliteStore]]

TS = 1_700_000_000_123_456_789


def msg(seq: int, subject: str = "orders.new", data: bytes = b"", **kw: Any) -> StoredMessage:
    return StoredMessage(
        seq=seq,
        subject=subject,
        headers=kw.pop("headers", b""),
        data=data or f"payload-{seq}".encode(),
        ts=kw.pop("ts", TS + seq),
        **kw,
    )


def stream(name: str, config: bytes = b"{}") -> StreamRecord:
    return StreamRecord(name=name, config=config, created_ns=TS)


def consumer(stream: str, name: str, state: bytes = b"s0") -> ConsumerRecord:
    return ConsumerRecord(
        stream=stream, name=name, config=b"cfg-" + name.encode(), state=state, created_ns=TS
    )


async def fill(store: Store, name: str, seqs: range | list[int], **kw: Any) -> list[StoredMessage]:
    messages = [msg(seq, **kw) for seq in seqs]
    store.put_stream(stream(name))
    for m in messages:
        store.append(name, m)
    await store.flush()
    return messages


@asynccontextmanager
async def hold_writer(store: Store) -> AsyncIterator[None]:
    """Keep a sqlite store's writer thread busy, so batches queue up behind it.

    The memory backend has no writer: its batches commit at the end of the tick, so a
    test that must look at a write *before* its commit does not yield to the loop.
    """
    if not hasattr(store, "call_in_writer"):  # sqlite and postgres have a writer thread
        yield
        return
    started, release = threading.Event(), threading.Event()

    def block(_conn: object) -> None:
        started.set()
        release.wait(10)

    job = store.call_in_writer(block)  # type: ignore[attr-defined]
    assert started.wait(10), "the writer thread never picked up the job"
    try:
        yield
    finally:
        release.set()
        await job


# -- streams ---------------------------------------------------------------------------


async def test_streams_put_load_replace(store: Store) -> None:
    assert await store.load_streams() == []
    store.put_stream(stream("b"))
    store.put_stream(stream("a"))
    await store.put_stream(stream("c"))
    assert [s.name for s in await store.load_streams()] == ["a", "b", "c"]

    await store.put_stream(StreamRecord("b", b"new-config", TS + 1))
    assert (await store.load_streams())[1] == StreamRecord("b", b"new-config", TS + 1)


async def test_delete_stream_removes_messages_consumers_and_last_seq(store: Store) -> None:
    await fill(store, "a", range(1, 4))
    await fill(store, "b", range(1, 3))
    store.put_consumer(consumer("a", "c1"))
    await store.put_consumer(consumer("b", "c1"))

    await store.delete_stream("a")

    assert [s.name for s in await store.load_streams()] == ["b"]
    assert await store.load_index("a") == []
    assert await store.read("a", 1) is None
    assert await store.read_range("a", 1, 10) == []
    assert store.cached("a", 1) is None
    assert await store.load_consumers("a") == []
    assert await store.load_last_seq("a") == 0
    # the other stream is untouched
    assert len(await store.load_index("b")) == 2
    assert [c.name for c in await store.load_consumers("b")] == ["c1"]


# -- messages --------------------------------------------------------------------------


async def test_append_and_read_round_trip(store: Store) -> None:
    m = StoredMessage(7, "a.b.c", b"NATS/1.0\r\nX: 1\r\n\r\n", b"\x00\xffdata", TS, priority=3)
    await store.append("s", m)
    got = await store.read("s", 7)
    assert got is not None and got == m
    assert isinstance(got.headers, bytes) and isinstance(got.data, bytes)
    assert await store.read("s", 6) is None
    assert await store.read("other", 7) is None


async def test_empty_headers_and_data_round_trip(store: Store) -> None:
    m = StoredMessage(1, "s", b"", b"", TS)
    await store.append("s", m)
    assert await store.read("s", 1) == m
    assert await store.read_range("s", 1, 1) == [m]


async def test_read_range_limit_and_start(store: Store) -> None:
    messages = await fill(store, "s", range(1, 11))
    await store.delete_messages("s", [4, 5])
    assert await store.read_range("s", 1, 3) == messages[0:3]
    assert await store.read_range("s", 4, 2) == [messages[5], messages[6]]  # skips the gap
    assert await store.read_range("s", 9, 100) == messages[8:]
    assert await store.read_range("s", 11, 5) == []
    assert await store.read_range("s", 1, 0) == []
    assert await store.read_range("missing", 1, 5) == []


async def test_read_range_max_bytes(store: Store) -> None:
    messages = await fill(store, "s", range(1, 6), data=b"x" * 100)
    size = messages[0].size
    assert size == len("orders.new") + 100 + 16
    # exactly two fit
    assert await store.read_range("s", 1, 10, max_bytes=2 * size) == messages[:2]
    # the third would take the total over
    assert await store.read_range("s", 1, 10, max_bytes=3 * size - 1) == messages[:2]
    # at least one, even when it alone is over
    assert await store.read_range("s", 2, 10, max_bytes=1) == [messages[1]]
    # limit still applies under max_bytes
    assert await store.read_range("s", 1, 2, max_bytes=10 * size) == messages[:2]
    # 0 means no byte limit
    assert await store.read_range("s", 1, 10, max_bytes=0) == messages


@pytest.mark.parametrize("own", [True, False], ids=["backend", "base-default"])
async def test_read_columns(store: Store, own: bool) -> None:
    """Columns of the messages in ``[start, last]``, gaps skipped, at most ``limit``;
    the backend's own version and the base class's default give the same columns."""
    messages = await fill(store, "s", range(1, 11))
    await store.delete_messages("s", [4, 5, 9])
    read = store.read_columns if own else functools.partial(Store.read_columns, store)

    def rows(*seqs: int) -> MessageColumns:
        return MessageColumns.of([m for m in messages if m.seq in seqs])

    assert await read("s", 1, 10, 100) == rows(1, 2, 3, 6, 7, 8, 10)
    assert await read("s", 2, 7, 100) == rows(2, 3, 6, 7)
    assert await read("s", 3, 10, 3) == rows(3, 6, 7)  # the limit counts live rows
    assert await read("s", 3, 10, 4) == rows(3, 6, 7, 8)
    assert await read("s", 4, 10, 2) == rows(6, 7)  # a dead head, then the limit
    for empty in [("s", 4, 5, 10), ("s", 9, 9, 10), ("s", 11, 20, 10), ("s", 1, 10, 0)]:
        assert await read(*empty) == rows()
    assert await read("s", 5, 1, 10) == rows()
    assert await read("missing", 1, 10, 10) == rows()


async def test_read_many(store: Store) -> None:
    messages = await fill(store, "s", range(1, 8))
    got = await store.read_many("s", [6, 2, 99, 4, 2])
    assert got == [messages[1], messages[3], messages[5]]
    assert await store.read_many("s", []) == []
    assert await store.read_many("missing", [1, 2]) == []


async def test_delete_messages(store: Store) -> None:
    messages = await fill(store, "s", range(1, 6))
    await store.delete_messages("s", [2, 4, 42])
    assert await store.read("s", 2) is None
    assert store.cached("s", 2) is None
    assert await store.read_range("s", 1, 10) == [messages[0], messages[2], messages[4]]
    assert [m.seq for m in await store.load_index("s")] == [1, 3, 5]


async def test_delete_messages_copies_the_sequence(store: Store) -> None:
    await fill(store, "s", range(1, 4))
    seqs = [1]
    fut = store.delete_messages("s", seqs)
    seqs.append(2)  # the caller reuses its list before the commit
    await fut
    assert [m.seq for m in await store.load_index("s")] == [2, 3]


async def test_delete_range(store: Store) -> None:
    messages = await fill(store, "s", range(1, 11))
    await store.delete_range("s", 3, 6)
    assert [m.seq for m in await store.load_index("s")] == [1, 2, 7, 8, 9, 10]
    assert await store.read_range("s", 3, 2) == messages[6:8]
    assert store.cached("s", 4) is None
    await store.delete_range("s", 0, 1_000_000)  # purge-sized
    assert await store.load_index("s") == []


async def test_load_index_order_and_fields(store: Store) -> None:
    store.append("s", msg(1, "a", headers=b"NATS/1.0\r\n\r\n", data=b"12345"))
    store.append("s", msg(2, "bb.\u00e9", data=b"x" * 2000, priority=9))
    store.append("s", msg(3, "c"))
    await store.append("other", msg(1, "zzz"))
    index = await store.load_index("s")
    assert index == [
        MessageMeta(1, "a", len("a") + 12 + 5 + 16, TS + 1, 0),
        MessageMeta(2, "bb.\u00e9", len("bb.\u00e9".encode()) + 2000 + 16, TS + 2, 9),
        MessageMeta(3, "c", (await store.read("s", 3)).size, TS + 3, 0),  # type: ignore[union-attr]
    ]
    assert await store.load_index("missing") == []


async def test_load_index_sizes_messages_as_asked(store: Store) -> None:
    # A file stream counts subject + payload + 30, subject + headers + payload + 34
    # with headers; ``overhead`` keeps what the size adds to the message's bytes.
    store.append("s", msg(1, "b.a", headers=b"NATS/1.0\r\nK: v\r\n\r\n", data=b"hello"))
    await store.append("s", msg(2, "b.a", data=b"hello"))
    index = await store.load_index("s", FILE_SIZING)
    assert index == [
        MessageMeta(1, "b.a", 60, TS + 1, 0, 34),
        MessageMeta(2, "b.a", 38, TS + 2, 0, 30),
    ]
    memory = await store.load_index("s", MEMORY_SIZING)
    assert [(m.size, m.overhead) for m in memory] == [(42, 16), (24, 16)]


async def test_last_seq_survives_deleting_the_tail(store: Store) -> None:
    assert await store.load_last_seq("s") == 0
    await fill(store, "s", range(1, 6))
    assert await store.load_last_seq("s") == 5
    await store.delete_range("s", 3, 5)
    await store.delete_messages("s", [1, 2])
    assert await store.load_index("s") == []
    assert await store.load_last_seq("s") == 5
    await store.append("s", msg(6))
    assert await store.load_last_seq("s") == 6


async def test_large_batch(store: Store) -> None:
    fut = None
    for seq in range(1, 5001):
        fut = store.append("s", msg(seq))
    assert fut is not None
    await fut
    index = await store.load_index("s")
    assert [m.seq for m in index] == list(range(1, 5001))
    assert await store.load_last_seq("s") == 5000
    assert (await store.read_range("s", 4999, 10))[-1] == msg(5000)


# -- consumers -------------------------------------------------------------------------


async def test_consumers(store: Store) -> None:
    assert await store.load_consumers("s") == []
    store.put_consumer(consumer("s", "zeta"))
    store.put_consumer(consumer("s", "alpha"))
    await store.put_consumer(consumer("t", "other"))
    assert [c.name for c in await store.load_consumers("s")] == ["alpha", "zeta"]

    await store.put_consumer_state("s", "zeta", b"s1")
    got = {c.name: c for c in await store.load_consumers("s")}
    assert got["zeta"] == consumer("s", "zeta", state=b"s1")
    assert got["alpha"] == consumer("s", "alpha")

    await store.put_consumer(ConsumerRecord("s", "alpha", b"cfg2", b"s9", TS + 5))
    assert (await store.load_consumers("s"))[0] == ConsumerRecord(
        "s", "alpha", b"cfg2", b"s9", TS + 5
    )

    await store.delete_consumer("s", "zeta")
    assert [c.name for c in await store.load_consumers("s")] == ["alpha"]
    assert [c.name for c in await store.load_consumers("t")] == ["other"]


async def test_consumer_state_for_a_missing_consumer_is_ignored(store: Store) -> None:
    await store.put_consumer_state("s", "ghost", b"x")
    assert await store.load_consumers("s") == []


async def test_put_consumer_replaces_an_earlier_state_of_the_tick(store: Store) -> None:
    store.put_consumer(consumer("s", "c"))
    store.put_consumer_state("s", "c", b"stale")
    await store.put_consumer(consumer("s", "c", state=b"replaced"))
    assert await store.load_consumers("s") == [consumer("s", "c", state=b"replaced")]


async def test_consumer_state_updates_in_one_tick_keep_the_last(store: Store) -> None:
    store.put_consumer(consumer("s", "c"))
    for i in range(10):
        store.put_consumer_state("s", "c", f"s{i}".encode())
    store.delete_consumer("s", "c")
    store.put_consumer(consumer("s", "c", state=b"fresh"))
    fut = store.put_consumer_state("s", "c", b"final")
    await fut
    assert await store.load_consumers("s") == [consumer("s", "c", state=b"final")]


# -- group commit ----------------------------------------------------------------------


async def test_writes_of_one_tick_share_one_future(store: Store) -> None:
    f1 = store.put_stream(stream("s"))
    f2 = store.append("s", msg(1))
    f3 = store.put_consumer(consumer("s", "c"))
    f4 = store.flush()
    assert f1 is f2 is f3 is f4
    await f1
    f5 = store.append("s", msg(2))
    assert f5 is not f1
    await f5


async def test_flush(store: Store) -> None:
    done = store.flush()
    assert done.done()
    await done
    async with hold_writer(store):
        pending = store.append("s", msg(1))
        await asyncio.sleep(0)  # the batch is handed off
        flushed = store.flush()  # a later tick: waits behind the in-flight batch
        if hasattr(store, "call_in_writer"):  # memory commits at hand-off: nothing in flight
            assert not flushed.done()
    await flushed
    assert pending.done()
    assert await store.read("s", 1) == msg(1)


async def test_writes_are_applied_in_order(store: Store) -> None:
    store.put_stream(stream("s", b"v1"))
    for seq in range(1, 6):
        store.append("s", msg(seq))
    store.delete_messages("s", [2])
    store.delete_range("s", 4, 5)
    store.append("s", msg(6))
    store.delete_stream("s")
    store.put_stream(stream("s", b"v2"))
    store.append("s", msg(7))
    store.append("s", msg(8))
    store.delete_messages("s", [7])
    await store.flush()
    assert await store.load_streams() == [stream("s", b"v2")]
    assert [m.seq for m in await store.load_index("s")] == [8]
    assert await store.load_last_seq("s") == 8
    assert store.cached("s", 6) is None and store.cached("s", 7) is None


async def test_deleting_a_stream_in_the_tick_of_its_appends_resets_last_seq(store: Store) -> None:
    store.put_stream(stream("s"))
    for seq in range(1, 4):
        store.append("s", msg(seq))
    store.delete_stream("s")
    await store.put_stream(stream("s"))
    assert await store.load_last_seq("s") == 0
    assert await store.load_index("s") == []


async def test_batches_of_later_ticks_follow_earlier_ones(store: Store) -> None:
    async with hold_writer(store):
        first = store.append("s", msg(1))
        await asyncio.sleep(0)
        store.delete_messages("s", [1])
        second = store.append("s", msg(2))
        assert second is not first
    await second  # only the later one is awaited: the earlier must be in too
    assert first.done()
    assert [m.seq for m in await store.load_index("s")] == [2]


async def test_reads_only_see_committed_data(store: Store) -> None:
    async with hold_writer(store):
        fut = store.append("s", msg(1))
        # Neither the cache nor the database may return a write before its commit.
        assert store.cached("s", 1) is None
        assert await store.read("s", 1) is None
        assert await store.read_range("s", 1, 10) == []
        assert await store.read_many("s", [1]) == []
        assert await store.load_index("s") == []
        assert not fut.done()
    await fut
    assert store.cached("s", 1) == msg(1)
    assert await store.read("s", 1) == msg(1)
    assert await store.read_many("s", [1]) == [msg(1)]


async def test_the_shared_future_cannot_be_cancelled(store: Store) -> None:
    async with hold_writer(store):
        fut = store.append("s", msg(1))
        assert fut.cancel() is False  # it belongs to every writer of the tick
        assert not fut.cancelled()
    await fut
    assert await store.read("s", 1) == msg(1)


async def test_close_commits_pending_writes_and_is_idempotent(make_store: MakeStore) -> None:
    store = await make_store()
    fut = store.append("s", msg(1))
    await store.close()
    assert fut.done() and fut.exception() is None
    await store.close()
    with pytest.raises(StorageError):
        store.append("s", msg(2))
    with pytest.raises(StorageError):
        await store.read_range("s", 1, 1)


async def test_cached_hits_after_commit(store: Store) -> None:
    await fill(store, "s", range(1, 4))
    assert store.cached("s", 2) == msg(2)
    assert store.cached("s", 9) is None


# -- sqlite: durability ---------------------------------------------------------------


async def test_a_fresh_instance_sees_an_awaited_commit(make_sqlite: MakeSqlite) -> None:
    writer = await make_sqlite()
    writer.put_stream(stream("s"))
    writer.put_consumer(consumer("s", "c"))
    for seq in range(1, 4):
        writer.append("s", msg(seq))
    await writer.flush()

    reader = await make_sqlite()  # same directory, while the first is still open
    assert await reader.load_streams() == [stream("s")]
    assert await reader.read_range("s", 1, 10) == [msg(1), msg(2), msg(3)]
    assert await reader.load_consumers("s") == [consumer("s", "c")]
    assert await reader.load_last_seq("s") == 3
    assert reader.cached("s", 1) is None  # its cache only holds its own commits


async def test_reopen_keeps_everything(make_sqlite: MakeSqlite, store_dir: Path) -> None:
    store = await make_sqlite()
    await fill(store, "s", range(1, 6))
    store.put_consumer(consumer("s", "c", state=b"st"))
    await store.delete_range("s", 4, 5)
    await store.close()
    assert (store_dir / "tether.db").is_file()

    again = await make_sqlite()
    assert await again.load_streams() == [stream("s")]
    assert [m.seq for m in await again.load_index("s")] == [1, 2, 3]
    assert await again.read("s", 2) == msg(2)
    assert await again.load_consumers("s") == [consumer("s", "c", state=b"st")]
    assert await again.load_last_seq("s") == 5  # the deleted tail still counts


async def test_sqlite_is_set_up_as_documented(make_sqlite: MakeSqlite, sync: str) -> None:
    store = await make_sqlite()

    def pragmas(conn: Any) -> tuple[str, int, int]:
        return (
            conn.execute("PRAGMA journal_mode").fetchone()[0],
            conn.execute("PRAGMA synchronous").fetchone()[0],
            conn.execute("PRAGMA busy_timeout").fetchone()[0],
        )

    journal, synchronous, busy = await store.call_in_writer(pragmas)
    assert journal == "wal"
    assert synchronous == (2 if sync == "always" else 1)  # FULL / NORMAL
    assert busy > 0


async def test_cache_is_bounded_by_bytes(make_sqlite: MakeSqlite) -> None:
    store = await make_sqlite(cache_bytes=5 * msg(1, data=b"x" * 100).size)
    messages = await fill(store, "s", range(1, 11), data=b"x" * 100)
    assert [seq for seq in range(1, 11) if store.cached("s", seq)] == [6, 7, 8, 9, 10]
    # evicted messages are still read from the database
    assert await store.read("s", 1) == messages[0]
    assert await store.read_many("s", [1, 10]) == [messages[0], messages[9]]


async def test_cache_can_be_disabled(make_sqlite: MakeSqlite) -> None:
    store = await make_sqlite(cache_bytes=0)
    await fill(store, "s", range(1, 3))
    assert store.cached("s", 1) is None
    assert await store.read("s", 1) == msg(1)


async def test_cancelling_one_waiter_leaves_the_others_alone(make_sqlite: MakeSqlite) -> None:
    store = await make_sqlite()
    async with hold_writer(store):
        fut = store.append("s", msg(1))

        async def wait() -> str:
            await fut
            return "committed"

        cancelled, other = asyncio.create_task(wait()), asyncio.create_task(wait())
        await asyncio.sleep(0)  # both are now waiting on the shared future
        cancelled.cancel()
    assert await other == "committed"
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert not fut.cancelled()
    assert await store.read("s", 1) == msg(1)


# -- sqlite: failures -----------------------------------------------------------------


async def _limit_file_growth(store: SqliteStore, pages: int | None) -> None:
    """Cap the database at its current size (or lift the cap): a real SQLITE_FULL."""

    def cap(conn: Any) -> None:
        limit = pages if pages is not None else conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {limit}").fetchone()

    await store.call_in_writer(cap)


async def test_a_failed_commit_stores_nothing_and_the_store_goes_on(
    make_sqlite: MakeSqlite,
) -> None:
    store = await make_sqlite()
    await fill(store, "s", [1])
    await _limit_file_growth(store, None)

    fut = store.append("s", msg(2))
    store.put_consumer(consumer("s", "c"))
    assert store.append("s", msg(3, data=b"x" * 200_000)) is fut  # needs new pages
    with pytest.raises(StorageError, match="database or disk is full") as info:
        await fut
    assert str(store.path) in str(info.value)

    # nothing of the failed batch is visible, anywhere
    assert await store.read("s", 2) is None
    assert store.cached("s", 2) is None
    assert [m.seq for m in await store.load_index("s")] == [1]
    assert await store.load_consumers("s") == []
    assert await store.load_last_seq("s") == 1

    # the writer survived: later batches commit once there is room again
    await _limit_file_growth(store, 1_000_000)
    await store.append("s", msg(2))
    assert await store.read("s", 2) == msg(2)
    assert await store.load_last_seq("s") == 2
    await store.close()

    again = await make_sqlite()
    assert [m.seq for m in await again.load_index("s")] == [1, 2]


async def test_merged_batches_commit_as_one_and_fail_alone(
    make_sqlite: MakeSqlite, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_sqlite()
    commits: list[int] = []
    real_commit = store._writer.commit

    def counting_commit(batches: Any) -> None:
        commits.append(len(batches))
        real_commit(batches)

    monkeypatch.setattr(store._writer, "commit", counting_commit)

    async with hold_writer(store):
        good1 = store.append("s", msg(1))
        await asyncio.sleep(0)
        good2 = store.append("s", msg(2))
        await asyncio.sleep(0)
        good3 = store.append("s", msg(3))
        await asyncio.sleep(0)
    await asyncio.gather(good1, good2, good3)
    assert commits == [3]  # three ticks queued behind a busy writer: one transaction

    commits.clear()
    unbindable = StoredMessage(5, "s", b"", [1, 2], TS)  # type: ignore[arg-type]
    async with hold_writer(store):
        before = store.append("s", msg(4))
        await asyncio.sleep(0)
        bad = store.append("s", unbindable)
        await asyncio.sleep(0)
        after = store.append("s", msg(6))
        await asyncio.sleep(0)
    await before
    with pytest.raises(StorageError):
        await bad
    await after
    assert commits == [3, 1, 1, 1]  # the merged try, then each batch alone
    assert [m.seq for m in await store.load_index("s")] == [1, 2, 3, 4, 6]


async def test_open_fails_clearly_when_the_directory_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    target = blocker / "sub"
    store = SqliteStore(target)
    with pytest.raises(StorageError) as info:
        await store.open()
    assert str(target) in str(info.value)
    await store.close()  # still safe


async def test_open_fails_clearly_on_a_corrupt_database(tmp_path: Path) -> None:
    (tmp_path / "tether.db").write_bytes(b"this is not a sqlite database" * 100)
    store = SqliteStore(tmp_path)
    with pytest.raises(StorageError) as info:
        await store.open()
    assert "tether.db" in str(info.value)
    await store.close()
