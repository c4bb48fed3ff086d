"""The pull algorithm of the NATS pull-subscribe ADR, asserted on the wire.

A scripted server plays the JetStream side; every test checks the exact lines the
client sends (SUB, PUB ...MSG.NEXT... with its JSON body, UNSUB counts).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tether.client import (
    Backoff,
    ConnectionClosed,
    ConsumerDeleted,
    HeartbeatMissed,
    NoResponders,
    PullError,
    PullSubscription,
    Timeout,
    connect,
)
from tether.client.connection import Connection
from tether.client.testing import ScriptedConnection, ScriptedServer

NEXT = "$JS.API.CONSUMER.MSG.NEXT.bar.dur"


def ack_subject(n: int, delivered: int = 1, pending: int = 0) -> str:
    return f"$JS.ACK.bar.dur.{delivered}.{n}.{n}.1626845015078897000.{pending}"


def msg(sid: str, n: int, payload: bytes = b"helo", subject: str = "bar") -> bytes:
    return b"MSG %s %s %s %d\r\n%s\r\n" % (
        subject.encode(),
        sid.encode(),
        ack_subject(n).encode(),
        len(payload),
        payload,
    )


def status(inbox: str, sid: str, code: int, text: str = "", headers: str = "") -> bytes:
    first = f"NATS/1.0 {code}" + (f" {text}" if text else "")
    block = (first + "\r\n" + headers + "\r\n").encode()
    return b"HMSG %s %s %d %d\r\n%s\r\n" % (
        inbox.encode(),
        sid.encode(),
        len(block),
        len(block),
        block,
    )


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as srv:
        yield srv


@pytest.fixture
async def setup(
    server: ScriptedServer,
) -> AsyncIterator[tuple[Connection, ScriptedConnection, PullSubscription, str, str]]:
    nc = await connect(server.url, reconnect_backoff=Backoff(0.01, 0.05, 2, 0))
    peer = await server.connection()
    sub = await nc.jetstream().pull_subscribe("bar", "dur")
    wild = await peer.expect("SUB")
    prefix, wild_sid = wild.args
    assert prefix.startswith("_INBOX.") and prefix.endswith(".*")
    yield nc, peer, sub, prefix[:-1], wild_sid
    await nc.close()


Setup = tuple[Connection, ScriptedConnection, PullSubscription, str, str]


async def test_pull_n_no_wait_then_linger_then_partial(setup: Setup) -> None:
    """ADR example: 404 to the no_wait request, UNSUB batch+1, lingering pull, 1 of 5, UNSUB."""
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(5, timeout=5.0))
    inbox, sid = (await peer.expect("SUB")).args
    first = await peer.expect("PUB")
    assert first.line == f"PUB {NEXT} {inbox} 26"
    assert first.payload == b'{"batch":5,"no_wait":true}'
    peer.send(status(inbox, sid, 404, "No Messages"))
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid} 6"
    second = await peer.expect("PUB")
    assert second.line == f"PUB {NEXT} {inbox} 32"
    assert second.payload == b'{"batch":5,"expires":4900000000}'
    peer.send(msg(sid, 1))
    peer.send(
        status(
            inbox,
            sid,
            408,
            "Request Timeout",
            "Nats-Pending-Messages: 4\r\nNats-Pending-Bytes: 0\r\n",
        )
    )
    got = await asyncio.wait_for(task, 2)
    assert [m.data for m in got] == [b"helo"]
    assert got[0].metadata.stream_seq == 1
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_pull_n_gives_up_early_and_unsubscribes(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(5, timeout=0.5))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid} 6"
    linger = await peer.expect("PUB")
    assert linger.json() == {"batch": 5, "expires": 400_000_000}
    peer.send(msg(sid, 7))  # one message, then the server stays silent
    got = await asyncio.wait_for(task, 2)
    assert [m.metadata.stream_seq for m in got] == [7]
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_pull_n_times_out_with_nothing(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(3, timeout=0.3))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    await peer.expect("UNSUB")
    await peer.expect("PUB")
    with pytest.raises(Timeout):
        await asyncio.wait_for(task, 2)
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_pull_n_served_by_the_no_wait_request(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(3, timeout=5.0))
    _inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(msg(sid, 1) + msg(sid, 2) + msg(sid, 3))
    got = await asyncio.wait_for(task, 2)
    assert [m.metadata.stream_seq for m in got] == [1, 2, 3]
    # No lingering request was made; the inbox is released.
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"
    await peer.nothing()


async def test_pull_n_partial_no_wait_returns_what_is_there(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(10, timeout=5.0))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(msg(sid, 1) + msg(sid, 2) + status(inbox, sid, 404, "No Messages"))
    got = await asyncio.wait_for(task, 2)
    assert [m.metadata.stream_seq for m in got] == [1, 2]
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_pull_n_full_batch_on_linger_needs_no_unsub(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(2, timeout=5.0))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid} 3"
    await peer.expect("PUB")
    peer.send(msg(sid, 1) + msg(sid, 2))
    got = await asyncio.wait_for(task, 2)
    assert len(got) == 2
    await peer.nothing()  # the server dropped the interest after batch+1 messages


async def test_pull_one_uses_the_wildcard_inbox(setup: Setup) -> None:
    _, peer, sub, prefix, wild_sid = setup
    task = asyncio.create_task(sub.fetch(1, timeout=5.0))
    pub = await peer.expect("PUB")
    assert pub.line.startswith(f"PUB {NEXT} {prefix}")
    assert pub.line.endswith(" 26")
    assert pub.payload == b'{"batch":1,"no_wait":true}'
    # The message comes back with its stored subject, not the inbox.
    peer.send(msg(wild_sid, 9, subject="orders.new"))
    got = await asyncio.wait_for(task, 2)
    assert got[0].subject == "orders.new"
    assert got[0].metadata.stream_seq == 9
    await peer.nothing()  # no per-fetch SUB/UNSUB for Pull(1)


async def test_pull_one_falls_back_to_a_unique_inbox(setup: Setup) -> None:
    _, peer, sub, prefix, wild_sid = setup
    task = asyncio.create_task(sub.fetch(1, timeout=2.0))
    pub = await peer.expect("PUB")
    reply = pub.args[1]
    peer.send(status(reply, wild_sid, 404, "No Messages"))
    inbox, sid = (await peer.expect("SUB")).args
    assert not inbox.startswith(prefix)
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid} 1"
    linger = await peer.expect("PUB")
    assert linger.line == f"PUB {NEXT} {inbox} {len(linger.payload)}"
    assert linger.json() == {"batch": 1, "expires": 1_900_000_000}
    peer.send(msg(sid, 4))
    got = await asyncio.wait_for(task, 2)
    assert got[0].metadata.stream_seq == 4
    await peer.nothing()


async def test_late_reply_on_the_wildcard_is_kept_for_the_next_fetch(setup: Setup) -> None:
    _, peer, sub, _, wild_sid = setup
    task = asyncio.create_task(sub.fetch(1, timeout=0.3))
    await peer.expect("PUB")
    with pytest.raises(Timeout):
        await asyncio.wait_for(task, 2)
    peer.send(msg(wild_sid, 5))
    await asyncio.sleep(0.05)
    assert sub.buffered == 1
    got = await sub.fetch(1, timeout=1)
    assert got[0].metadata.stream_seq == 5


@pytest.mark.parametrize(
    ("code", "text", "error"),
    [
        (409, "Consumer Deleted", ConsumerDeleted),
        (409, "Exceeded MaxWaiting", PullError),
        (400, "Bad Request", PullError),
        (503, "", NoResponders),
    ],
)
async def test_statuses_become_typed_errors(
    setup: Setup, code: int, text: str, error: type[Exception]
) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(5, timeout=2.0))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, code, text))
    with pytest.raises(error):
        await asyncio.wait_for(task, 2)
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_status_ends_a_batch_but_keeps_its_messages(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(5, timeout=2.0))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    await peer.expect("UNSUB")
    await peer.expect("PUB")
    heartbeat = status(inbox, sid, 100, "Idle Heartbeat")
    peer.send(msg(sid, 1) + heartbeat + msg(sid, 2) + status(inbox, sid, 409, "Consumer Deleted"))
    got = await asyncio.wait_for(task, 2)
    assert [m.metadata.stream_seq for m in got] == [1, 2]  # the 100 never reaches the caller


async def test_heartbeats_detect_a_dead_pull(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(sub.fetch(5, timeout=3.0, heartbeat=0.1))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    linger = await peer.expect("PUB")  # no auto-unsubscribe: heartbeats would count against it
    assert linger.json() == {"batch": 5, "expires": 2_900_000_000, "idle_heartbeat": 100_000_000}
    started = loop.time()
    for _ in range(3):  # heartbeats keep it alive
        await asyncio.sleep(0.08)
        peer.send(status(inbox, sid, 100, "Idle Heartbeat"))
    with pytest.raises(HeartbeatMissed):
        await asyncio.wait_for(task, 2)
    assert 0.4 <= loop.time() - started < 1.5
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_heartbeat_must_fit_the_expiry(setup: Setup) -> None:
    _, _, sub, _, _ = setup
    with pytest.raises(ValueError):
        await sub.fetch(5, timeout=1.0, heartbeat=0.5)


async def test_no_wait_fetch_returns_empty(setup: Setup) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(5, timeout=2.0, no_wait=True))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    assert await asyncio.wait_for(task, 2) == []
    assert (await peer.expect("UNSUB")).line == f"UNSUB {sid}"


async def test_pending_lingering_pull_is_reissued_after_reconnect(
    server: ScriptedServer, setup: Setup
) -> None:
    _, peer, sub, _, _ = setup
    task = asyncio.create_task(sub.fetch(3, timeout=5.0))
    inbox, sid = (await peer.expect("SUB")).args
    await peer.expect("PUB")
    peer.send(status(inbox, sid, 404, "No Messages"))
    await peer.expect("UNSUB")
    await peer.expect("PUB")
    peer.send(msg(sid, 1))
    await asyncio.sleep(0.05)
    peer.abort()
    again = await server.connection()
    wild, fetch_sub, fetch_unsub, reissued = [await again.next() for _ in range(4)]
    assert wild.line.startswith("SUB _INBOX.")
    assert fetch_sub.line == f"SUB {inbox} {sid}"
    assert fetch_unsub.line == f"UNSUB {sid} 2"  # 3 + 1 expected, 2 already received
    body = reissued.json()
    assert reissued.args[1] == inbox and body["batch"] == 2 and 4e9 < body["expires"] < 5e9
    again.send(msg(sid, 2) + msg(sid, 3))
    got = await asyncio.wait_for(task, 2)
    assert [m.metadata.stream_seq for m in got] == [1, 2, 3]


async def test_server_vanishing_mid_pull_raises_instead_of_hanging() -> None:
    async with ScriptedServer() as srv:
        nc = await connect(
            srv.url, max_reconnect_attempts=1, reconnect_backoff=Backoff(0.01, 0.02, 2, 0)
        )
        peer = await srv.connection()
        sub = await nc.jetstream().pull_subscribe("bar", "dur")
        await peer.expect("SUB")
        task = asyncio.create_task(sub.fetch(5, timeout=30))
        inbox, sid = (await peer.expect("SUB")).args
        await peer.expect("PUB")
        # A status frame cut in the middle, then the server is gone for good.
        peer.send(b"HMSG %s %s 28 28\r\nNATS/1.0 40" % (inbox.encode(), sid.encode()))
        await srv.stop_listening()
        peer.abort()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(task, 5)
        assert nc.is_closed


async def test_unexpected_status_on_the_wildcard_is_ignored(setup: Setup) -> None:
    _, peer, sub, prefix, wild_sid = setup
    # A status for a request nobody waits for (e.g. a stale 408) is dropped quietly.
    peer.send(status(prefix + "999", wild_sid, 408, "Request Timeout"))
    task = asyncio.create_task(sub.fetch(1, timeout=2.0))
    await peer.expect("PUB")
    peer.send(msg(wild_sid, 3))
    assert (await asyncio.wait_for(task, 2))[0].metadata.stream_seq == 3


async def test_a_pull_made_while_reconnecting_is_sent_once() -> None:
    async with ScriptedServer() as srv:
        down = asyncio.Event()
        nc = await connect(
            srv.url, reconnect_backoff=Backoff(0.01, 0.05, 2, 0), disconnected_cb=down.set
        )
        peer = await srv.connection()
        sub = await nc.jetstream().pull_subscribe("bar", "dur")
        await peer.expect("SUB")
        await srv.stop_listening()
        peer.abort()
        await asyncio.wait_for(down.wait(), 2)
        task = asyncio.create_task(sub.fetch(2, timeout=5.0))
        await asyncio.sleep(0)  # the fetch runs: its request waits in the reconnect buffer
        await srv.start()
        again = await srv.connection()
        wild, inbox_sub = await again.expect("SUB"), await again.expect("SUB")
        inbox, sid = inbox_sub.args
        assert wild.args[0].endswith(".*")
        assert (await again.expect("PUB")).payload == b'{"batch":2,"no_wait":true}'
        again.send(msg(sid, 1) + msg(sid, 2))
        assert len(await asyncio.wait_for(task, 2)) == 2
        pulls = [f for f in again.frames if f.op == "PUB" and f.args[0] == NEXT]
        assert len(pulls) == 1 and pulls[0].args[1] == inbox
        await nc.close()
