"""open_store: storage URLs to backends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tether.storage import StorageError, Store, open_store
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore


def test_memory() -> None:
    store = open_store("memory")
    assert isinstance(store, MemoryStore)
    assert isinstance(store, Store)


@pytest.mark.parametrize(
    ("url", "directory"),
    [
        ("sqlite:data", "data"),
        ("sqlite:./data/dir", "data/dir"),
        ("sqlite://data", "data"),
        ("sqlite:/var/lib/tether", "/var/lib/tether"),
        ("sqlite:///var/lib/tether", "/var/lib/tether"),
    ],
)
def test_sqlite_forms(url: str, directory: str) -> None:
    store = open_store(url)
    assert isinstance(store, SqliteStore)
    assert store.directory == Path(directory).absolute()
    assert store.path.name == "tether.db"
    assert store.sync == "always"


def test_sqlite_sync_mode_is_passed_through() -> None:
    store = open_store("sqlite:data", sync="os")
    assert isinstance(store, SqliteStore)
    assert store.sync == "os"


def test_building_a_store_touches_no_disk(tmp_path: Path) -> None:
    open_store(f"sqlite:{tmp_path / 'later'}")
    assert not (tmp_path / "later").exists()


@pytest.mark.parametrize(
    "url", ["", "mem", "memory:", "sqlite", "sqlite:", "sqlite://", "file:/x", "/var/lib/tether"]
)
def test_malformed_urls_list_the_valid_forms(url: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"'memory', 'sqlite:DIR', 'sqlite://DIR' or 'postgresql://USER:PASS@HOST/DB'",
    ):
        open_store(url)


def test_unknown_sync_mode() -> None:
    with pytest.raises(ValueError, match="sync mode 'sometimes'"):
        open_store("memory", sync="sometimes")


@pytest.mark.parametrize("url", ["postgres://localhost/tether", "postgresql://u@h/db"])
def test_postgres_urls_build_the_postgres_store(url: str) -> None:
    from tether.storage.postgres import PostgresStore

    store = open_store(url)  # built, not opened: no server needed
    assert isinstance(store, PostgresStore) and store.url == url


def test_the_postgres_store_without_psycopg_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StorageError, match=r"tether\[postgres\]"):
        open_store("postgresql://u@h/db")


def test_backends_are_imported_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tether.storage\n"
        "assert 'tether.storage.sqlite' not in sys.modules\n"
        "assert 'sqlite3' not in sys.modules\n"
        "tether.storage.open_store('sqlite:x')\n"
        "assert 'tether.storage.sqlite' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
