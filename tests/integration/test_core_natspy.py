"""Core NATS against a real Tether server, driven by the real nats-py client."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from natspy_support import flush_subscriptions

from tether.testing import RunningServer, run_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """One server for the tests that do not need their own configuration."""
    with run_server(store="memory") as srv:
        yield srv


@asynccontextmanager
async def client(url: str, **options: Any) -> AsyncIterator[Client]:
    nc = await nats.connect(url, **options)
    try:
        yield nc
    finally:
        await nc.close()


async def refused(url: str, **options: Any) -> Exception:
    """Connect, expecting the server to refuse; the error nats-py raised. (The client is
    closed afterwards: nats-py leaves its socket open after a failed connect.)"""
    nc = Client()
    try:
        await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **options)
    except Exception as exc:
        return exc
    finally:
        await nc.close()
    pytest.fail("the server accepted the connection")


async def eventually(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool], within: float = 5.0
) -> None:
    """Poll ``condition`` until it holds; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = condition()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.02)


async def test_connect(server: RunningServer) -> None:
    async with client(server.url, name="probe") as nc:
        assert nc.is_connected
        assert nc.max_payload == 1024 * 1024
        info = nc._server_info
        assert info["headers"] is True
        assert (nc.connected_server_version.major, nc.connected_server_version.minor) >= (2, 10)
        rtt = await nc.rtt()
        assert rtt < 1.0


async def test_pub_sub(server: RunningServer) -> None:
    async with client(server.url) as nc:
        sub = await nc.subscribe("greet.joe")
        await nc.publish("greet.joe", b"hello")
        await nc.publish("greet.joe", b"")
        await nc.publish("greet.joe", b"\x00\xff" * 1000, reply="back")
        first = await sub.next_msg(timeout=2)
        second = await sub.next_msg(timeout=2)
        third = await sub.next_msg(timeout=2)
        assert (first.subject, first.data, first.reply) == ("greet.joe", b"hello", "")
        assert second.data == b""
        assert (third.data, third.reply) == (b"\x00\xff" * 1000, "back")


async def test_pub_sub_across_connections(server: RunningServer) -> None:
    async with client(server.url) as a, client(server.url) as b:
        sub = await a.subscribe("across")
        await flush_subscriptions(a)
        for i in range(100):
            await b.publish("across", str(i).encode())
        got = [int((await sub.next_msg(timeout=2)).data) for _ in range(100)]
        assert got == list(range(100))  # one publisher's order is kept


async def test_wildcards(server: RunningServer) -> None:
    async with client(server.url) as nc:
        subs = {
            f: await nc.subscribe(f)
            for f in ("wc.*", "wc.>", "wc.*.c", "wc.b.*", "*.b.c", "wc.b.c")
        }
        await nc.publish("wc.b", b"1")
        await nc.publish("wc.b.c", b"2")
        await nc.publish("wc.x.c.d", b"3")
        await nc.publish("wc", b"4")  # 'wc.>' needs at least one more token
        await nc.flush()
        expected = {
            "wc.*": ["wc.b"],
            "wc.>": ["wc.b", "wc.b.c", "wc.x.c.d"],
            "wc.*.c": ["wc.b.c"],
            "wc.b.*": ["wc.b.c"],
            "*.b.c": ["wc.b.c"],
            "wc.b.c": ["wc.b.c"],
        }
        for f, sub in subs.items():
            got = [(await sub.next_msg(timeout=2)).subject for _ in expected[f]]
            assert got == expected[f], f
            with pytest.raises(NatsTimeoutError):
                await sub.next_msg(timeout=0.05)


async def test_queue_group_distribution(server: RunningServer) -> None:
    counts: Counter[int] = Counter()
    done = asyncio.Event()

    def member(i: int) -> Callable[[Msg], Awaitable[None]]:
        async def handler(msg: Msg) -> None:
            counts[i] += 1
            if sum(counts.values()) >= 300:
                done.set()

        return handler

    async with (
        client(server.url) as m0,
        client(server.url) as m1,
        client(server.url) as m2,
        client(server.url) as plain,
        client(server.url) as publisher,
    ):
        for i, nc in enumerate((m0, m1, m2)):
            await nc.subscribe("jobs", queue="workers", cb=member(i))
            await flush_subscriptions(nc)
        watcher = await plain.subscribe("jobs")
        await flush_subscriptions(plain)
        for i in range(300):
            await publisher.publish("jobs", str(i).encode())
        await publisher.flush()
        await asyncio.wait_for(done.wait(), 10)
        for nc in (m0, m1, m2):
            await nc.flush()  # anything in flight would show as a count above 300
        assert sum(counts.values()) == 300
        assert all(counts[i] > 0 for i in range(3)), counts
        # A plain subscriber on the same subject gets its own copy of every message.
        got = [await watcher.next_msg(timeout=2) for _ in range(300)]
        assert len(got) == 300


