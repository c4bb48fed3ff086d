"""The connection's I/O core: the batched writer, keepalive, and frames from the server.

Writes are collected in a list and handed to the transport once per event-loop
iteration (``writelines``), so a burst of publishes or acks costs one system call.
Frames from the server arrive through the parser's handler methods below and are
routed inline to their subscription: no task per message.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import msgspec

from tether.client import _wire
from tether.client.errors import (
    AuthorizationError,
    ClientError,
    ConnectionClosed,
    FlushTimeout,
    MaxPayloadExceeded,
    OutboundBufferFull,
    PermissionsViolation,
    ProtocolViolation,
    ServerError,
    StaleConnection,
)
from tether.client.options import ServerPool
from tether.client.subscription import RawHandler, Subscription
from tether.protocol.nats import (
    PING,
    PONG,
    ProtocolError,
    encode_headers,
    encode_hpub,
    encode_pub,
)
from tether.protocol.nats.errors import UNKNOWN_OPERATION

log = logging.getLogger("tether.client")

CONNECTING, CONNECTED, RECONNECTING, DRAINING, CLOSED = range(5)


def _no_handler(subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
    return None


class Io(_wire.Reader):
    """State and methods shared by the writer, keepalive and frame handlers."""

    _pool: ServerPool
    last_error: Exception | None

    def __init__(self) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._state = CONNECTING
        self.server_info: dict[str, Any] = {}
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._writable: asyncio.Future[None] | None = None
        self._subs: dict[str, Subscription] = {}
        self._pongs: deque[asyncio.Future[None] | None] = deque()
        self._carried: list[asyncio.Future[None]] = []
        self._pings_out = 0
        self._ping_timer: asyncio.TimerHandle | None = None
        self._max_payload = 1024 * 1024
        self._resp_sid = ""  # the muxed inbox's sid, routed without a Subscription hop
        self._resp_handler: RawHandler = _no_handler

    @property
    def max_payload(self) -> int:
        """The largest payload the server accepts."""
        return self._max_payload

    def _report(self, exc: Exception) -> None:
        raise NotImplementedError

    # -- keepalive ----------------------------------------------------------------------

    def _arm_ping(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._ping_timer = self._loop.call_later(self.options.ping_interval, self._ping_tick)

    def _ping_tick(self) -> None:
        if self._state not in (CONNECTED, DRAINING) or self._transport is None:
            return
        if self._pings_out >= self.options.max_outstanding_pings:
            self.last_error = StaleConnection("server did not answer PINGs")
            self._report(self.last_error)
            self._transport.abort()
            return
        self._pings_out += 1
        self._pongs.append(None)
        self._send(PING)
        self._arm_ping()

    # -- frames from the server (parser handler) ----------------------------------------

    def on_msg(self, subject: str, sid: str, reply: str, payload: bytes) -> None:
        if sid == self._resp_sid:  # replies to requests and publishes: the busiest sid
            self._resp_handler(subject, reply, None, payload)
            return
        sub = self._subs.get(sid)
        if sub is not None:
            sub._deliver(subject, reply, None, payload)

    def on_hmsg(self, subject: str, sid: str, reply: str, headers: bytes, payload: bytes) -> None:
        sub = self._subs.get(sid)
        if sub is not None:
            sub._deliver(subject, reply, headers, payload)

    def on_ping(self) -> None:
        self._send_now(PONG)

    def on_pong(self) -> None:
        if self._handshake_pong is not None:
            if not self._handshake_pong.done():
                self._handshake_pong.set_result(None)
            return
        self._pings_out = 0
        if self._pongs:
            fut = self._pongs.popleft()
            if fut is not None and not fut.done():
                fut.set_result(None)

    def on_info(self, info: bytes) -> None:
        try:
            parsed = msgspec.json.decode(info)
        except msgspec.DecodeError:
            self._protocol_violation("INFO is not JSON")
            return
        if not isinstance(parsed, dict):
            self._protocol_violation("INFO is not an object")
            return
        if self._handshake_info is not None and not self._handshake_info.done():
            self._handshake_info.set_result(parsed)
            return
        self.server_info.update(parsed)
        self._max_payload = int(self.server_info.get("max_payload") or self._max_payload)
        self._pool.add_discovered(parsed.get("connect_urls") or [])

    def on_ok(self) -> None:
        pass

    def on_err(self, message: str) -> None:
        low = message.lower()
        exc: ClientError
        if "permissions violation" in low:
            self._report(PermissionsViolation(message))
            return
        if "authorization" in low or "authentication" in low:
            exc = AuthorizationError(message)
        elif "stale connection" in low:
            exc = StaleConnection(message)
        else:
            exc = ServerError(message)
        if self._fail_handshake(exc):
            return
        self.last_error = exc
        self._report(exc)

    def _unexpected(self, *_: object) -> None:
        raise ProtocolError(UNKNOWN_OPERATION)

    on_connect = on_pub = on_hpub = on_sub = on_unsub = _unexpected

    def _protocol_violation(self, why: str) -> None:
        exc = ProtocolViolation(why)
        if not self._fail_handshake(exc):
            self._protocol_error(exc)
        wire = self._wire
        if wire is not None and wire.transport is not None:
            wire.transport.abort()

    def _protocol_error(self, exc: ProtocolViolation) -> None:
        self.last_error = exc
        self._report(exc)

    # -- writing ------------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        """Queue one frame; it goes out with everything else queued in this loop iteration."""
        state = self._state
        if state == CLOSED:
            raise ConnectionClosed("connection is closed")
        self._out.append(frame)
        self._out_bytes += len(frame)
        if state == RECONNECTING:
            if self._out_bytes > self.options.reconnect_buffer_size:
                self._out.pop()
                self._out_bytes -= len(frame)
                raise OutboundBufferFull("reconnect buffer is full")
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if not self._out or transport is None or self._state in (RECONNECTING, CLOSED):
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        transport.writelines(out)

    def _send_now(self, frame: bytes) -> None:
        wire = self._wire
        if self._handshake_pong is not None or self._handshake_info is not None:
            if wire is not None and wire.transport is not None:
                wire.transport.write(frame)
        elif self._state != CLOSED:
            self._send(frame)

    async def _publish_frame(self, frame: bytes) -> None:
        self._send(frame)
        if self._out_bytes > self.options.write_high_water or self._paused:
            await self._wait_writable()

    async def _wait_if_congested(self) -> None:
        if self._out_bytes > self.options.write_high_water or self._paused:
            await self._wait_writable()

    async def _wait_writable(self) -> None:
        if self._state == CONNECTED and self._out_bytes > self.options.write_high_water:
            self._flush_out()
        while self._paused and self._state in (CONNECTED, DRAINING):
            if self._writable is None or self._writable.done():
                self._writable = self._loop.create_future()
            await self._writable

    def _on_resume_writing(self) -> None:
        self._wake_writers()

    def _wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Publish ``payload`` (buffered; goes out within this loop iteration)."""
        await self._publish_frame(self._encode_publish(subject, payload, reply, headers))

    def _encode_publish(
        self, subject: str, payload: bytes, reply: str, headers: dict[str, str] | None
    ) -> bytes:
        if len(payload) > self._max_payload:
            raise MaxPayloadExceeded(f"{len(payload)} bytes > max_payload {self._max_payload}")
        if headers:
            return encode_hpub(subject, encode_headers(headers.items()), payload, reply)
        return encode_pub(subject, payload, reply)

    async def flush(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - the NATS client API
        """Wait until the server has processed everything sent so far (PING/PONG)."""
        if self._state == CLOSED:
            raise ConnectionClosed("connection is closed")
        fut: asyncio.Future[None] = self._loop.create_future()
        if self._state == RECONNECTING:
            self._carried.append(fut)
        else:
            self._pongs.append(fut)
            self._send(PING)
        timeout = self.options.flush_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            raise FlushTimeout(f"no PONG within {timeout}s") from None
