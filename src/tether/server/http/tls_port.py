"""An HTTPS port that answers plain HTTP as Go's ``net/http`` server does.

Go's server (nats-server's monitoring port, nsqd's ``--https-address``) reads the first
five bytes of a connection, a TLS record header, before its handshake:

* a record of a handshake or an alert (``0x16``, ``0x15``, version below ``0x1000``):
  the handshake goes on;
* ``0x80`` (an SSLv2 hello): a TLS ``protocol_version`` alert, then closed;
* the start of a request line (``GET /``, ``HEAD ``, ``POST ``, ``PUT /``, ``OPTIO``):
  ``HTTP/1.0 400 Bad Request`` with the body ``Client sent an HTTP request to an HTTPS
  server.``, no headers, then closed;
* anything else, or the end of the stream before five bytes: closed without a word.

OpenSSL has no such look (it fails the handshake and closes), so :class:`TlsPort`
accepts the connections itself, peeks at the first five bytes (``MSG_PEEK``: they stay
in the socket for the handshake) and gives a TLS connection to the loop's own TLS
transport with the HTTP server's protocol, as ``create_server(ssl=...)`` would.

A connection costs little until its handshake is done, and a flood of silent ones must
not keep real clients out: the first bytes and the handshake together get
:data:`GREETING_TIMEOUT` seconds (nats-server's ``ReadHeaderTimeout``, which bounds its
handshake too), and past ``max_pending`` such connections the oldest is closed to let a
new one in. While a connection waits for its first bytes the kernel is asked to wake
the loop only once five are there (``SO_RCVLOWAT``), so a thousand clients that sent
one byte each cost nothing until they send more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable

log = logging.getLogger("tether.http")

# Go's answer (net/http's conn.serve), byte for byte.
MISDIRECTED = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
# crypto/tls's answer to an SSLv2 hello: a fatal protocol_version alert in a TLS 1.0 record.
SSLV2_ALERT = b"\x15\x03\x01\x00\x02\x02\x46"
_REQUEST_STARTS = (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO")  # Go's list
_RECORD_HEADER = 5
_TLS_RECORD_TYPES = (0x15, 0x16)  # alert, handshake
_LINGER, _LINGER_BYTES = 2.0, 1 << 20  # how long and how much a refused client may send
_TCP_CLOSE_WAIT = 8  # Linux's tcpi_state once the peer has sent its FIN
# Seconds for the first bytes and the handshake together: nats-server's monitoring
# server's ReadHeaderTimeout, which Go's net/http applies to the handshake too.
GREETING_TIMEOUT = 5.0
_WARN_EVERY = 10.0  # seconds between two warnings of the same kind


def first_record(head: bytes) -> str:
    """What Go makes of a connection's first bytes: ``"tls"``, ``"sslv2"``, ``"http"``
    or ``"other"`` (``head`` holds five bytes, or fewer when the stream ended)."""
    if len(head) < _RECORD_HEADER:
        return "other"
    if head[0] == 0x80:
        return "sslv2"
    if head[0] in _TLS_RECORD_TYPES and head[1] < 0x10:
        return "tls"
    if head[:_RECORD_HEADER] in _REQUEST_STARTS:
        return "http"
    return "other"


class _Warning:
    """A warning logged at most once every ``every`` seconds, with how many times it
    happened since the last one logged (an ``accept`` failing on EMFILE would otherwise
    fill the log ten times a second)."""

    def __init__(self, message: str, every: float) -> None:
        self._message = message
        self._every = every
        self._last = -every
        self._count = 0

    def __call__(self, *args: object) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last < self._every:
            return
        if self._count > 1:
            log.warning(
                self._message + " (%d times in the last %.3g s)",
                *args,
                self._count,
                now - self._last,
            )
        else:
            log.warning(self._message, *args)
        self._last = now
        self._count = 0


class TlsPort:
    """Accepts on ``sock`` (bound, listening, non-blocking); each TLS connection gets a
    protocol from ``protocol_factory`` over a TLS transport with ``context``.

    ``timeout`` bounds the wait for the first five bytes and the handshake together, as
    nats-server's ``ReadHeaderTimeout`` (5 s) does (nsqd's server waits without end);
    ``max_pending`` the connections in that phase at once: past it the one waiting the
    longest is closed, so that idle sockets cannot keep a real client out.
    """

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        timeout: float,
        max_pending: int,
    ) -> None:
        self._sock = sock
        self._context = context
        self._factory = protocol_factory
        self._timeout = timeout
        self._max_pending = max(1, max_pending)
        # Connections not yet handed over, oldest first (a dict keeps the order).
        self._pending: dict[asyncio.Task[None], None] = {}
        # Those whose socket a TLS transport owns: it closes it, never this class.
        self._handed: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._accept_failed = _Warning("https: accept failed: %s", _WARN_EVERY)
        self._crowded = _Warning(
            "https: %d connections waiting for their first bytes or TLS handshake at once"
            " (the most allowed): closed the oldest",
            _WARN_EVERY,
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._accept())

    async def stop(self) -> None:
        """Stops accepting and drops the connections not yet handed over."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sock.close()
        pending = list(self._pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors, say: try again shortly
                self._accept_failed(exc)
                await asyncio.sleep(0.1)
                continue
            if len(self._pending) >= self._max_pending:
                # The oldest waiting is the likeliest idle: closing it (its task's own
                # cleanup closes the socket, or the transport) lets this one in.
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                oldest.cancel()
                self._crowded(self._max_pending)
            task = asyncio.create_task(self._greet(conn))
            self._pending[task] = None
            task.add_done_callback(functools.partial(self._forget, conn))

    def _forget(self, conn: socket.socket, task: asyncio.Task[None]) -> None:
        self._pending.pop(task, None)
        if task in self._handed:
            self._handed.discard(task)
        else:
            # However it ended: refused, failed, or cancelled (also before it ever ran,
            # in a burst of accepts past the limit, or by stop()).
            conn.close()

    async def _greet(self, conn: socket.socket) -> None:
        """Peek, then hand ``conn`` to TLS or refuse it. The socket is closed by
        :meth:`_forget` when this ends, unless a TLS transport took it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            head = await asyncio.wait_for(_peek(conn, _RECORD_HEADER), self._timeout)
        except TimeoutError:
            head = b""  # too slow: closed as a stream that ended early
        except OSError:  # reset by the client
            return
        kind = first_record(head)
        if kind == "tls":
            task = asyncio.current_task()
            if task is not None:
                self._handed.add(task)  # the transport owns the socket now, even failing
            await self._handshake(conn, max(deadline - loop.time(), 0.001))
            return
        reply = {"sslv2": SSLV2_ALERT, "http": MISDIRECTED}.get(kind, b"")
        log.debug("https: %s client (%r) refused", kind, head)
        with contextlib.suppress(OSError):
            if reply:
                await asyncio.wait_for(loop.sock_sendall(conn, reply), self._timeout)
            await _linger(conn)

    async def _handshake(self, conn: socket.socket, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self._factory, conn, ssl=self._context, ssl_handshake_timeout=seconds
            )
        except OSError as exc:  # the handshake failed (ssl.SSLError) or timed out
            log.debug("https: TLS handshake failed: %s", exc)


async def _peek(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` first bytes, left in the socket; fewer when the stream ends first."""
    loop = asyncio.get_running_loop()
    # With the low-water mark at ``size`` the socket reads as readable only once ``size``
    # bytes, the end or an error are there: no wake-up per byte, no polling.
    low_water = _set_low_water(sock, size)
    try:
        delay = 0.005
        while True:
            await _readable(loop, sock)
            try:
                head = sock.recv(size, socket.MSG_PEEK)
            except BlockingIOError:
                continue
            if len(head) >= size or not head:
                return head
            # Some bytes: the end behind them, which a peek cannot see, or (without a
            # low-water mark, or woken early by Linux under memory pressure) the rest
            # still to come, which the socket does not wait for: look again a little later.
            closed = _peer_closed(sock)
            if closed or (closed is None and low_water):
                return head
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
    finally:
        if low_water:  # the TLS transport and the linger read byte by byte again
            _set_low_water(sock, 1)


def _set_low_water(sock: socket.socket, size: int) -> bool:
    """Sets ``SO_RCVLOWAT``; whether the system has it (Linux and the BSDs do)."""
    option = getattr(socket, "SO_RCVLOWAT", None)
    if option is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, size)
    except OSError:
        return False
    return True


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _peer_closed(sock: socket.socket) -> bool | None:
    """Whether the peer has sent its FIN (Linux's TCP_INFO); ``None`` where the system
    cannot tell."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 1)
    except OSError:
        return None
    return bool(info) and info[0] == _TCP_CLOSE_WAIT


async def _linger(sock: socket.socket) -> None:
    """Ends our side, then reads and drops what the client still sends, until its end
    or for :data:`_LINGER` seconds: closing with unread bytes would reset the
    connection, and the client might lose the answer with it (nginx's lingering
    close; Go's server closes at once and a long request can lose its ``400``)."""
    loop = asyncio.get_running_loop()
    sock.shutdown(socket.SHUT_WR)
    deadline = loop.time() + _LINGER
    taken = 0
    while taken < _LINGER_BYTES:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(_readable(loop, sock), remaining)
        except TimeoutError:
            return
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            continue
        if not chunk:
            return
        taken += len(chunk)
