"""The SQLite writer's multi-row appends: every count of rows, streams mixed, and ops
that need the appends in place (a delete) in between, all land as one by one would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.storage.base import StoredMessage
from tether.storage.sqlite import APPEND_ROWS_MAX, SqliteStore, sql_append_rows


def test_the_statement_has_one_group_of_parameters_per_row() -> None:
    assert sql_append_rows(1).count("?") == 8  # the seven fields and the checksum
    assert sql_append_rows(3).count("(?,") == 3


@pytest.mark.parametrize("count", [1, 2, 3, 7, APPEND_ROWS_MAX - 1, APPEND_ROWS_MAX, 1100])
async def test_appends_of_any_count_are_all_stored(tmp_path: Path, count: int) -> None:
    store = SqliteStore(tmp_path)
    await store.open()
    try:
        for seq in range(1, count + 1):
            # Two streams interleaved, and a delete half way that needs what came before.
            store.append("A", StoredMessage(seq, "a", b"", b"%d" % seq, seq, 0))
            store.append("B", StoredMessage(seq, "b", b"h", b"x" * (seq % 5), seq, seq % 3))
            if seq == count // 2:
                store.delete_range("A", 1, seq)
        await store.flush()
        a = await store.read_range("A", 1, count + 10)
        b = await store.read_range("B", 1, count + 10)
        assert [m.seq for m in a] == list(range(count // 2 + 1, count + 1))
        assert [m.data for m in a] == [b"%d" % s for s in range(count // 2 + 1, count + 1)]
        assert b == [
            StoredMessage(s, "b", b"h", b"x" * (s % 5), s, s % 3) for s in range(1, count + 1)
        ]
        assert await store.load_last_seq("A") == count
    finally:
        await store.close()


def test_the_message_cache_mirrors_committed_appends() -> None:
    from tether.storage.cache import MessageCache

    def m(seq: int, data: bytes) -> StoredMessage:
        return StoredMessage(seq, "s", b"", data, 0, 0)

    cache = MessageCache(limit=3 * (1 + 16 + 10))  # three messages of 10 bytes
    cache.apply([(0, "A", m(1, b"a" * 10)), (0, "A", m(2, b"b" * 10))])
    cache.apply([(0, "A", m(2, b"c" * 10))])  # stored again: replaces, counted once
    assert cache.get("A", 2) == m(2, b"c" * 10)
    cache.apply([(0, "A", m(3, b"x" * 200))])  # larger than the whole cache: not kept
    assert cache.get("A", 3) is None
    cache.apply([(0, "B", m(1, b"d" * 10)), (0, "B", m(2, b"e" * 10))])
    # Four of 10 bytes for room for three: the oldest (A 1) went first.
    assert [cache.get("A", 1), cache.get("A", 2) is not None, len(cache)] == [None, True, 3]
    cache.apply([(3, "B", (1, 2))])
    assert len(cache) == 1 and cache.get("A", 2) is not None


def test_the_message_cache_keeps_no_trace_of_deleted_messages() -> None:
    from tether.storage.cache import MessageCache

    cache = MessageCache(limit=1 << 20)
    for seq in range(1, 5001):  # a work queue: each message deleted once consumed
        cache.apply([(0, "Q", StoredMessage(seq, "q", b"", b"x", 0, 0))])
        cache.apply([(3, "Q", (seq,))] if seq % 2 else [(4, "Q", seq, seq)])
    cache.apply([(0, "Q", StoredMessage(5001, "q", b"", b"x", 0, 0))])
    assert len(cache) == 1 and cache.get("Q", 5001) is not None
    assert len(cache._runs) <= 1025  # what is gone is forgotten, not kept in order
    tiny = MessageCache(limit=2 * (1 + 16 + 1))
    for stream, seq in [("A", 1), ("B", 1), ("A", 2)]:
        tiny.apply([(0, stream, StoredMessage(seq, "q", b"", b"x", 0, 0))])
    assert [tiny.get("A", 1), tiny.get("B", 1) is not None, tiny.get("A", 2) is not None] == [
        None,
        True,
        True,
    ]  # oldest first, across streams
