"""Shared fixtures: a real Tether server (subprocess, free ports, temp store)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from tether.testing import PostgresServer, RunningServer, find_postgres, run_server


@pytest.fixture
def tether_server() -> Iterator[RunningServer]:
    with run_server() as server:
        yield server


@pytest.fixture
def memory_server() -> Iterator[RunningServer]:
    with run_server(store="memory") as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session (tests make their own databases).
    Skipped where PostgreSQL or psycopg is missing, except under CI, which must have
    them (scripts/system-packages installs Debian's postgresql)."""
    bindir = find_postgres()
    why = None
    if bindir is None:
        why = "PostgreSQL is not installed (initdb, pg_ctl, postgres)"
    elif importlib.util.find_spec("psycopg") is None:
        why = "psycopg is not installed (pip install 'tether[postgres]')"
    if why is not None or bindir is None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI is set: the PostgreSQL store must be tested)")
        pytest.skip(str(why))
    server = PostgresServer(bindir)
    try:
        yield server
    finally:
        server.cleanup()
