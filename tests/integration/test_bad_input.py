"""Hostile and broken clients: each gets a clear reaction (or the door), while the
server keeps serving everybody else — checked with a real request/reply after each."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from natspy_support import flush_subscriptions

from tether.testing import RawClient, RunningServer, run_server

# Protocol 0: no INFO follows the first PONG, so transcripts stay short.
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'


class Witness:
    """A nats-py responder and requester: proof that the server still works."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.responder: Client | None = None
        self.requester: Client | None = None
        self.count = 0

    async def start(self) -> None:
        self.responder = await nats.connect(self.server.url)
        self.requester = await nats.connect(self.server.url)

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data)

        await self.responder.subscribe("witness.echo", cb=echo)
        await flush_subscriptions(self.responder)

    async def check(self) -> None:
        assert self.requester is not None
        self.count += 1
        body = f"ping {self.count}".encode()
        reply = await self.requester.request("witness.echo", body, timeout=5)
        assert reply.data == body

    async def close(self) -> None:
        for nc in (self.requester, self.responder):
            if nc is not None:
                await nc.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv
        # Whatever it was fed, the server neither died nor logged a crash.
        assert srv.proc is not None and srv.proc.poll() is None
        assert "Traceback" not in srv.stderr


@pytest.fixture
async def witness(server: RunningServer) -> AsyncIterator[Witness]:
    w = Witness(server)
    await w.start()
    await w.check()
    try:
        yield w
    finally:
        await w.close()


async def raw(server: RunningServer) -> RawClient:
    return await RawClient.connect(server.host, server.port)


async def eventually(condition: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():
        if loop.time() > deadline:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.02)


