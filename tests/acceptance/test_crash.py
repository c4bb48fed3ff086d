"""Crash safety: ``tether serve`` (SQLite, sync="always") killed with SIGKILL under load.

A publisher pipelines acknowledged publishes over a raw socket, hundreds in flight. The
server is killed at a random moment, restarted on the same store, and the publisher
retries what was not acknowledged with the same ``Nats-Msg-Id``. After every restart:

* every acknowledged message is stored exactly once, at its acknowledged sequence, with
  its content;
* no message is stored twice (retries of messages stored but not acknowledged are
  reported as duplicates of the stored one: dedup survives the restart);
* the stream is contiguous and the next sequence follows the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tether.testing import RunningServer

# Imported with --import-mode=importlib: the crash tests' shared helpers are a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from crash_support import payload_for, read_stream

pytestmark = pytest.mark.slow

STREAM = "CRASH"
ROUNDS = int(os.environ.get("TETHER_CRASH_ROUNDS", "5"))
WINDOW = 400  # publishes in flight
INBOX = "_INBOX.crash"


@dataclass
class Ack:
    seq: int
    duplicate: bool


@dataclass
class Outcome:
    """What one publisher connection saw before it ended (or finished)."""

    acked: dict[str, Ack] = field(default_factory=dict)
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    sent: int = 0
    in_flight_at_end: int = 0


class RawPublisher:
    """Pipelines ``HPUB``s with reply subjects and matches the PubAcks to them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        info = await self.reader.readline()
        assert info.startswith(b"INFO "), info
        connect = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
        self.writer.write(
            b"CONNECT %s\r\nSUB %s.* 1\r\nPING\r\n" % (json.dumps(connect).encode(), INBOX.encode())
        )
        await self.writer.drain()
        while (line := await self.reader.readline()) != b"PONG\r\n":
            assert line and not line.startswith(b"-ERR"), line

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()

    async def publish_all(
        self,
        messages: list[tuple[str, bytes]],
        on_ack: Any = None,
    ) -> Outcome:
        """Publish ``(key, payload)`` pairs, ``WINDOW`` in flight, until done or cut off.

        ``on_ack(outcome)`` is called after every ack (the test's kill switch).
        """
        assert self.reader is not None and self.writer is not None
        reader, writer = self.reader, self.writer
        outcome = Outcome()
        slots = asyncio.Semaphore(WINDOW)
        pending: set[str] = set()

        async def send() -> None:
            for key, payload in messages:
                await slots.acquire()
                header = b"NATS/1.0\r\nNats-Msg-Id: %s\r\n\r\n" % key.encode()
                subject = f"crash.{key.split('-')[0]}"
                writer.write(
                    b"HPUB %s %s.%s %d %d\r\n%s%s\r\n"
                    % (
                        subject.encode(),
                        INBOX.encode(),
                        key.encode(),
                        len(header),
                        len(header) + len(payload),
                        header,
                        payload,
                    )
                )
                pending.add(key)
                outcome.sent += 1
                await writer.drain()

        async def receive() -> None:
            while pending or outcome.sent < len(messages):
                line = await reader.readline()
                if not line:
                    raise ConnectionResetError("server closed the connection")
                if line == b"PING\r\n":
                    writer.write(b"PONG\r\n")
                    continue
                if not line.startswith(b"MSG "):
                    assert not line.startswith(b"-ERR"), line
                    continue
                _, subject, _sid, size = line.split()
                body = await reader.readexactly(int(size) + 2)
                key = subject.decode()[len(INBOX) + 1 :]
                reply = json.loads(body[:-2])
                pending.discard(key)
                slots.release()
                if "error" in reply:
                    outcome.errors[key] = reply["error"]
                else:
                    assert reply["stream"] == STREAM
                    outcome.acked[key] = Ack(reply["seq"], bool(reply.get("duplicate")))
                if on_ack is not None:
                    on_ack(outcome)

        sender = asyncio.ensure_future(send())
        try:
            await receive()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # the server was killed
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender
        outcome.in_flight_at_end = len(pending)
        return outcome


