"""The SQLite backend: one WAL-mode database file, ``tether.db``, in a directory.

* Writes: one dedicated writer thread owns the only write connection and commits
  each group commit (and whatever queued up behind it) in one explicit transaction.
  ``sync="always"`` runs ``synchronous=FULL``: every commit is fsynced before its
  future completes. ``sync="os"`` runs ``synchronous=NORMAL``: a commit survives the
  process crashing but not the machine losing power.
* Reads: a two-thread pool, each thread with its own read-only connection; WAL lets
  them read committed data while the writer writes.
* ``cached()``: a byte-bounded cache of recently committed messages, filled when their
  commit completes and kept in step with deletes, so it never holds anything that a
  read of the database would not return.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from tether.storage.base import (
    MEMORY_SIZING,
    ConsumerRecord,
    CorruptMessage,
    DamagedStore,
    MessageColumns,
    MessageMeta,
    Sizing,
    StorageError,
    StoredMessage,
    StreamRecord,
)
from tether.storage.cache import MiB
from tether.storage.checksum import checksum, crc32, head, stream_seed
from tether.storage.compression import compress, compressing, decompress
from tether.storage.group_commit import (
    APPEND,
    DELETE_CONSUMER,
    DELETE_MESSAGES,
    DELETE_RANGE,
    DELETE_STREAM,
    PUT_CONSUMER,
    PUT_CONSUMER_STATE,
    PUT_STREAM,
    Op,
    Settled,
)
from tether.storage.manifest import (
    MANIFEST_FILENAME,
    compare,
    database_file_problem,
    fsync_file,
    read_manifest,
    remove_manifest,
    write_manifest,
)
from tether.storage.stats import LATENCY_BUCKETS, Histogram, StoreStats, disk_bytes
from tether.storage.threaded import ThreadedStore

__all__ = ["DB_FILENAME", "SqliteStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DB_FILENAME = "tether.db"
WAL_SUFFIX = "-wal"
# 1: the first schema. 2: ``messages.crc``, each message's checksum (see checksum.py).
# 3: ``streams.compression`` and ``messages.plain_size`` (see compression.py).
# 4: ``messages`` and ``consumers`` are rowid tables (they were WITHOUT ROWID).
SCHEMA_VERSION = 4
BUSY_TIMEOUT_MS = 5000

# -- SQL --------------------------------------------------------------------------------
# Every statement the backend runs. ``stream_seq`` holds each stream's high-water mark,
# raised once per stream per transaction, so the last sequence survives deleting the
# tail messages.
#
# ``messages`` and ``consumers`` are rowid tables with a unique (stream, …) key, not
# WITHOUT ROWID: a WITHOUT ROWID row is kept in its page only up to about 1,000 bytes
# (of a 4 KiB page), the rest of a longer row going to an overflow page of its own, so
# a 1 KiB message took 4.7 KiB on disk. A rowid table keeps rows up to about 4,000
# bytes in the page; the key's index costs a second, small B-tree (measured in
# docs/benchmarks.md, "SQLite row layout").
_MESSAGES_TABLE = """(
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    subject TEXT NOT NULL,
    headers BLOB NOT NULL,
    data BLOB NOT NULL,
    ts INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    plain_size INTEGER,
    PRIMARY KEY (stream, seq)
)"""
_MESSAGE_COLUMNS = "stream, seq, subject, headers, data, ts, priority, crc, plain_size"
_CONSUMERS_TABLE = """(
    stream TEXT NOT NULL,
    name TEXT NOT NULL,
    config BLOB NOT NULL,
    state BLOB NOT NULL,
    created_ns INTEGER NOT NULL,
    PRIMARY KEY (stream, name)
)"""
_CONSUMER_COLUMNS = "stream, name, config, state, created_ns"
SQL_SCHEMA = f"""
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS streams (
    name TEXT NOT NULL PRIMARY KEY,
    config BLOB NOT NULL,
    created_ns INTEGER NOT NULL,
    compression TEXT NOT NULL DEFAULT 'none'
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stream_seq (
    stream TEXT NOT NULL PRIMARY KEY,
    last_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages {_MESSAGES_TABLE};
CREATE TABLE IF NOT EXISTS consumers {_CONSUMERS_TABLE};
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""

SQL_JOURNAL_WAL = "PRAGMA journal_mode = WAL"
SQL_SYNCHRONOUS = {
    "always": "PRAGMA synchronous = FULL",  # fsync the WAL at every commit
    "os": "PRAGMA synchronous = NORMAL",  # fsync only at checkpoints
}
SQL_BUSY_TIMEOUT = f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}"
SQL_SCHEMA_VERSION = "PRAGMA user_version"
SQL_HAS_TABLES = (
    "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
    " AND name IN ('streams', 'stream_seq', 'messages')"
)
SQL_MESSAGE_COLUMNS = "SELECT name FROM pragma_table_info('messages')"
# Version 1 to 2: the rows written before get their checksum now. Damage done to them
# before this migration cannot be told apart from their content; from here on, every
# change to a row is.
SQL_MIGRATE_1_TO_2 = """
BEGIN IMMEDIATE;
ALTER TABLE messages ADD COLUMN crc INTEGER;
UPDATE messages SET crc = tether_checksum(stream, seq, subject, headers, data, ts, priority);
PRAGMA user_version = 2;
COMMIT;
"""
# Version 2 to 3: streams say how their payloads are stored; a row whose ``plain_size``
# is not NULL holds its payload compressed (that many bytes once decompressed). Every
# row written before is stored as sent: NULL.
SQL_MIGRATE_2_TO_3 = """
BEGIN IMMEDIATE;
ALTER TABLE streams ADD COLUMN compression TEXT NOT NULL DEFAULT 'none';
ALTER TABLE messages ADD COLUMN plain_size INTEGER;
PRAGMA user_version = 3;
COMMIT;
"""
# Version 3 to 4: ``messages`` is copied into its rowid layout in key order, a stretch
# of rows a transaction, so that the write-ahead log stays the size of a stretch (one
# transaction for the whole copy made it twice the size of the new table, on top of
# the new table itself). The old table stays whole until the last transaction swaps
# the tables (and copies the consumers, a small table): a copy cut short, by a full
# disk or a kill, leaves schema 3 as it was, and the next start copies again.
MIGRATE_STRETCH_ROWS = 10_000
SQL_MIGRATE_3_TO_4_START = f"""
BEGIN IMMEDIATE;
DROP TABLE IF EXISTS messages_4;
CREATE TABLE messages_4 {_MESSAGES_TABLE};
COMMIT;
"""
SQL_MIGRATE_3_TO_4_STRETCH = (
    f"INSERT INTO messages_4 ({_MESSAGE_COLUMNS}) SELECT {_MESSAGE_COLUMNS} FROM messages"
    " WHERE (stream, seq) > (?, ?) ORDER BY stream, seq LIMIT ?"
)
SQL_MIGRATE_3_TO_4_COPIED = (
    "SELECT stream, seq FROM messages_4 ORDER BY stream DESC, seq DESC LIMIT 1"
)
SQL_MIGRATE_3_TO_4_SWAP = f"""
BEGIN IMMEDIATE;
DROP TABLE messages;
ALTER TABLE messages_4 RENAME TO messages;
CREATE TABLE consumers_4 {_CONSUMERS_TABLE};
INSERT INTO consumers_4 ({_CONSUMER_COLUMNS})
    SELECT {_CONSUMER_COLUMNS} FROM consumers ORDER BY stream, name;
DROP TABLE consumers;
ALTER TABLE consumers_4 RENAME TO consumers;
PRAGMA user_version = 4;
COMMIT;
"""
SQL_MIGRATE_3_TO_4_ABANDON = "DROP TABLE IF EXISTS messages_4"
SQL_CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"
# Each stream's last sequence: the high-water mark, or for a stream with no mark yet 0.
SQL_HELD = (
    "SELECT name, coalesce((SELECT last_seq FROM stream_seq WHERE stream = name), 0)"
    " FROM streams UNION SELECT stream, last_seq FROM stream_seq"
)

SQL_BEGIN = "BEGIN IMMEDIATE"
SQL_SAVEPOINT = "SAVEPOINT probe"
SQL_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO probe"
SQL_RELEASE_SAVEPOINT = "RELEASE probe"
SQL_COMMIT = "COMMIT"
SQL_ROLLBACK = "ROLLBACK"

SQL_PUT_STREAM = (
    "INSERT OR REPLACE INTO streams (name, config, created_ns, compression) VALUES (?, ?, ?, ?)"
)
SQL_COMPRESSING = "SELECT name, compression FROM streams"
SQL_DELETE_STREAM = (
    "DELETE FROM streams WHERE name = ?",
    "DELETE FROM messages WHERE stream = ?",
    "DELETE FROM consumers WHERE stream = ?",
    "DELETE FROM stream_seq WHERE stream = ?",
)
SQL_APPEND_INTO = (
    "INSERT OR REPLACE INTO messages (stream, seq, subject, headers, data, ts, priority, crc)"
    " VALUES "
)
APPEND_COLUMNS = 8
# Rows with a compressed payload have their own statement, with ``plain_size``: the
# rows of every other stream bind no more values than before compression existed.
SQL_APPEND_PACKED_INTO = (
    "INSERT OR REPLACE INTO messages"
    " (stream, seq, subject, headers, data, ts, priority, crc, plain_size) VALUES "
)
PACKED_COLUMNS = 9
# Appends are written by statements of several rows each (``VALUES (…), (…), …``):
# sqlite3 releases and re-takes the GIL around every statement step, so one row per
# step (executemany) means one GIL round trip per message, each a wait while the
# event loop thread is busy. At most this many rows per statement (and below it, a
# power of two, so a handful of statements cover every count and stay cached).
APPEND_ROWS_MAX = 512
_EMPTY = bytearray()  # bound by copy, so one shared empty value will do


def _blob(value: bytes) -> bytes | bytearray:
    """``value`` as sqlite3 binds it fastest: a bytearray, which it takes directly,
    while bytes goes through its adaptation lookups (with the GIL held) that cost more
    than the copy. Anything else is left for sqlite3 to accept or refuse."""
    if type(value) is not bytes:
        return value
    return bytearray(value) if value else _EMPTY


@functools.lru_cache(maxsize=16)
def sql_append_rows(rows: int) -> str:
    """The append statement for ``rows`` rows at once."""
    return SQL_APPEND_INTO + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * rows)


