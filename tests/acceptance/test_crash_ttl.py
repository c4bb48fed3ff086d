"""Crash safety of per-message TTLs and subject delete markers: ``tether serve`` (SQLite,
sync="always") killed with SIGKILL while messages with a ``Nats-TTL`` are published,
and again while they expire.

Every message is on its own subject, so each expiry leaves exactly one delete marker
(``subject_delete_marker_ttl``), which expires in turn without a marker of its own.
After every restart: no acknowledged message is lost; the TTLs read back from the store
still expire (also those that came due while the server was down); and once everything
has expired, the stream has used exactly two sequences per stored message (the message
and its one marker): a marker lost or stored twice across a crash would show there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tether.testing import RunningServer

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("TETHER_CRASH_ROUNDS", "2"))
COUNT = 300
TTL = 3  # seconds; the delete markers live 1 s


async def info(nc: Client) -> dict[str, Any]:
    reply = await nc.request("$JS.API.STREAM.INFO.T", b"", timeout=5)
    state: dict[str, Any] = json.loads(reply.data)["state"]
    return state


async def subjects(nc: Client) -> dict[str, int]:
    body = json.dumps({"subjects_filter": ">"}).encode()
    reply = await nc.request("$JS.API.STREAM.INFO.T", body, timeout=5)
    found: dict[str, int] = json.loads(reply.data)["state"].get("subjects") or {}
    return found


async def publish_until_killed(url: str, round_no: int, kill_after: int, kill: Any) -> set[str]:
    """Publish COUNT messages with a TTL, 50 in flight; kill the server once
    ``kill_after`` are acknowledged. Returns the acknowledged subjects."""
    nc = await nats.connect(url, allow_reconnect=False)
    js = nc.jetstream(timeout=5)
    acked: set[str] = set()
    slots = asyncio.Semaphore(50)
    killing: list[asyncio.Future[None]] = []

    async def one(i: int) -> None:
        subject = f"ttl.{round_no}.{i}"
        try:
            await js.publish(subject, b"x" * 40, headers={"Nats-TTL": str(TTL)})
        except Exception:
            return  # the server went away: not acknowledged
        finally:
            slots.release()
        acked.add(subject)
        if len(acked) >= kill_after and not killing:
            killing.append(asyncio.ensure_future(asyncio.to_thread(kill)))

    tasks = []
    for i in range(COUNT):
        await slots.acquire()
        if killing:
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks, return_exceptions=True)
    if not killing:
        killing.append(asyncio.ensure_future(asyncio.to_thread(kill)))
    await killing[0]
    with contextlib.suppress(Exception):
        await nc.close()
    return acked


async def wait_until(nc: Client, done: Any) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        state = await info(nc)
        if done(state):
            return state
        assert loop.time() < deadline, f"stream never settled: {state}"
        await asyncio.sleep(0.1)


async def test_ttls_and_markers_survive_kill_minus_nine(tmp_path: Any) -> None:
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "0")) or None)
    server = RunningServer(store=f"sqlite:{tmp_path}", args=["--sync", "always"])
    server.start()
    try:
        nc = await nats.connect(server.url)
        config = {"name": "T", "subjects": ["ttl.>"], "subject_delete_marker_ttl": 10**9}
        await nc.request("$JS.API.STREAM.CREATE.T", json.dumps(config).encode())
        await nc.close()
        base = 0
        for round_no in range(ROUNDS):
            acked = await publish_until_killed(
                server.url, round_no, rng.randint(20, COUNT - 20), server.kill
            )
            server.start()
            nc = await nats.connect(server.url)
            try:
                # Nothing acknowledged is lost (none has expired yet).
                present = {s for s in await subjects(nc) if s.startswith(f"ttl.{round_no}.")}
                assert acked <= present, f"lost: {sorted(acked - present)[:5]}"
                stored = len(present)
                # Kill again while the TTLs come due and markers are being written.
                await asyncio.sleep(TTL - 0.5 + rng.random() * 1.5)
            finally:
                await nc.close()
            server.kill()
            server.start()
            nc = await nats.connect(server.url)
            try:
                # Everything expires: the messages (some came due while the server was
                # down), then their markers.
                state = await wait_until(nc, lambda st: st["messages"] == 0)
                assert state["last_seq"] - base == 2 * stored, (
                    f"round {round_no}: {stored} messages used "
                    f"{state['last_seq'] - base} sequences (one marker each expected)"
                )
                base = state["last_seq"]
            finally:
                await nc.close()
        print(f"\n{ROUNDS} rounds of kill -9 under TTLs: {base} sequences, as expected")
    finally:
        server.cleanup()
