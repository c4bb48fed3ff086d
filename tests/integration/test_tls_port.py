"""What a connection costs an HTTPS port before its handshake (server/http/tls_port.py),
in process: a client that sent one byte wakes the loop no more (``SO_RCVLOWAT``), the
socket reads byte by byte again once handed to TLS, the oldest waiting connection
makes room for a new one, and a failing ``accept`` is not logged ten times a second."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, ClassVar, cast

import pytest

from tether.server.http import tls_port
from tether.server.http.tls_port import MISDIRECTED, TlsPort

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a test's body on both loops: the broker runs on uvloop, whose transports
    differ from asyncio's."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run  # type: ignore[no-any-return]
    return asyncio.run


linux_only = pytest.mark.skipif(
    not hasattr(socket, "SO_RCVLOWAT") or not hasattr(socket, "TCP_INFO"),
    reason="SO_RCVLOWAT and TCP_INFO are Linux's",
)


class Echo(asyncio.Protocol):
    """Answers each read with the same bytes; notes the socket's low-water mark."""

    low_water: ClassVar[list[int]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        Echo.low_water.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


@contextlib.asynccontextmanager
async def tls_port_on(
    certs: dict[str, str], *, wait: float = 5.0, max_pending: int = 64
) -> AsyncIterator[int]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["cert"], certs["key"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    port = TlsPort(sock, context, Echo, timeout=wait, max_pending=max_pending)
    port.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        await port.stop()


async def closed(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@linux_only
def test_a_byte_at_a_time_wakes_nothing_until_five_are_there(
    run: Run, nsq_certs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wakes = 0
    readable = tls_port._readable

    async def counted(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        nonlocal wakes
        await readable(loop, sock)
        wakes += 1

    monkeypatch.setattr(tls_port, "_readable", counted)

    async def body() -> None:
        async with tls_port_on(nsq_certs) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GE")
            await asyncio.sleep(0.6)
            assert wakes == 0  # polled, it would have woken every 5 to 100 ms
            writer.write(b"T / HTTP/1.1\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == MISDIRECTED
            writer.close()
            # The end before five bytes ends the wait at once.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 1) == b""
            writer.close()

    run(body())


@linux_only
def test_the_tls_transport_reads_byte_by_byte_again(run: Run, nsq_certs: dict[str, str]) -> None:
    Echo.low_water.clear()
    client = ssl.create_default_context(cafile=nsq_certs["ca"])

    async def body() -> None:
        async with tls_port_on(nsq_certs) as port:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="localhost"
            )
            writer.write(b"hello")
            assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
            writer.close()

    run(body())
    assert Echo.low_water == [1]


def test_the_oldest_waiting_connection_makes_room(run: Run, nsq_certs: dict[str, str]) -> None:
    client = ssl.create_default_context(cafile=nsq_certs["ca"])

    async def body() -> None:
        async with tls_port_on(nsq_certs, wait=30, max_pending=4) as port:
            first = await asyncio.open_connection("127.0.0.1", port)
            first[1].write(b"\x16\x03\x01\x02\x00\x01")  # in its handshake: half a hello
            await asyncio.sleep(0.2)  # handed to the TLS transport, waiting for the rest
            idle = [first, *[await asyncio.open_connection("127.0.0.1", port) for _ in range(9)]]
            await asyncio.sleep(0.2)
            for reader, _ in idle[:6]:
                assert await closed(reader, 2)
            for reader, _ in idle[6:]:
                assert not await closed(reader, 0.05)
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="localhost"
            )
            writer.write(b"in")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"in"
            for _, w in [*idle, (reader, writer)]:
                w.close()

    run(body())


def test_a_burst_past_the_limit_leaves_no_socket_open(run: Run, nsq_certs: dict[str, str]) -> None:
    """Connections already waiting are accepted in a row, without a turn of the loop
    between them: the ones closed to make room have tasks that never ran."""

    async def body() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(nsq_certs["cert"], nsq_certs["key"])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
        clients = [socket.create_connection(sock.getsockname()) for _ in range(10)]
        port = TlsPort(sock, context, Echo, timeout=5.0, max_pending=2)
        port.start()
        await asyncio.sleep(0.3)
        await port.stop()
        for client in clients:
            client.close()
        gc.collect()  # an unclosed socket would warn here (filterwarnings = error)

    run(body())


def test_a_failing_accept_is_logged_once_in_a_while(
    run: Run, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls_port, "_WARN_EVERY", 0.35)

    async def body() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # not listening: every accept fails (EINVAL)
        sock.setblocking(False)
        port = TlsPort(sock, context, Echo, timeout=1, max_pending=4)
        port.start()
        await asyncio.sleep(0.6)  # some six attempts
        await port.stop()

    with caplog.at_level(logging.WARNING, logger="tether.http"):
        run(body())
    warnings = [r.getMessage() for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "times in the last" not in warnings[0]
    assert "times in the last" in warnings[1]
