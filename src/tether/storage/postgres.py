"""The PostgreSQL backend: Tether's tables in a database the operator already runs.

* Writes: one dedicated writer thread owns the only write connection (psycopg 3,
  blocking calls, so the event loop never waits on the network) and commits each group
  commit, with whatever queued up behind it, in **one transaction**. Runs of appends go
  in with ``COPY ... (FORMAT BINARY)``. Durability is PostgreSQL's: a commit is
  confirmed when PostgreSQL says COMMIT, which with ``synchronous_commit = on`` means
  flushed to its WAL (and, with synchronous standbys, to them) — see docs/deployment.md.
* Fencing: a store given an ``epoch`` checks, inside every transaction, that the leader
  row still holds that epoch (``SELECT ... FOR SHARE``). A node that takes over raises
  the epoch with an UPDATE, which waits for a commit in progress; from then on every
  commit of the former leader fails with :class:`Fenced` and nothing of it is written.
* Reads: a two-thread pool, each thread with its own connection.
* ``cached()``: the same byte-bounded cache of committed messages as the SQLite store.
* ``/metrics``: the writer times every COMMIT round trip (the durability point: the
  answer comes once PostgreSQL has made the transaction as durable as its
  ``synchronous_commit`` says); the size of Tether's tables is read on a reader
  thread at most every few seconds, never by the event loop (:meth:`disk_bytes`).
* Schema: created and migrated by Tether from the versioned ``migrations/*.sql`` files
  shipped with it, in one transaction under an advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from tether.storage.base import (
    MEMORY_SIZING,
    ConsumerRecord,
    CorruptMessage,
    MessageColumns,
    MessageMeta,
    Sizing,
    StorageError,
    StoredMessage,
    StreamRecord,
)
from tether.storage.cache import MiB
from tether.storage.checksum import crc32, head, stream_seed
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
)
from tether.storage.stats import LATENCY_BUCKETS, Histogram, StoreStats
from tether.storage.threaded import ThreadedStore

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "MIGRATION_LOCK",
    "Fenced",
    "PostgresStore",
    "connect",
    "migrate",
    "redact",
    "require_psycopg",
]

T = TypeVar("T")

EXTRA_HINT = "pip install 'tether[postgres]'"
# Advisory lock keys (one 64-bit key space per database): migrations, and leadership.
MIGRATION_LOCK = 0x7E7E_0001
LEADER_LOCK = 0x7E7E_0002
CONNECT_TIMEOUT = 10  # seconds


class Fenced(StorageError):
    """Another node became active: this one's epoch is not the leader row's any more."""

    def __init__(self, mine: int, current: int | None) -> None:
        self.mine = mine
        self.current = current
        super().__init__(
            f"this node was fenced off: it is active for epoch {mine}, but the database's"
            f" leader row holds epoch {current} (another node took over); nothing of the"
            " commit was written"
        )


def require_psycopg() -> Any:
    """The psycopg module, or a :class:`StorageError` naming the extra to install."""
    try:
        import psycopg
    except ImportError as exc:
        raise StorageError(
            f"the PostgreSQL store needs psycopg 3, which is not installed: {EXTRA_HINT}"
        ) from exc
    return psycopg


_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def redact(url: str) -> str:
    """``url`` without its password, fit for logs and errors."""
    return _PASSWORD.sub(r"\1***@", url)


def connect(url: str, *, keepalive: float = 5.0, **options: Any) -> psycopg.Connection[Any]:
    """An autocommit connection to ``url`` whose TCP keepalives (both sides) notice a
    dead peer within about ``keepalive`` * 2 seconds."""
    pg = require_psycopg()
    idle = max(1, int(keepalive))
    interval = max(1, idle // 2)
    server_side = (
        f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval}"
        " -c tcp_keepalives_count=2"
    )
    extra = options.pop("options", "")
    try:
        conn: psycopg.Connection[Any] = pg.connect(
            url,
            autocommit=True,
            application_name=options.pop("application_name", "tether"),
            connect_timeout=CONNECT_TIMEOUT,
            keepalives=1,
            keepalives_idle=idle,
            keepalives_interval=interval,
            keepalives_count=2,
            options=f"{server_side} {extra}".strip(),
            **options,
        )
    except pg.Error as exc:
        raise StorageError(f"cannot connect to PostgreSQL at {redact(url)}: {exc}") from exc
    return conn


# -- migrations -------------------------------------------------------------------------

SQL_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS tether_schema (version integer NOT NULL)"
SQL_VERSION = "SELECT max(version) FROM tether_schema"
SQL_SET_VERSION = "INSERT INTO tether_schema (version) VALUES (%s)"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """The shipped migrations, ``(version, file name, SQL)``, in version order."""
    folder = importlib.resources.files("tether.storage") / "migrations"
    found = []
    for entry in folder.iterdir():
        m = _MIGRATION_NAME.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort()
    return found


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema up to the newest shipped migration, in one transaction, under
    an advisory lock (nodes starting together migrate once). Returns the version."""
    known = migrations()
    newest = known[-1][0] if known else 0
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(SQL_VERSION_TABLE)
        row = conn.execute(SQL_VERSION).fetchone()
        version = int(row[0]) if row and row[0] is not None else 0
        if version > newest:
            raise StorageError(
                f"the database has Tether schema version {version}, newer than this version"
                f" of tether supports ({newest})"
            )
        for number, _name, sql in known:
            if number > version:
                conn.execute(sql.encode())
                conn.execute(SQL_SET_VERSION, (number,))
                version = number
    return version