async def test_request_reply(server: RunningServer) -> None:
    async with client(server.url) as responder, client(server.url) as requester:

        async def echo(msg: Msg) -> None:
            await msg.respond(b"echo:" + msg.data)

        await responder.subscribe("svc.echo", cb=echo)
        await flush_subscriptions(responder)
        for i in range(20):
            reply = await requester.request("svc.echo", str(i).encode(), timeout=2)
            assert reply.data == f"echo:{i}".encode()
        # Old-style requests use a fresh inbox each time.
        reply = await requester.request("svc.echo", b"old", timeout=2, old_style=True)
        assert reply.data == b"echo:old"


async def test_headers_round_trip(server: RunningServer) -> None:
    async with client(server.url) as nc:
        sub = await nc.subscribe("hdr")
        headers = {"Trace-Id": "abc-123", "x-lower": "v", "Spaces": "a b  c"}
        await nc.publish("hdr", b"body", headers=headers)
        msg = await sub.next_msg(timeout=2)
        assert msg.data == b"body"
        assert msg.headers == headers

        async def responder(msg: Msg) -> None:
            assert msg.headers is not None
            await nc.publish(msg.reply, b"", headers={"Got": msg.headers["Ask"]})

        await nc.subscribe("hdr.svc", cb=responder)
        reply = await nc.request("hdr.svc", b"", timeout=2, headers={"Ask": "yes"})
        assert reply.headers == {"Got": "yes"}


async def test_no_responders(server: RunningServer) -> None:
    async with client(server.url) as nc:
        with pytest.raises(NoRespondersError):
            await nc.request("nobody.listens", b"hi", timeout=2)
        # The connection is still fine afterwards.
        sub = await nc.subscribe("after")
        await nc.publish("after", b"x")
        assert (await sub.next_msg(timeout=2)).data == b"x"


async def test_unsubscribe_with_limit(server: RunningServer) -> None:
    async with client(server.url) as nc, httpx.AsyncClient() as http:

        async def subscriptions() -> int:
            varz = (await http.get(f"{server.http_url}/varz")).json()
            return int(varz["subscriptions"])

        before = await subscriptions()
        sub = await nc.subscribe("limited")
        await sub.unsubscribe(limit=3)
        await nc.flush()
        assert await subscriptions() == before + 1
        for i in range(5):
            await nc.publish("limited", str(i).encode())
        await nc.flush()
        got = [(await sub.next_msg(timeout=2)).data for _ in range(3)]
        assert got == [b"0", b"1", b"2"]
        # The server itself dropped the subscription after the third message.
        await eventually(lambda: _equals(subscriptions(), before))


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_many_subscribers(server: RunningServer) -> None:
    received: Counter[int] = Counter()
    done = asyncio.Event()

    def handler(i: int) -> Callable[[Msg], Awaitable[None]]:
        async def on_msg(msg: Msg) -> None:
            received[i] += 1
            if len(received) == 200 and all(n == 3 for n in received.values()):
                done.set()

        return on_msg

    async with client(server.url) as subscriber, client(server.url) as publisher:
        for i in range(200):
            await subscriber.subscribe("fanout", cb=handler(i))
        await flush_subscriptions(subscriber)
        for _ in range(3):
            await publisher.publish("fanout", b"x")
        await asyncio.wait_for(done.wait(), 10)
        await subscriber.flush()
        assert received == Counter({i: 3 for i in range(200)})


async def test_no_echo(server: RunningServer) -> None:
    async with client(server.url, no_echo=True) as quiet, client(server.url) as other:
        sub = await quiet.subscribe("echo.test")
        await flush_subscriptions(quiet)
        await quiet.publish("echo.test", b"mine")
        await quiet.flush()
        await other.publish("echo.test", b"theirs")
        await other.flush()
        msg = await sub.next_msg(timeout=2)
        assert msg.data == b"theirs"
        with pytest.raises(NatsTimeoutError):
            await sub.next_msg(timeout=0.1)