@functools.lru_cache(maxsize=16)
def sql_append_packed_rows(rows: int) -> str:
    """The append statement for ``rows`` rows with compressed payloads at once."""
    return SQL_APPEND_PACKED_INTO + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)


SQL_RAISE_LAST_SEQ = (
    "INSERT INTO stream_seq (stream, last_seq) VALUES (?, ?)"
    " ON CONFLICT (stream) DO UPDATE SET last_seq = max(last_seq, excluded.last_seq)"
)
SQL_DELETE_MESSAGE = "DELETE FROM messages WHERE stream = ? AND seq = ?"
SQL_DELETE_RANGE = "DELETE FROM messages WHERE stream = ? AND seq BETWEEN ? AND ?"
SQL_PUT_CONSUMER = (
    "INSERT OR REPLACE INTO consumers (stream, name, config, state, created_ns)"
    " VALUES (?, ?, ?, ?, ?)"
)
SQL_PUT_CONSUMER_STATE = "UPDATE consumers SET state = ? WHERE stream = ? AND name = ?"
SQL_DELETE_CONSUMER = "DELETE FROM consumers WHERE stream = ? AND name = ?"

SQL_LOAD_STREAMS = "SELECT name, config, created_ns, compression FROM streams ORDER BY name"
SQL_LOAD_CONSUMERS = (
    "SELECT stream, name, config, state, created_ns FROM consumers WHERE stream = ? ORDER BY name"
)
SQL_LOAD_LAST_SEQ = "SELECT last_seq FROM stream_seq WHERE stream = ?"
# length() of a BLOB is read from the record header, so the payloads are not loaded.
# ?2 and ?3: the stream's overhead per message without and with headers (Sizing). A
# compressed payload counts its plain size, as every size a client sees does.
_OVERHEAD = "CASE WHEN length(headers) > 0 THEN ?3 ELSE ?2 END"
SQL_LOAD_INDEX = (
    "SELECT seq, subject, length(CAST(subject AS BLOB)) + length(headers)"
    " + coalesce(plain_size, length(data))"
    f" + {_OVERHEAD},"
    f" ts, priority, {_OVERHEAD} FROM messages WHERE stream = ?1 ORDER BY seq"
)
# Every read of messages returns these columns, the checksum last, and verifies it. A
# compressed payload comes back decompressed by tether_plain() (see _plain), called by
# SQLite for those rows alone: rows stored as sent cost a NULL test, made in C.
_COLUMNS = (
    "seq, subject, headers,"
    " CASE WHEN plain_size IS NULL THEN data ELSE tether_plain(data, plain_size) END,"
    " ts, priority, crc"
)
SQL_READ = f"SELECT {_COLUMNS} FROM messages WHERE stream = ? AND seq = ?"
SQL_READ_RANGE = (
    f"SELECT {_COLUMNS} FROM messages WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT ?"
)
SQL_READ_ROWS = (
    f"SELECT {_COLUMNS} FROM messages WHERE stream = ? AND seq BETWEEN ? AND ? ORDER BY seq LIMIT ?"
)
# The sequences arrive as one JSON array: one statement whatever their number.
SQL_READ_MANY = (
    f"SELECT {_COLUMNS} FROM messages"
    " WHERE stream = ? AND seq IN (SELECT value FROM json_each(?)) ORDER BY seq"
)


