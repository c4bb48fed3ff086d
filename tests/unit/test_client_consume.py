"""Continuous consumption (``PullSubscription.messages``) against a scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tether.client import Backoff, ConsumerDeleted, PullSubscription, connect
from tether.client.connection import Connection
from tether.client.testing import ScriptedConnection, ScriptedServer

NEXT = "$JS.API.CONSUMER.MSG.NEXT.bar.dur"

Setup = tuple[Connection, ScriptedConnection, PullSubscription, str, str, ScriptedServer]


def msg(sid: str, n: int) -> bytes:
    ack = f"$JS.ACK.bar.dur.1.{n}.{n}.1626845015078897000.0".encode()
    return b"MSG bar %s %s 1\r\nx\r\n" % (sid.encode(), ack)


def status(inbox: str, sid: str, code: int, text: str, headers: str = "") -> bytes:
    block = f"NATS/1.0 {code} {text}\r\n{headers}\r\n".encode()
    return b"HMSG %s %s %d %d\r\n%s\r\n" % (
        inbox.encode(),
        sid.encode(),
        len(block),
        len(block),
        block,
    )


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    async with ScriptedServer() as server:
        nc = await connect(server.url, reconnect_backoff=Backoff(0.01, 0.05, 2, 0))
        peer = await server.connection()
        sub = await nc.jetstream().pull_subscribe("bar", "dur")
        prefix, sid = (await peer.expect("SUB")).args
        yield nc, peer, sub, prefix[:-1], sid, server
        await nc.close()


async def test_prefetch_is_topped_up_at_the_threshold(setup: Setup) -> None:
    _, peer, sub, prefix, sid, _ = setup
    stream = sub.messages(batch=10, threshold=5, expires=5.0, heartbeat=None)
    first = asyncio.create_task(stream.__anext__())
    pull = await peer.expect("PUB")
    assert pull.line.startswith(f"PUB {NEXT} {prefix}")
    assert pull.payload == b'{"batch":10,"expires":4900000000}'
    peer.send(b"".join(msg(sid, n) for n in range(1, 11)))
    got = [await asyncio.wait_for(first, 2)]
    for _ in range(3):
        got.append(await stream.__anext__())
    await peer.nothing(0.2)  # 6 buffered, nothing owed: above the threshold
    got.append(await stream.__anext__())  # 5 buffered: at the threshold, top up to 10
    top_up = await peer.expect("PUB")
    assert top_up.payload == b'{"batch":5,"expires":4900000000}'
    assert [m.metadata.stream_seq for m in got] == [1, 2, 3, 4, 5]
    await stream.stop()


async def test_an_expired_request_is_renewed(setup: Setup) -> None:
    _, peer, sub, _prefix, sid, _ = setup
    stream = sub.messages(batch=4, expires=1.0, heartbeat=None)
    waiting = asyncio.create_task(stream.__anext__())
    pull = await peer.expect("PUB")
    reply = pull.args[1]
    peer.send(msg(sid, 1))
    assert (await asyncio.wait_for(waiting, 2)).metadata.stream_seq == 1
    waiting = asyncio.create_task(stream.__anext__())
    peer.send(status(reply, sid, 408, "Request Timeout", "Nats-Pending-Messages: 3\r\n"))
    renewed = await peer.expect("PUB")
    assert renewed.json()["batch"] == 4
    peer.send(msg(sid, 2))
    assert (await asyncio.wait_for(waiting, 2)).metadata.stream_seq == 2
    await stream.stop()


async def test_missed_heartbeats_trigger_a_new_pull(setup: Setup) -> None:
    _, peer, sub, _, _, _ = setup
    stream = sub.messages(batch=5, expires=1.0, heartbeat=0.1)
    waiting = asyncio.create_task(stream.__anext__())
    first = await peer.expect("PUB")
    assert first.json() == {"batch": 5, "expires": 900_000_000, "idle_heartbeat": 100_000_000}
    again = await peer.expect("PUB", within=2)  # the server went silent: pull again
    assert again.json()["batch"] == 5
    assert stream.heartbeats_missed >= 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.stop()


async def test_consumer_deleted_ends_the_stream(setup: Setup) -> None:
    _, peer, sub, _, sid, _ = setup
    stream = sub.messages(batch=5, expires=2.0, heartbeat=None)
    waiting = asyncio.create_task(stream.__anext__())
    reply = (await peer.expect("PUB")).args[1]
    peer.send(status(reply, sid, 409, "Consumer Deleted"))
    with pytest.raises(ConsumerDeleted):
        await asyncio.wait_for(waiting, 2)
    assert stream.stopped


async def test_stop_cancels_waiting_requests(setup: Setup) -> None:
    _, peer, sub, _prefix, sid, _ = setup
    async with sub.messages(batch=5, expires=5.0, heartbeat=None) as stream:
        waiting = asyncio.create_task(stream.__anext__())
        await peer.expect("PUB")
        peer.send(msg(sid, 1))
        await asyncio.wait_for(waiting, 2)
    # The old wildcard interest is dropped (so the server forgets the request) and a
    # new one takes its place.
    assert (await peer.expect("SUB")).line.startswith("SUB _INBOX.")
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_reconnect_pulls_again(setup: Setup) -> None:
    _, peer, sub, _, _, server = setup
    stream = sub.messages(batch=3, expires=5.0, heartbeat=None)
    waiting = asyncio.create_task(stream.__anext__())
    await peer.expect("PUB")
    peer.abort()
    again = await server.connection()
    _, wild_sid = (await again.expect("SUB")).args
    pull = await again.expect("PUB")
    assert pull.json()["batch"] == 3  # nothing was owed any more: the full batch again
    again.send(msg(wild_sid, 1))
    assert (await asyncio.wait_for(waiting, 2)).metadata.stream_seq == 1
    await stream.stop()


@pytest.mark.parametrize(
    ("code", "description", "error"),
    [(503, "", "NoResponders"), (409, "Server Shutdown", "PullError")],
    ids=["no-responders", "server-shutdown"],
)
async def test_no_responders_is_reported_and_pulled_again_later(
    code: int, description: str, error: str
) -> None:
    """A 503 (the server still restoring its consumers, say) or a 409 Server Shutdown
    (every waiting request dropped) does not end the stream: it is reported, and the
    pull is repeated after a growing delay."""
    reported: list[Exception] = []
    async with ScriptedServer() as server:
        nc = await connect(server.url, error_cb=reported.append)
        peer = await server.connection()
        sub = await nc.jetstream().pull_subscribe("bar", "dur")
        sid = (await peer.expect("SUB")).args[1]
        await _no_responders_flow(peer, sub, sid, reported, code, description)
        assert [type(e).__name__ for e in reported] == [error, error]
        await nc.close()


async def _no_responders_flow(
    peer: ScriptedConnection,
    sub: PullSubscription,
    sid: str,
    reported: list[Exception],
    code: int = 503,
    description: str = "",
) -> None:
    stream = sub.messages(batch=5, expires=5.0, heartbeat=None)
    waiting = asyncio.create_task(stream.__anext__())
    reply = (await peer.expect("PUB")).args[1]
    loop = asyncio.get_running_loop()
    peer.send(status(reply, sid, code, description))
    sent = loop.time()
    again = await peer.expect("PUB", within=2)
    first_gap = loop.time() - sent
    assert again.json()["batch"] == 5 and 0.08 <= first_gap < 1.0
    peer.send(status(reply, sid, code, description))
    sent = loop.time()
    await peer.expect("PUB", within=2)
    assert loop.time() - sent >= 0.18  # doubled
    assert not waiting.done()
    peer.send(msg(sid, 1))
    assert (await asyncio.wait_for(waiting, 2)).metadata.stream_seq == 1
    assert len(reported) == 2
    await stream.stop()
