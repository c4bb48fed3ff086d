"""Giving a SQLite store's free pages back to the file system (``tether store compact``).

Deleted messages, purged streams and the tables an upgrade copied leave free pages in
the database file: the server reuses them for new messages but never shrinks the file.
:func:`compact_store` rewrites the file without them (SQLite's ``VACUUM``, which is as
safe against a crash as any other transaction: the file is the old one or the new one).
It needs free disk space of about the database's size while it runs, and runs in a
process of its own with the server stopped.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from tether.storage.base import StorageError
from tether.storage.integrity import in_use
from tether.storage.manifest import database_file_problem
from tether.storage.sqlite import DB_FILENAME, SQL_BUSY_TIMEOUT, WAL_SUFFIX, refuse_newer_schema

__all__ = ["CompactReport", "compact_store"]


@dataclass(frozen=True)
class CompactReport:
    """The database's size on disk (with its write-ahead log) before and after."""

    directory: Path
    before: int
    after: int

    def lines(self) -> list[str]:
        saved = self.before - self.after
        return [
            f"store {self.directory}",
            f"before: {self.before} bytes",
            f"after: {self.after} bytes ({saved} bytes given back)",
        ]


def _size(db: Path) -> int:
    wal = db.with_name(db.name + WAL_SUFFIX)
    return sum(p.stat().st_size for p in (db, wal) if p.exists())


def compact_store(directory: str | Path) -> CompactReport:
    """Rewrite the database in ``directory`` without its free pages."""
    directory = Path(directory).absolute()
    db = directory / DB_FILENAME
    if not db.exists():
        raise StorageError(f"there is no store in {directory}")
    try:
        problem = database_file_problem(db)
        busy = problem is None and in_use(db)
    except OSError as exc:  # not readable, or not writable (a read-only file system)
        raise StorageError(f"cannot open the database {db}: {exc.strerror or exc}") from exc
    if problem is not None:
        raise StorageError(
            f"the database {db} {problem}: run `tether store check` and `tether store repair`"
        )
    if busy:
        raise StorageError(f"{db} is in use: stop the server before compacting its store")
    before = _size(db)
    try:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute(SQL_BUSY_TIMEOUT)
            refuse_newer_schema(conn, db)
            conn.execute("VACUUM")
            # The rewritten pages went through the log: copy them into the file and
            # empty the log, so the space is given back now, not at some later start.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StorageError(f"compacting the store in {directory} failed: {exc}") from exc
    return CompactReport(directory, before, _size(db))