async def varz(server: RunningServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        body: dict[str, Any] = (await http.get(f"{server.http_url}/varz")).json()
        return body


# -- one bad client at a time -------------------------------------------------------------------

UNKNOWN = b"-ERR 'Unknown Protocol Operation'\r\n"

# (bytes sent after CONNECT, what comes back before the close; None: the connection stays)
BAD_INPUTS: list[tuple[str, bytes, bytes | None]] = [
    ("garbage", bytes(range(256)) * 4, UNKNOWN),
    ("binary noise", random.Random(7).randbytes(2000), UNKNOWN),
    ("HTTP request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", UNKNOWN),
    (
        "oversized control line",
        b"PUB " + b"x" * 10_000 + b" 1\r\n",
        b"-ERR 'maximum control line exceeded'\r\n",
    ),
    (
        "oversized line never ended",
        b"SUB " + b"y" * 100_000,
        b"-ERR 'maximum control line exceeded'\r\n",
    ),
    ("negative size", b"PUB foo -1\r\n", b""),
    ("huge size", b"PUB foo 99999999999\r\n", b""),
    ("size too big", b"PUB foo 2000000\r\n", b"-ERR 'Maximum Payload Violation'\r\n"),
    ("payload longer", b"PUB foo 2\r\nhello world\r\n", UNKNOWN),
    ("payload shorter", b"PUB foo 10\r\nhi\r\nPING\r\nPING\r\n", UNKNOWN),
    ("invalid SUB subject", b"SUB foo..bar 1\r\n", None),
    ("invalid publish subject", b"PUB foo.*.> 1\r\nx\r\n", None),
    ("empty tokens", b"PUB .. 1\r\nx\r\nSUB .. 1\r\n", None),
    ("unknown sid", b"UNSUB 42\r\nUNSUB 42 5\r\n", None),
    ("wrong arguments", b"SUB a b c d e\r\n", b""),
    ("headers without CONNECT headers", b"HPUB foo 12 12\r\nNATS/1.0\r\n\r\n\r\n", None),
]


@pytest.mark.parametrize(
    ("data", "reaction"),
    [pytest.param(data, reaction, id=name) for name, data, reaction in BAD_INPUTS],
)
async def test_bad_input(
    server: RunningServer, witness: Witness, data: bytes, reaction: bytes | None
) -> None:
    client = await raw(server)
    try:
        connect = CONNECT
        if data.startswith(b"HPUB"):
            connect = b'CONNECT {"verbose":false,"headers":false}\r\n'
            reaction = b""  # no headers negotiated: nats-server hangs up without a word
        await client.send(connect + data)
        await witness.check()
        if reaction is None:
            assert await client.sync(), "the connection should have stayed open"
            out = client.take()
            assert b"-ERR" in out or out.endswith(b"PONG\r\n")
        else:
            assert await client.wait_closed(5), "the connection should have been closed"
            assert client.take() == reaction
        await witness.check()
    finally:
        await client.close()


async def test_sub_before_connect(server: RunningServer, witness: Witness) -> None:
    client = await raw(server)
    try:
        # Without auth a client may skip CONNECT (telnet style); verbose is the default.
        await client.send(b"SUB early 1\r\nPUB early 2\r\nhi\r\n")
        assert await client.sync()
        assert client.take() == b"+OK\r\n+OK\r\nMSG early 1 2\r\nhi\r\nPONG\r\n"
        await witness.check()
    finally:
        await client.close()


async def test_sub_before_connect_with_auth() -> None:
    with run_server(store="memory", args=["--auth-token", "s3cret"]) as srv:
        async with await RawClient.connect(srv.host, srv.port) as client:
            await client.send(b"SUB early 1\r\n")
            assert await client.wait_closed()
            assert client.take() == b"-ERR 'Authorization Violation'\r\n"
        nc = await nats.connect(srv.url, token="s3cret")
        try:
            sub = await nc.subscribe("after")
            await nc.publish("after", b"ok")
            assert (await sub.next_msg(timeout=2)).data == b"ok"
        finally:
            await nc.close()


async def test_bad_input_split_byte_by_byte(server: RunningServer, witness: Witness) -> None:
    client = await raw(server)
    try:
        for byte in CONNECT + b"SUB s 1\r\nPUB s 3\r\nabc\r\n":
            await client.send(bytes([byte]))
        assert await client.sync()
        assert client.take() == b"MSG s 1 3\r\nabc\r\nPONG\r\n"
        for byte in b"PUB s 2\r\nabc\r\n":
            await client.send(bytes([byte]))
        assert await client.wait_closed()
        assert UNKNOWN in client.take()
        await witness.check()
    finally:
        await client.close()


# -- slow consumers -------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_slow_consumer_is_cut_off() -> None:
    with run_server(store="memory", args=["--max-pending", "1048576"]) as srv:
        assert srv.proc is not None
        witness = Witness(srv)
        await witness.start()
        # A subscriber that never reads, with the smallest kernel buffer we can get.
        slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            slow.settimeout(5)
            slow.connect((srv.host, srv.port))
            slow.sendall(CONNECT + b"SUB flood 1\r\nPING\r\n")
            publisher = await nats.connect(srv.url)
            try:
                baseline = rss_bytes(srv.proc.pid)
                chunk = b"x" * 65536
                # 256 MiB offered to a subscriber that takes nothing: without a bound the
                # server would have to hold all of it.
                for i in range(4096):
                    await publisher.publish("flood", chunk)
                    if i % 256 == 0:
                        await publisher.flush()
                        await witness.check()  # others keep working meanwhile
                await publisher.flush()
                await eventually(lambda: _slow_consumers_is(srv, 1))
                grown = rss_bytes(srv.proc.pid) - baseline
                assert grown < 64 * 1024 * 1024, f"server grew by {grown} bytes"
                await witness.check()
            finally:
                await publisher.close()
            # Reading now, the subscriber finds what reached its socket before the cut,
            # then the end: no -ERR, as from nats-server (it would sit behind all the
            # rest, and without one nats-py reconnects instead of giving up).
            received = await asyncio.to_thread(_read_to_end, slow)
            assert received.startswith(b"INFO ")
            assert b"MSG flood 1 65536\r\n" in received
            assert b"-ERR" not in received
            assert len(received) < 16 * 1024 * 1024
        finally:
            slow.close()
            await witness.close()
        assert "Traceback" not in srv.stderr


async def _slow_consumers_is(srv: RunningServer, n: int) -> bool:
    return int((await varz(srv))["slow_consumers"]) == n


def _read_to_end(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


# -- stale connections, connection limits -----------------------------------------------------


async def test_stale_connection(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text("ping_interval = 0.2\n")
    with run_server(store="memory", args=["--config", str(config)]) as srv:
        witness = Witness(srv)
        await witness.start()
        idle = await nats.connect(srv.url)  # sends nothing, answers the server's PINGs
        try:
            async with await RawClient.connect(srv.host, srv.port) as silent:
                await silent.send(CONNECT)
                assert await silent.wait_closed(10)
                # Two unanswered PINGs, then the cut.
                assert silent.take() == b"PING\r\nPING\r\n-ERR 'Stale Connection'\r\n"
            # Meanwhile the idle nats-py client went through the same intervals and was
            # kept: it answered.
            assert idle.is_connected
            sub = await idle.subscribe("still.here")
            await witness.requester.publish("still.here", b"yes")  # type: ignore[union-attr]
            assert (await sub.next_msg(timeout=2)).data == b"yes"
            await witness.check()
        finally:
            await idle.close()
            await witness.close()


async def test_max_connections() -> None:
    with run_server(store="memory", args=["--max-connections", "5"]) as srv:
        clients = [await RawClient.connect(srv.host, srv.port) for _ in range(5)]
        try:
            for client in clients:
                await client.send(CONNECT)
                assert await client.sync()
            refused = await RawClient.connect(srv.host, srv.port)
            async with refused:
                assert refused.info["client_id"] > 0  # INFO first, as nats-server does
                assert await refused.wait_closed()
                assert refused.take() == b"-ERR 'maximum connections exceeded'\r\n"
            # The five keep working.
            await clients[0].send(b"SUB x 1\r\n")
            await clients[1].send(b"PUB x 2\r\nok\r\n")
            assert await clients[1].sync()
            assert await clients[0].sync()
            assert b"MSG x 1 2\r\nok\r\n" in clients[0].take()
            # One leaves: a newcomer gets in.
            await clients.pop().close()
            await eventually(lambda: _connections_is(srv, 4))
            clients.append(await RawClient.connect(srv.host, srv.port))
            await clients[-1].send(CONNECT)
            assert await clients[-1].sync()
        finally:
            for client in clients:
                await client.close()


async def _connections_is(srv: RunningServer, n: int) -> bool:
    return int((await varz(srv))["connections"]) == n


# -- churn --------------------------------------------------------------------------------------

# What a vanishing client may have sent before it went away.
_LAST_WORDS = [
    b"",
    CONNECT,
    CONNECT + b"SUB churn.%d 1\r\n",
    CONNECT + b"SUB churn.> q 1\r\nPUB churn.x 100\r\nonly part of the pay",
    CONNECT + b"PUB churn.y 5\r\nabc",
    CONNECT + b"HPUB churn.z 12 20\r\nNATS/1.0\r\n",
    b'CONNECT {"verbose":fal',
    CONNECT + b"SUB " + b"a" * 3000,
    b"PUB churn.w 3\r\nxyz\r\nPING\r\n",
    os.urandom(64),
]


async def test_connection_churn(server: RunningServer, witness: Witness) -> None:
    steady = int((await varz(server))["connections"])
    rng = random.Random(1234)
    failures: list[BaseException] = []
    done = asyncio.Event()

    async def keep_requesting() -> None:
        while not done.is_set():
            try:
                await witness.check()
            except Exception as exc:  # collected and reported below
                failures.append(exc)

    async def vanish(i: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection(server.host, server.port)
            try:
                words = rng.choice(_LAST_WORDS)
                if b"%d" in words:
                    words = words.replace(b"%d", str(i).encode())
                if words:
                    writer.write(words)
                    await writer.drain()
                if rng.random() < 0.5:
                    await reader.readuntil(b"\r\n")  # its INFO
            finally:
                if rng.random() < 0.7:
                    writer.transport.abort()  # a reset, mid-frame or not
                else:
                    writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    requests = asyncio.create_task(keep_requesting())
    gate = asyncio.Semaphore(64)
    await asyncio.gather(*(vanish(i, gate) for i in range(1000)))
    done.set()
    await requests
    assert not failures, failures[:3]
    assert witness.count > 1
    await witness.check()
    # Every vanished connection was cleaned up: back to the steady number.
    await eventually(lambda: _connections_is(server, steady))
    stats = await varz(server)
    assert stats["total_connections"] >= 1000
