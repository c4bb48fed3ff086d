"""What only the PostgreSQL store promises: fencing, leadership, migrations, and its
errors. (The shared contract runs on it in test_store_contract.py.)"""

from __future__ import annotations

import asyncio
import itertools
import sys

import pytest

from tether.server.config import load_config
from tether.storage import StorageError, open_store
from tether.storage.leadership import Leadership
from tether.storage.postgres import Fenced, PostgresStore, connect, migrations, redact
from tether.testing import PostgresServer

from .test_store_contract import msg, stream

_databases = itertools.count(1)


def test_a_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(StorageError, match=r"pip install 'tether\[postgres\]'"):
        open_store("postgresql://u:p@localhost/db")


def test_urls_are_shown_without_their_password() -> None:
    assert redact("postgresql://tether:s3cr%40t@db:5432/x") == "postgresql://tether:***@db:5432/x"
    assert redact("postgres://db/x") == "postgres://db/x"


def test_migrations_are_versioned_sql_files_shipped_with_the_package() -> None:
    found = migrations()
    assert [version for version, _, _ in found] == list(range(1, len(found) + 1))
    assert found[0][1] == "0001_initial.sql"
    assert "CREATE TABLE tether_leader" in found[0][2]


def test_the_poll_interval_must_be_below_the_session_timeout() -> None:
    with pytest.raises(ValueError, match="less than ha_session_timeout"):
        load_config(None, {"ha_poll_interval": 10.0, "ha_session_timeout": 5.0})
    cfg = load_config(None, {"store": "postgres://db/x", "connect_urls": ["a:4222"]})
    assert cfg.connect_urls == ["a:4222"]


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database(f"store_{next(_databases)}")


@pytest.mark.postgres
async def test_a_commit_after_a_takeover_is_refused_and_writes_nothing(database: str) -> None:
    first = Leadership(database, poll_interval=0.1, session_timeout=2.0)
    assert await first.acquire() == 1
    told: list[Fenced] = []
    old = PostgresStore(database, epoch=1, on_fenced=told.append)
    await old.open()
    try:
        old.put_stream(stream("s"))
        await old.append("s", msg(1))

        await first.close()  # the lock goes; a second node takes over
        second = Leadership(database, poll_interval=0.1, session_timeout=2.0)
        assert await second.acquire() == 2

        with pytest.raises(Fenced, match=r"epoch 1.*epoch 2"):
            await old.append("s", msg(2))
        await asyncio.sleep(0.05)
        assert len(told) == 1 and told[0].current == 2
        with pytest.raises(Fenced):  # and every later one, without asking again
            await old.append("s", msg(3))

        new = PostgresStore(database, epoch=2)
        await new.open()
        try:
            assert [m.seq for m in await new.load_index("s")] == [1]
            await new.append("s", msg(2, data=b"from the new leader"))
            assert (await new.read("s", 2)) == msg(2, data=b"from the new leader")
        finally:
            await new.close()
        await second.close()
    finally:
        await old.close()


@pytest.mark.postgres
async def test_a_standby_waits_for_the_lock(database: str) -> None:
    active = Leadership(database, poll_interval=0.1, session_timeout=2.0)
    standby = Leadership(database, poll_interval=0.1, session_timeout=2.0)
    assert await active.acquire() == 1
    stopping = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, stopping.set)
    assert await standby.acquire(stopping) is None  # told to stop while waiting
    assert standby.role == "standby"
    waiting = asyncio.ensure_future(standby.acquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await active.close()
    assert await asyncio.wait_for(waiting, 5) == 2
    assert standby.role == "active"
    await standby.close()


@pytest.mark.postgres
async def test_a_newer_schema_is_refused(database: str) -> None:
    store = PostgresStore(database)
    await store.open()
    await store.close()
    with connect(database) as conn:
        conn.execute("INSERT INTO tether_schema (version) VALUES (99)")
    with pytest.raises(StorageError, match="schema version 99, newer"):
        await PostgresStore(database).open()


@pytest.mark.postgres
async def test_an_unreachable_server_is_a_clear_error(postgres_server: PostgresServer) -> None:
    url = f"postgresql://tether:pw@127.0.0.1:{postgres_server.port}/missing_db"
    with pytest.raises(StorageError) as caught:
        await PostgresStore(url).open()
    assert "cannot connect to PostgreSQL at postgresql://tether:***@127.0.0.1" in str(caught.value)
    assert "pw" not in str(caught.value)


@pytest.mark.postgres
async def test_a_value_postgresql_cannot_hold_is_refused_alone(database: str) -> None:
    store = PostgresStore(database)
    await store.open()
    heard: list[dict[str, dict[int, str]]] = []

    def refused(by_stream: dict[str, dict[int, str]]) -> None:
        heard.append(by_stream)
        for name, seqs in by_stream.items():
            store.withdraw(name, min(seqs))

    store.on_refused(refused)
    try:
        store.append("s", msg(1, "fine"))
        await store.append("s", msg(2, "nul\x00in.text"))  # text cannot hold NUL
        assert list(heard[0]["s"]) == [2] and "0x00" in heard[0]["s"][2]
        assert [m.seq for m in await store.load_index("s")] == [1]
        await store.append("s", msg(2, "fine"))
        assert [m.seq for m in await store.load_index("s")] == [1, 2]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_measurements_for_metrics(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit sizes and latencies, the COMMIT round trip, and the tables' size: read in
    the background, never waited for by the caller, cached between reads."""
    import tether.storage.postgres as pg_store

    store = PostgresStore(database)
    await store.open()
    try:
        store.put_stream(stream("s"))
        for seq in range(1, 21):
            await store.append("s", msg(seq, data=b"x" * 1000))
        stats = store.stats()
        assert stats.commit_seconds.count > 0 and stats.commit_ops.count > 0
        assert stats.commit_ops.total >= 21  # the stream and its 20 messages
        assert stats.sync_seconds.count == stats.commit_seconds.count
        assert 0 < stats.sync_seconds.total <= stats.commit_seconds.total

        assert store.disk_bytes() is None  # the first call starts the read, does not wait
        first = await _size(store)
        assert first > 20 * 1000

        for seq in range(21, 221):
            await store.append("s", msg(seq, data=b"y" * 4000))
        assert store.disk_bytes() == first  # still the cached value
        monkeypatch.setattr(pg_store, "SIZE_MAX_AGE", 0.0)
        store.disk_bytes()  # stale now: read again
        await asyncio.sleep(0)
        deadline = asyncio.get_running_loop().time() + 10
        while store.disk_bytes() == first:
            assert asyncio.get_running_loop().time() < deadline, "the size was not read again"
            await asyncio.sleep(0.02)
        assert (store.disk_bytes() or 0) > first  # 200 more messages of 4000 bytes
    finally:
        await store.close()
    assert store.disk_bytes() is not None  # a closed store answers what it knew


async def _size(store: PostgresStore) -> int:
    for _ in range(500):
        size = store.disk_bytes()
        if size is not None and not store._size_reading:
            return size
        await asyncio.sleep(0.01)
    raise AssertionError("the size of the tables was never read")
