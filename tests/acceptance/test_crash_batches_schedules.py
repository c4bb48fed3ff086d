"""Crash safety of atomic batches and message schedules: ``tether serve`` (SQLite,
sync="always") killed with SIGKILL.

Atomic batches: a publisher pipelines many batches (their commits in flight together)
and the server is killed at a random moment. After every restart each batch is in the
stream whole, in order and contiguous, or not at all; every batch whose commit was
acknowledged is there.

Schedules: repeating and one-shot schedules run while the server is killed and
restarted. Each ``@at`` schedule produces exactly one message; a repeating schedule
never fires twice for one run (its produced messages are at least an interval apart,
with increasing ``Nats-Schedule-Next``) and goes on after every restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import itertools
import json
import os
import random
import re
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tether.testing import RunningServer

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("TETHER_CRASH_ROUNDS", "3"))
BATCH = 50
INBOX = "_INBOX.batches"


async def connect_raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert (await reader.readline()).startswith(b"INFO ")
    connect = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
    writer.write(
        b"CONNECT %s\r\nSUB %s.* 1\r\nPING\r\n" % (json.dumps(connect).encode(), INBOX.encode())
    )
    await writer.drain()
    while (line := await reader.readline()) != b"PONG\r\n":
        assert line and not line.startswith(b"-ERR"), line
    return reader, writer


def batch_frames(batch_id: str) -> bytes:
    """Every message of one batch; only the commit asks for an answer."""
    out = []
    for i in range(1, BATCH + 1):
        commit = b"Nats-Batch-Commit: 1\r\n" if i == BATCH else b""
        header = b"NATS/1.0\r\nNats-Batch-Id: %s\r\nNats-Batch-Sequence: %d\r\n%s\r\n" % (
            batch_id.encode(),
            i,
            commit,
        )
        payload = b"%s:%d" % (batch_id.encode(), i)
        reply = b" %s.%s" % (INBOX.encode(), batch_id.encode()) if i == BATCH else b""
        out.append(
            b"HPUB batch.%d%s %d %d\r\n%s%s\r\n"
            % (i % 7, reply, len(header), len(header) + len(payload), header, payload)
        )
    return b"".join(out)


async def publish_batches(port: int, ids: list[str], kill_after: int, kill: Any) -> dict[str, int]:
    """Send the batches, up to 20 commits in flight; kill the server once ``kill_after``
    commits are acknowledged. Returns the acknowledged batches (id -> last seq)."""
    reader, writer = await connect_raw(port)
    acked: dict[str, int] = {}
    slots = asyncio.Semaphore(20)
    killing: list[asyncio.Future[None]] = []

    async def send() -> None:
        for batch_id in ids:
            await slots.acquire()
            writer.write(batch_frames(batch_id))
            await writer.drain()

    async def receive() -> None:
        while len(acked) < len(ids):
            line = await reader.readline()
            if not line:
                raise ConnectionResetError
            if line == b"PING\r\n":
                writer.write(b"PONG\r\n")
                continue
            if not line.startswith(b"MSG "):
                continue
            _, subject, _sid, size = line.split()
            body = json.loads((await reader.readexactly(int(size) + 2))[:-2])
            assert "error" not in body, body
            batch_id = subject.decode()[len(INBOX) + 1 :]
            assert body["batch"] == batch_id and body["count"] == BATCH
            acked[batch_id] = body["seq"]
            slots.release()
            if len(acked) >= kill_after and not killing:
                killing.append(asyncio.ensure_future(asyncio.to_thread(kill)))

    sender = asyncio.ensure_future(send())
    try:
        await receive()
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await sender
        writer.close()
    assert killing, "every batch was acknowledged before the kill"
    await killing[0]
    return acked


async def stored(nc: Client, stream: str) -> list[dict[str, Any]]:
    """Every message of ``stream`` with its headers and time."""
    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)).data)
    first, last = info["state"]["first_seq"], info["state"]["last_seq"]
    out = []
    for seq in range(first, last + 1):
        reply = await nc.request(
            f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(), timeout=5
        )
        doc = json.loads(reply.data)
        if "error" in doc:
            continue
        msg = doc["message"]
        lines = base64.b64decode(msg.get("hdrs", "")).decode().split("\r\n")[1:]
        msg["headers"] = dict(line.split(": ", 1) for line in lines if line)
        msg["data"] = base64.b64decode(msg.get("data", ""))
        out.append(msg)
    return out


def check_whole_batches(msgs: list[dict[str, Any]], acked: dict[str, int]) -> int:
    by_batch: dict[str, list[tuple[int, int]]] = {}
    for msg in msgs:
        batch_id, index = msg["data"].decode().split(":")
        by_batch.setdefault(batch_id, []).append((msg["seq"], int(index)))
    for batch_id, items in by_batch.items():
        seqs = [s for s, _ in items]
        assert [i for _, i in items] == list(range(1, BATCH + 1)), f"batch {batch_id} is partial"
        assert seqs == list(range(seqs[0], seqs[0] + BATCH)), f"batch {batch_id} has holes"
    for batch_id, last in acked.items():
        assert batch_id in by_batch, f"acknowledged batch {batch_id} is lost"
        assert by_batch[batch_id][-1][0] == last
    return len(by_batch)


async def test_no_partial_batch_is_ever_visible_after_kill_minus_nine(tmp_path: Any) -> None:
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "0")) or None)
    server = RunningServer(store=f"sqlite:{tmp_path}", args=["--sync", "always"])
    server.start()
    all_acked: dict[str, int] = {}
    try:
        nc = await nats.connect(server.url)
        await nc.request(
            "$JS.API.STREAM.CREATE.B",
            json.dumps({"name": "B", "subjects": ["batch.>"], "allow_atomic": True}).encode(),
        )
        await nc.close()
        whole = 0
        for round_no in range(ROUNDS):
            ids = [f"r{round_no}b{i}" for i in range(400)]
            acked = await publish_batches(server.port, ids, rng.randint(5, 150), server.kill)
            all_acked.update(acked)
            server.start()
            nc = await nats.connect(server.url)
            try:
                whole = check_whole_batches(await stored(nc, "B"), all_acked)
                # The stream goes on: a new batch lands right after what is stored.
                info = json.loads((await nc.request("$JS.API.STREAM.INFO.B", b"")).data)
                last = info["state"]["last_seq"]
                reply = await nc.request(
                    "batch.next",
                    b"next",
                    headers={
                        "Nats-Batch-Id": f"next{round_no}",
                        "Nats-Batch-Sequence": "1",
                        "Nats-Batch-Commit": "1",
                    },
                )
                assert json.loads(reply.data)["seq"] == last + 1
                await nc.request("$JS.API.STREAM.PURGE.B", b"")
            finally:
                await nc.close()
            all_acked.clear()
        print(f"\n{ROUNDS} kill -9 rounds: the last one left {whole} whole batches")
    finally:
        server.cleanup()


def _time(text: str) -> dt.datetime:
    """An RFC 3339 time with up to nanoseconds (fromisoformat takes microseconds)."""
    text = re.sub(r"(\.[0-9]{6})[0-9]*", r"\1", text)
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _at(seconds: float) -> str:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_schedules_fire_once_across_kill_minus_nine(tmp_path: Any) -> None:
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "0")) or None)
    server = RunningServer(store=f"sqlite:{tmp_path}", args=["--sync", "always"])
    server.start()
    try:
        nc = await nats.connect(server.url)
        config = {"name": "S", "subjects": ["sch.>", "out.>"], "allow_msg_schedules": True}
        await nc.request("$JS.API.STREAM.CREATE.S", json.dumps(config).encode())
        for i in range(5):
            await nc.request(
                f"sch.every.{i}",
                b"every",
                headers={"Nats-Schedule": "@every 2s", "Nats-Schedule-Target": f"out.every.{i}"},
            )
        for i in range(8):
            await nc.request(
                f"sch.at.{i}",
                b"at",
                headers={
                    "Nats-Schedule": f"@at {_at(1 + i)}",
                    "Nats-Schedule-Target": f"out.at.{i}",
                },
            )
        await nc.close()
        for _ in range(3):
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            server.kill()
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            server.start()
        await asyncio.sleep(5)  # every @at is due by now, and each repeat ran again
        nc = await nats.connect(server.url)
        try:
            msgs = await stored(nc, "S")
        finally:
            await nc.close()
        produced: dict[str, list[dict[str, Any]]] = {}
        for msg in msgs:
            if msg["subject"].startswith("out."):
                produced.setdefault(msg["headers"]["Nats-Scheduler"], []).append(msg)
        for i in range(8):
            assert len(produced.get(f"sch.at.{i}", [])) == 1, (
                f"@at {i}: {produced.get(f'sch.at.{i}')}"
            )
        assert not any(m["subject"].startswith("sch.at.") for m in msgs)  # fired: purged
        for i in range(5):
            runs = produced[f"sch.every.{i}"]
            assert len(runs) >= 4, f"@every {i} stopped: {len(runs)} runs"
            nexts = [r["headers"]["Nats-Schedule-Next"] for r in runs]
            assert nexts == sorted(set(nexts)), f"@every {i} fired twice for one run: {nexts}"
            times = [_time(r["time"]) for r in runs]
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
            assert min(gaps) > 1.0, f"@every {i} fired twice: {gaps}"
    finally:
        server.cleanup()
