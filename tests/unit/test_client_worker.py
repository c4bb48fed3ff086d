"""Worker behaviour (settling, retries, give-up, backoff, RDY) asserted on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tether.client import Backoff, JsMsg, PullSubscription, Retry, Worker, connect
from tether.client.connection import Connection
from tether.client.testing import Frame, ScriptedConnection, ScriptedServer

NEXT = "$JS.API.CONSUMER.MSG.NEXT.bar.dur"


def ack_subject(seq: int, delivered: int = 1) -> str:
    return f"$JS.ACK.bar.dur.{delivered}.{seq}.{seq}.1626845015078897000.0"


def msg(sid: str, seq: int, delivered: int = 1) -> bytes:
    ack = ack_subject(seq, delivered).encode()
    return b"MSG bar %s %s 2\r\n%02d\r\n" % (sid.encode(), ack, seq % 100)


def kind(frame: Frame) -> str:
    if frame.op == "PUB" and frame.args[0] == NEXT:
        return "pull"
    if frame.op == "PUB" and frame.args[0].startswith("$JS.ACK."):
        return "settle"
    return frame.op


@dataclass
class Peer:
    conn: Connection
    peer: ScriptedConnection
    sub: PullSubscription
    sid: str  # the wildcard inbox's sid
    stash: list[Frame] = field(default_factory=list)

    async def next(self, wanted: str, within: float = 3.0) -> Frame:
        """The next frame of a kind (pull, settle, SUB, UNSUB); others wait their turn."""
        for i, frame in enumerate(self.stash):
            if kind(frame) == wanted:
                return self.stash.pop(i)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            frame = await self.peer.next(max(0.0, deadline - loop.time()))
            if kind(frame) == wanted:
                return frame
            self.stash.append(frame)

    async def pull(self, within: float = 3.0) -> dict[str, Any]:
        body: dict[str, Any] = (await self.next("pull", within)).json()
        return body

    async def settle(self, within: float = 3.0) -> Frame:
        return await self.next("settle", within)


@pytest.fixture
async def servers() -> AsyncIterator[list[ScriptedServer]]:
    a, b = ScriptedServer(), ScriptedServer()
    await a.start()
    await b.start()
    yield [a, b]
    await a.close()
    await b.close()


async def attach(server: ScriptedServer) -> Peer:
    conn = await connect(server.url, reconnect_backoff=Backoff(0.01, 0.05, 2, 0))
    peer = await server.connection()
    sub = await conn.jetstream().pull_subscribe("bar", "dur")
    _, sid = (await peer.expect("SUB")).args
    return Peer(conn, peer, sub, sid)


@pytest.fixture
async def one(servers: list[ScriptedServer]) -> AsyncIterator[Peer]:
    p = await attach(servers[0])
    yield p
    await p.conn.close()


def worker(p: Peer | list[Peer], handler: Any, **kw: Any) -> Worker:
    peers = p if isinstance(p, list) else [p]
    kw.setdefault("heartbeat", None)
    kw.setdefault("backoff", None)
    return Worker([x.sub for x in peers], handler, **kw)


async def test_success_acks_and_rdy_grows_from_one(one: Peer) -> None:
    async def handler(m: JsMsg) -> None:
        pass

    async with worker(one, handler, max_in_flight=8, pull_expires=5.0):
        assert await one.pull() == {"batch": 1, "expires": 4_900_000_000}  # initial RDY 1
        one.peer.send(msg(one.sid, 1))
        ack = await one.settle()
        assert ack.line == f"PUB {ack_subject(1)} 4" and ack.payload == b"+ACK"
        assert (await one.pull())["batch"] == 8  # the full share after the first message


async def test_failure_naks_with_a_delay_growing_with_attempts(one: Peer) -> None:
    async def handler(m: JsMsg) -> None:
        raise RuntimeError("downstream is down")

    async with worker(one, handler, max_in_flight=4, requeue_delay=2.0):
        await one.pull()
        one.peer.send(msg(one.sid, 1, delivered=1))
        assert (await one.settle()).payload == b'-NAK {"delay":2000000000}'
        await one.pull()
        one.peer.send(msg(one.sid, 1, delivered=3))
        assert (await one.settle()).payload == b'-NAK {"delay":6000000000}'


async def test_explicit_retry_uses_its_delay(one: Peer) -> None:
    async def handler(m: JsMsg) -> None:
        raise Retry(delay=7)

    async with worker(one, handler, max_in_flight=1):
        await one.pull()
        one.peer.send(msg(one.sid, 1))
        assert (await one.settle()).payload == b'-NAK {"delay":7000000000}'


async def test_max_attempts_gives_up_then_terms(one: Peer) -> None:
    calls: list[int] = []
    given_up: list[int] = []

    async def handler(m: JsMsg) -> None:
        calls.append(m.metadata.stream_seq)
        raise RuntimeError("poison")

    async with worker(
        one,
        handler,
        max_in_flight=2,
        max_attempts=3,
        on_give_up=lambda m: given_up.append(m.metadata.stream_seq),
    ):
        await one.pull()
        one.peer.send(msg(one.sid, 5, delivered=3))  # last attempt fails
        assert (await one.settle()).payload == b"+TERM max attempts reached"
        one.peer.send(msg(one.sid, 6, delivered=4))  # already over: not even handled
        assert (await one.settle()).payload == b"+TERM max attempts reached"
    assert calls == [5]
    assert given_up == [5, 6]


async def test_in_progress_only_when_the_handler_asks(one: Peer) -> None:
    async def handler(m: JsMsg) -> None:
        if m.metadata.stream_seq == 2:
            await m.in_progress()

    async with worker(one, handler, max_in_flight=1):
        await one.pull()
        one.peer.send(msg(one.sid, 1))
        assert (await one.settle()).payload == b"+ACK"
        await one.pull()
        one.peer.send(msg(one.sid, 2))
        assert (await one.settle()).payload == b"+WPI"
        assert (await one.settle()).payload == b"+ACK"


async def test_sync_handlers_run_in_threads(one: Peer) -> None:
    threads: list[str] = []

    def handler(m: Any) -> None:
        threads.append(threading.current_thread().name)
        m.in_progress()

    async with worker(one, handler, max_in_flight=1):
        await one.pull()
        one.peer.send(msg(one.sid, 1))
        assert (await one.settle()).payload == b"+WPI"
        assert (await one.settle()).payload == b"+ACK"
    assert threads and threads[0].startswith("tether-worker")


async def test_backoff_stops_pulling_then_tests_with_one_message(one: Peer) -> None:
    loop = asyncio.get_running_loop()
    fail = False

    async def handler(m: JsMsg) -> None:
        if fail:
            raise RuntimeError("failing")

    w = worker(one, handler, max_in_flight=4, backoff=Backoff(0.4, 2.0, 2.0, 0.0), requeue_delay=0)
    async with w:
        assert (await one.pull())["batch"] == 1
        one.peer.send(msg(one.sid, 1))
        assert (await one.settle()).payload == b"+ACK"
        assert (await one.pull())["batch"] == 4
        fail = True
        one.peer.send(msg(one.sid, 2))
        assert (await one.settle()).payload == b'-NAK {"delay":0}'
        failed_at = loop.time()
        # RDY 0: the 3 messages still owed are cancelled by replacing the wildcard inbox.
        new_wildcard = await one.next("SUB")
        assert (await one.next("UNSUB")).line == f"UNSUB {one.sid}"
        one.sid = new_wildcard.args[1]
        test_pull = await one.pull(within=3)
        waited = loop.time() - failed_at
        assert test_pull["batch"] == 1  # test the waters with one message
        assert 0.35 <= waited < 1.0, waited
        fail = False
        one.peer.send(msg(one.sid, 3))
        assert (await one.settle()).payload == b"+ACK"
        # Level 1 -> 0 after one success: full flow again.
        assert (await one.pull())["batch"] == 4


async def test_backoff_grows_while_failures_continue(one: Peer) -> None:
    loop = asyncio.get_running_loop()

    async def handler(m: JsMsg) -> None:
        raise RuntimeError("failing")

    async with worker(
        one, handler, max_in_flight=2, backoff=Backoff(0.2, 2.0, 2.0, 0.0), requeue_delay=0
    ):
        await one.pull()
        gaps = []
        for seq in (1, 2, 3):
            one.peer.send(msg(one.sid, seq))
            await one.settle()
            t0 = loop.time()
            await one.pull(within=3)
            gaps.append(loop.time() - t0)
            one.sid = [f for f in one.peer.frames if f.op == "SUB"][-1].args[1]
    assert 0.15 < gaps[0] < 0.5 and 0.35 < gaps[1] < 0.8 and 0.7 < gaps[2] < 1.4, gaps


async def test_max_in_flight_spans_servers(servers: list[ScriptedServer]) -> None:
    a, b = await attach(servers[0]), await attach(servers[1])
    try:
        release = asyncio.Event()

        async def handler(m: JsMsg) -> None:
            await release.wait()

        async with worker([a, b], handler, max_in_flight=1, stop_timeout=1):
            pulls = []
            for p in (a, b):
                with contextlib.suppress(TimeoutError):
                    pulls.append(await p.pull(within=0.5))
            assert pulls == [{"batch": 1, "expires": 9_900_000_000}]  # one RDY for both
            release.set()
    finally:
        await a.conn.close()
        await b.conn.close()


async def test_rdy_is_split_evenly(servers: list[ScriptedServer]) -> None:
    a, b = await attach(servers[0]), await attach(servers[1])
    try:

        async def handler(m: JsMsg) -> None:
            pass

        async with worker([a, b], handler, max_in_flight=10):
            for p in (a, b):
                assert (await p.pull())["batch"] == 1
                p.peer.send(msg(p.sid, 1))
                await p.settle()
                assert (await p.pull())["batch"] == 5
    finally:
        await a.conn.close()
        await b.conn.close()


async def test_stop_finishes_in_flight_and_returns_the_rest(one: Peer) -> None:
    started = asyncio.Event()
    finished: list[int] = []

    async def handler(m: JsMsg) -> None:
        started.set()
        await asyncio.sleep(0.2)
        finished.append(m.metadata.stream_seq)

    w = worker(one, handler, max_in_flight=1)
    await w.start()
    await one.pull()
    assert not w.is_starved()
    one.peer.send(msg(one.sid, 1))
    await started.wait()
    assert w.is_starved()  # 1 in flight of RDY 1: time for a batching handler to flush
    await w.stop(timeout=2)
    assert finished == [1]
    settled = [f.payload for f in one.peer.frames if f.args and f.args[0].startswith("$JS.ACK.")]
    assert settled == [b"+ACK"]
