"""Damaged stores (SQLite): a damaged message is an error on every read path, never
content; a store that lost committed data refuses to open; check and repair.

Damage is done the way a disk does it: behind the store's back, here through a
second SQLite connection (a row changed without its checksum) or by cutting files.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tether.storage import (
    ConsumerRecord,
    CorruptMessage,
    DamagedStore,
    StorageError,
    StoredMessage,
    StreamRecord,
)
from tether.storage.checksum import checksum, checksums, stream_seed
from tether.storage.integrity import check_store, in_use, repair_store
from tether.storage.manifest import MANIFEST_FILENAME, database_file_problem, read_manifest
from tether.storage.sqlite import DB_FILENAME, SCHEMA_VERSION, SqliteStore

MakeSqlite = Callable[..., Awaitable[SqliteStore]]

TS = 1_700_000_000_123_456_789
HEADERS = b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n"


def msg(seq: int, **kw: Any) -> StoredMessage:
    return StoredMessage(
        seq=seq,
        subject=kw.pop("subject", "orders.new"),
        headers=kw.pop("headers", HEADERS if seq % 2 else b""),
        data=kw.pop("data", f"payload-{seq}".encode()),
        ts=kw.pop("ts", TS + seq),
        **kw,
    )


async def fill(store: SqliteStore, name: str, seqs: range) -> list[StoredMessage]:
    messages = [msg(seq) for seq in seqs]
    store.put_stream(StreamRecord(name, b"{}", TS))
    for m in messages:
        store.append(name, m)
    await store.flush()
    return messages


def damage(directory: Path, sql: str, *params: Any) -> None:
    """Change rows behind the store's back (as bit rot would), leaving checksums alone."""
    conn = sqlite3.connect(directory / DB_FILENAME, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        assert conn.execute(sql, params).rowcount >= 1
    finally:
        conn.close()


def claims(directory: Path) -> dict[str, int]:
    manifest = read_manifest(directory)
    assert manifest is not None
    return dict(manifest.streams)


def temp_files(directory: Path) -> list[Path]:
    return list(directory.glob("*.tmp"))


def set_claims(directory: Path, streams: dict[str, int]) -> None:
    (directory / MANIFEST_FILENAME).write_text(json.dumps({"format": 1, "streams": streams}))


# -- the checksum -----------------------------------------------------------------------


def test_the_checksum_covers_every_field() -> None:
    seed = stream_seed("S")
    base = (1, "a.b", b"h", b"d", TS, 0)
    c = checksum(seed, *base)
    variants = [
        (2, "a.b", b"h", b"d", TS, 0),
        (1, "a.c", b"h", b"d", TS, 0),
        (1, "a.b", b"H", b"d", TS, 0),
        (1, "a.b", b"h", b"D", TS, 0),
        (1, "a.b", b"h", b"d", TS + 1, 0),
        (1, "a.b", b"h", b"d", TS, 1),
        (1, "a.b", b"", b"hd", TS, 0),  # a byte moved from the headers to the payload
    ]
    assert all(checksum(seed, *v) != c for v in variants)
    assert checksum(stream_seed("T"), *base) != c
    assert checksum(seed, 1, b"a.b", b"h", b"d", TS, 0) == c  # an encoded subject will do
    columns = [list(col) for col in zip(base, *variants, strict=True)]
    assert checksums(seed, *columns) == [checksum(seed, *v) for v in (base, *variants)]


# -- damaged messages: an error on every read path --------------------------------------

READS: dict[str, Callable[[SqliteStore, int], Awaitable[object]]] = {
    "read": lambda store, seq: store.read("s", seq),
    "read_range": lambda store, seq: store.read_range("s", 1, 100),
    "read_range_max_bytes": lambda store, seq: store.read_range("s", seq, 10, max_bytes=10_000),
    "read_columns": lambda store, seq: store.read_columns("s", 1, 10, 100),
    "read_many": lambda store, seq: store.read_many("s", [seq - 1, seq, seq + 1]),
}

DAMAGE = {
    "payload": "UPDATE messages SET data = CAST('payload-X' AS BLOB) WHERE seq = ?",
    "headers": "UPDATE messages SET headers = CAST('NATS/1.0' AS BLOB) WHERE seq = ?",
    "subject": "UPDATE messages SET subject = 'orders.old' WHERE seq = ?",
    "timestamp": "UPDATE messages SET ts = ts + 1 WHERE seq = ?",
    "priority": "UPDATE messages SET priority = 9 WHERE seq = ?",
    "checksum": "UPDATE messages SET crc = crc + 1 WHERE seq = ?",
    "moved": "UPDATE messages SET seq = 99 WHERE seq = ?",
    "payload type": "UPDATE messages SET data = 'text now' WHERE seq = ?",
    "timestamp type": "UPDATE messages SET ts = 1.5 WHERE seq = ?",
}


@pytest.mark.parametrize("path", list(READS))
async def test_a_damaged_payload_is_an_error_on_every_read_path(
    make_sqlite: MakeSqlite, store_dir: Path, path: str
) -> None:
    store = await make_sqlite(cache_bytes=0)
    messages = await fill(store, "s", range(1, 11))
    damage(store_dir, DAMAGE["payload"], 5)
    with pytest.raises(CorruptMessage) as info:
        await READS[path](store, 5)
    assert (info.value.stream, info.value.seq) == ("s", 5)
    assert isinstance(info.value, StorageError)
    message = str(info.value)
    assert "message 5 of stream 's' is damaged" in message
    assert "tether store check" in message and "\n" not in message
    # The rest of the stream is still served, and the store goes on.
    assert await store.read("s", 4) == messages[3]
    assert await store.read_many("s", [6, 7]) == messages[5:7]
    assert await store.read_range("s", 6, 10) == messages[5:]
    await store.append("s", msg(11))
    assert await store.read("s", 11) == msg(11)


@pytest.mark.parametrize("what", list(DAMAGE))
async def test_any_change_to_a_stored_message_is_detected(
    make_sqlite: MakeSqlite, store_dir: Path, what: str
) -> None:
    store = await make_sqlite(cache_bytes=0)
    await fill(store, "s", range(1, 6))
    damage(store_dir, DAMAGE[what], 3)
    seq = 99 if what == "moved" else 3
    with pytest.raises(CorruptMessage) as info:
        await store.read("s", seq)
    assert info.value.seq == seq
    with pytest.raises(CorruptMessage):
        await store.read_columns("s", 1, 100, 100)


async def test_a_fresh_instance_verifies_what_another_wrote(make_sqlite: MakeSqlite) -> None:
    writer = await make_sqlite()
    messages = await fill(writer, "s", range(1, 50))
    await writer.close()
    reader = await make_sqlite(cache_bytes=0)
    assert await reader.read_range("s", 1, 100) == messages
    columns = await reader.read_columns("s", 1, 49, 100)
    assert columns.data == [m.data for m in messages]


# -- migration from schema 1 ----------------------------------------------------------

SCHEMA_1 = """
CREATE TABLE streams (name TEXT NOT NULL PRIMARY KEY, config BLOB NOT NULL,
    created_ns INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE stream_seq (stream TEXT NOT NULL PRIMARY KEY, last_seq INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE messages (stream TEXT NOT NULL, seq INTEGER NOT NULL, subject TEXT NOT NULL,
    headers BLOB NOT NULL, data BLOB NOT NULL, ts INTEGER NOT NULL,
    priority INTEGER NOT NULL, PRIMARY KEY (stream, seq)) WITHOUT ROWID;
CREATE TABLE consumers (stream TEXT NOT NULL, name TEXT NOT NULL, config BLOB NOT NULL,
    state BLOB NOT NULL, created_ns INTEGER NOT NULL, PRIMARY KEY (stream, name))
    WITHOUT ROWID;
PRAGMA user_version = 1;
"""


async def test_a_schema_1_database_gets_checksums_on_open(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.executescript(SCHEMA_1)
    old = [msg(seq, priority=seq % 3) for seq in range(1, 6)]
    conn.execute("INSERT INTO streams VALUES ('s', x'7b7d', 1)")
    conn.execute("INSERT INTO stream_seq VALUES ('s', 5)")
    conn.executemany(
        "INSERT INTO messages VALUES ('s', ?, ?, ?, ?, ?, ?)",
        [(m.seq, m.subject, m.headers, m.data, m.ts, m.priority) for m in old],
    )
    conn.commit()
    conn.close()

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert await store.read_range("s", 1, 10) == old
        assert await store.load_last_seq("s") == 5
        version = await store.call_in_writer(
            lambda c: c.execute("PRAGMA user_version").fetchone()[0]
        )
        assert version == SCHEMA_VERSION  # migrated through every version
        await store.append("s", msg(6))
        assert await store.read("s", 6) == msg(6)
    finally:
        await store.close()
    damage(tmp_path, DAMAGE["payload"], 2)  # the migrated rows are protected too
    again = SqliteStore(tmp_path, cache_bytes=0)
    await again.open()
    try:
        with pytest.raises(CorruptMessage):
            await again.read("s", 2)
    finally:
        await again.close()


# -- the manifest -------------------------------------------------------------------------


async def test_the_manifest_follows_the_streams(make_sqlite: MakeSqlite, store_dir: Path) -> None:
    store = await make_sqlite(manifest_interval=0.01)
    assert claims(store_dir) == {}  # written at open: this directory holds a store now
    await fill(store, "a", range(1, 4))
    assert claims(store_dir) == {"a": 3}  # a new stream is claimed before its reply
    await store.append("a", msg(4))
    for _ in range(200):
        if claims(store_dir) == {"a": 4}:
            break
        await asyncio.sleep(0.01)
    assert claims(store_dir) == {"a": 4}  # appends are claimed within the interval
    await store.put_stream(StreamRecord("b", b"{}", TS))
    assert claims(store_dir) == {"a": 4, "b": 0}
    await store.delete_stream("a")
    assert claims(store_dir) == {"b": 0}
    await store.append("b", msg(1))
    await store.close()
    assert claims(store_dir) == {"b": 1}  # closing brings it up to date
    assert not temp_files(store_dir)


async def test_a_stream_is_unclaimed_before_it_is_deleted(
    make_sqlite: MakeSqlite, store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_sqlite()
    await fill(store, "a", range(1, 3))
    seen: list[dict[str, int]] = []

    def spy(stream: str) -> None:
        unclaim(stream)
        seen.append(claims(store_dir))  # the delete is not committed yet
        conn = sqlite3.connect(store_dir / DB_FILENAME)
        try:
            assert conn.execute("SELECT count(*) FROM streams").fetchone() == (1,)
        finally:
            conn.close()

    unclaim = store._writer._unclaim
    monkeypatch.setattr(store._writer, "_unclaim", spy)
    await store.delete_stream("a")
    assert seen == [{}]


async def test_a_failed_delete_leaves_the_stream_claimed_again(
    make_sqlite: MakeSqlite, store_dir: Path
) -> None:
    store = await make_sqlite(manifest_interval=0.01)
    await fill(store, "a", range(1, 3))
    unbindable = StoredMessage(5, "s", b"", [1, 2], TS)  # type: ignore[arg-type]
    store.delete_stream("a")
    with pytest.raises(StorageError):
        await store.append("a", unbindable)  # fails the tick: the delete is rolled back
    assert [s.name for s in await store.load_streams()] == ["a"]
    await store.append("a", msg(3))
    for _ in range(200):
        if claims(store_dir) == {"a": 3}:
            break
        await asyncio.sleep(0.01)
    assert claims(store_dir) == {"a": 3}


# -- opening a store that lost data: refused -------------------------------------------


async def make_store(directory: Path, n: int = 20) -> None:
    store = SqliteStore(directory)
    await store.open()
    await fill(store, "ORDERS", range(1, n + 1))
    await store.put_stream(StreamRecord("EMPTY", b"{}", TS))
    await store.close()


async def refused(directory: Path) -> str:
    store = SqliteStore(directory)
    with pytest.raises(DamagedStore) as info:
        await store.open()
    await store.close()
    message = str(info.value)
    assert "\n" not in message
    assert f"tether store check --store sqlite:{directory}" in message
    assert f"tether store repair --store sqlite:{directory}" in message
    return message


async def test_an_emptied_database_is_refused(tmp_path: Path) -> None:
    await make_store(tmp_path)
    os.truncate(tmp_path / DB_FILENAME, 0)
    message = await refused(tmp_path)
    assert "tether.db is empty (0 bytes), but tether.manifest says it held 2 streams" in message
    assert (tmp_path / DB_FILENAME).stat().st_size == 0  # nothing was written to it


async def test_a_missing_database_is_refused(tmp_path: Path) -> None:
    await make_store(tmp_path)
    (tmp_path / DB_FILENAME).unlink()
    assert "tether.db is missing" in await refused(tmp_path)
    assert not (tmp_path / DB_FILENAME).exists()


async def test_a_truncated_database_is_refused(tmp_path: Path) -> None:
    await make_store(tmp_path, n=2000)
    size = (tmp_path / DB_FILENAME).stat().st_size
    os.truncate(tmp_path / DB_FILENAME, size // 2)
    assert "is truncated" in await refused(tmp_path)
    assert database_file_problem(tmp_path / DB_FILENAME) is not None


async def test_a_database_behind_its_manifest_is_refused(tmp_path: Path) -> None:
    await make_store(tmp_path)
    set_claims(tmp_path, {"ORDERS": 25, "EMPTY": 0})
    before = (tmp_path / DB_FILENAME).read_bytes()
    message = await refused(tmp_path)
    assert (tmp_path / DB_FILENAME).read_bytes() == before  # left as it was found
    assert "stream 'ORDERS' ends at sequence 20, but messages up to 25 were committed" in message
    set_claims(tmp_path, {"ORDERS": 20, "GONE": 3})
    assert "stream 'GONE' is missing" in await refused(tmp_path)


async def test_a_damaged_manifest_is_refused(tmp_path: Path) -> None:
    await make_store(tmp_path)
    (tmp_path / MANIFEST_FILENAME).write_bytes(b'{"format": 1, "str')
    store = SqliteStore(tmp_path)
    with pytest.raises(DamagedStore, match=r"tether\.manifest is damaged"):
        await store.open()
    await store.close()


async def test_what_claims_nothing_opens(tmp_path: Path) -> None:
    # A new directory; an emptied database whose creation never got to a manifest; a
    # store of an older version (no manifest); claims the database meets.
    for prepare in ("new", "empty file", "no manifest", "claims met"):
        directory = tmp_path / prepare.replace(" ", "-")
        directory.mkdir()
        if prepare == "empty file":
            (directory / DB_FILENAME).write_bytes(b"")
        elif prepare != "new":
            await make_store(directory)
            if prepare == "no manifest":
                (directory / MANIFEST_FILENAME).unlink()
            else:
                set_claims(directory, {"ORDERS": 19})
        store = SqliteStore(directory)
        await store.open()
        await store.close()
        assert (directory / MANIFEST_FILENAME).exists()


# -- check and repair ----------------------------------------------------------------------


async def test_check_reports_and_repair_keeps_what_verifies(tmp_path: Path) -> None:
    await make_store(tmp_path)
    store = SqliteStore(tmp_path)
    await store.open()
    await store.put_consumer(ConsumerRecord("ORDERS", "c", b"cfg", b"state", TS))
    await store.close()
    damage(tmp_path, DAMAGE["payload"], 5)
    damage(tmp_path, DAMAGE["subject"], 8)

    report = check_store(tmp_path)
    assert not report.ok
    orders = next(s for s in report.streams if s.name == "ORDERS")
    assert (orders.messages, orders.verified, orders.damaged) == (20, 18, [5, 8])
    text = "\n".join(report.lines())
    assert "2 damaged (checksum mismatch): sequence 5, 8" in text
    assert "tether store repair" in text

    repaired = repair_store(tmp_path)
    assert repaired.repaired and repaired.kept == {"ORDERS": 18, "EMPTY": 0}
    assert any("sequence 5, 8" in line for line in repaired.lost)
    names = sorted(p.name for p in repaired.moved)  # the store was closed: no log
    assert len(names) == 2
    assert names[0].startswith("tether.db.damaged-")
    assert names[1].startswith("tether.manifest.damaged-")
    assert names[0].removeprefix("tether.db") == names[1].removeprefix("tether.manifest")
    assert check_store(tmp_path).ok
    assert claims(tmp_path) == {"ORDERS": 20, "EMPTY": 0}

    again = SqliteStore(tmp_path, cache_bytes=0)
    await again.open()
    try:
        kept = await again.read_range("ORDERS", 1, 100)
        assert [m.seq for m in kept] == [s for s in range(1, 21) if s not in (5, 8)]
        assert kept[0] == msg(1)
        assert await again.load_last_seq("ORDERS") == 20
        assert [c.name for c in await again.load_consumers("ORDERS")] == ["c"]
    finally:
        await again.close()
    assert repair_store(tmp_path).repaired is False  # a whole store is left alone


async def test_repair_keeps_sequences_of_lost_messages_taken(tmp_path: Path) -> None:
    await make_store(tmp_path)
    set_claims(tmp_path, {"ORDERS": 30, "EMPTY": 0, "GONE": 7})
    report = check_store(tmp_path)
    assert not report.ok
    assert any("'GONE' is missing" in p for p in report.problems)
    repaired = repair_store(tmp_path)
    lost = "\n".join(repaired.lost)
    assert "sequences 21 to 30" in lost and "'GONE': the whole stream" in lost
    store = SqliteStore(tmp_path)
    await store.open()
    try:
        assert await store.load_last_seq("ORDERS") == 30  # the next message is 31
    finally:
        await store.close()


async def test_repair_of_an_emptied_database_starts_over(tmp_path: Path) -> None:
    await make_store(tmp_path)
    os.truncate(tmp_path / DB_FILENAME, 0)
    repaired = repair_store(tmp_path)
    assert "'ORDERS': the whole stream" in "\n".join(repaired.lost)
    store = SqliteStore(tmp_path)
    await store.open()
    try:
        assert await store.load_streams() == []
    finally:
        await store.close()


def test_repair_refuses_a_store_in_use(tmp_path: Path) -> None:
    asyncio.run(make_store(tmp_path))
    damage(tmp_path, DAMAGE["payload"], 5)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
            " c.execute('SELECT 1 FROM streams').fetchall(); print('open', flush=True);"
            " sys.stdin.read()",
            str(tmp_path / DB_FILENAME),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        assert in_use(tmp_path / DB_FILENAME)
        with pytest.raises(StorageError, match="is in use: stop the server"):
            repair_store(tmp_path)
    finally:
        holder.communicate(b"")
    assert not in_use(tmp_path / DB_FILENAME)
    assert repair_store(tmp_path).repaired