@dataclass
class Ledger:
    """Everything the publisher was told, across rounds."""

    payloads: dict[str, bytes] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    duplicates_after_restart: int = 0
    killed_with_in_flight: int = 0

    def record(self, outcome: Outcome) -> None:
        assert not outcome.errors, outcome.errors
        for key, ack in outcome.acked.items():
            previous = self.acked.setdefault(key, ack.seq)
            assert previous == ack.seq, f"{key} acknowledged as {previous} and then {ack.seq}"


async def verify(nc: Client, ledger: Ledger) -> int:
    """The durability promises; returns the stream's last sequence."""
    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=5)).data)
    state = info["state"]
    stored = await read_stream(nc, STREAM)
    last = state["last_seq"]
    assert state["messages"] == len(stored)
    # Commits are atomic and in order, and nothing was deleted: no gaps.
    assert sorted(stored) == list(range(1, last + 1))
    by_key: dict[str, int] = {}
    for seq, (subject, data, key) in stored.items():
        assert key not in by_key, f"{key} stored twice: {by_key[key]} and {seq}"
        by_key[key] = seq
        assert data == ledger.payloads[key], f"{key} at {seq} has other content"
        assert subject == f"crash.{key.split('-')[0]}"
    for key, seq in ledger.acked.items():
        assert by_key.get(key) == seq, f"acknowledged {key} (seq {seq}) is not stored there"
    return int(last)


async def test_every_acknowledged_message_survives_kill_minus_nine(
    tmp_path: Any,
) -> None:
    rng = random.Random(int(os.environ.get("TETHER_CRASH_SEED", "0")) or None)
    server = RunningServer(store=f"sqlite:{tmp_path}", args=["--sync", "always"])
    server.start()
    ledger = Ledger()
    try:
        nc = await nats.connect(server.url)
        await nc.jsm().add_stream(name=STREAM, subjects=["crash.>"], allow_direct=True)
        await nc.close()
        for round_no in range(ROUNDS):
            keys = [f"r{round_no}-{i}" for i in range(20_000)]
            for key in keys:
                ledger.payloads[key] = payload_for(key, rng)
            kill_after = rng.randint(200, 3000)
            killing: list[asyncio.Task[None]] = []

            def kill_switch(
                outcome: Outcome,
                target: int = kill_after,
                killing: list[asyncio.Task[None]] = killing,
            ) -> None:
                if len(outcome.acked) >= target and not killing:
                    killing.append(asyncio.ensure_future(asyncio.to_thread(server.kill)))

            publisher = RawPublisher(server.port)
            await publisher.connect()
            outcome = await publisher.publish_all(
                [(k, ledger.payloads[k]) for k in keys], kill_switch
            )
            await publisher.close()
            assert killing, f"round {round_no}: everything was acknowledged before the kill"
            await killing[0]
            ledger.record(outcome)
            if outcome.in_flight_at_end:
                ledger.killed_with_in_flight += 1

            server.start()
            nc = await nats.connect(server.url)
            try:
                await verify(nc, ledger)
                # The publisher retries what it sent without an answer, same msg ids.
                unanswered = [k for k in keys[: outcome.sent] if k not in outcome.acked]
                publisher = RawPublisher(server.port)
                await publisher.connect()
                retried = await publisher.publish_all([(k, ledger.payloads[k]) for k in unanswered])
                await publisher.close()
                assert len(retried.acked) == len(unanswered)
                ledger.record(retried)
                ledger.duplicates_after_restart += sum(
                    1 for ack in retried.acked.values() if ack.duplicate
                )
                last = await verify(nc, ledger)
                probe = f"next-{round_no}"
                ledger.payloads[probe] = b"next"
                ack = await nc.jetstream().publish(
                    "crash.next", b"next", headers={"Nats-Msg-Id": probe}
                )
                assert ack.seq == last + 1
                ledger.acked[probe] = ack.seq
            finally:
                await nc.close()
        print(
            f"\n{ROUNDS} kill -9 rounds: {len(ledger.acked)} acknowledged messages verified,"
            f" {ledger.killed_with_in_flight} kills with publishes in flight,"
            f" {ledger.duplicates_after_restart} retries answered as duplicates"
        )
        assert ledger.killed_with_in_flight > 0
    finally:
        server.cleanup()