# -- opening: checks and migrations ----------------------------------------------------


def _repair_hint(directory: Path) -> str:
    return (
        f". Run `tether store check --store sqlite:{directory}` for a report and"
        f" `tether store repair --store sqlite:{directory}` to keep what is intact"
    )


def _describe(claims: dict[str, int]) -> str:
    names = sorted(claims)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} stream{'s' if len(names) != 1 else ''} ({shown})"


def held_streams(conn: sqlite3.Connection) -> dict[str, int]:
    """Each stream the database holds (a definition or a high-water mark) -> its last
    sequence; empty for a database without tables yet."""
    (tables,) = conn.execute(SQL_HAS_TABLES).fetchone()
    if not tables:
        return {}
    return {str(name): int(seq) for name, seq in conn.execute(SQL_HELD)}


def _legacy_checksum(
    stream: str, seq: int, subject: str, headers: bytes, data: bytes, ts: int, priority: int
) -> int:
    return checksum(stream_seed(stream), seq, subject, headers, data, ts, priority)


def refuse_newer_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Raise :class:`StorageError` for a database written by a newer version of tether."""
    (version,) = conn.execute(SQL_SCHEMA_VERSION).fetchone()
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"the database {path} has schema version {version}, newer than this"
            f" version of tether supports ({SCHEMA_VERSION})"
        )


def migrate(conn: sqlite3.Connection) -> None:
    """Bring an older schema up to :data:`SCHEMA_VERSION` (no-op for a new database)."""
    columns = {row[0] for row in conn.execute(SQL_MESSAGE_COLUMNS)}
    if not columns:
        return
    if "crc" not in columns:
        conn.create_function("tether_checksum", 7, _legacy_checksum, deterministic=True)
        _migrate_step(conn, SQL_MIGRATE_1_TO_2)
    if "plain_size" not in columns:
        _migrate_step(conn, SQL_MIGRATE_2_TO_3)
    (version,) = conn.execute(SQL_SCHEMA_VERSION).fetchone()
    if version < 4:
        _migrate_3_to_4(conn)


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    """Copy ``messages`` into its rowid layout a stretch at a time, then swap the tables
    (see :data:`SQL_MIGRATE_3_TO_4_START`)."""
    (_, _, path) = conn.execute("PRAGMA database_list").fetchone()
    log.info("upgrading %s to schema 4: copying its messages into rowid tables", path)
    started = time.monotonic()
    # This SQLite may be built to overwrite every freed page (SECURE_DELETE): dropping
    # the old table would then write all of it again, into the log. What it held lives
    # on in the new table, so nothing is gained by erasing it.
    (secure_delete,) = conn.execute("PRAGMA secure_delete").fetchone()
    conn.execute("PRAGMA secure_delete = FAST")
    try:
        _migrate_step(conn, SQL_MIGRATE_3_TO_4_START)
        last: tuple[str, int] = ("", -(2**63))
        while True:
            conn.execute(SQL_BEGIN)
            try:
                copied = conn.execute(
                    SQL_MIGRATE_3_TO_4_STRETCH, (*last, MIGRATE_STRETCH_ROWS)
                ).rowcount
                if copied > 0:
                    last = conn.execute(SQL_MIGRATE_3_TO_4_COPIED).fetchone()
                conn.execute(SQL_COMMIT)
            except BaseException:
                conn.execute(SQL_ROLLBACK)
                raise
            if copied < MIGRATE_STRETCH_ROWS:
                break
        _migrate_step(conn, SQL_MIGRATE_3_TO_4_SWAP)
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute(SQL_MIGRATE_3_TO_4_ABANDON)  # its pages become free pages
        raise StorageError(
            f"upgrading the database {path} to schema 4 failed: {exc}. The database is as"
            " it was; the upgrade copies its messages once and needs free disk space of"
            " about their size"
        ) from exc
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(secure_delete)}")
    # The log held the last stretches and the swap: give its space back now.
    with contextlib.suppress(sqlite3.Error):
        conn.execute(SQL_CHECKPOINT_TRUNCATE)
    log.info("upgraded %s to schema 4 in %.1f s", path, time.monotonic() - started)


def _migrate_step(conn: sqlite3.Connection, script: str) -> None:
    try:
        conn.executescript(script)
    except BaseException:
        if conn.in_transaction:
            conn.execute(SQL_ROLLBACK)
        raise


# -- the writer -------------------------------------------------------------------------


class _Writer:
    """The write connection and how a batch of ops becomes one transaction.

    Runs only on the writer thread (see :class:`ThreadCommitter`). It also keeps the
    manifest (see manifest.py): what each stream held as of the last commit, and what
    the manifest file claims, which is never more than a durable commit held.
    """

    def __init__(self, path: Path, sync: Literal["always", "os"]) -> None:
        self.path = path
        self.sync = sync
        self.sync_seconds = Histogram(LATENCY_BUCKETS)  # the COMMIT statement alone
        self.directory = path.parent
        self.wal_path = path.with_name(path.name + WAL_SUFFIX)
        self._conn: sqlite3.Connection | None = None
        self._held: dict[str, int] = {}  # stream -> last sequence, as of the last commit
        self._claimed: dict[str, int] | None = None  # the manifest's claims (None: no file)
        # True when ``_held`` is ahead of the manifest's claims. Read by the loop thread,
        # after the settlement of the commit that set it, to schedule a refresh.
        self.manifest_dirty = False
        # The streams whose payloads are stored compressed, as of the last stream
        # definition written (see _Transaction).
        self.compressing: set[str] = set()

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError("the write connection is not open")
        return self._conn

    def setup(self) -> None:
        directory = self.directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the storage directory {directory}: {exc.strerror or exc}"
            ) from exc
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StorageError(f"the storage directory {directory} is not writable")
        manifest = read_manifest(directory)
        claims = manifest.streams if manifest is not None else {}
        self._check_file(claims)
        try:
            if claims:
                self._check_claims(claims)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        try:
            self._configure(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._open_error(exc) from exc
            raise
        self._conn = conn
        self._claimed = dict(claims) if manifest is not None else None
        # What was just read may sit in the OS's cache only (a crashed run with
        # sync="os"): make it durable before the manifest claims it.
        self._write_claims(sync_database=True)

    def _check_file(self, claims: dict[str, int]) -> None:
        """Refuse a database file that is certainly damaged, or that is gone while the
        manifest says it held streams (a new or emptied file would open as empty)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size <= 0:
            # Nothing claimed: a new store, or one whose creation was interrupted.
            if claims:
                state = "is missing" if size < 0 else "is empty (0 bytes)"
                raise DamagedStore(
                    f"the database {self.path} {state}, but {MANIFEST_FILENAME} says it held"
                    f" {_describe(claims)}{_repair_hint(self.directory)}"
                )
            return
        problem = database_file_problem(self.path)
        if problem is not None:
            raise DamagedStore(f"the database {self.path} {problem}{_repair_hint(self.directory)}")

    def _open_error(self, exc: sqlite3.Error) -> StorageError:
        if type(exc) is sqlite3.DatabaseError:  # "malformed", "not a database"
            return DamagedStore(
                f"cannot open the database {self.path}: {exc}{_repair_hint(self.directory)}"
            )
        return StorageError(f"cannot open the database {self.path}: {exc}")

    def _check_claims(self, claims: dict[str, int]) -> None:
        """Refuse a database that holds less than the manifest claims. Read-only: a
        refused store is left as it was found (a writing connection would copy what is
        left of the write-ahead log into the database as it closes, and delete it)."""
        conn = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True, isolation_level=None)
        try:
            conn.execute(SQL_BUSY_TIMEOUT)
            problems = compare(claims, held_streams(conn))
        finally:
            conn.close()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DamagedStore(
                f"the store in {self.directory} lost committed data: {problems[0]}{more},"
                f" according to {MANIFEST_FILENAME}; the database or its write-ahead log"
                f" {self.wal_path.name} was deleted, truncated or damaged"
                f"{_repair_hint(self.directory)}"
            )

    def _configure(self, conn: sqlite3.Connection) -> None:
        (mode,) = conn.execute(SQL_JOURNAL_WAL).fetchone()
        if str(mode).lower() != "wal":
            raise StorageError(f"cannot put the database {self.path} in WAL mode (got {mode!r})")
        conn.execute(SQL_SYNCHRONOUS[self.sync])
        conn.execute(SQL_BUSY_TIMEOUT)
        refuse_newer_schema(conn, self.path)
        migrate(conn)
        conn.executescript(SQL_SCHEMA)
        self._held = held_streams(conn)
        self.compressing = {n for n, codec in conn.execute(SQL_COMPRESSING) if compressing(codec)}

    def teardown(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                self.flush_manifest()
            finally:
                conn.close()

    # -- the manifest ------------------------------------------------------------------
    def flush_manifest(self) -> None:
        """Bring the manifest's claims up to the last commit, if they lag behind it."""
        if self.manifest_dirty:
            self._write_claims()

    def _write_claims(self, *, sync_database: bool = False) -> None:
        """Claim what the last commit held. Never raises: on failure the old claims,
        which a durable commit held, stay, and a later call tries again."""
        held = dict(self._held)
        try:
            if self.sync == "os" or sync_database:
                # The commits are written but not necessarily on disk yet.
                fsync_file(self.wal_path)
                if sync_database:
                    fsync_file(self.path)
            write_manifest(self.directory, held)
        except OSError:
            self.manifest_dirty = True
            return
        self._claimed = held
        self.manifest_dirty = False

    def _unclaim(self, stream: str) -> None:
        """Drop ``stream`` from the manifest before the commit that deletes it."""
        claimed = self._claimed
        if claimed is None or stream not in claimed:
            return
        rest = {name: seq for name, seq in claimed.items() if name != stream}
        self.manifest_dirty = True  # the delete may yet fail: then the claim comes back
        try:
            write_manifest(self.directory, rest)
        except OSError:
            try:  # no manifest claims nothing, which is always true
                remove_manifest(self.directory)
            except OSError as exc:
                raise StorageError(
                    f"cannot update {self.directory / MANIFEST_FILENAME} before deleting"
                    f" stream {stream!r}: {exc.strerror or exc}"
                ) from exc
            self._claimed = None
            return
        self._claimed = rest

    def _committed(self, txn: _Transaction) -> None:
        """Account for a transaction that just committed."""
        held = self._held
        for name, exists in txn.streams.items():
            if exists:
                held.setdefault(name, 0)
            else:
                held.pop(name, None)
        for name, seq in txn.last_seqs.items():
            if seq > held.get(name, 0):
                held[name] = seq
        claimed = self._claimed
        if txn.streams and (claimed is None or held.keys() != claimed.keys()):
            self._write_claims()  # a stream was created: claim it before its reply
        elif txn.last_seqs:
            self.manifest_dirty = True

    def commit(self, batches: Sequence[list[Op]]) -> None:
        conn = self.connection
        if not any(batches):
            return  # flush markers only: nothing to write
        try:
            if conn.in_transaction:  # left over by a failed ROLLBACK
                conn.execute(SQL_ROLLBACK)
            conn.execute(SQL_BEGIN)
            txn = _Transaction(conn, self._unclaim, self.compressing)
            for ops in batches:
                txn.apply(ops)
            txn.finish()
            started = time.perf_counter()
            conn.execute(SQL_COMMIT)  # the WAL write, and its fsync with sync="always"
            self.sync_seconds.observe(time.perf_counter() - started)
        except BaseException as exc:
            self._rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise StorageError(
                    f"commit to {self.path} failed and was rolled back: {exc}"
                ) from exc
            raise
        self._committed(txn)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            # If even ROLLBACK fails, the next commit retries it before its BEGIN.
            with contextlib.suppress(sqlite3.Error):
                conn.execute(SQL_ROLLBACK)

    def find_culprits(self, ops: list[Op], error: BaseException) -> list[tuple[int, str]]:
        """The ops that cannot be stored (see ``Isolating``), found by bisection: a run
        of ops is applied in a savepoint of a transaction that is rolled back at the
        end; a run that fails is split in two. Nothing is to blame when the failure is
        not about a value (a full disk, an I/O error, ...)."""
        if not _about_a_value(error):
            return []
        conn = self.connection
        found: list[tuple[int, str]] = []

        def probe(lo: int, hi: int) -> bool:
            """Apply ops[lo:hi], keeping what can be kept; False: give up."""
            conn.execute(SQL_SAVEPOINT)
            try:
                # No manifest bookkeeping; the commit that follows applies the same
                # stream definitions again.
                txn = _Transaction(conn, lambda _stream: None, self.compressing)
                txn.apply(ops[lo:hi])
                txn.finish()
            except Exception as exc:
                conn.execute(SQL_ROLLBACK_TO_SAVEPOINT)
                conn.execute(SQL_RELEASE_SAVEPOINT)
                if not _about_a_value(exc):
                    return False
                if hi - lo == 1:
                    found.append((lo, str(exc)))
                    return True
                mid = (lo + hi) // 2
                return probe(lo, mid) and probe(mid, hi)
            conn.execute(SQL_RELEASE_SAVEPOINT)
            return True

        try:
            if conn.in_transaction:
                conn.execute(SQL_ROLLBACK)
            conn.execute(SQL_BEGIN)
            if not probe(0, len(ops)):
                return []
        except sqlite3.Error:
            return []
        finally:
            self._rollback(conn)
        return found


# sqlite3 errors about a value rather than the database or the disk.
_VALUE_ERRORS = frozenset(
    (
        sqlite3.SQLITE_CONSTRAINT,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_RANGE,
    )
)


def _about_a_value(error: BaseException) -> bool:
    """Whether a failed write is to blame on a value it carried (a number too large
    for an INTEGER, a string that is not UTF-8, ...), not on the store."""
    if isinstance(error, StorageError):
        if not isinstance(error.__cause__, sqlite3.Error):
            return False
        error = error.__cause__
    if isinstance(error, sqlite3.Error):
        if isinstance(error, sqlite3.InterfaceError | sqlite3.ProgrammingError):
            return True  # a parameter it cannot bind
        code = getattr(error, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _VALUE_ERRORS
    return not isinstance(error, OSError | MemoryError)


class _Transaction:
    """Turns ops into statements inside one open transaction, in op order.

    Appends are buffered, as one flat list of parameters, until an op that touches
    messages needs them in place, then written a few hundred rows per statement.
    Consumer states are coalesced (the last one wins) until an op
    that touches consumers needs them in place. Each stream's high-water mark is
    raised once, at the end.

    Every appended row carries its checksum, computed here on the writer thread, over
    the message as sent. The payload of a stream in ``compressing`` is compressed here
    too, when that saves bytes; each stream definition written keeps ``compressing`` up
    to date. A definition whose commit then fails leaves it ahead of the database, which
    costs nothing but the form of some rows: every row says how it is stored.
    ``last_seqs`` and ``streams`` (created: True, deleted: False) tell the writer what
    the transaction changed; ``unclaim(stream)`` runs before a stream is deleted.
    """

    __slots__ = (
        "_compressing",
        "_conn",
        "_packed",
        "_params",
        "_states",
        "_unclaim",
        "last_seqs",
        "streams",
    )

    def __init__(
        self, conn: sqlite3.Connection, unclaim: Callable[[str], None], compressing: set[str]
    ) -> None:
        self._conn = conn
        self._compressing = compressing
        self._params: list[str | int | bytes | bytearray] = []  # APPEND_COLUMNS per buffered row
        self._packed: list[str | int | bytes | bytearray] = []  # PACKED_COLUMNS per row
        self._states: dict[tuple[str, str], bytes] = {}
        self._unclaim = unclaim
        self.last_seqs: dict[str, int] = {}
        self.streams: dict[str, bool] = {}

    def apply(self, ops: list[Op]) -> None:
        conn, params, last_seqs = self._conn, self._params, self.last_seqs
        # The stream whose checksum seed is ``seed``, and whether it compresses.
        seed_of, seed, squeeze = "", 0, False
        for op in ops:
            if op[0] == APPEND:
                stream, m = op[1], op[2]
                if stream != seed_of:
                    seed_of, seed = stream, stream_seed(stream)
                    squeeze = stream in self._compressing
                # checksum(), inlined: this runs for every message published.
                seq, ts, priority, headers, data = m.seq, m.ts, m.priority, m.headers, m.data
                s = m.subject.encode()
                crc = crc32(s, crc32(head(seq, ts, priority, len(s), len(headers)), seed))
                if headers:
                    crc = crc32(headers, crc)
                packed = compress(data) if squeeze else None
                if packed is None:
                    params += (
                        stream,
                        seq,
                        m.subject,
                        _blob(headers),
                        _blob(data),
                        ts,
                        priority,
                        crc32(data, crc),
                    )
                else:
                    self._packed += (
                        stream,
                        seq,
                        m.subject,
                        _blob(headers),
                        _blob(packed),
                        ts,
                        priority,
                        crc32(data, crc),
                        len(data),
                    )
                if seq > last_seqs.get(stream, 0):
                    last_seqs[stream] = seq
            elif op[0] == PUT_CONSUMER_STATE:
                self._states[(op[1], op[2])] = op[3]
            elif op[0] == DELETE_MESSAGES:
                self._flush_rows()
                stream = op[1]
                conn.executemany(SQL_DELETE_MESSAGE, [(stream, seq) for seq in op[2]])
            elif op[0] == DELETE_RANGE:
                self._flush_rows()
                conn.execute(SQL_DELETE_RANGE, (op[1], op[2], op[3]))
            elif op[0] == PUT_STREAM:
                record = op[1]
                conn.execute(
                    SQL_PUT_STREAM,
                    (record.name, record.config, record.created_ns, record.compression),
                )
                self.streams[record.name] = True
                if compressing(record.compression):
                    self._compressing.add(record.name)
                else:
                    self._compressing.discard(record.name)
                seed_of = ""  # the next append looks its stream up again
            elif op[0] == DELETE_STREAM:
                self._flush_rows()
                self._flush_states()
                stream = op[1]
                self._unclaim(stream)
                self.streams[stream] = False
                self._compressing.discard(stream)
                seed_of = ""
                last_seqs.pop(stream, None)  # the high-water mark goes with the stream
                for sql in SQL_DELETE_STREAM:
                    conn.execute(sql, (stream,))
            elif op[0] == PUT_CONSUMER:
                self._flush_states()
                c = op[1]
                conn.execute(SQL_PUT_CONSUMER, (c.stream, c.name, c.config, c.state, c.created_ns))
            elif op[0] == DELETE_CONSUMER:
                self._flush_states()
                conn.execute(SQL_DELETE_CONSUMER, (op[1], op[2]))

    def finish(self) -> None:
        """Write what is still buffered (the caller then commits)."""
        self._flush_rows()
        self._flush_states()
        if self.last_seqs:
            self._conn.executemany(SQL_RAISE_LAST_SEQ, self.last_seqs.items())

    def _flush_rows(self) -> None:
        if self._params:
            self._insert(self._params, APPEND_COLUMNS, sql_append_rows)
        if self._packed:
            self._insert(self._packed, PACKED_COLUMNS, sql_append_packed_rows)

    def _insert(
        self,
        params: list[str | int | bytes | bytearray],
        columns: int,
        sql: Callable[[int], str],
    ) -> None:
        execute = self._conn.execute
        left = len(params) // columns
        start = 0
        while left:
            rows = APPEND_ROWS_MAX if left >= APPEND_ROWS_MAX else 1 << (left.bit_length() - 1)
            end = start + rows * columns
            execute(sql(rows), params[start:end])
            start = end
            left -= rows
        params.clear()

    def _flush_states(self) -> None:
        if self._states:
            self._conn.executemany(
                SQL_PUT_CONSUMER_STATE,
                [(state, stream, name) for (stream, name), state in self._states.items()],
            )
            self._states.clear()


# -- reads (on the reader threads) ------------------------------------------------------
# Rows come back as (seq, subject, headers, data, ts, priority, crc), ``data``
# decompressed. Each is checked against its checksum (of the message as sent) before
# anything of it is returned: a damaged message raises CorruptMessage, it is never
# served as content.

Row = tuple[int, str, bytes, bytes, int, int, int]


def _plain(packed: object, size: object) -> bytes | None:
    """SQL ``tether_plain(data, plain_size)``: a compressed payload decompressed, or
    NULL when it does not decompress to ``size`` bytes (damage, which the checksum
    then reports: raising would fail the whole statement)."""
    try:
        return decompress(packed, size)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return None


def _damage_hint(path: Path) -> str:
    return (
        f" in {path}; `tether store check --store sqlite:{path.parent}` lists the damage,"
        " `tether store repair` keeps what is intact"
    )


# A damaged row may even hold values of the wrong type (a TEXT where a BLOB was, a
# NULL for a compressed payload that does not decompress).
_WRONG_TYPE = (TypeError, AttributeError, ValueError, struct.error)


def _verified(stream: str, rows: Sequence[Row], path: Path) -> list[StoredMessage]:
    """The messages of ``rows``, each checked against its checksum (inlined
    :func:`~tether.storage.checksum.checksum`: this runs for every message read)."""
    seed = stream_seed(stream)
    out: list[StoredMessage] = []
    add = out.append
    seq = 0
    try:
        for seq, subject, headers, data, ts, priority, crc in rows:
            s = subject.encode()
            c = crc32(s, crc32(head(seq, ts, priority, len(s), len(headers)), seed))
            if headers:
                c = crc32(headers, c)
            if crc32(data, c) != crc:
                raise CorruptMessage(stream, seq, _damage_hint(path))
            add(StoredMessage(seq, subject, headers, data, ts, priority))
    except _WRONG_TYPE:
        raise CorruptMessage(stream, seq, _damage_hint(path)) from None
    return out


def _check_rows(stream: str, rows: list[Row], path: Path) -> None:
    """Raise CorruptMessage for the first of ``rows`` that does not match its checksum."""
    seed = stream_seed(stream)
    seq = 0
    try:
        for seq, subject, headers, data, ts, priority, crc in rows:
            s = subject.encode()
            c = crc32(s, crc32(head(seq, ts, priority, len(s), len(headers)), seed))
            if headers:
                c = crc32(headers, c)
            if crc32(data, c) != crc:
                raise CorruptMessage(stream, seq, _damage_hint(path))
    except _WRONG_TYPE:
        raise CorruptMessage(stream, seq, _damage_hint(path)) from None


def _read(conn: sqlite3.Connection, path: Path, stream: str, seq: int) -> StoredMessage | None:
    row = conn.execute(SQL_READ, (stream, seq)).fetchone()
    return None if row is None else _verified(stream, (row,), path)[0]


def _read_range(
    conn: sqlite3.Connection,
    path: Path,
    stream: str,
    start_seq: int,
    limit: int,
    max_bytes: int,
) -> list[StoredMessage]:
    # Rows are fetched before they are verified: a statement left open by an error
    # would hold its read transaction, and this connection's later reads would see
    # that old snapshot.
    cursor = conn.execute(SQL_READ_RANGE, (stream, start_seq, limit))
    if max_bytes <= 0:
        return _verified(stream, cursor.fetchall(), path)
    rows: list[Row] = []
    total = 0
    try:
        for row in cursor:
            total += len(row[1]) + len(row[2]) + len(row[3] or b"") + 16
            if rows and total > max_bytes:
                break
            rows.append(row)
    finally:
        cursor.close()  # stop the statement early rather than stepping it to the end
    return _verified(stream, rows, path)


def _read_columns(
    conn: sqlite3.Connection,
    path: Path,
    stream: str,
    start_seq: int,
    last_seq: int,
    limit: int,
) -> MessageColumns:
    # fetchall builds the row tuples in C, zip turns them into columns: no Python
    # frame per row but the checksum's.
    rows = conn.execute(SQL_READ_ROWS, (stream, start_seq, last_seq, limit)).fetchall()
    if not rows:
        return MessageColumns([], [], [], [], [])
    _check_rows(stream, rows, path)
    seqs, subjects, headers, data, stamps, _, _ = map(list, zip(*rows, strict=True))
    return MessageColumns(seqs, subjects, headers, data, stamps)


def _read_many(
    conn: sqlite3.Connection, path: Path, stream: str, seqs: Sequence[int]
) -> list[StoredMessage]:
    wanted = msgspec.json.encode(list(seqs)).decode()
    return _verified(stream, conn.execute(SQL_READ_MANY, (stream, wanted)).fetchall(), path)


def _load_index(conn: sqlite3.Connection, stream: str, sizing: Sizing) -> list[MessageMeta]:
    rows = conn.execute(SQL_LOAD_INDEX, (stream, sizing.plain, sizing.headers))
    return [MessageMeta(*row) for row in rows]


def _load_streams(conn: sqlite3.Connection) -> list[StreamRecord]:
    return [StreamRecord(*row) for row in conn.execute(SQL_LOAD_STREAMS)]


def _load_consumers(conn: sqlite3.Connection, stream: str) -> list[ConsumerRecord]:
    return [ConsumerRecord(*row) for row in conn.execute(SQL_LOAD_CONSUMERS, (stream,))]


def _load_last_seq(conn: sqlite3.Connection, stream: str) -> int:
    row = conn.execute(SQL_LOAD_LAST_SEQ, (stream,)).fetchone()
    return 0 if row is None else int(row[0])


# -- the store --------------------------------------------------------------------------


def _flush_manifest(writer: _Writer) -> None:
    writer.flush_manifest()


def _ignore_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a failure is retried by the next refresh


class SqliteStore(ThreadedStore[_Writer, sqlite3.Connection]):
    """A durable store in ``directory/tether.db`` (the directory is created if missing).

    ``sync="always"`` fsyncs every group commit; ``sync="os"`` leaves flushing to the
    OS (durable across a process crash, not a power loss). ``cache_bytes`` bounds the
    cache behind :meth:`cached` (0 disables it).

    Next to the database, ``tether.manifest`` records the streams and their last
    sequences (see manifest.py): at once when streams are created or deleted, else
    at most every ``manifest_interval`` seconds while messages are appended, and when
    the store closes. :meth:`open` refuses a store that holds less than it claims,
    with a :class:`DamagedStore` error.
    """

    name = "sqlite"

    def __init__(
        self,
        directory: str | Path,
        sync: Literal["always", "os"] = "always",
        cache_bytes: int = 64 * MiB,
        manifest_interval: float = 0.2,
    ) -> None:
        if sync not in ("always", "os"):
            raise ValueError(f"sync must be 'always' or 'os', not {sync!r}")
        self.directory = Path(directory).absolute()
        self.path = self.directory / DB_FILENAME
        self.sync: Literal["always", "os"] = sync
        self._writer = _Writer(self.path, sync)
        super().__init__(self._writer, cache_bytes)
        self._manifest_interval = manifest_interval
        self._manifest_timer: asyncio.TimerHandle | None = None

    def _closed(self) -> None:
        if self._manifest_timer is not None:
            self._manifest_timer.cancel()  # the writer brings it up to date as it stops
            self._manifest_timer = None

    def call_in_writer(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``fn(write_connection)`` on the writer thread, between two commits.

        For maintenance (checkpoints, pragmas) and tests; ``fn`` must not leave a
        transaction open.
        """
        return self._committer.call(lambda writer: fn(writer.connection))

    # -- group commit ----------------------------------------------------------------
    def _settle(self, results: list[Settled]) -> None:
        super()._settle(results)
        if self._writer.manifest_dirty and self._manifest_timer is None and self._state == "open":
            self._manifest_timer = asyncio.get_running_loop().call_later(
                self._manifest_interval, self._refresh_manifest
            )

    def _refresh_manifest(self) -> None:
        """Have the writer bring the manifest up to date, between two commits."""
        self._manifest_timer = None
        if self._state != "open":
            return
        try:
            done = self._committer.call(_flush_manifest)
        except StorageError:
            return  # the writer is stopping: it brings the manifest up to date itself
        done.add_done_callback(_ignore_outcome)

    # -- reads -----------------------------------------------------------------------
    def _in_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._connect_reader()
            return fn(conn)
        except sqlite3.Error as exc:
            raise StorageError(f"reading {self.path} failed: {exc}") from exc

    def _connect_reader(self) -> sqlite3.Connection:
        uri = self.path.as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self._keep_reader(conn)
        conn.execute(SQL_BUSY_TIMEOUT)
        conn.create_function("tether_plain", 2, _plain, deterministic=True)
        return conn

    def stats(self) -> StoreStats:
        """Commit sizes and latencies, and the COMMIT statement's time (for /metrics)."""
        stats = self._committer.stats
        return StoreStats(stats.commit_ops, stats.commit_seconds, self._writer.sync_seconds)

    def disk_bytes(self) -> int:
        """Bytes of the store's files (database, WAL, manifest)."""
        return disk_bytes(self.directory)

    async def load_streams(self) -> list[StreamRecord]:
        return await self._run_read(_load_streams)

    async def load_index(self, stream: str, sizing: Sizing = MEMORY_SIZING) -> list[MessageMeta]:
        return await self._run_read(lambda conn: _load_index(conn, stream, sizing))

    async def load_consumers(self, stream: str) -> list[ConsumerRecord]:
        return await self._run_read(lambda conn: _load_consumers(conn, stream))

    async def load_last_seq(self, stream: str) -> int:
        return await self._run_read(lambda conn: _load_last_seq(conn, stream))

    async def read(self, stream: str, seq: int) -> StoredMessage | None:
        hit = self.cached(stream, seq)
        if hit is not None:
            return hit
        return await self._run_read(lambda conn: _read(conn, self.path, stream, seq))

    async def read_range(
        self, stream: str, start_seq: int, limit: int, max_bytes: int = 0
    ) -> list[StoredMessage]:
        if limit <= 0:
            return []
        return await self._run_read(
            lambda conn: _read_range(conn, self.path, stream, start_seq, limit, max_bytes)
        )

    async def read_columns(
        self, stream: str, start_seq: int, last_seq: int, limit: int
    ) -> MessageColumns:
        if limit <= 0 or last_seq < start_seq:
            return MessageColumns([], [], [], [], [])
        return await self._run_read(
            lambda conn: _read_columns(conn, self.path, stream, start_seq, last_seq, limit)
        )

    async def read_many(self, stream: str, seqs: Sequence[int]) -> list[StoredMessage]:
        if not seqs:
            return []
        wanted = sorted(set(seqs))
        hits = self._all_cached(stream, wanted)
        if hits is not None:
            return hits
        return await self._run_read(lambda conn: _read_many(conn, self.path, stream, wanted))