# -- SQL --------------------------------------------------------------------------------

SQL_FENCE = "SELECT epoch FROM tether_leader WHERE id = 1 FOR SHARE"
SQL_PUT_STREAM = (
    "INSERT INTO tether_streams (name, config, created_ns, compression) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
    " created_ns = excluded.created_ns, compression = excluded.compression"
)
SQL_COMPRESSING = "SELECT name, compression FROM tether_streams"
SQL_DELETE_STREAM = (
    "DELETE FROM tether_streams WHERE name = %s",
    "DELETE FROM tether_messages WHERE stream = %s",
    "DELETE FROM tether_consumers WHERE stream = %s",
    "DELETE FROM tether_stream_seq WHERE stream = %s",
)
# An append's seq is above every earlier one of its stream, so rows at or above the
# first of a run can only be left from a commit whose outcome was lost (the connection
# broke during COMMIT): the run replaces them.
SQL_CLEAR_FROM = "DELETE FROM tether_messages WHERE stream = %s AND seq >= %s"
SQL_COPY_MESSAGES = (
    "COPY tether_messages (stream, seq, subject, headers, data, ts, priority, crc)"
    " FROM STDIN (FORMAT BINARY)"
)
COPY_TYPES = ["text", "int8", "text", "bytea", "bytea", "int8", "int4", "int8"]
# Rows with a compressed payload go in with a COPY of their own, with ``plain_size``:
# the rows of every other stream carry no more than before compression existed.
SQL_COPY_PACKED = (
    "COPY tether_messages (stream, seq, subject, headers, data, ts, priority, crc, plain_size)"
    " FROM STDIN (FORMAT BINARY)"
)
PACKED_TYPES = [*COPY_TYPES, "int8"]
SQL_RAISE_LAST_SEQ = (
    "INSERT INTO tether_stream_seq (stream, last_seq) VALUES (%s, %s)"
    " ON CONFLICT (stream) DO UPDATE"
    " SET last_seq = greatest(tether_stream_seq.last_seq, excluded.last_seq)"
)
SQL_DELETE_MESSAGES = "DELETE FROM tether_messages WHERE stream = %s AND seq = ANY(%s)"
SQL_DELETE_RANGE = "DELETE FROM tether_messages WHERE stream = %s AND seq BETWEEN %s AND %s"
SQL_PUT_CONSUMER = (
    "INSERT INTO tether_consumers (stream, name, config, state, created_ns)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (stream, name) DO UPDATE"
    " SET config = excluded.config, state = excluded.state, created_ns = excluded.created_ns"
)
SQL_PUT_CONSUMER_STATE = "UPDATE tether_consumers SET state = %s WHERE stream = %s AND name = %s"
SQL_DELETE_CONSUMER = "DELETE FROM tether_consumers WHERE stream = %s AND name = %s"

