"""Checking and repairing a SQLite store's files (``tether store check|repair``).

:func:`check_store` reads everything, changes nothing, and reports: the database
file against its header, SQLite's own structural check, every message against its
checksum, every stream against the manifest's claims.

:func:`repair_store` copies everything that verifies into a new database, moves the
damaged files aside under a timestamped name (nothing is deleted), makes the new
database the store's and writes a new manifest. Each stream's last sequence stays at
least what it was known to be, so lost sequences are never handed out again: they read
as deleted messages. It reports what was lost.

Both run in a process of their own with the server stopped; :func:`repair_store`
refuses to run while another process has the database open.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from tether.storage.base import StorageError
from tether.storage.damage import (
    RepairReport,
    StoreReport,
    StreamReport,
    account,
    plural,
    verifies,
)
from tether.storage.manifest import (
    MANIFEST_FILENAME,
    compare,
    database_file_problem,
    fsync_file,
    read_manifest,
    write_manifest,
)
from tether.storage.sqlite import DB_FILENAME, SQL_HAS_TABLES, SQL_HELD, SQL_SCHEMA, WAL_SUFFIX

__all__ = ["RepairReport", "StoreReport", "StreamReport", "check_store", "repair_store"]

SHM_SUFFIX = "-shm"
REPAIRING = f"{DB_FILENAME}.repairing"
# A message's columns, in the order of SQL_SCAN. A database older than schema 3 has
# no plain_size (every payload as sent) and its streams no compression: NULL and
# 'none' stand in for them (see _scan_sql).
_SCAN_COLUMNS = "seq, subject, headers, data, ts, priority, crc, plain_size"
# A scan's rows start with their position, from which a scan cut short by damage goes
# on: the sequence, read through the (stream, seq) key. A database SQLite finds
# damaged is read through the table itself instead, by rowid, where it has one
# (schema 4): a damaged key index must not hide the intact rows it points to.
SQL_SCAN = f"SELECT seq, {_SCAN_COLUMNS} FROM messages WHERE stream = ? AND seq >= ? ORDER BY seq"
SQL_PROBE = "SELECT seq FROM messages WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT 1"
SQL_SCAN_TABLE = (
    f"SELECT rowid, {_SCAN_COLUMNS} FROM messages NOT INDEXED"
    " WHERE stream = ? AND rowid >= ? ORDER BY rowid"
)
SQL_PROBE_TABLE = (
    "SELECT rowid FROM messages NOT INDEXED WHERE stream = ? AND rowid >= ? ORDER BY rowid LIMIT 1"
)
SQL_LAST_ROWID = "SELECT max(rowid) FROM messages NOT INDEXED"
SQL_MESSAGES_TABLE = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'"
SQL_MESSAGE_STREAMS = "SELECT DISTINCT stream FROM messages"
SQL_STREAMS = "SELECT name, config, created_ns, compression FROM streams"
SQL_CONSUMERS = "SELECT stream, name, config, state, created_ns FROM consumers"
SQL_INSERT_STREAM = (
    "INSERT INTO streams (name, config, created_ns, compression) VALUES (?, ?, ?, ?)"
)
SQL_INSERT_SEQ = "INSERT INTO stream_seq (stream, last_seq) VALUES (?, ?)"
SQL_INSERT_MESSAGE = (
    # OR IGNORE: a damaged table read row by row may hold a key twice; the first stays.
    f"INSERT OR IGNORE INTO messages (stream, {_SCAN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SQL_INSERT_CONSUMER = (
    "INSERT INTO consumers (stream, name, config, state, created_ns) VALUES (?, ?, ?, ?, ?)"
)
# SQLite's lock bytes: every connection to a WAL database holds a read lock on the
# "shared" range for as long as it is open (see SQLite's file format, section Locking).
_SHARED_FIRST = 0x40000000 + 2
_SHARED_SIZE = 510


# -- reading a damaged database ---------------------------------------------------------


def _open_read_only(path: Path) -> sqlite3.Connection:
    # Without a write-ahead log there is nothing but the file to read: "immutable" then
    # keeps SQLite from creating an empty log and shared-memory file next to it.
    wal = path.with_name(path.name + WAL_SUFFIX)
    options = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"{path.as_uri()}?{options}", uri=True, isolation_level=None)
    conn.text_factory = bytes  # a damaged subject may not even be UTF-8
    return conn


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


class _Scan:
    """How the messages of a stream are read: the statements and what their position is."""

    def __init__(self, scan: str, probe: str, unit: str) -> None:
        self.scan, self.probe, self.unit = scan, probe, unit


_BY_KEY = _Scan(SQL_SCAN, SQL_PROBE, "sequence")
_BY_ROWID = _Scan(SQL_SCAN_TABLE, SQL_PROBE_TABLE, "row")


def _rows(
    conn: sqlite3.Connection, stream: str, bound: int, how: _Scan = _BY_KEY
) -> Iterator[tuple[object, ...] | str]:
    """Every row of ``stream`` in order of position, and a sentence for each stretch
    that could not be read: the scan skips forward past it (1, 2, 4… positions) until
    reads work again, up to position ``bound``."""
    scan = _scan_sql(conn, how.scan)
    start = 1
    while True:
        try:
            for row in conn.execute(scan, (stream, start)):
                yield row[1:]
                if isinstance(row[0], int):
                    start = row[0] + 1
            return
        except sqlite3.DatabaseError as exc:
            failed_at = start
            step = 1
            while True:
                start = failed_at + step
                if start > max(bound, failed_at + 1):
                    yield f"from {how.unit} {failed_at} on: {exc}"
                    return
                try:
                    conn.execute(how.probe, (stream, start)).fetchone()
                except sqlite3.DatabaseError:
                    step *= 2
                    continue
                break
            yield f"{how.unit}s {failed_at} to {start - 1}: {exc}"


def _table_scan(conn: sqlite3.Connection) -> tuple[_Scan, int] | None:
    """How to read a damaged database's messages through their table, and the last
    position there; None for a ``WITHOUT ROWID`` table (schema 3 and older), whose rows
    are their key."""
    try:
        row = conn.execute(SQL_MESSAGES_TABLE).fetchone()
    except sqlite3.DatabaseError:
        return None
    if row is None or b"WITHOUT ROWID" in (row[0] or b"").upper():
        return None
    try:
        (last,) = conn.execute(SQL_LAST_ROWID).fetchone()
    except sqlite3.DatabaseError:
        last = None
    return _BY_ROWID, int(last) if isinstance(last, int) else 2**62


def _scan_sql(conn: sqlite3.Connection, sql: str) -> str:
    """``sql`` as a database of an older schema can answer it."""
    try:
        columns = {_text(row[1]) for row in conn.execute("PRAGMA table_info(messages)")}
    except sqlite3.DatabaseError:
        return sql
    if columns and "plain_size" not in columns:
        sql = sql.replace("crc, plain_size", "crc, NULL").replace(
            "created_ns, compression", "created_ns, 'none'"
        )
    return sql


def _held(conn: sqlite3.Connection) -> dict[str, int]:
    (tables,) = conn.execute(SQL_HAS_TABLES).fetchone()
    if not tables:
        return {}
    return {_text(name): int(seq) for name, seq in conn.execute(SQL_HELD)}


def _describe_file(path: Path) -> str:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name}: missing"
    return f"{path.name}: {size} bytes"


def _scan(
    directory: Path,
    copy: sqlite3.Connection | None = None,
) -> StoreReport:
    """Check the store in ``directory``; with ``copy``, also insert every row that
    verifies into that (new, empty) database."""
    db = directory / DB_FILENAME
    wal = directory / (DB_FILENAME + WAL_SUFFIX)
    report = StoreReport(str(directory), f"sqlite:{directory}")
    report.files = [_describe_file(db), _describe_file(wal)]
    try:
        manifest = read_manifest(directory)
    except StorageError as exc:
        report.problems.append(str(exc))
        manifest = None
    if manifest is None:
        report.files.append(f"{MANIFEST_FILENAME}: missing (nothing to compare with)")
    else:
        report.claims = dict(manifest.streams)
        report.files.append(f"{MANIFEST_FILENAME}: {plural(len(manifest.streams), 'stream')}")
    size = db.stat().st_size if db.exists() else -1
    if size <= 0:
        if report.claims or size == 0:
            state = "is missing" if size < 0 else "is empty (0 bytes)"
            report.problems.append(f"the database {db} {state}")
        elif manifest is None:
            report.problems.append(f"there is no store in {directory}")
        _missing_streams(report, {})
        return report
    problem = database_file_problem(db)
    if problem is not None:
        report.problems.append(f"the database {db} {problem}")
    try:
        conn = _open_read_only(db)
    except sqlite3.Error as exc:
        report.problems.append(f"cannot open the database {db}: {exc}")
        _missing_streams(report, {})
        return report
    try:
        _scan_database(conn, report, copy)
    finally:
        conn.close()
    return report


def _scan_database(
    conn: sqlite3.Connection, report: StoreReport, copy: sqlite3.Connection | None
) -> None:
    try:
        findings = [_text(row[0]) for row in conn.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        findings = [str(exc)]
    if findings != ["ok"]:
        more = f" (and {len(findings) - 1} more findings)" if len(findings) > 1 else ""
        report.problems.append(f"SQLite finds the database damaged: {findings[0]}{more}")
    by_table = _table_scan(conn) if findings != ["ok"] else None
    try:
        held = _held(conn)
    except sqlite3.DatabaseError as exc:
        report.problems.append(f"cannot read the streams' last sequences: {exc}")
        held = {}
    definitions: dict[str, tuple[object, ...]] = {}
    try:
        for row in conn.execute(_scan_sql(conn, SQL_STREAMS)):
            definitions[_text(row[0])] = row
    except sqlite3.DatabaseError as exc:
        report.problems.append(f"cannot read every stream definition: {exc}")
    names = set(held) | set(definitions)
    try:
        unknown = {_text(n) for (n,) in conn.execute(SQL_MESSAGE_STREAMS)} - names
    except sqlite3.DatabaseError:
        unknown = set()
    for name in sorted(unknown):
        report.problems.append(
            f"messages under stream name {name!r}, which no stream has (a damaged key?)"
        )
    _missing_streams(report, held)
    claims = report.claims
    for name in sorted(names):
        stream = StreamReport(
            name, name in definitions, held.get(name, 0), claims.get(name) if claims else None
        )
        report.streams.append(stream)
        if copy is not None and name in definitions:
            config, created_ns, compression = definitions[name][1:]
            copy.execute(SQL_INSERT_STREAM, (name, config, created_ns, _text(compression)))
        if by_table is None:
            rows = _rows(conn, name, max(stream.last_seq, stream.claimed or 0))
        else:
            rows = _rows(conn, name, by_table[1], by_table[0])
        for row in rows:
            if isinstance(row, str):
                stream.unreadable.append(row)
                continue
            stream.messages += 1
            if not verifies(name, row):
                stream.damaged.append(row[0] if isinstance(row[0], int) else -1)
            elif copy is not None:
                copy.execute(SQL_INSERT_MESSAGE, (name, row[0], _text(row[1]), *row[2:]))
    try:
        for row in conn.execute(SQL_CONSUMERS):
            report.consumers += 1
            if copy is not None and _text(row[0]) in names:
                copy.execute(SQL_INSERT_CONSUMER, (_text(row[0]), _text(row[1]), *row[2:]))
    except sqlite3.DatabaseError as exc:
        report.problems.append(f"cannot read every consumer: {exc}")


def _missing_streams(report: StoreReport, held: dict[str, int]) -> None:
    """The streams the manifest claims and the database lacks (a stream that is there
    but shorter than claimed is reported with the stream)."""
    claims = report.claims
    lacking = {name: seq for name, seq in claims.items() if name not in held}
    report.problems += [f"{p}, according to the manifest" for p in compare(lacking, {})]


def check_store(directory: str | Path) -> StoreReport:
    """Check the store in ``directory`` without changing anything."""
    return _scan(Path(directory).absolute())


# -- repairing --------------------------------------------------------------------------


def in_use(db: Path) -> bool:
    """True when another process has the database open (it holds SQLite's shared lock).

    Never call it in a process that has the database open itself: closing any file
    descriptor of a file drops every POSIX lock the process holds on it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: cannot tell
        return False
    try:
        fd = os.open(db, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SHARED_SIZE, _SHARED_FIRST)
        except OSError:
            return True
        fcntl.lockf(fd, fcntl.LOCK_UN, _SHARED_SIZE, _SHARED_FIRST)
        return False
    finally:
        os.close(fd)


def repair_store(directory: str | Path) -> RepairReport:
    """Keep what verifies of the store in ``directory`` and report what was lost.

    Does nothing to a whole store. Raises :class:`StorageError` when the database is
    in use or the new files cannot be written.
    """
    directory = Path(directory).absolute()
    db = directory / DB_FILENAME
    try:
        busy = in_use(db)
    except OSError as exc:
        raise StorageError(f"cannot open {db}: {exc.strerror or exc}") from exc
    if busy:
        raise StorageError(f"{db} is in use: stop the server before repairing its store")
    found = check_store(directory)
    if found.ok:
        return RepairReport(found)
    if not db.exists() and not (directory / MANIFEST_FILENAME).exists():
        raise StorageError(f"there is no store in {directory}")
    new = directory / REPAIRING
    for leftover in (new, *_companions(new)):
        leftover.unlink(missing_ok=True)
    try:
        conn = sqlite3.connect(new, isolation_level=None)
        try:
            conn.executescript(SQL_SCHEMA)
            conn.execute("BEGIN IMMEDIATE")
            salvaged = _scan(directory, conn)
            seqs = _last_seqs(salvaged, conn)
            for name, seq in seqs.items():
                conn.execute(SQL_INSERT_SEQ, (name, seq))
            conn.execute("COMMIT")
        finally:
            conn.close()  # checkpoints the new database's log into it
        fsync_file(new)
        report = RepairReport(salvaged, repaired=True)
        report.moved = _move_aside(directory)
        report.done = [f"a new {DB_FILENAME} and {MANIFEST_FILENAME} are in place"]
        os.replace(new, db)
        write_manifest(directory, seqs)  # also makes the renames durable
    except (OSError, sqlite3.Error) as exc:
        raise StorageError(f"repairing the store in {directory} failed: {exc}") from exc
    account(report, set(seqs))
    return report


def _companions(db: Path) -> list[Path]:
    return [db.with_name(db.name + WAL_SUFFIX), db.with_name(db.name + SHM_SUFFIX)]


def _last_seqs(report: StoreReport, conn: sqlite3.Connection) -> dict[str, int]:
    """Each kept stream's last sequence: never below what it was known to be, so that
    sequences of lost messages are not handed out again."""
    kept: dict[str, int] = {}
    for (name,) in conn.execute("SELECT name FROM streams"):
        kept[str(name)] = 0
    for name, last in conn.execute("SELECT stream, max(seq) FROM messages GROUP BY stream"):
        kept[str(name)] = int(last)
    for stream in report.streams:
        if stream.name in kept:
            kept[stream.name] = max(kept[stream.name], stream.last_seq, stream.claimed or 0)
    return kept


def _move_aside(directory: Path) -> list[Path]:
    """Rename the damaged files out of the way: ``tether.db`` becomes
    ``tether.db.damaged-<time>``, and its log and shared-memory file follow it (under
    the names SQLite pairs with it), as does the manifest."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = f"{DB_FILENAME}.damaged-{stamp}"
    n = 1
    while any(directory.glob(f"{aside}*")):  # two repairs within one second
        n += 1
        aside = f"{DB_FILENAME}.damaged-{stamp}.{n}"
    renames = [(DB_FILENAME, aside)]
    renames += [(DB_FILENAME + x, aside + x) for x in (WAL_SUFFIX, SHM_SUFFIX)]
    renames.append((MANIFEST_FILENAME, aside.replace(DB_FILENAME, MANIFEST_FILENAME, 1)))
    moved: list[Path] = []
    for name, target in renames:
        if (directory / name).exists():
            (directory / name).rename(directory / target)
            moved.append(directory / target)
    return moved
