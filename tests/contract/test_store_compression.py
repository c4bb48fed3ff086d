"""Streams with ``compression: "s2"``: durable backends store their payloads compressed
(Snappy block format) and every read gives them back as sent, with the sizes of the
message as sent. Runs on every backend (the memory one keeps payloads as they are);
what is on disk is looked at in SQLite's and PostgreSQL's own tables."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import cramjam
import pytest

from tether.storage import (
    FILE_SIZING,
    MEMORY_SIZING,
    CorruptMessage,
    MessageColumns,
    Store,
    StoredMessage,
    StreamRecord,
)
from tether.storage.compression import MIN_SIZE, compress, decompress
from tether.storage.integrity import check_store, repair_store
from tether.storage.sqlite import DB_FILENAME, SCHEMA_VERSION, SqliteStore

from .conftest import MakeStore

TS = 1_700_000_000_123_456_789
HEADERS = b"NATS/1.0\r\nK: v\r\n\r\n"


def record(name: str, compression: str = "s2") -> StreamRecord:
    return StreamRecord(name, b"{}", TS, compression)


def document(seq: int) -> bytes:
    """A payload that compresses well (JSON with repeated keys)."""
    items = [{"sku": f"item-{i}", "qty": i, "status": "reserved"} for i in range(20)]
    return json.dumps({"order": seq, "customer": "alice", "items": items}).encode()


def messages() -> list[StoredMessage]:
    """Compressible payloads with and without headers, a tiny one, an incompressible
    one, an empty one."""
    noise = os.urandom(2000)
    return [
        StoredMessage(1, "orders.new", b"", document(1), TS + 1),
        StoredMessage(2, "orders.new", HEADERS, document(2), TS + 2, priority=3),
        StoredMessage(3, "orders.tiny", b"", b"x" * (MIN_SIZE - 1), TS + 3),
        StoredMessage(4, "orders.noise", HEADERS, noise, TS + 4),
        StoredMessage(5, "orders.empty", HEADERS, b"", TS + 5),
        StoredMessage(6, "orders.ünï", b"", document(6), TS + 6),
    ]


def stored_rows(store: Store, backend: str) -> Any:
    """{seq: (plain_size, bytes stored for the payload)} straight from the tables."""
    table = "tether_messages" if backend == "postgres" else "messages"
    sql = f"SELECT seq, plain_size, length(data) FROM {table} ORDER BY seq"

    def rows(conn: Any) -> dict[int, tuple[int | None, int]]:
        return {seq: (size, stored) for seq, size, stored in conn.execute(sql).fetchall()}

    return store.call_in_writer(rows)  # type: ignore[attr-defined]


async def fill(store: Store, name: str, msgs: list[StoredMessage]) -> None:
    store.put_stream(record(name))
    for m in msgs:
        store.append(name, m)
    await store.flush()


def test_payloads_compress_only_when_it_saves_bytes() -> None:
    doc = document(1)
    packed = compress(doc)
    assert packed is not None and len(packed) < len(doc) // 3
    assert bytes(cramjam.snappy.decompress_raw(packed)) == doc  # plain Snappy blocks
    assert decompress(packed, len(doc)) == doc
    assert compress(b"a" * (MIN_SIZE - 1)) is None  # too small to try
    assert compress(os.urandom(4096)) is None  # would grow
    with pytest.raises(ValueError, match="Snappy"):
        decompress(packed[:-3], len(doc))
    with pytest.raises(ValueError, match="where"):
        decompress(packed, len(doc) + 1)


async def test_every_read_gives_back_the_messages_as_sent(
    make_store: MakeStore, backend: str
) -> None:
    store = await make_store(**({} if backend == "memory" else {"cache_bytes": 0}))
    sent = messages()
    await fill(store, "z", sent)
    assert await store.read("z", 2) == sent[1]
    assert await store.read_range("z", 1, 10) == sent
    assert await store.read_many("z", [6, 1, 4]) == [sent[0], sent[3], sent[5]]
    assert await store.read_columns("z", 1, 6, 10) == MessageColumns.of(sent)
    assert await store.read_columns("z", 2, 3, 10) == MessageColumns.of(sent[1:3])
    # max_bytes counts the messages as sent: the first two take this much together.
    two = sent[0].size + sent[1].size
    assert await store.read_range("z", 1, 10, max_bytes=two) == sent[:2]
    assert await store.read_range("z", 1, 10, max_bytes=two - 1) == sent[:1]
    for sizing in (FILE_SIZING, MEMORY_SIZING):
        index = await store.load_index("z", sizing)
        assert [m.size for m in index] == [
            len(m.subject.encode()) + len(m.headers) + len(m.data) + sizing.overhead(m.headers)
            for m in sent
        ]
    assert (await store.load_streams())[0].compression == "s2"
    if backend == "memory":
        return  # it keeps payloads as they are
    rows = await stored_rows(store, backend)
    for seq in (1, 2, 6):
        plain_size, stored = rows[seq]
        assert plain_size == len(sent[seq - 1].data)
        assert stored < plain_size // 3
    assert rows[3] == (None, MIN_SIZE - 1)  # tiny: as sent
    assert rows[4] == (None, 2000)  # incompressible: as sent
    assert rows[5] == (None, 0)


async def test_switching_compression_keeps_every_row_readable(
    make_store: MakeStore, backend: str
) -> None:
    store = await make_store(**({} if backend == "memory" else {"cache_bytes": 0}))
    plain = [StoredMessage(seq, "a", b"", document(seq), TS + seq) for seq in range(1, 4)]
    store.put_stream(record("z", "none"))
    store.append("z", plain[0])
    store.put_stream(record("z", "s2"))  # same commit: the next append is compressed
    store.append("z", plain[1])
    store.put_stream(record("z", "none"))
    await store.append("z", plain[2])
    assert await store.read_range("z", 1, 10) == plain
    if backend != "memory":
        rows = await stored_rows(store, backend)
        assert [rows[seq][0] is not None for seq in (1, 2, 3)] == [False, True, False]
    assert (await store.load_streams())[0].compression == "none"


@pytest.mark.parametrize("backend", ["sqlite-always", "postgres"])  # what survives a restart
async def test_a_reopened_store_remembers_which_streams_compress(
    make_store: MakeStore, backend: str
) -> None:
    first = await make_store(cache_bytes=0)
    await fill(first, "z", messages()[:2])
    first.put_stream(record("p", "none"))
    await first.append("p", StoredMessage(1, "p", b"", document(1), TS))
    await first.close()

    again = await make_store(cache_bytes=0)
    loaded = await again.load_streams()
    assert [(r.name, r.compression) for r in loaded] == [("p", "none"), ("z", "s2")]
    await again.append("z", StoredMessage(3, "orders.new", b"", document(3), TS + 3))
    await again.append("p", StoredMessage(2, "p", b"", document(2), TS))
    assert await again.read("z", 3) == StoredMessage(3, "orders.new", b"", document(3), TS + 3)
    rows = await stored_rows(again, backend)
    assert rows[3][0] == len(document(3))  # z, after the restart: still compressed
    assert await again.read_many("p", [1, 2]) == [
        StoredMessage(1, "p", b"", document(1), TS),
        StoredMessage(2, "p", b"", document(2), TS),
    ]
    # A deleted and re-created stream starts from its new definition.
    await again.delete_stream("z")
    again.put_stream(record("z", "none"))
    await again.append("z", StoredMessage(1, "orders.new", b"", document(1), TS))
    rows = await stored_rows(again, backend)
    assert all(size is None for size, _ in rows.values())


# -- SQLite's own tools and older files -----------------------------------------------------


async def test_damage_to_a_compressed_payload_is_reported_and_repair_keeps_the_rest(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    sent = messages()
    await fill(store, "z", sent)
    await store.close()
    assert check_store(tmp_path).ok

    conn = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None)
    # A payload that no longer decompresses, and a flag that no longer says compressed.
    conn.execute("UPDATE messages SET data = CAST('garbage' AS BLOB) WHERE seq = 1")
    conn.execute("UPDATE messages SET plain_size = NULL WHERE seq = 2")
    conn.close()
    report = check_store(tmp_path)
    assert report.streams[0].damaged == [1, 2]

    reopened = SqliteStore(tmp_path, cache_bytes=0)
    await reopened.open()
    try:
        for seq in (1, 2):
            with pytest.raises(CorruptMessage):
                await reopened.read("z", seq)
    finally:
        await reopened.close()

    repaired = repair_store(tmp_path)
    assert repaired.repaired
    after = SqliteStore(tmp_path, cache_bytes=0)
    await after.open()
    try:
        assert await after.read_range("z", 1, 10) == sent[2:]
        assert (await after.load_streams())[0].compression == "s2"
        await after.append("z", StoredMessage(7, "orders.new", b"", document(7), TS + 7))
        size = await after.call_in_writer(
            lambda c: c.execute("SELECT plain_size FROM messages WHERE seq = 7").fetchone()[0]
        )
        assert size == len(document(7))  # the repaired store still compresses
    finally:
        await after.close()


SCHEMA_2 = """
CREATE TABLE streams (name TEXT NOT NULL PRIMARY KEY, config BLOB NOT NULL,
    created_ns INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE stream_seq (stream TEXT NOT NULL PRIMARY KEY, last_seq INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE messages (stream TEXT NOT NULL, seq INTEGER NOT NULL, subject TEXT NOT NULL,
    headers BLOB NOT NULL, data BLOB NOT NULL, ts INTEGER NOT NULL,
    priority INTEGER NOT NULL, crc INTEGER NOT NULL, PRIMARY KEY (stream, seq)) WITHOUT ROWID;
CREATE TABLE consumers (stream TEXT NOT NULL, name TEXT NOT NULL, config BLOB NOT NULL,
    state BLOB NOT NULL, created_ns INTEGER NOT NULL, PRIMARY KEY (stream, name))
    WITHOUT ROWID;
PRAGMA user_version = 2;
"""


async def test_a_schema_2_database_is_checked_then_migrated(tmp_path: Path) -> None:
    from tether.storage.checksum import checksum, stream_seed

    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.executescript(SCHEMA_2)
    old = [StoredMessage(seq, "a", b"", document(seq), TS + seq) for seq in (1, 2)]
    conn.execute("INSERT INTO streams VALUES ('s', x'7b7d', 1)")
    conn.execute("INSERT INTO stream_seq VALUES ('s', 2)")
    conn.executemany(
        "INSERT INTO messages VALUES ('s', ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                m.seq,
                m.subject,
                m.headers,
                m.data,
                m.ts,
                m.priority,
                checksum(stream_seed("s"), m.seq, m.subject, m.headers, m.data, m.ts, 0),
            )
            for m in old
        ],
    )
    conn.commit()
    conn.close()
    found = check_store(tmp_path)  # the tools read a file of the older schema too
    assert found.ok and found.streams[0].verified == 2

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        assert await store.read_range("s", 1, 10) == old
        assert await store.load_streams() == [StreamRecord("s", b"{}", 1, "none")]
        version = await store.call_in_writer(
            lambda c: c.execute("PRAGMA user_version").fetchone()[0]
        )
        assert version == SCHEMA_VERSION == 4
        await store.put_stream(StreamRecord("s", b"{}", 1, "s2"))
        await store.append("s", StoredMessage(3, "a", b"", document(3), TS + 3))
        assert await store.read("s", 3) == StoredMessage(3, "a", b"", document(3), TS + 3)
    finally:
        await store.close()


@pytest.mark.parametrize("backend", ["sqlite-always", "postgres"])  # what has tables to damage
async def test_a_damaged_compressed_payload_is_an_error_never_content(
    make_store: MakeStore, backend: str
) -> None:
    store = await make_store(cache_bytes=0)
    sent = messages()
    await fill(store, "z", sent)
    table = "tether_messages" if backend == "postgres" else "messages"
    garbage = "'\\x0011'::bytea" if backend == "postgres" else "x'0011'"

    def damage(conn: Any) -> None:
        conn.execute(f"UPDATE {table} SET data = {garbage} WHERE seq = 1")
        conn.execute(f"UPDATE {table} SET plain_size = plain_size + 1 WHERE seq = 2")

    await store.call_in_writer(damage)  # type: ignore[attr-defined]
    for seq in (1, 2):
        with pytest.raises(CorruptMessage):
            await store.read("z", seq)
    with pytest.raises(CorruptMessage):
        await store.read_range("z", 1, 10)
    assert await store.read_range("z", 3, 10) == sent[2:]


async def test_a_large_commit_of_compressed_and_plain_rows(
    make_store: MakeStore, backend: str
) -> None:
    store = await make_store(**({} if backend == "memory" else {"cache_bytes": 0}))
    store.put_stream(record("z"))
    store.put_stream(record("p", "none"))
    sent = [StoredMessage(seq, "a", b"", document(seq), TS + seq) for seq in range(1, 1101)]
    for m in sent:  # one commit: several statements of each kind
        store.append("z", m)
        store.append("p", m)
    await store.flush()
    assert await store.read_range("z", 1, 2000) == sent
    assert await store.read_range("p", 1, 2000) == sent
    cols = await store.read_columns("z", 500, 700, 1000)
    assert cols.data == [m.data for m in sent[499:700]]
