"""PostgreSQL for the benchmarks: a given server, or a throwaway one.

``--store postgresql://USER:PASS@HOST/DB`` (or ``postgres://``) names a database the
benchmark may empty: Tether's tables (``tether_*``) are dropped before each run so every
server starts fresh. ``--store postgres`` starts a throwaway PostgreSQL server instead
(``initdb`` in a temporary directory, ``fsync = on``, ``synchronous_commit = on``: the
durable defaults), removed at exit.
"""

from __future__ import annotations

import atexit
from contextlib import suppress

_TABLES = (
    "tether_messages",
    "tether_consumers",
    "tether_stream_seq",
    "tether_streams",
    "tether_leader",
    "tether_schema",
)
_throwaway: list[object] = []


def is_postgres(store: str) -> bool:
    return store == "postgres" or store.startswith(("postgres://", "postgresql://"))


def resolve(store: str) -> str:
    """The URL for ``store``: itself, or that of a throwaway server for ``postgres``."""
    if store != "postgres":
        return store
    if not _throwaway:
        from tether.testing import PostgresServer, find_postgres

        bindir = find_postgres()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (initdb, pg_ctl, postgres)")
        server = PostgresServer(bindir)
        _throwaway.append(server)
        atexit.register(server.cleanup)
    server = _throwaway[0]
    return str(server.url())  # type: ignore[attr-defined]


def reset(url: str) -> None:
    """Drop Tether's tables from ``url``'s database (a fresh store for the next run)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for table in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}".encode())


def settings(url: str) -> dict[str, str]:
    """The server settings that decide what a commit costs."""
    import psycopg

    found = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method"):
            with suppress(psycopg.Error):
                row = conn.execute(f"SHOW {name}".encode()).fetchone()
                found[name] = str(row[0]) if row else ""
    return found
