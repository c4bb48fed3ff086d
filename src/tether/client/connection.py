"""The connection: handshake, reconnect, subscriptions, lifecycle.

Built from three parts: :mod:`._wire` (the transport and the INFO/CONNECT handshake),
:mod:`._io` (the batched writer, keepalive and the parser's frame handlers) and
:mod:`._mux` (request/reply over one muxed inbox).

When the connection breaks, a single reconnect task walks the server pool with
exponential backoff and jitter; publishes are buffered (bounded) meanwhile, and on
success every live subscription is re-established before the buffered frames go
out. Listeners (pull subscriptions, workers) are told so they can re-issue pulls.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tether.client._io import CLOSED, CONNECTED, DRAINING, RECONNECTING, Io
from tether.client._listener import Listener
from tether.client._mux import RequestMux
from tether.client.credentials import Signer, from_creds_file, from_seed, from_seed_file
from tether.client.errors import (
    AuthorizationError,
    ClientError,
    ConnectionClosed,
    NoServersAvailable,
    Timeout,
)
from tether.client.jetstream import JetStream
from tether.client.nuid import Nuid
from tether.client.options import Options, Server, ServerPool
from tether.client.subscription import (
    DEFAULT_PENDING_MSGS_LIMIT,
    MsgCallback,
    RawHandler,
    Subscription,
)
from tether.protocol.nats import PING, encode_sub, encode_unsub

log = logging.getLogger("tether.client")


class Connection(Io, RequestMux):
    """A client connection to one server of a pool. Create it with :func:`connect`."""

    def __init__(self, options: Options) -> None:
        Io.__init__(self)
        RequestMux.__init__(self)
        self.options = options
        self._pool = ServerPool(options.servers, options.randomize)
        self._server: Server | None = None
        self._next_sid = 0
        self._nuid = Nuid()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.last_error: Exception | None = None
        self.reconnects = 0
        self._connected = asyncio.Event()
        self._signer = _signer(options)

    # -- properties ---------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._state in (CONNECTED, DRAINING) and self._transport is not None

    @property
    def is_reconnecting(self) -> bool:
        return self._state == RECONNECTING

    @property
    def is_closed(self) -> bool:
        return self._state == CLOSED

    @property
    def connected_address(self) -> str | None:
        """``host:port`` of the current server, None while disconnected."""
        return self._server.address if self._server and self.is_connected else None

    async def wait_connected(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the connection is up (again); :class:`ConnectionClosed` if it never will be."""
        if self._state == CLOSED:
            raise ConnectionClosed("connection is closed")
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise Timeout(f"not reconnected within {timeout}s") from None
        if self._state == CLOSED:
            raise ConnectionClosed("connection is closed")

    def new_inbox(self) -> str:
        """A unique subject under the inbox prefix."""
        return f"{self.options.inbox_prefix}.{self._nuid.next()}"

    def jetstream(self, **kwargs: Any) -> JetStream:
        """A JetStream context on this connection (see :class:`JetStream`)."""
        return JetStream(self, **kwargs)

    # -- connecting -------------------------------------------------------------------

    async def _connect_first(self) -> None:
        last: BaseException | None = None
        for _ in range(len(self._pool)):
            server = self._pool.next()
            try:
                await self._handshake(server)
            except (OSError, TimeoutError, ClientError) as exc:
                last = exc
                continue
            self._became_connected(server)
            return
        self._state = CLOSED
        if isinstance(last, AuthorizationError):
            raise last
        reason = "timed out" if isinstance(last, TimeoutError) else (str(last) or repr(last))
        raise NoServersAvailable(f"could not connect to any server: {reason}") from last

    def _became_connected(self, server: Server) -> None:
        self._server = server
        server.failures = 0
        self._pool.mark_current(server)
        self._pool.add_discovered(self.server_info.get("connect_urls") or [])
        self._state = CONNECTED
        self._max_payload = int(self.server_info.get("max_payload") or 1024 * 1024)
        self._connected.set()
        self._pings_out = 0
        self._arm_ping()

    def _connect_options(self, server: Server) -> dict[str, Any]:
        from tether.version import __version__

        opts = self.options
        headers = bool(self.server_info.get("headers"))
        connect: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "lang": "python3-tether",
            "version": __version__,
            "protocol": 1,
            "headers": headers,
            "no_responders": headers,
            "echo": opts.echo,
        }
        if opts.name:
            connect["name"] = opts.name
        user = server.user or opts.user
        password = server.password or opts.password
        token = server.token or opts.token
        if user is not None:
            connect["user"] = user
            connect["pass"] = password or ""
        elif token is not None:
            connect["auth_token"] = token
        if self._signer is not None:
            connect.update(self._signer.connect_fields(self.server_info.get("nonce")))
        if self._tls_context(server) is not None or self.server_info.get("tls_required"):
            connect["tls_required"] = True
        return connect

    # -- the reconnect loop -------------------------------------------------------------

    def _on_lost(self, exc: Exception | None) -> None:
        """The current transport is gone (the wire layer calls this once per connection)."""
        if self._state in (CONNECTED, DRAINING):
            if exc is not None and self.last_error is None:
                self.last_error = exc
            self._disconnected()

    def _disconnected(self) -> None:
        self._connected.clear()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._carried.extend(f for f in self._pongs if f is not None and not f.done())
        self._pongs.clear()
        self._wake_writers()
        for listener in list(self._listeners):
            listener._on_disconnected()
        self._fire(self.options.disconnected_cb)
        if self.options.allow_reconnect and self._state == CONNECTED:
            self._state = RECONNECTING
            self._reconnect_task = self._loop.create_task(self._reconnect())
        else:
            self._spawn(self._shutdown(self.last_error))

    async def _reconnect(self) -> None:
        opts = self.options
        attempt = 0
        while self._state == RECONNECTING:
            candidates = [
                s
                for s in self._pool.servers
                if opts.max_reconnect_attempts < 0 or s.failures < opts.max_reconnect_attempts
            ]
            if not candidates:
                break
            server = self._pool.next()
            if server not in candidates:
                continue
            delay = opts.reconnect_backoff.delay(attempt)
            attempt += 1
            if delay:
                await asyncio.sleep(delay)
            if self._state != RECONNECTING:
                return
            try:
                await self._handshake(server)
            except (OSError, TimeoutError, ClientError) as exc:
                server.failures += 1
                self.last_error = exc
                continue
            self._became_connected(server)
            self.reconnects += 1
            self._resume()
            return
        if self._state == RECONNECTING:
            await self._shutdown(NoServersAvailable(f"gave up reconnecting: {self.last_error}"))

    def _resume(self) -> None:
        """Re-establish subscriptions, then send what was buffered while disconnected."""
        frames: list[bytes] = []
        for sub in self._subs.values():
            frames.append(encode_sub(sub.subject, sub.sid, sub.queue))
            if sub.max_msgs:
                frames.append(encode_unsub(sub.sid, max(1, sub.max_msgs - sub.received)))
        # SUB/UNSUB/PING frames in the buffer are stale: subscriptions were replayed above.
        # Pull requests are too: pull subscriptions re-issue what is still owed (below),
        # and sending both would ask the server for more than we account for.
        kept = [
            f
            for f in self._out
            if (f[:4] == b"PUB " or f[:5] == b"HPUB ") and b".CONSUMER.MSG.NEXT." not in f[:160]
        ]
        self._out = frames + kept
        self._out_bytes = sum(map(len, self._out))
        for fut in self._carried:
            if not fut.done():
                self._pongs.append(fut)
                self._out.append(PING)
        self._carried.clear()
        self._schedule_flush()
        for listener in list(self._listeners):
            listener._on_reconnected()
        self._fire(self.options.reconnected_cb)

    # -- subscriptions ------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        queue: str = "",
        *,
        cb: MsgCallback | None = None,
        max_msgs: int = 0,
        pending_msgs_limit: int = DEFAULT_PENDING_MSGS_LIMIT,
    ) -> Subscription:
        """Subscribe to ``subject`` (optionally in a queue group)."""
        sub = self._add_sub(subject, queue, None, cb, pending_msgs_limit)
        if max_msgs:
            await sub.unsubscribe(max_msgs)
        return sub

    def _subscribe_raw(self, subject: str, handler: RawHandler, queue: str = "") -> Subscription:
        """A subscription whose frames go to ``handler`` inline (internal fast path)."""
        return self._add_sub(subject, queue, handler, None, DEFAULT_PENDING_MSGS_LIMIT)

    def _add_sub(
        self,
        subject: str,
        queue: str,
        handler: RawHandler | None,
        cb: MsgCallback | None,
        limit: int,
    ) -> Subscription:
        if self._state == CLOSED:
            raise ConnectionClosed("connection is closed")
        self._next_sid += 1
        sid = str(self._next_sid)
        sub = Subscription(
            self, sid, subject, queue, handler=handler, cb=cb, pending_msgs_limit=limit
        )
        self._subs[sid] = sub
        if self._state != RECONNECTING:  # otherwise the reconnect replays it
            self._send(encode_sub(subject, sid, queue))
        return sub

    def _unsubscribe(self, sub: Subscription, limit: int) -> None:
        if self._state in (CONNECTED, DRAINING):
            self._send(encode_unsub(sub.sid, limit))

    def _forget(self, sub: Subscription) -> None:
        if self._subs.get(sub.sid) is sub:
            del self._subs[sub.sid]
        sub._close()

    # -- callbacks and listeners ----------------------------------------------------------

    def _listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _unlisten(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def _report(self, exc: Exception) -> None:
        cb = self.options.error_cb
        if cb is None:
            log.debug("connection error: %r", exc)
            return
        self._fire(lambda: cb(exc))

    def _fire(self, cb: Callable[[], Awaitable[None] | None] | None) -> None:
        if cb is None:
            return
        try:
            result = cb()
        except Exception:
            log.exception("connection callback failed")
            return
        if inspect.isawaitable(result):
            self._spawn(result)

    def _spawn(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- ending ---------------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - the NATS client API
        """Unsubscribe everything, handle what already arrived, flush publishes, close."""
        if self._state in (CLOSED, DRAINING):
            return
        timeout = self.options.drain_timeout if timeout is None else timeout
        if self._state == CONNECTED:
            self._state = DRAINING
        subs = [s for s in self._subs.values() if s.subject != self._resp_prefix + "*"]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(sub.drain(timeout) for sub in subs))
                if self.is_connected:
                    await self.flush(timeout)
        except (TimeoutError, ClientError) as exc:
            self._report(Timeout(f"drain did not finish: {exc!r}"))
        await self.close()

    async def close(self) -> None:
        """Close now: pending requests fail with :class:`ConnectionClosed`."""
        await self._shutdown(None)

    async def _shutdown(self, error: Exception | None) -> None:
        if self._state == CLOSED:
            return
        self._state = CLOSED
        if error is not None:
            self.last_error = error
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        task = self._reconnect_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        transport = self._transport
        if transport is not None and self._out:
            transport.writelines(self._out)
        self._out = []
        closed = ConnectionClosed(f"connection closed: {error}" if error else "connection closed")
        pending = [*self._pongs, *self._carried]
        targets = list(self._resp_map.values())
        self._pongs.clear()
        self._carried.clear()
        self._resp_map.clear()
        for fut in pending:
            if fut is not None and not fut.done():
                fut.set_exception(closed)
                fut.exception()  # retrieved: nobody may be waiting any more
        for target in targets:
            target._fail(closed)
        subs = list(self._subs.values())
        self._subs.clear()
        for sub in subs:
            sub._close()
        self._wake_writers()
        self._connected.set()  # wakes wait_connected(), which then sees the closed state
        for listener in list(self._listeners):
            listener._on_closed()
        await self._close_transport()
        for sub in subs:
            await sub._stop_callback()
        self._fire(self.options.closed_cb)
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=1.0)
        for t in others:
            t.cancel()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _signer(options: Options) -> Signer | None:
    """The key that signs the server's nonce, read (and checked) once, before connecting."""
    if options.user_credentials:
        return from_creds_file(options.user_credentials)
    if options.nkeys_seed:
        return from_seed_file(options.nkeys_seed)
    if options.nkeys_seed_str:
        return from_seed(options.nkeys_seed_str)
    return None


async def connect(servers: str | list[str] | None = None, **options: Any) -> Connection:
    """Connect to the first server of ``servers`` (random order) that accepts us.

    ``options`` are the fields of :class:`Options`, e.g. ``user=``, ``password=``,
    ``token=``, ``user_credentials=`` (a ``.creds`` file), ``nkeys_seed=`` (a seed file),
    ``tls=`` (an ``ssl.SSLContext``), ``tls_handshake_first=``, ``name=``,
    ``max_reconnect_attempts=``, ``reconnect_backoff=``.
    """
    if servers is not None:
        options["servers"] = [servers] if isinstance(servers, str) else list(servers)
    conn = Connection(Options(**options))
    await conn._connect_first()
    return conn
