"""Disk trouble: a store that cannot be created, and a disk that fills up.

A full disk must give publishers an error PubAck (never an ack), keep the server
running, and leave everything already stored intact, readable and durable.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import ServiceUnavailableError

from tether.server.app import Tether
from tether.server.config import ServerConfig
from tether.storage.sqlite import DB_FILENAME, SqliteStore
from tether.testing import RunningServer, ServerStartError

PAYLOAD = b"x" * 1000


def test_a_store_that_cannot_be_created_is_a_clear_startup_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    server = RunningServer(store=f"sqlite:{blocker / 'store'}")
    with pytest.raises(ServerStartError) as excinfo:
        server.start()
    assert server.proc is not None and server.proc.wait(10) == 1
    message = str(excinfo.value)
    assert "cannot start: cannot create the storage directory" in message
    assert str(blocker / "store") in message
    assert "Traceback" not in message
    assert "Server is ready" not in message
    server.cleanup()


class Filled:
    """What a publisher saw while filling the disk."""

    def __init__(self) -> None:
        self.acked: dict[int, bytes] = {}
        self.refused: list[ServiceUnavailableError] = []


async def fill(nc: Client, subject: str, limit: int = 20_000) -> Filled:
    """Publish 1 KB messages (the first bytes make each unique) until the store refuses."""
    js = nc.jetstream()
    out = Filled()
    for i in range(limit):
        payload = b"%08d" % i + PAYLOAD
        try:
            ack = await js.publish(subject, payload)
        except ServiceUnavailableError as exc:
            out.refused.append(exc)
            if len(out.refused) >= 3:
                return out
            continue
        out.acked[ack.seq] = payload
    raise AssertionError(f"the store took {limit} KB without filling up")


async def check_intact(nc: Client, stream: str, acked: dict[int, bytes]) -> None:
    jsm = nc.jsm()
    for seq, payload in acked.items():
        msg = await jsm.get_msg(stream, seq)
        assert msg.data == payload, f"message {seq} changed"


def assert_refusals_are_error_acks(filled: Filled) -> None:
    assert filled.acked, "nothing was stored before the disk filled up"
    assert filled.refused, "the disk never filled up"
    for exc in filled.refused:
        assert (exc.code, exc.err_code) == (503, 10077)
        assert "full" in (exc.description or "")


def integrity_check(directory: Path) -> str:
    conn = sqlite3.connect(f"{(directory / DB_FILENAME).as_uri()}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


# -- a real full file system: a small tmpfs (needs the right to mount) ------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.slow
async def test_a_full_disk_refuses_publishes_and_keeps_what_is_stored(small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 1024 * 1024)  # freed later, to make room again
    store = small_disk / "store"
    server = RunningServer(store=f"sqlite:{store}")
    server.start()
    try:
        nc = await nats.connect(server.url)
        try:
            await nc.jsm().add_stream(name="FULL", subjects=["full"])
            filled = await fill(nc, "full")
            assert_refusals_are_error_acks(filled)
            # Still serving, and what was acknowledged is all there.
            info = await nc.jsm().stream_info("FULL")
            assert info.state.messages == len(filled.acked)
            await check_intact(nc, "FULL", filled.acked)
            # Room again: publishing resumes where it left off.
            ballast.unlink()
            ack = await nc.jetstream().publish("full", b"after")
            assert ack.seq == max(filled.acked) + 1
            filled.acked[ack.seq] = b"after"
        finally:
            await nc.close()
        server.kill()
        assert integrity_check(store) == "ok"
        server.start()
        nc = await nats.connect(server.url)
        try:
            assert (await nc.jsm().stream_info("FULL")).state.messages == len(filled.acked)
            await check_intact(nc, "FULL", filled.acked)
        finally:
            await nc.close()
    finally:
        server.cleanup()


# -- a database size limit: runs anywhere, the server in this process ---------------------


@pytest.fixture
async def in_process(tmp_path: Path) -> AsyncIterator[Tether]:
    app = Tether(ServerConfig(port=0, http_port=0, nsq_port=0, store=f"sqlite:{tmp_path}"))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def set_page_limit(app: Tether, pages: int) -> asyncio.Future[Any]:
    """Cap the database's size (pages of 4 KiB): SQLite then fails like a full disk."""
    assert isinstance(app.store, SqliteStore)
    return app.store.call_in_writer(
        lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}").fetchone()
    )


async def test_a_database_size_limit_acts_like_a_full_disk(
    in_process: Tether, tmp_path: Path
) -> None:
    app = in_process
    nc = await nats.connect(f"nats://127.0.0.1:{app.nats.port}")
    try:
        await nc.jsm().add_stream(name="CAPPED", subjects=["capped"])
        await nc.jetstream().publish("capped", b"warm up")
        used = await app.store.call_in_writer(  # type: ignore[union-attr]
            lambda conn: conn.execute("PRAGMA page_count").fetchone()[0]
        )
        await set_page_limit(app, int(used) + 40)
        filled = await fill(nc, "capped")
        filled.acked[1] = b"warm up"
        assert_refusals_are_error_acks(filled)
        await check_intact(nc, "CAPPED", filled.acked)
        reply = await nc.request("$JS.API.STREAM.INFO.CAPPED", b"", timeout=2)
        assert json.loads(reply.data)["state"]["messages"] == len(filled.acked)
        await set_page_limit(app, 1_000_000)
        ack = await nc.jetstream().publish("capped", b"after")
        assert ack.seq == max(filled.acked) + 1
    finally:
        await nc.close()
    await app.stop()
    assert integrity_check(tmp_path) == "ok"
