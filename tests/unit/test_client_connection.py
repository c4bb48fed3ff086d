"""The connection against a scripted server: handshake, keepalive, reconnect, bad input."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from tether.client import (
    AuthorizationError,
    Backoff,
    ConnectionClosed,
    FlushTimeout,
    MaxPayloadExceeded,
    Msg,
    NoResponders,
    NoServersAvailable,
    OutboundBufferFull,
    PermissionsViolation,
    ProtocolViolation,
    SlowConsumer,
    StaleConnection,
    Timeout,
    connect,
)
from tether.client.options import ServerPool, parse_url
from tether.client.testing import ScriptedServer

FAST = {"reconnect_backoff": Backoff(0.01, 0.05, 2.0, 0.0), "connect_timeout": 1.0}


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as srv:
        yield srv


async def test_connect_announces_headers_and_no_responders(server: ScriptedServer) -> None:
    nc = await connect(server.url, name="svc", user="alice", password="s3cret")
    peer = await server.connection()
    assert peer.connect["headers"] is True
    assert peer.connect["no_responders"] is True
    assert peer.connect["verbose"] is False
    assert (peer.connect["name"], peer.connect["user"], peer.connect["pass"]) == (
        "svc",
        "alice",
        "s3cret",
    )
    assert nc.is_connected and nc.connected_address == f"127.0.0.1:{server.port}"
    await nc.close()
    assert nc.is_closed


async def test_token_and_credentials_from_the_url(server: ScriptedServer) -> None:
    nc = await connect(f"nats://tok3n@127.0.0.1:{server.port}")
    assert (await server.connection()).connect["auth_token"] == "tok3n"
    await nc.close()
    nc = await connect(f"nats://bob:pw@127.0.0.1:{server.port}")
    peer = await server.connection()
    assert (peer.connect["user"], peer.connect["pass"]) == ("bob", "pw")
    await nc.close()


async def test_authorization_violation_is_typed() -> None:
    async with ScriptedServer(auto_pong=False) as srv:
        attempt = asyncio.create_task(connect(srv.url, **FAST))
        conn = await asyncio.wait_for(srv._new.get(), 2)
        await conn.expect("CONNECT")
        conn.send(b"-ERR 'Authorization Violation'\r\n")
        conn.abort()
        with pytest.raises(AuthorizationError):
            await asyncio.wait_for(attempt, 3)


async def test_a_silent_server_fails_the_connect_in_time() -> None:
    async with ScriptedServer(send_info=False) as srv:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(NoServersAvailable):
            await connect(srv.url, connect_timeout=0.3)
        assert loop.time() - started < 2


async def test_first_reachable_server_of_the_list(server: ScriptedServer) -> None:
    dead = ScriptedServer()
    await dead.start()
    await dead.close()  # its port now refuses connections
    nc = await connect([dead.url, server.url], randomize=False, **FAST)
    assert nc.connected_address == f"127.0.0.1:{server.port}"
    await nc.close()


def test_server_pool_order_is_random_unless_disabled() -> None:
    urls = [f"nats://127.0.0.1:{4000 + i}" for i in range(5)]
    orders = {
        tuple(s.port for s in ServerPool(urls, True, random.Random(i)).servers) for i in range(20)
    }
    assert len(orders) > 1
    fixed = [s.port for s in ServerPool(urls, False).servers]
    assert fixed == [4000, 4001, 4002, 4003, 4004]
    assert parse_url("h:99").port == 99 and parse_url("nats://h").port == 4222
    assert parse_url("tls://h:1").tls and not parse_url("nats://h:1").tls
    with pytest.raises(ValueError):
        parse_url("ws://h:1")


async def test_request_reply_on_one_muxed_inbox(server: ScriptedServer) -> None:
    nc = await connect(server.url)
    peer = await server.connection()
    first = asyncio.create_task(nc.request("svc.a", b"1", timeout=2))
    second = asyncio.create_task(nc.request("svc.b", b"2", timeout=2))
    mux = await peer.expect("SUB")
    assert mux.args[0].endswith(".*")
    a, b = await peer.expect("PUB"), await peer.expect("PUB")
    assert a.args[1].rsplit(".", 1)[0] == b.args[1].rsplit(".", 1)[0] == mux.args[0][:-2]
    mux_sid = mux.args[1]
    peer.send(b"MSG %s %s 3\r\nbbb\r\n" % (b.args[1].encode(), mux_sid.encode()))
    peer.send(b"MSG %s %s 3\r\naaa\r\n" % (a.args[1].encode(), mux_sid.encode()))
    assert (await first).data == b"aaa" and (await second).data == b"bbb"
    no_one = asyncio.create_task(nc.request("nobody", timeout=2))
    c = await peer.expect("PUB")
    block = b"NATS/1.0 503\r\n\r\n"
    peer.send(
        b"HMSG %s %s %d %d\r\n%s\r\n"
        % (c.args[1].encode(), mux_sid.encode(), len(block), len(block), block)
    )
    with pytest.raises(NoResponders):
        await no_one
    with pytest.raises(Timeout):
        await nc.request("slow", timeout=0.1)
    await nc.close()


async def test_server_ping_gets_a_pong_and_keepalive_pings(server: ScriptedServer) -> None:
    nc = await connect(server.url, ping_interval=0.05)
    peer = await server.connection()
    peer.send(b"PING\r\n")
    assert (await peer.next(skip=("PING",))).op == "PONG"
    await asyncio.sleep(0.2)
    assert sum(1 for f in peer.frames if f.op == "PING") >= 3
    assert nc.is_connected
    await nc.close()


async def test_stale_connection_is_replaced() -> None:
    errors: list[Exception] = []
    async with ScriptedServer() as srv:
        nc = await connect(
            srv.url, ping_interval=0.05, max_outstanding_pings=2, error_cb=errors.append, **FAST
        )
        first = await srv.connection()
        first.auto_pong = False  # the server stops answering
        second = await srv.connection(within=3)
        assert second is not first
        assert any(isinstance(e, StaleConnection) for e in errors)
        await nc.flush(1)
        await nc.close()


async def test_flush_timeout() -> None:
    async with ScriptedServer() as srv:
        nc = await connect(srv.url)
        peer = await srv.connection()
        peer.auto_pong = False
        with pytest.raises(FlushTimeout):
            await nc.flush(0.2)
        await nc.close()


async def test_reconnect_resubscribes_and_flushes_buffered_publishes(
    server: ScriptedServer,
) -> None:
    events: list[str] = []
    down = asyncio.Event()
    nc = await connect(
        server.url,
        disconnected_cb=lambda: (events.append("down"), down.set())[0],
        reconnected_cb=lambda: events.append("up"),
        **FAST,
    )
    peer = await server.connection()
    sub = await nc.subscribe("orders.*", "workers")
    await sub.unsubscribe(limit=5)
    assert (await peer.expect("SUB")).line == "SUB orders.* workers 1"
    assert (await peer.expect("UNSUB")).line == "UNSUB 1 5"
    peer.send(b"MSG orders.a 1 1\r\nx\r\n")
    assert (await sub.next_msg(1)).data == b"x"
    await server.stop_listening()
    peer.abort()
    await asyncio.wait_for(down.wait(), 2)
    assert nc.is_reconnecting
    await nc.publish("during.outage", b"kept")
    await server.start()
    again = await server.connection()
    assert (await again.expect("SUB")).line == "SUB orders.* workers 1"
    assert (await again.expect("UNSUB")).line == "UNSUB 1 4"  # 5 allowed, 1 received
    kept = await again.expect("PUB")
    assert (kept.line, kept.payload) == ("PUB during.outage 4", b"kept")
    assert events == ["down", "up"] and nc.reconnects == 1
    await nc.close()


async def test_reconnect_buffer_is_bounded(server: ScriptedServer) -> None:
    down = asyncio.Event()
    nc = await connect(
        server.url,
        reconnect_buffer_size=100,
        max_reconnect_attempts=-1,
        disconnected_cb=down.set,
        **FAST,
    )
    peer = await server.connection()
    await server.stop_listening()
    peer.abort()
    await asyncio.wait_for(down.wait(), 2)
    await nc.publish("a", b"x" * 50)
    with pytest.raises(OutboundBufferFull):
        await nc.publish("a", b"x" * 60)
    await nc.close()


async def test_server_vanishing_fails_waiters_instead_of_hanging() -> None:
    async with ScriptedServer() as srv:
        nc = await connect(srv.url, max_reconnect_attempts=2, **FAST)
        peer = await srv.connection()
        pending = asyncio.create_task(nc.request("svc", timeout=30))
        await peer.expect("SUB")
        await peer.expect("PUB")
        peer.send(b"MSG svc 1 10\r\nabc")  # a truncated frame, then the server is gone
        await srv.stop_listening()
        peer.abort()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(pending, 5)
        assert nc.is_closed
        assert isinstance(nc.last_error, NoServersAvailable)
        with pytest.raises(ConnectionClosed):
            await nc.publish("x", b"")


async def test_garbage_from_the_server_is_a_protocol_violation() -> None:
    errors: list[Exception] = []
    async with ScriptedServer() as srv:
        nc = await connect(srv.url, error_cb=errors.append, **FAST)
        peer = await srv.connection()
        peer.send(b"BOGUS stuff\r\n")
        await srv.connection(within=3)  # dropped and reconnected
        assert any(isinstance(e, ProtocolViolation) for e in errors)
        await nc.close()


async def test_bad_sizes_and_unexpected_ops_are_violations() -> None:
    for bad in (b"MSG a 1 notasize\r\n", b"PUB a 1\r\nx\r\n", b"HMSG a 1 10 5\r\n"):
        errors: list[Exception] = []
        async with ScriptedServer() as srv:
            nc = await connect(srv.url, error_cb=errors.append, **FAST)
            peer = await srv.connection()
            peer.send(bad)
            await srv.connection(within=3)
            assert any(isinstance(e, ProtocolViolation) for e in errors), bad
            await nc.close()


async def test_permissions_violation_keeps_the_connection(server: ScriptedServer) -> None:
    errors: list[Exception] = []
    nc = await connect(server.url, error_cb=errors.append)
    peer = await server.connection()
    peer.send(b"-ERR 'Permissions Violation for Publish to \"secret\"'\r\n")
    await nc.flush(1)
    assert isinstance(errors[0], PermissionsViolation) and nc.is_connected
    await nc.close()


async def test_async_error_callback_runs(server: ScriptedServer) -> None:
    seen: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        seen.set_result(exc)

    nc = await connect(server.url, error_cb=on_error)
    peer = await server.connection()
    peer.send(b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n")
    assert isinstance(await asyncio.wait_for(seen, 2), PermissionsViolation)
    await nc.close()


async def test_max_payload_is_enforced() -> None:
    async with ScriptedServer(info={"max_payload": 10}) as srv:
        nc = await connect(srv.url)
        with pytest.raises(MaxPayloadExceeded):
            await nc.publish("a", b"x" * 11)
        await nc.close()


async def test_slow_consumer_drops_and_reports(server: ScriptedServer) -> None:
    errors: list[Exception] = []
    nc = await connect(server.url, error_cb=errors.append)
    peer = await server.connection()
    sub = await nc.subscribe("a", pending_msgs_limit=2)
    await peer.expect("SUB")
    peer.send(b"MSG a 1 1\r\n1\r\n" * 5)
    await nc.flush(1)
    assert sub.pending == 2
    assert [type(e) for e in errors] == [SlowConsumer]
    await nc.close()


async def test_callbacks_and_drain(server: ScriptedServer) -> None:
    got: list[bytes] = []

    async def on_msg(msg: Msg) -> None:
        await asyncio.sleep(0.01)
        got.append(msg.data)

    nc = await connect(server.url)
    peer = await server.connection()
    await nc.subscribe("a", cb=on_msg)
    await peer.expect("SUB")
    peer.send(b"".join(b"MSG a 1 1\r\n%d\r\n" % i for i in range(5)))
    await nc.flush(1)
    await nc.drain(timeout=3)
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    assert (await peer.expect("UNSUB")).line == "UNSUB 1"
    assert nc.is_closed


async def test_headers_round_trip(server: ScriptedServer) -> None:
    nc = await connect(server.url)
    peer = await server.connection()
    sub = await nc.subscribe("h")
    await peer.expect("SUB")
    await nc.publish("h", b"body", headers={"Trace-Id": "42"})
    pub = await peer.expect("HPUB")
    assert pub.line == "HPUB h 26 30"
    assert pub.payload == b"NATS/1.0\r\nTrace-Id: 42\r\n\r\nbody"
    block = b"NATS/1.0\r\nTrace-Id: 42\r\nTrace-Id: 43\r\n\r\n"
    peer.send(b"HMSG h 1 %d %d\r\n%sbody\r\n" % (len(block), len(block) + 4, block))
    msg = await sub.next_msg(1)
    assert msg.headers == {"Trace-Id": "42"} and msg.status == 0 and msg.data == b"body"
    await nc.close()


async def test_closed_connection_refuses_work(server: ScriptedServer) -> None:
    nc = await connect(server.url)
    await nc.close()
    for op in (nc.flush(), nc.publish("a"), nc.subscribe("a")):
        with pytest.raises(ConnectionClosed):
            await op
    await nc.close()  # idempotent
