"""Checking and repairing a PostgreSQL store (``tether store check|repair``).

PostgreSQL looks after its own files (WAL replay, page checksums where enabled); what
Tether checks is what it keeps in its tables. :func:`check_postgres` reads every
stream, consumer and message in one snapshot (a read-only REPEATABLE READ
transaction; the messages through a server-side cursor, a batch at a time, so a big
table never has to fit in memory) and verifies each message against its checksum.
There is no manifest to compare with: each stream's high-water mark
(``tether_stream_seq``) is compared with its messages instead, since every commit
raises it with them.

:func:`repair_postgres` deletes the messages that fail verification, in one
transaction, keeps every stream's last sequence (raised where messages went past it),
so the sequences of lost messages are never handed out again, and reports what was
lost. It refuses while a Tether node is active on the database (that node holds the
leader lock) and holds the lock itself while it works, so a node started meanwhile
waits as a standby.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether.storage.base import StorageError
from tether.storage.damage import (
    RepairReport,
    StoreReport,
    StreamReport,
    account,
    plural,
    verifies,
)
from tether.storage.leadership import SQL_TRY_LOCK, SQL_UNLOCK
from tether.storage.postgres import (
    LEADER_LOCK,
    SQL_RAISE_LAST_SEQ,
    TABLES,
    connect,
    migrations,
    redact,
    require_psycopg,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["check_postgres", "repair_postgres"]

# Rows fetched per round trip by the server-side cursor: a few MB at most for
# typical messages, and few enough round trips for millions of rows.
BATCH = 2000
SQL_MISSING_TABLES = "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL"
SQL_VERSION = "SELECT max(version) FROM tether_schema"
SQL_HELD = "SELECT stream, last_seq FROM tether_stream_seq"
SQL_STREAMS = "SELECT name FROM tether_streams"
SQL_CONSUMERS = "SELECT count(*) FROM tether_consumers"
# In (stream, seq) order: the primary key's own order, read straight off its index.
SQL_SCAN = (
    "SELECT stream, seq, subject, headers, data, ts, priority, crc, {plain_size}"
    " FROM tether_messages ORDER BY stream, seq"
)
# Schema 2 added plain_size (compression); before it every payload is as sent.
PLAIN_SIZE_SINCE = 2
SQL_DELETE_DAMAGED = "DELETE FROM tether_messages WHERE stream = %s AND seq = ANY(%s)"
SQL_DELETE_STREAM_NAME = "DELETE FROM tether_messages WHERE stream = %s"


@dataclass
class _Found:
    """What a scan found beyond the report: whether the tables could be read at all,
    and the messages under stream names that no stream has (name -> count)."""

    readable: bool = False
    unknown: dict[str, int] = field(default_factory=dict)


def _scan(conn: psycopg.Connection[Any], report: StoreReport) -> _Found:
    """Fill in ``report`` from the tables, inside the caller's transaction."""
    found = _Found()
    missing = [t for (t,) in conn.execute(SQL_MISSING_TABLES, (list(TABLES),)).fetchall()]
    if len(missing) == len(TABLES):
        report.problems.append("there is no Tether store in this database (no tether_* tables)")
        return found
    if missing:
        report.problems.append(f"Tether's tables are incomplete: {', '.join(missing)} missing")
        return found
    row = conn.execute(SQL_VERSION).fetchone()
    version = int(row[0]) if row and row[0] is not None else 0
    newest = migrations()[-1][0]
    server = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    report.files = [
        f"PostgreSQL {server}, Tether schema version {version}",
        "no manifest: each stream's last sequence (tether_stream_seq) is compared with"
        " its messages",
    ]
    if version > newest:
        report.problems.append(
            f"the database has Tether schema version {version}, newer than this version of"
            f" tether reads ({newest})"
        )
        return found
    held = {str(name): int(seq) for name, seq in conn.execute(SQL_HELD).fetchall()}
    defined = {str(name) for (name,) in conn.execute(SQL_STREAMS).fetchall()}
    streams = {
        name: StreamReport(name, name in defined, held.get(name, 0))
        for name in sorted(held.keys() | defined)
    }
    report.streams = list(streams.values())
    plain_size = "plain_size" if version >= PLAIN_SIZE_SINCE else "NULL::int8"
    # A named cursor lives on the server: rows come BATCH at a time (binary: bytea
    # arrives as bytes, with no hex to decode).
    with conn.cursor(name="tether_store_check", binary=True) as cur:
        cur.itersize = BATCH
        cur.execute(SQL_SCAN.format(plain_size=plain_size))
        for name, *rest in cur:
            stream = streams.get(name)
            if stream is None:
                found.unknown[name] = found.unknown.get(name, 0) + 1
                continue
            seq = rest[0]
            stream.messages += 1
            stream.highest = seq  # in order: the last one read is the highest
            if not verifies(name, tuple(rest)):
                stream.damaged.append(seq)
    for name, n in sorted(found.unknown.items()):
        report.problems.append(
            f"{plural(n, 'message')} under stream name {name!r}, which no stream has"
            " (a damaged key?)"
        )
    report.consumers = int(conn.execute(SQL_CONSUMERS).fetchone()[0])  # type: ignore[index]
    found.readable = True
    return found


