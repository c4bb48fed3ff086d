"""``tether store compact`` gives the pages of deleted messages back to the file system,
keeps every message that was not deleted, and refuses a store the server has open."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from tether.storage import StoredMessage, StreamRecord
from tether.storage.integrity import check_store
from tether.storage.sqlite import DB_FILENAME, SqliteStore

TS = 1_700_000_000_000_000_000
COUNT = 3000


def payload(seq: int) -> bytes:
    return (b"%06d" % seq) * 170  # 1,020 bytes


def compact(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", "store", "compact", "--store", f"sqlite:{directory}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def fill_then_delete(directory: Path) -> None:
    store = SqliteStore(directory, cache_bytes=0)
    await store.open()
    try:
        store.put_stream(StreamRecord("s", b"{}", 1))
        await store.append_run(
            "s", [StoredMessage(seq, "s.a", b"", payload(seq), TS) for seq in range(1, COUNT + 1)]
        )
        await store.delete_range("s", 1, COUNT - 10)
    finally:
        await store.close()


def size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob(DB_FILENAME + "*"))


async def test_compact_gives_free_pages_back_and_keeps_the_rest(tmp_path: Path) -> None:
    await fill_then_delete(tmp_path)
    before = size(tmp_path)
    assert before > COUNT * 1000  # deleting freed pages, it did not shrink the file

    done = compact(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "given back" in done.stdout
    after = size(tmp_path)
    assert after < before / 10, (before, after)
    assert check_store(tmp_path).ok

    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    try:
        kept = await store.read_range("s", 1, COUNT)
        assert [m.seq for m in kept] == list(range(COUNT - 9, COUNT + 1))
        assert all(m.data == payload(m.seq) for m in kept)
        assert await store.load_last_seq("s") == COUNT
    finally:
        await store.close()


async def test_compact_refuses_a_store_in_use_a_newer_one_and_a_missing_one(
    tmp_path: Path,
) -> None:
    await fill_then_delete(tmp_path)
    before = size(tmp_path)
    holder = sqlite3.connect(tmp_path / DB_FILENAME)  # as a running server holds it
    try:
        holder.execute("SELECT count(*) FROM messages").fetchone()
        refused = compact(tmp_path)
    finally:
        holder.close()
    assert refused.returncode == 1
    assert "is in use: stop the server before compacting its store" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert size(tmp_path) == before

    missing = compact(tmp_path / "nothing")
    assert missing.returncode == 1
    assert f"there is no store in {tmp_path / 'nothing'}" in missing.stderr

    newer = sqlite3.connect(tmp_path / DB_FILENAME)
    try:
        newer.execute("PRAGMA user_version = 99")  # as a later version of tether would leave it
    finally:
        newer.close()
    refused = compact(tmp_path)
    assert refused.returncode == 1
    assert "has schema version 99, newer than this version of tether supports" in refused.stderr


def test_compact_says_why_it_cannot_open_the_file(tmp_path: Path) -> None:
    (tmp_path / DB_FILENAME).mkdir()  # a path that cannot be opened as a file
    refused = compact(tmp_path)
    assert refused.returncode == 1
    assert f"cannot open the database {tmp_path / DB_FILENAME}" in refused.stderr
    assert "Traceback" not in refused.stderr