async def test_auth_token() -> None:
    with run_server(store="memory", args=["--auth-token", "s3cret"]) as srv:
        async with client(srv.url, token="s3cret") as nc:
            sub = await nc.subscribe("t")
            await nc.publish("t", b"ok")
            assert (await sub.next_msg(timeout=2)).data == b"ok"
        errors: list[Exception] = []

        async def on_error(e: Exception) -> None:
            errors.append(e)

        for token in ("wrong", None):
            error = await refused(srv.url, token=token, error_cb=on_error)
            assert "Authorization Violation" in str(error)
        # The error callback hears it too (possibly followed by the reset of the socket).
        assert sum("Authorization Violation" in str(e) for e in errors) == 2


async def test_auth_user_password() -> None:
    with run_server(store="memory", args=["--user", "alice", "--password", "wonder"]) as srv:
        async with client(srv.url, user="alice", password="wonder") as nc:
            assert nc.is_connected
        url = f"nats://alice:wonder@{srv.host}:{srv.port}"
        async with client(url) as nc:
            assert nc.is_connected
        for user, password in (("alice", "nope"), ("bob", "wonder"), ("alice", None)):
            error = await refused(srv.url, user=user, password=password)
            assert "Authorization Violation" in str(error)


async def test_max_payload() -> None:
    with run_server(store="memory", args=["--max-payload", "1024"]) as srv:
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        async with client(srv.url, allow_reconnect=False, closed_cb=on_closed) as nc:
            assert nc.max_payload == 1024
            await nc.publish("big", b"x" * 1024)  # the limit itself is fine
            await nc.flush()
            with pytest.raises(MaxPayloadError):
                await nc.publish("big", b"x" * 1025)
            # Past the client's own check, the server refuses and hangs up.
            nc._max_payload = 10 * 1024
            await nc.publish("big", b"x" * 2000)
            await asyncio.wait_for(closed.wait(), 5)
            assert "maximum payload violation" in str(nc.last_error).lower()


async def test_reconnect_after_restart() -> None:
    with run_server(store="memory") as srv:
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        port = srv.port
        async with client(
            srv.url,
            reconnected_cb=on_reconnect,
            reconnect_time_wait=0.1,
            max_reconnect_attempts=200,
        ) as nc:
            sub = await nc.subscribe("survives")
            await nc.publish("survives", b"before")
            assert (await sub.next_msg(timeout=2)).data == b"before"
            await asyncio.to_thread(srv.restart)
            assert srv.port == port
            await asyncio.wait_for(reconnected.wait(), 15)
            # The client re-sent its subscription: traffic flows again, also from others.
            async with client(srv.url) as other:
                await other.publish("survives", b"after")
                await other.flush()
            assert (await sub.next_msg(timeout=5)).data == b"after"


async def test_monitoring(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}

        async def varz() -> dict[str, Any]:
            response = await http.get("/varz")
            assert response.status_code == 200
            body: dict[str, Any] = response.json()
            return body

        first = await varz()
        for key in ("server_id", "version", "connections", "in_msgs", "out_msgs"):
            assert key in first
        assert first["server_id"].startswith("N") and first["version"].startswith("2.")
        baseline = first["connections"]
        async with client(server.url) as a, client(server.url) as b:
            await eventually(lambda: _field_is(varz(), "connections", baseline + 2))
            before = await varz()
            sub = await a.subscribe("stats")
            await flush_subscriptions(a)
            for _ in range(10):
                await b.publish("stats", b"12345")
            await b.flush()
            for _ in range(10):
                await sub.next_msg(timeout=2)
            after = await varz()
            assert after["in_msgs"] - before["in_msgs"] == 10
            assert after["in_bytes"] - before["in_bytes"] == 50
            assert after["out_msgs"] - before["out_msgs"] == 10
            assert after["out_bytes"] - before["out_bytes"] == 50
        # Closed connections leave the count; their traffic stays in the totals.
        await eventually(lambda: _field_is(varz(), "connections", baseline))
        final = await varz()
        assert final["in_msgs"] >= after["in_msgs"] and final["out_msgs"] >= after["out_msgs"]


async def _field_is(varz: Awaitable[dict[str, Any]], key: str, expected: int) -> bool:
    return (await varz)[key] == expected