def check_postgres(url: str) -> StoreReport:
    """Check the store in the PostgreSQL database at ``url`` without changing anything.

    Raises :class:`StorageError` when psycopg is missing or the database cannot be
    reached or read."""
    pg = require_psycopg()
    shown = redact(url)
    report = StoreReport(shown, shown)
    conn = connect(url, application_name="tether-store-check")
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            _scan(conn, report)
    except pg.Error as exc:
        raise StorageError(f"reading the store at {shown} failed: {exc}") from exc
    finally:
        conn.close()
    return report


def repair_postgres(url: str) -> RepairReport:
    """Delete what fails verification in the store at ``url`` and report what was lost.

    Does nothing to a whole store. Raises :class:`StorageError` when a Tether node is
    active on the database, when there is no store there, or when the repair fails (it
    then changed nothing)."""
    pg = require_psycopg()
    shown = redact(url)
    lock = connect(url, application_name="tether-store-repair-lock")
    try:
        try:
            (got,) = lock.execute(SQL_TRY_LOCK, (LEADER_LOCK,)).fetchone() or (False,)
        except pg.Error as exc:
            raise StorageError(f"PostgreSQL at {shown}: {exc}") from exc
        if not got:
            raise StorageError(
                f"a Tether node is active on {shown} (it holds the leader lock): stop it"
                " before repairing its store"
            )
        try:
            return _repair(url, shown)
        finally:
            with contextlib.suppress(pg.Error):
                lock.execute(SQL_UNLOCK, (LEADER_LOCK,))
    finally:
        lock.close()


def _repair(url: str, shown: str) -> RepairReport:
    pg = require_psycopg()
    found_report = StoreReport(shown, shown)
    conn = connect(url, application_name="tether-store-repair")
    try:
        # One snapshot for what is read and what is deleted: a row that changed
        # meanwhile fails the transaction (serialization error) instead of being
        # judged on what it was.
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            found = _scan(conn, found_report)
            if found_report.ok:
                return RepairReport(found_report)
            if not found.readable:
                raise StorageError(
                    f"cannot repair the store at {shown}: {'; '.join(found_report.problems)}"
                )
            report = RepairReport(found_report, repaired=True)
            deleted = 0
            for stream in found_report.streams:
                if stream.damaged:
                    cur = conn.execute(SQL_DELETE_DAMAGED, (stream.name, stream.damaged))
                    deleted += cur.rowcount
                if stream.beyond:
                    conn.execute(SQL_RAISE_LAST_SEQ, (stream.name, stream.highest))
                    report.done.append(
                        f"stream {stream.name!r}: last sequence raised to {stream.highest}"
                        " (its messages went past it)"
                    )
            for name, n in sorted(found.unknown.items()):
                deleted += conn.execute(SQL_DELETE_STREAM_NAME, (name,)).rowcount
                report.lost.append(
                    f"{plural(n, 'message')} under stream name {name!r}, which no stream has"
                )
            report.done.insert(
                0,
                f"{plural(deleted, 'row')} deleted from tether_messages in one transaction;"
                " every stream keeps its last sequence",
            )
    except pg.Error as exc:
        raise StorageError(
            f"repairing the store at {shown} failed, nothing was changed: {exc}"
        ) from exc
    finally:
        conn.close()
    lost_names = report.lost
    report.lost = []
    account(report, {s.name for s in found_report.streams if s.defined})
    report.lost += lost_names
    return report
