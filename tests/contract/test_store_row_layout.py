"""SQLite keeps messages and consumer states in rowid tables (schema 4): a row of up to
about 4,000 bytes stays in its page. The WITHOUT ROWID tables of schema 3 kept about
1,000 bytes of a row there and put the rest on an overflow page of its own, so that a
1 KiB message took 4.7 KiB on disk. A schema 3 database is copied into the new layout
when it is opened, with nothing lost; a copy that fails leaves it as it was."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from tether.storage import ConsumerRecord, StorageError, StoredMessage, StreamRecord
from tether.storage import sqlite as sqlite_backend
from tether.storage.checksum import checksum, stream_seed
from tether.storage.integrity import check_store, repair_store
from tether.storage.sqlite import DB_FILENAME, SCHEMA_VERSION, SqliteStore

TS = 1_700_000_000_000_000_000

SCHEMA_3 = """
CREATE TABLE streams (name TEXT NOT NULL PRIMARY KEY, config BLOB NOT NULL,
    created_ns INTEGER NOT NULL, compression TEXT NOT NULL DEFAULT 'none') WITHOUT ROWID;
CREATE TABLE stream_seq (stream TEXT NOT NULL PRIMARY KEY, last_seq INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE messages (stream TEXT NOT NULL, seq INTEGER NOT NULL, subject TEXT NOT NULL,
    headers BLOB NOT NULL, data BLOB NOT NULL, ts INTEGER NOT NULL,
    priority INTEGER NOT NULL, crc INTEGER NOT NULL, plain_size INTEGER,
    PRIMARY KEY (stream, seq)) WITHOUT ROWID;
CREATE TABLE consumers (stream TEXT NOT NULL, name TEXT NOT NULL, config BLOB NOT NULL,
    state BLOB NOT NULL, created_ns INTEGER NOT NULL, PRIMARY KEY (stream, name))
    WITHOUT ROWID;
PRAGMA user_version = 3;
"""


def payload(seq: int, size: int) -> bytes:
    """Incompressible and the same for the same arguments."""
    return random.Random(seq).randbytes(size)


def old_messages() -> list[StoredMessage]:
    """Small, 1 KiB, just past a page, and several pages long."""
    sizes = [10, 1024, 1024, 5000, 100_000, 0]
    return [
        StoredMessage(
            seq,
            f"s.{seq}",
            b"NATS/1.0\r\nK: v\r\n\r\n" if seq % 2 else b"",
            payload(seq, size),
            TS + seq,
            priority=seq % 3,
        )
        for seq, size in enumerate(sizes, start=1)
    ]


def write_schema_3(directory: Path, msgs: list[StoredMessage]) -> ConsumerRecord:
    directory.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(directory / DB_FILENAME)
    conn.executescript(SCHEMA_3)
    conn.execute("INSERT INTO streams VALUES ('s', x'7b7d', 1, 'none')")
    conn.execute("INSERT INTO stream_seq VALUES ('s', ?)", (len(msgs),))
    conn.executemany(
        "INSERT INTO messages VALUES ('s', ?, ?, ?, ?, ?, ?, ?, NULL)",
        [
            (
                m.seq,
                m.subject,
                m.headers,
                m.data,
                m.ts,
                m.priority,
                checksum(stream_seed("s"), m.seq, m.subject, m.headers, m.data, m.ts, m.priority),
            )
            for m in msgs
        ],
    )
    consumer = ConsumerRecord("s", "worker", b"{}", os.urandom(3000), 7)
    conn.execute(
        "INSERT INTO consumers VALUES (?, ?, ?, ?, ?)",
        (consumer.stream, consumer.name, consumer.config, consumer.state, consumer.created_ns),
    )
    conn.commit()
    conn.close()
    return consumer


def table_sql(directory: Path) -> dict[str, str]:
    conn = sqlite3.connect(directory / DB_FILENAME)
    try:
        return {
            name: sql
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
            )
        }
    finally:
        conn.close()


async def test_a_1_kib_message_takes_about_1_kib_on_disk(tmp_path: Path) -> None:
    count = 2000
    store = SqliteStore(tmp_path, sync="os", cache_bytes=0)
    await store.open()
    try:
        store.put_stream(StreamRecord("s", b"{}", 1))
        await store.append_run(
            "s",
            [StoredMessage(seq, "s.a", b"", payload(seq, 1024), TS) for seq in range(1, count + 1)],
        )
        await store.call_in_writer(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
        assert await store.read("s", 1234) == StoredMessage(
            1234, "s.a", b"", payload(1234, 1024), TS
        )
    finally:
        await store.close()
    per_message = (tmp_path / DB_FILENAME).stat().st_size / count
    # The row (1 KiB payload, subject, key, checksum) and its key's index entry; schema
    # 3 took 4.7 KiB a message.
    assert per_message < 1.5 * 1024, per_message


async def test_a_schema_3_database_is_copied_into_rowid_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "MIGRATE_STRETCH_ROWS", 4)  # a few stretches
    msgs = old_messages()
    consumer = write_schema_3(tmp_path, msgs)
    assert "WITHOUT ROWID" in table_sql(tmp_path)["messages"]

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert await store.read_range("s", 1, 100) == msgs
        assert await store.load_consumers("s") == [consumer]
        assert await store.load_last_seq("s") == len(msgs)
        version = await store.call_in_writer(
            lambda c: c.execute("PRAGMA user_version").fetchone()[0]
        )
        assert version == SCHEMA_VERSION == 4
        # The key still holds: a second row for a sequence replaces the first.
        again = StoredMessage(2, "s.again", b"", b"replaced", TS)
        await store.append("s", again)
        await store.delete_range("s", 3, 4)
        assert await store.read_range("s", 1, 100) == [msgs[0], again, *msgs[4:]]
        await store.put_consumer_state("s", "worker", b"newer")
    finally:
        await store.close()

    tables = table_sql(tmp_path)
    assert "WITHOUT ROWID" not in tables["messages"] and "WITHOUT ROWID" not in tables["consumers"]
    assert {"messages", "consumers", "streams", "stream_seq"} <= set(tables)
    assert not any(name.endswith("_4") for name in tables)
    report = check_store(tmp_path)
    assert report.ok, report

    reopened = SqliteStore(tmp_path, cache_bytes=0)  # opening a schema 4 database copies nothing
    await reopened.open()
    try:
        assert await reopened.read_range("s", 1, 100) == [msgs[0], again, *msgs[4:]]
        assert [c.state for c in await reopened.load_consumers("s")] == [b"newer"]
    finally:
        await reopened.close()


async def test_a_copy_that_fails_leaves_the_schema_3_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    msgs = old_messages()
    write_schema_3(tmp_path, msgs)
    before = table_sql(tmp_path)
    # As when the disk fills up at the end of the copy: the swap fails half-way through.
    failing = sqlite_backend.SQL_MIGRATE_3_TO_4_SWAP.replace(
        "DROP TABLE consumers;", "SELECT no_such_function();"
    )
    monkeypatch.setattr(sqlite_backend, "SQL_MIGRATE_3_TO_4_SWAP", failing)
    monkeypatch.setattr(sqlite_backend, "MIGRATE_STRETCH_ROWS", 2)
    store = SqliteStore(tmp_path, cache_bytes=0)
    with pytest.raises(StorageError, match=r"to schema 4 failed: .* The database is as it was"):
        await store.open()
    await store.close()
    assert table_sql(tmp_path) == before
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(msgs)
    finally:
        conn.close()

    monkeypatch.undo()
    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert await store.read_range("s", 1, 100) == msgs
    finally:
        await store.close()


async def test_repair_keeps_every_row_when_only_the_key_index_is_damaged(tmp_path: Path) -> None:
    count = 20_000
    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        store.put_stream(StreamRecord("s", b"{}", 1))
        await store.append_run(
            "s",
            [StoredMessage(seq, "s.a", b"", payload(seq, 100), TS) for seq in range(1, count + 1)],
        )
    finally:
        await store.close()  # checkpoints: everything is in the database file
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    try:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages'"
        ).fetchone()
    finally:
        conn.close()
    with (tmp_path / DB_FILENAME).open("r+b") as db:  # the index's root: every lookup by key
        db.seek((root - 1) * page_size)
        db.write(b"\xff" * page_size)

    found = check_store(tmp_path)
    assert not found.ok
    assert found.streams[0].messages == count and found.streams[0].verified == count
    repaired = repair_store(tmp_path)
    assert repaired.repaired
    assert repaired.lost == [], repaired.lost

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert [m.seq for m in await store.read_range("s", 1, count)] == list(range(1, count + 1))
        assert await store.read("s", 12_345) == StoredMessage(
            12_345, "s.a", b"", payload(12_345, 100), TS
        )
    finally:
        await store.close()


async def test_a_copy_cut_short_by_a_kill_is_made_again(tmp_path: Path) -> None:
    msgs = old_messages()
    write_schema_3(tmp_path, msgs)
    conn = sqlite3.connect(tmp_path / DB_FILENAME)  # what a kill -9 after two stretches leaves
    try:
        conn.executescript(sqlite_backend.SQL_MIGRATE_3_TO_4_START)
        conn.execute(sqlite_backend.SQL_MIGRATE_3_TO_4_STRETCH, ("", -(2**63), 2))
        conn.commit()
    finally:
        conn.close()
    assert "messages_4" in table_sql(tmp_path)

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert await store.read_range("s", 1, 100) == msgs
    finally:
        await store.close()
    assert "messages_4" not in table_sql(tmp_path)
