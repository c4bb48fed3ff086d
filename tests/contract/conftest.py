"""Fixtures for the storage contract: every backend, opened fresh for each test."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tether.storage import Store
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore

BACKENDS = ["memory", "sqlite-always", "sqlite-os", "postgres"]

MakeStore = Callable[..., Awaitable[Store]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def postgres_url(backend: str, request: pytest.FixtureRequest) -> str | None:
    """A fresh database of the session's PostgreSQL server, for the postgres backend."""
    if backend != "postgres":
        return None
    server = request.getfixturevalue("postgres_server")
    return str(server.create_database(f"contract_{next(_databases)}"))


_databases = itertools.count(1)


@pytest.fixture
async def make_store(
    backend: str, store_dir: Path, postgres_url: str | None
) -> AsyncIterator[MakeStore]:
    """Opens a new store of the test's backend; sqlite ones share ``store_dir``,
    postgres ones the test's database."""
    stores: list[Store] = []

    async def make(**options: Any) -> Store:
        store: Store
        if backend == "memory":
            store = MemoryStore()
        elif backend == "postgres":
            from tether.storage.postgres import PostgresStore

            assert postgres_url is not None
            store = PostgresStore(postgres_url, **options)
        else:
            sync = backend.removeprefix("sqlite-")
            store = SqliteStore(store_dir, sync=sync, **options)  # type: ignore[arg-type]
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def store(make_store: MakeStore) -> Store:
    return await make_store()


@pytest.fixture(params=["always", "os"])
def sync(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_sqlite(
    sync: str, store_dir: Path
) -> AsyncIterator[Callable[..., Awaitable[SqliteStore]]]:
    """Opens SqliteStores on ``store_dir`` (for the durability-only tests)."""
    stores: list[SqliteStore] = []

    async def make(**options: Any) -> SqliteStore:
        store = SqliteStore(store_dir, sync=sync, **options)  # type: ignore[arg-type]
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()