SQL_LOAD_STREAMS = "SELECT name, config, created_ns, compression FROM tether_streams ORDER BY name"
SQL_LOAD_CONSUMERS = (
    "SELECT stream, name, config, state, created_ns FROM tether_consumers"
    " WHERE stream = %s ORDER BY name"
)
SQL_LOAD_LAST_SEQ = "SELECT last_seq FROM tether_stream_seq WHERE stream = %s"
# The parameters: the stream's overhead per message with and without headers (Sizing),
# twice, then the stream. A compressed payload counts its plain size.
_OVERHEAD = "CASE WHEN octet_length(headers) > 0 THEN %s ELSE %s END"
SQL_LOAD_INDEX = (
    "SELECT seq, subject, octet_length(subject) + octet_length(headers)"
    f" + coalesce(plain_size, octet_length(data)) + {_OVERHEAD}, ts, priority, {_OVERHEAD}"
    " FROM tether_messages WHERE stream = %s ORDER BY seq"
)
_COLUMNS = "seq, subject, headers, data, ts, priority, crc, plain_size"
SQL_READ = f"SELECT {_COLUMNS} FROM tether_messages WHERE stream = %s AND seq = %s"
SQL_READ_RANGE = (
    f"SELECT {_COLUMNS} FROM tether_messages WHERE stream = %s AND seq >= %s ORDER BY seq LIMIT %s"
)
SQL_READ_ROWS = (
    f"SELECT {_COLUMNS} FROM tether_messages"
    " WHERE stream = %s AND seq BETWEEN %s AND %s ORDER BY seq LIMIT %s"
)
SQL_READ_MANY = (
    f"SELECT {_COLUMNS} FROM tether_messages WHERE stream = %s AND seq = ANY(%s) ORDER BY seq"
)
# The store's size: every table of Tether's with its indexes and TOAST, found through
# the connection's search_path as the other statements find them (a missing one: NULL,
# which sum() skips).
TABLES = (
    "tether_schema",
    "tether_streams",
    "tether_stream_seq",
    "tether_messages",
    "tether_consumers",
    "tether_leader",
)
SQL_TABLE_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)::int8"
    " FROM unnest(%s::text[]) AS t"
)
# Seconds a size read stays good: scrapes every second cost one query per this many.
SIZE_MAX_AGE = 5.0


# -- the writer -------------------------------------------------------------------------


