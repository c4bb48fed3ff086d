"""The catch-up algorithm step by step against a scripted JetStream: the overlap between
the last pull and the push buffer is skipped, and a push gap falls back to pulling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tether.client import CatchUpSubscription, JsMsg, connect
from tether.client.testing import Frame, Progress, ScriptedConnection, ScriptedServer

API = "$JS.API."


class FakeJetStream:
    """Answers consumer create/delete and pull requests for one stream ``S``."""

    def __init__(self, peer: ScriptedConnection) -> None:
        self.peer = peer
        self.stream: list[bytes] = []  # index i holds sequence i + 1
        self.subs: dict[str, str] = {}  # subject (maybe ending in .*) -> sid
        self.consumers: dict[str, dict[str, Any]] = {}
        self.pushes: asyncio.Queue[str] = asyncio.Queue()  # push consumer names, as created
        self.pulls: list[int] = []  # first sequence of every pull consumer
        self.deleted: list[str] = []
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def sid_for(self, subject: str) -> str:
        if subject in self.subs:
            return self.subs[subject]
        return self.subs[subject.rsplit(".", 1)[0] + ".*"]

    def send(self, subject: str, payload: bytes, reply: str = "", to: str = "") -> None:
        sid = self.sid_for(to or subject)
        head = f"MSG {subject} {sid} {reply} {len(payload)}".replace("  ", " ")
        self.peer.send(head.encode() + b"\r\n" + payload + b"\r\n")

    def reply(self, to: str, body: dict[str, Any]) -> None:
        self.send(to, json.dumps(body).encode())

    def deliver(self, name: str, seq: int, cseq: int, to: str) -> None:
        pending = len(self.stream) - seq
        ack = f"$JS.ACK.S.{name}.1.{seq}.{cseq}.1700000000000000000.{pending}"
        self.send("s.events", self.stream[seq - 1], ack, to=to)

    def push(self, seq: int, cseq: int) -> None:
        """Deliver ``seq`` through the newest live push consumer."""
        live = [
            n
            for n, c in self.consumers.items()
            if c.get("deliver_subject") and n not in self.deleted
        ]
        name = live[-1]
        self.deliver(name, seq, cseq, self.consumers[name]["deliver_subject"])

    async def _serve(self) -> None:
        while True:
            frame = await self.peer.next(within=60)
            self.handle(frame)

    def handle(self, frame: Frame) -> None:
        if frame.op == "SUB":
            subject, sid = frame.args[0], frame.args[-1]
            self.subs[subject] = sid
        elif frame.op == "PUB" and frame.args[0].startswith(API + "CONSUMER.CREATE."):
            body = frame.json()
            config = body["config"]
            name = config["name"]
            self.consumers[name] = {**config, "cursor": config.get("opt_start_seq") or 1, "cseq": 0}
            if config.get("deliver_subject"):
                self.pushes.put_nowait(name)
            else:
                self.pulls.append(config["opt_start_seq"])
            self.reply(frame.args[1], {"stream_name": "S", "name": name, "config": config})
        elif frame.op == "PUB" and frame.args[0].startswith(API + "CONSUMER.DELETE."):
            self.deleted.append(frame.args[0].rsplit(".", 1)[1])
            self.reply(frame.args[1], {"success": True})
        elif frame.op == "PUB" and frame.args[0].startswith(API + "CONSUMER.MSG.NEXT."):
            name = frame.args[0].rsplit(".", 1)[1]
            consumer = self.consumers[name]
            inbox = frame.args[1]
            batch = frame.json()["batch"]
            sent = 0
            while sent < batch and consumer["cursor"] <= len(self.stream):
                consumer["cseq"] += 1
                self.deliver(name, consumer["cursor"], consumer["cseq"], inbox)
                consumer["cursor"] += 1
                sent += 1
            if sent < batch:
                block = b"NATS/1.0 404 No Messages\r\n\r\n"
                sid = self.sid_for(inbox)
                self.peer.send(
                    b"HMSG %s %s %d %d\r\n%s\r\n"
                    % (inbox.encode(), sid.encode(), len(block), len(block), block)
                )


@pytest.fixture
async def fake() -> AsyncIterator[FakeJetStream]:
    async with ScriptedServer() as server:
        task = asyncio.create_task(connect(server.url))
        peer = await server.connection()
        nc = await task
        js = FakeJetStream(peer)
        js.nc = nc  # type: ignore[attr-defined]
        yield js
        js.task.cancel()
        await nc.close()


async def test_overlap_is_skipped_and_a_gap_resyncs(fake: FakeJetStream) -> None:
    fake.stream = [b"%d" % i for i in range(1, 6)]  # 1..5 before we start
    seen: list[int] = []
    progress = Progress()

    def handler(msg: JsMsg) -> None:
        seen.append(msg.metadata.stream_seq)
        progress.add()

    sub = CatchUpSubscription(fake.nc.jetstream(), "S", handler, heartbeat=5)  # type: ignore[attr-defined]
    await sub.start()
    await progress.reach(5, 5)  # step 1: pulled 1..5
    first_push = await asyncio.wait_for(fake.pushes.get(), 5)  # step 2: push consumer, new messages
    # 6 and 7 were published meanwhile; the push consumer saw 7 and 8.
    fake.stream += [b"6", b"7", b"8"]
    fake.push(7, 1)
    fake.push(8, 2)
    await sub.wait_live(5)  # step 3 pulled 6..8 from the stream; step 4 drained the buffer
    assert seen == [1, 2, 3, 4, 5, 6, 7, 8]  # 7 and 8 from the buffer were skipped
    assert fake.pulls == [1, 6]
    fake.stream += [b"9", b"10", b"11", b"12"]
    fake.push(9, 3)
    await progress.reach(9, 5)  # step 5: live on push
    fake.push(11, 5)  # consumer sequence 4 never came: a gap
    second_push = await asyncio.wait_for(fake.pushes.get(), 5)  # pulled again, then pushed again
    await progress.reach(12, 5)
    assert seen == list(range(1, 13))
    assert fake.pulls[2] == 10  # resumed right after the last processed sequence
    assert sub.resyncs == 1 and first_push in fake.deleted and second_push not in fake.deleted
    fake.stream.append(b"13")
    fake.push(13, 1)
    await progress.reach(13, 5)
    await sub.stop()
    assert seen == list(range(1, 14))
