"""Damaged stores: ``tether serve`` refuses a store that lost acknowledged messages,
answers a damaged message with an error (never its content) and keeps serving, and
``tether store check`` / ``tether store repair`` report and salvage.

The damage is done to the files while the server is down, as a disk, an operator or a
backup tool does it: a database emptied, a byte flipped, a write-ahead log deleted or
cut short after ``kill -9``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NotFoundError

from tether.storage.manifest import read_manifest
from tether.storage.sqlite import DB_FILENAME
from tether.testing import RunningServer, ServerStartError

STREAM = "ORDERS"
WAL = DB_FILENAME + "-wal"


def marker(seq: int) -> bytes:
    return b"message-%04d:" % seq


async def publish(
    nc: Client, count: int, size: int = 64, first: int = 1, **config: float
) -> list[bytes]:
    """Publish ``count`` messages of about ``size`` bytes, all acknowledged (the stream
    is created with the first one)."""
    js = nc.jetstream()
    if first == 1:
        await nc.jsm().add_stream(name=STREAM, subjects=["orders.>"], allow_direct=True, **config)
    seqs = range(first, first + count)
    payloads = [marker(seq) + b"x" * size for seq in seqs]
    acks = await asyncio.gather(*(js.publish("orders.new", p) for p in payloads))
    assert [ack.seq for ack in acks] == list(seqs)
    return payloads


def refusal(server: RunningServer) -> str:
    """Start ``server``, which must refuse: exit status 1, one error line, no traceback."""
    with pytest.raises(ServerStartError):
        server.start()
    assert server.proc is not None and server.proc.wait(10) == 1
    stderr = server.stderr
    assert "Traceback" not in stderr and "Server is ready" not in stderr
    errors = [line for line in stderr.splitlines() if "[ERR]" in line]
    assert len(errors) == 1, stderr
    assert "cannot start:" in errors[0]
    assert f"tether store check --store sqlite:{server.store[7:]}" in errors[0]
    return errors[0]


def store_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", "store", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def wait_for_claim(directory: Path, seq: int) -> None:
    """The manifest claims what was acknowledged within a few hundred milliseconds."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        manifest = read_manifest(directory)
        if manifest is not None and manifest.streams.get(STREAM, 0) >= seq:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the manifest never claimed {STREAM} up to {seq}")


async def test_an_emptied_database_is_refused_with_one_line(tmp_path: Path) -> None:
    server = RunningServer(store=f"sqlite:{tmp_path}")
    server.start()
    try:
        nc = await nats.connect(server.url)
        await publish(nc, 20)
        await nc.close()
    finally:
        server.stop()
    os.truncate(tmp_path / DB_FILENAME, 0)

    line = refusal(server)
    assert f"the database {tmp_path / DB_FILENAME} is empty (0 bytes)" in line
    assert "tether.manifest says it held 1 stream (ORDERS)" in line
    server.cleanup()