class _Writer:
    """The write connection and how a batch of ops becomes one transaction (on the
    writer thread only). A broken connection fails the commit in progress and is
    opened again by the next one."""

    def __init__(
        self,
        url: str,
        epoch: int | None,
        synchronous_commit: str | None,
        keepalive: float,
        on_fenced: Callable[[Fenced], None],
        options: str = "",
    ) -> None:
        self.url = url
        self.options = options
        self.epoch = epoch
        self.synchronous_commit = synchronous_commit
        self.keepalive = keepalive
        self._on_fenced = on_fenced
        self._conn: psycopg.Connection[Any] | None = None
        self.fenced: Fenced | None = None
        # The streams whose payloads are stored compressed (see _Transaction).
        self.compressing: set[str] = set()
        self.sync_seconds = Histogram(LATENCY_BUCKETS)  # the COMMIT round trip alone

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect(
            self.url,
            keepalive=self.keepalive,
            application_name="tether-writer",
            options=self.options,
        )
        if self.synchronous_commit:
            conn.execute(
                "SELECT set_config('synchronous_commit', %s, false)", (self.synchronous_commit,)
            )
        return conn

    def setup(self) -> None:
        conn = self.connection
        pg = require_psycopg()
        try:
            migrate(conn)
            self.compressing = {
                name
                for name, codec in conn.execute(SQL_COMPRESSING).fetchall()
                if compressing(codec)
            }
        except BaseException as exc:
            self._drop()  # no teardown follows a failed setup
            if isinstance(exc, pg.Error):
                raise StorageError(
                    f"cannot create Tether's tables in {redact(self.url)}: {exc}"
                ) from exc
            raise

    def teardown(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def commit(self, batches: Sequence[list[Op]]) -> None:
        if self.fenced is not None:
            raise self.fenced
        if not any(batches):
            return
        psycopg = require_psycopg()
        try:
            conn = self.connection
            with conn.transaction():
                if self.epoch is not None:
                    row = conn.execute(SQL_FENCE).fetchone()
                    current = None if row is None else int(row[0])
                    if current != self.epoch:
                        raise Fenced(self.epoch, current)
                txn = _Transaction(conn, self.compressing)
                for ops in batches:
                    txn.apply(ops)
                txn.finish()
                started = time.perf_counter()
            # Leaving the block sent COMMIT and waited for PostgreSQL's answer: the
            # durability point (its WAL flush, and standbys', per synchronous_commit).
            self.sync_seconds.observe(time.perf_counter() - started)
        except Fenced as fenced:
            self.fenced = fenced
            self._on_fenced(fenced)
            raise
        except psycopg.OperationalError as exc:
            # The connection is gone (PostgreSQL restarted, the network broke): the
            # commit is reported failed; the next one connects again.
            self._drop()
            raise StorageError(
                f"commit to PostgreSQL at {redact(self.url)} failed, nothing was confirmed: {exc}"
            ) from exc
        except psycopg.Error as exc:
            if self._conn is not None and self._conn.broken:
                self._drop()
            raise StorageError(
                f"commit to PostgreSQL at {redact(self.url)} failed and was rolled back: {exc}"
            ) from exc

    def find_culprits(self, ops: list[Op], error: BaseException) -> list[tuple[int, str]]:
        """The ops that cannot be stored (see ``Isolating``), found by bisection: runs of
        ops are applied in savepoints of a transaction that is always rolled back; a
        run that fails on a value is split in two. Nothing is to blame when the failure
        is not about a value (a lost connection, fencing, a full disk)."""
        if not _about_a_value(error):
            return []
        found: list[tuple[int, str]] = []
        pg = require_psycopg()

        def probe(conn: psycopg.Connection[Any], lo: int, hi: int) -> bool:
            """Apply ops[lo:hi] in a savepoint; False: give up."""
            try:
                with conn.transaction():
                    txn = _Transaction(conn, self.compressing)
                    txn.apply(ops[lo:hi])
                    txn.finish()
            except Exception as exc:
                if not _about_a_value(exc):
                    return False
                if hi - lo == 1:
                    found.append((lo, _reason(exc)))
                    return True
                mid = (lo + hi) // 2
                return probe(conn, lo, mid) and probe(conn, mid, hi)
            return True

        try:
            conn = self.connection
            with conn.transaction(force_rollback=True):
                if not probe(conn, 0, len(ops)):
                    return []
        except (pg.Error, StorageError):
            return []
        return found

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _about_a_value(error: BaseException) -> bool:
    """Whether a failed write is to blame on a value it carried (a subject PostgreSQL's
    text cannot hold, a number too large for its column), not on the store."""
    if isinstance(error, Fenced):
        return False
    if isinstance(error, StorageError):
        if error.__cause__ is None:
            return False
        error = error.__cause__
    pg = require_psycopg()
    if isinstance(error, pg.Error):
        return isinstance(error, pg.DataError)
    return isinstance(error, UnicodeError | OverflowError | ValueError | TypeError)


def _reason(error: BaseException) -> str:
    """An error's first line (PostgreSQL adds a CONTEXT line)."""
    return str(error).split("\n", 1)[0]


class _Transaction:
    """Turns ops into statements inside one open transaction, in op order.

    Appends are buffered until an op that touches messages needs them in place, then
    written with one COPY; consumer states are coalesced (the last one wins) until an
    op that touches consumers needs them in place; each stream's high-water mark is
    raised once, at the end. Every row carries its checksum, computed here over the
    message as sent. The payload of a stream in ``compressing`` is compressed here too,
    when that saves bytes; each stream definition written keeps ``compressing`` up to
    date (one whose commit fails leaves it ahead, which only changes the form of some
    rows: every row says how it is stored).
    """

    __slots__ = ("_compressing", "_conn", "_first", "_packed", "_rows", "_states", "last_seqs")

    def __init__(self, conn: psycopg.Connection[Any], compressing: set[str]) -> None:
        self._conn = conn
        self._compressing = compressing
        self._rows: list[tuple[str, int, str, bytes, bytes, int, int, int]] = []
        self._packed: list[tuple[str, int, str, bytes, bytes, int, int, int, int]] = []
        self._first: dict[str, int] = {}  # stream -> first seq buffered
        self._states: dict[tuple[str, str], bytes] = {}
        self.last_seqs: dict[str, int] = {}

    def apply(self, ops: list[Op]) -> None:
        conn, rows, last_seqs, first = self._conn, self._rows, self.last_seqs, self._first
        seed_of, seed, squeeze = "", 0, False
        for op in ops:
            if op[0] == APPEND:
                stream, m = op[1], op[2]
                if stream != seed_of:
                    seed_of, seed = stream, stream_seed(stream)
                    squeeze = stream in self._compressing
                seq, ts, priority, headers, data = m.seq, m.ts, m.priority, m.headers, m.data
                s = m.subject.encode()
                crc = crc32(s, crc32(head(seq, ts, priority, len(s), len(headers)), seed))
                if headers:
                    crc = crc32(headers, crc)
                packed = compress(data) if squeeze else None
                if packed is None:
                    rows.append(
                        (stream, seq, m.subject, headers, data, ts, priority, crc32(data, crc))
                    )
                else:
                    crc, plain_size = crc32(data, crc), len(data)
                    self._packed.append(
                        (stream, seq, m.subject, headers, packed, ts, priority, crc, plain_size)
                    )
                if stream not in first:
                    first[stream] = seq
                if seq > last_seqs.get(stream, 0):
                    last_seqs[stream] = seq
            elif op[0] == PUT_CONSUMER_STATE:
                self._states[(op[1], op[2])] = op[3]
            elif op[0] == DELETE_MESSAGES:
                self._flush_rows()
                conn.execute(SQL_DELETE_MESSAGES, (op[1], list(op[2])))
            elif op[0] == DELETE_RANGE:
                self._flush_rows()
                conn.execute(SQL_DELETE_RANGE, (op[1], op[2], op[3]))
            elif op[0] == PUT_STREAM:
                r = op[1]
                conn.execute(SQL_PUT_STREAM, (r.name, r.config, r.created_ns, r.compression))
                if compressing(r.compression):
                    self._compressing.add(r.name)
                else:
                    self._compressing.discard(r.name)
                seed_of = ""  # the next append looks its stream up again
            elif op[0] == DELETE_STREAM:
                self._flush_rows()
                self._flush_states()
                stream = op[1]
                last_seqs.pop(stream, None)  # the high-water mark goes with the stream
                self._compressing.discard(stream)
                seed_of = ""
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
        self._flush_rows()
        self._flush_states()
        if self.last_seqs:
            with self._conn.cursor() as cur:
                cur.executemany(SQL_RAISE_LAST_SEQ, list(self.last_seqs.items()))

    def _flush_rows(self) -> None:
        rows, packed = self._rows, self._packed
        if not rows and not packed:
            return
        with self._conn.cursor() as cur:
            for stream, seq in self._first.items():
                cur.execute(SQL_CLEAR_FROM, (stream, seq))
            if rows:
                _copy(cur, SQL_COPY_MESSAGES, COPY_TYPES, rows)
            if packed:
                _copy(cur, SQL_COPY_PACKED, PACKED_TYPES, packed)
        rows.clear()
        packed.clear()
        self._first.clear()

    def _flush_states(self) -> None:
        if self._states:
            with self._conn.cursor() as cur:
                cur.executemany(
                    SQL_PUT_CONSUMER_STATE,
                    [(state, stream, name) for (stream, name), state in self._states.items()],
                )
            self._states.clear()


# -- reads ------------------------------------------------------------------------------

# The end of a damaged message's error line: where it is and what to do about it.
DAMAGED_HINT = (
    " in the PostgreSQL store; `tether store check` with its URL lists the damage,"
    " `tether store repair` deletes it"
)

# (seq, subject, headers, data, ts, priority, crc, plain_size): a row whose plain_size
# is not NULL holds its payload compressed.
Row = tuple[int, str, bytes, bytes, int, int, int, int | None]


def _verified(stream: str, rows: Sequence[Row]) -> list[StoredMessage]:
    """The messages of ``rows`` (payloads decompressed), each checked against its
    checksum."""
    seed = stream_seed(stream)
    out: list[StoredMessage] = []
    add = out.append
    for seq, subject, headers, data, ts, priority, crc, plain_size in rows:
        if plain_size is not None:
            try:
                data = decompress(data, plain_size)
            except ValueError:
                raise CorruptMessage(stream, seq, DAMAGED_HINT) from None
        s = subject.encode()
        c = crc32(s, crc32(head(seq, ts, priority, len(s), len(headers)), seed))
        if headers:
            c = crc32(headers, c)
        if crc32(data, c) != crc:
            raise CorruptMessage(stream, seq, DAMAGED_HINT)
        add(StoredMessage(seq, subject, headers, data, ts, priority))
    return out


def _rows(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[Row]:
    # Binary results: bytea arrives as bytes, with no hex to decode.
    rows: list[Row] = conn.execute(sql, params, binary=True).fetchall()
    return rows


# -- the store --------------------------------------------------------------------------


class PostgresStore(ThreadedStore[_Writer, "psycopg.Connection[Any]"]):
    """A durable store in a PostgreSQL database (``postgresql://user:pass@host/db``).

    ``epoch``: the fencing epoch this node was given when it became active (see
    tether.storage.leadership); every commit checks it, and the first that finds
    another one fails with :class:`Fenced` and calls ``on_fenced`` on the event loop.
    None (tools, tests) checks nothing. ``synchronous_commit`` overrides PostgreSQL's
    setting for the write connection (None keeps the server's); ``writer_options``
    are server settings for it (``-c name=value ...``).
    """

    name = "postgres"

    def __init__(
        self,
        url: str,
        *,
        epoch: int | None = None,
        on_fenced: Callable[[Fenced], None] | None = None,
        synchronous_commit: str | None = None,
        keepalive: float = 5.0,
        writer_options: str = "",
        cache_bytes: int = 64 * MiB,
    ) -> None:
        require_psycopg()
        self.url = url
        self.keepalive = keepalive
        self._on_fenced = on_fenced
        self._writer = _Writer(
            url, epoch, synchronous_commit, keepalive, self._fenced_in_writer, writer_options
        )
        super().__init__(self._writer, cache_bytes)
        # The size of Tether's tables, for /metrics: None until first read; written by
        # a reader thread (whole-value assignments), read by the event loop.
        self._size: int | None = None
        self._size_read_at = -SIZE_MAX_AGE
        self._size_reading = False

    @property
    def fenced(self) -> Fenced | None:
        return self._writer.fenced

    # -- measurements ----------------------------------------------------------------
    def stats(self) -> StoreStats:
        """Commit sizes and latencies, and the COMMIT round trip's time (for /metrics)."""
        stats = self._committer.stats
        return StoreStats(stats.commit_ops, stats.commit_seconds, self._writer.sync_seconds)

    def disk_bytes(self) -> int | None:
        """``pg_total_relation_size`` of Tether's tables, as read at most
        :data:`SIZE_MAX_AGE` seconds ago (None until the first read is done). Never
        waits for PostgreSQL: a stale value starts a read on a reader thread and is
        returned meanwhile, so a scrape stays cheap and the event loop never blocks."""
        if not self._size_reading and time.monotonic() - self._size_read_at >= SIZE_MAX_AGE:
            self._read_size()
        return self._size

    def _read_size(self) -> None:
        readers = self._readers
        if readers is None:
            return

        def query(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(SQL_TABLE_BYTES, (list(TABLES),)).fetchone()
            return 0 if row is None else int(row[0])

        self._size_reading = True
        try:
            future = readers.submit(self._in_reader, query)
        except RuntimeError:  # the store is closing: its readers take no more work
            self._size_reading = False
            return
        future.add_done_callback(self._size_done)

    def _size_done(self, future: Future[int]) -> None:
        # On a reader thread. A failed read (PostgreSQL away) keeps the last value and
        # waits SIZE_MAX_AGE like a good one, so scrapes do not hammer a database that
        # is down; the commits' own errors say what is wrong.
        with contextlib.suppress(Exception):
            self._size = future.result()
        self._size_read_at = time.monotonic()
        self._size_reading = False

    # -- lifecycle -------------------------------------------------------------------
    def call_in_writer(self, fn: Callable[[psycopg.Connection[Any]], T]) -> asyncio.Future[T]:
        """Run ``fn(write_connection)`` on the writer thread, between two commits."""
        return self._committer.call(lambda writer: fn(writer.connection))

    def _fenced_in_writer(self, fenced: Fenced) -> None:
        loop, handler = self._loop, self._on_fenced
        if loop is not None and handler is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(handler, fenced)

    # -- reads -----------------------------------------------------------------------
    def _in_reader(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        pg = require_psycopg()
        for attempt in (1, 2):
            conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
            try:
                if conn is None or conn.closed:
                    conn = self._keep_reader(
                        connect(
                            self.url, keepalive=self.keepalive, application_name="tether-reader"
                        )
                    )
                return fn(conn)
            except pg.OperationalError as exc:
                # A connection broken by a restart of PostgreSQL: one more try on a new one.
                self._local.conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                if attempt == 2:
                    raise StorageError(
                        f"reading from PostgreSQL at {redact(self.url)} failed: {exc}"
                    ) from exc
            except pg.Error as exc:
                raise StorageError(
                    f"reading from PostgreSQL at {redact(self.url)} failed: {exc}"
                ) from exc
        raise AssertionError("unreachable")

    async def load_streams(self) -> list[StreamRecord]:
        def load(conn: psycopg.Connection[Any]) -> list[StreamRecord]:
            return [
                StreamRecord(name, bytes(config), created, compression)
                for name, config, created, compression in conn.execute(SQL_LOAD_STREAMS).fetchall()
            ]

        return await self._run_read(load)

    async def load_index(self, stream: str, sizing: Sizing = MEMORY_SIZING) -> list[MessageMeta]:
        params = (sizing.headers, sizing.plain, sizing.headers, sizing.plain, stream)

        def load(conn: psycopg.Connection[Any]) -> list[MessageMeta]:
            return [MessageMeta(*row) for row in conn.execute(SQL_LOAD_INDEX, params)]

        return await self._run_read(load)

    async def load_consumers(self, stream: str) -> list[ConsumerRecord]:
        def load(conn: psycopg.Connection[Any]) -> list[ConsumerRecord]:
            return [
                ConsumerRecord(s, n, bytes(config), bytes(state), created)
                for s, n, config, state, created in conn.execute(
                    SQL_LOAD_CONSUMERS, (stream,)
                ).fetchall()
            ]

        return await self._run_read(load)

    async def load_last_seq(self, stream: str) -> int:
        def load(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(SQL_LOAD_LAST_SEQ, (stream,)).fetchone()
            return 0 if row is None else int(row[0])

        return await self._run_read(load)

    async def read(self, stream: str, seq: int) -> StoredMessage | None:
        hit = self.cached(stream, seq)
        if hit is not None:
            return hit

        def load(conn: psycopg.Connection[Any]) -> StoredMessage | None:
            rows = _rows(conn, SQL_READ, (stream, seq))
            return _verified(stream, rows)[0] if rows else None

        return await self._run_read(load)

    async def read_range(
        self, stream: str, start_seq: int, limit: int, max_bytes: int = 0
    ) -> list[StoredMessage]:
        if limit <= 0:
            return []

        def load(conn: psycopg.Connection[Any]) -> list[StoredMessage]:
            rows = _rows(conn, SQL_READ_RANGE, (stream, start_seq, limit))
            if max_bytes > 0:
                total = 0
                for i, row in enumerate(rows):
                    total += len(row[1]) + len(row[2]) + (row[7] or len(row[3])) + 16
                    if i and total > max_bytes:
                        rows = rows[:i]
                        break
            return _verified(stream, rows)

        return await self._run_read(load)

    async def read_columns(
        self, stream: str, start_seq: int, last_seq: int, limit: int
    ) -> MessageColumns:
        if limit <= 0 or last_seq < start_seq:
            return MessageColumns([], [], [], [], [])

        def load(conn: psycopg.Connection[Any]) -> MessageColumns:
            msgs = _verified(
                stream, _rows(conn, SQL_READ_ROWS, (stream, start_seq, last_seq, limit))
            )
            return MessageColumns.of(msgs)

        return await self._run_read(load)

    async def read_many(self, stream: str, seqs: Sequence[int]) -> list[StoredMessage]:
        if not seqs:
            return []
        wanted = sorted(set(seqs))
        hits = self._all_cached(stream, wanted)
        if hits is not None:
            return hits

        def load(conn: psycopg.Connection[Any]) -> list[StoredMessage]:
            return _verified(stream, _rows(conn, SQL_READ_MANY, (stream, wanted)))

        return await self._run_read(load)


def _copy(cur: Any, sql: str, types: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """One ``COPY`` of ``rows`` into the messages table."""
    with cur.copy(sql) as copy:
        copy.set_types(types)
        write = copy.write_row
        for row in rows:
            write(row)