async def test_a_flipped_byte_is_an_error_and_the_server_stays_up(tmp_path: Path) -> None:
    server = RunningServer(store=f"sqlite:{tmp_path}")
    server.start()
    try:
        nc = await nats.connect(server.url)
        # A short duplicate window: restoring it after the restart reads back only the
        # last message, not the damaged one.
        payloads = await publish(nc, 10, duplicate_window=0.1)
        await nc.close()
    finally:
        server.stop()
    db = tmp_path / DB_FILENAME
    raw = bytearray(db.read_bytes())
    at = raw.find(marker(5))
    assert at > 0 and raw.find(marker(5), at + 1) == -1
    raw[at + len(marker(5)) + 3] ^= 0x01  # one bit of message 5's payload
    db.write_bytes(raw)

    server.start()
    try:
        nc = await nats.connect(server.url)
        jsm = nc.jsm()
        with pytest.raises(APIError) as info:
            await jsm.get_msg(STREAM, 5)
        assert info.value.code == 500
        assert "message 5 of stream 'ORDERS' is damaged" in str(info.value.description)
        # DIRECT.GET, alone or in a batch that covers it, never sends the damaged bytes:
        # it answers with an error status naming the damage.
        for request in (b'{"seq": 5}', b'{"seq": 4, "batch": 3}'):
            sub = await nc.subscribe(nc.new_inbox())
            await nc.publish(f"$JS.API.DIRECT.GET.{STREAM}", request, reply=sub.subject)
            got: list[bytes] = []
            with pytest.raises(NatsTimeout):
                while True:
                    got.append((await sub.next_msg(timeout=0.5)).data)
            assert not any(data.startswith(marker(5)) for data in got), got
            await sub.unsubscribe()
        status = await nc.request(f"$JS.API.DIRECT.GET.{STREAM}", b'{"seq": 5}', timeout=5)
        assert status.headers is not None
        assert status.headers.get("Status") == "500", status.headers
        assert "is damaged" in status.headers.get("Description", ""), status.headers
        # A consumer gets every whole message; the damaged one is terminated (kept as a
        # dead letter), not sent and not redelivered.
        js = nc.jetstream()
        sub = await js.pull_subscribe("orders.>", "reader", stream=STREAM)
        seen: list[int] = []
        with contextlib.suppress(NatsTimeout):
            while len(seen) < 9:
                for msg in await sub.fetch(10, timeout=2):
                    seen.append(msg.metadata.sequence.stream)
                    await msg.ack()
        assert sorted(seen) == [1, 2, 3, 4, 6, 7, 8, 9, 10]
        info = await js.consumer_info(STREAM, "reader")
        assert info.num_ack_pending == 0 and info.num_pending == 0
        # Everything else is served, and publishing goes on.
        for seq in (4, 6, 10):
            assert (await jsm.get_msg(STREAM, seq)).data == payloads[seq - 1]
        ack = await nc.jetstream().publish("orders.new", b"after")
        assert ack.seq == 11
        await nc.close()
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()

    check = store_command("check", "--store", f"sqlite:{tmp_path}")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "1 damaged (checksum mismatch): sequence 5" in check.stdout
    repair = store_command("repair", "--store", f"sqlite:{tmp_path}")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert f"lost: stream '{STREAM}': 1 damaged message (sequence 5)" in repair.stdout

    server.start()
    try:
        nc = await nats.connect(server.url)
        jsm = nc.jsm()
        with pytest.raises(NotFoundError):
            await jsm.get_msg(STREAM, 5)
        assert (await jsm.get_msg(STREAM, 6)).data == payloads[5]
        info_ = await jsm.stream_info(STREAM)
        assert (info_.state.messages, info_.state.last_seq) == (10, 11)
        await nc.close()
    finally:
        server.cleanup()


@pytest.mark.parametrize("damage", ["deleted", "cut short"])
async def test_a_lost_write_ahead_log_is_refused_then_repaired(tmp_path: Path, damage: str) -> None:
    server = RunningServer(store=f"sqlite:{tmp_path}")
    server.start()
    try:
        nc = await nats.connect(server.url)
        count = 200
        if damage == "deleted":
            # Enough to make SQLite copy its log into the database (at about 4 MB) and
            # start the log over: the database then holds the first messages, the new
            # log only the last ones.
            await publish(nc, 150, 32_000)
            await publish(nc, 50, 1000, first=151)
        else:
            # Four commits at least: cutting the log in half loses the last ones.
            for first in range(1, count, 50):
                await publish(nc, 50, 1000, first=first)
        await nc.close()
        await wait_for_claim(tmp_path, count)
    finally:
        server.kill()
    wal = tmp_path / WAL
    assert wal.stat().st_size > 0
    if damage == "deleted":
        wal.unlink()
    else:
        os.truncate(wal, wal.stat().st_size // 2)

    line = refusal(server)
    assert "lost committed data" in line
    assert "tether.db-wal was deleted, truncated or damaged" in line

    check = store_command("check", "--store", f"sqlite:{tmp_path}")
    assert check.returncode == 1
    assert f"to {count} were committed and are gone" in check.stdout

    repair = store_command("repair", "--store", f"sqlite:{tmp_path}")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert f"to {count} (committed, then lost" in repair.stdout
    assert store_command("check", "--store", f"sqlite:{tmp_path}").returncode == 0

    server.start()
    try:
        nc = await nats.connect(server.url)
        info = await nc.jsm().stream_info(STREAM)
        assert 0 < info.state.messages < count
        assert info.state.last_seq == count  # lost sequences are not handed out again
        msg = await nc.jsm().get_msg(STREAM, 1)
        assert msg.data.startswith(marker(1))
        ack = await nc.jetstream().publish("orders.new", b"next")
        assert ack.seq == count + 1
        await nc.close()
    finally:
        server.cleanup()
