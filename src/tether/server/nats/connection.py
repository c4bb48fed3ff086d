"""One NATS client connection: parses its input, routes its publishes, buffers its output."""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
from typing import TYPE_CHECKING, Any, cast

import msgspec

from tether.engine.subjects import is_valid_filter, is_valid_subject
from tether.protocol.nats import errors
from tether.protocol.nats.commands import (
    OK,
    PING,
    PONG,
    encode,
    encode_err,
    encode_info,
)
from tether.protocol.nats.errors import ProtocolError
from tether.protocol.nats.parser import Parser

if TYPE_CHECKING:
    from tether.server.nats.server import NatsServer

log = logging.getLogger("tether.nats")

_decode_json = msgspec.json.Decoder(dict[str, Any]).decode


class ClientSubscription:
    """A client's SUB: delivers MSG/HMSG frames into the client's output buffer."""

    __slots__ = ("client", "delivered", "max_msgs", "queue", "sid", "sid_b", "subject")

    def __init__(self, client: ClientConnection, subject: str, queue: str, sid: str) -> None:
        self.client: ClientConnection | None = client
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.sid_b = encode(sid)
        self.max_msgs = 0
        self.delivered = 0

    def deliver(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes, sb: bytes, rb: bytes
    ) -> None:
        client = self.client
        if client is None:
            return
        self.delivered += 1
        client.send_msg(self.sid_b, sb, rb, headers, payload)
        if self.max_msgs and self.delivered >= self.max_msgs:
            client.remove_subscription(self)


class ClientConnection(asyncio.Protocol):
    """asyncio protocol for one client; implements the parser's handler interface."""

    def __init__(self, server: NatsServer, cid: int) -> None:
        self.server = server
        self.cid = cid
        cfg = server.config
        self.parser = Parser(
            self, max_payload=cfg.max_payload, max_control_line=cfg.max_control_line
        )
        self.transport: asyncio.Transport | None = None
        self.subs: dict[str, ClientSubscription] = {}
        self.connected = False  # CONNECT received and accepted
        self.closing = False
        self.verbose = False
        self.pedantic = False
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.name = ""
        self.lang = ""
        self.version = ""
        self.remote = ("", 0)
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        self._pings_out = 0
        self._got_data = False
        self._ping_timer: asyncio.TimerHandle | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        self._auth_required = cfg.auth_required
        self._loop = asyncio.get_running_loop()

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote = (str(peer[0]), int(peer[1]))
        self.transport.write(encode_info(self.server.info_for(self)))
        if not self.server.admit(self):
            self.close_with_error(errors.MAX_CONNECTIONS)
            return
        cfg = self.server.config
        if self._auth_required:
            self._auth_timer = self._loop.call_later(cfg.auth_timeout, self._auth_expired)
        if cfg.ping_interval > 0:
            self._ping_timer = self._loop.call_later(cfg.ping_interval, self._ping_tick)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._got_data = True
        try:
            self.parser.feed(data)
        except ProtocolError as exc:
            if exc.message != errors.UNKNOWN_OPERATION or not self.closing:
                log.debug("client %d protocol error: %s", self.cid, exc.message)
            self.close_with_error(exc.message)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        for timer in (self._ping_timer, self._auth_timer):
            if timer is not None:
                timer.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for sub in list(self.subs.values()):
            self._unindex(sub)
        self.subs.clear()
        self._out.clear()
        self.server.remove(self)

    def pause_writing(self) -> None:
        pass  # the outbound bound is enforced in _flush via get_write_buffer_size

    def resume_writing(self) -> None:
        pass

    # -- output ------------------------------------------------------------------------
    def send_msg(
        self, sid_b: bytes, sb: bytes, rb: bytes, headers: bytes | None, payload: bytes
    ) -> None:
        if headers is not None and self.headers:
            hlen = len(headers)
            if rb:
                head = b"HMSG %s %s %s %d %d\r\n" % (sb, sid_b, rb, hlen, hlen + len(payload))
            else:
                head = b"HMSG %s %s %d %d\r\n" % (sb, sid_b, hlen, hlen + len(payload))
            out = self._out
            out.append(head)
            out.append(headers)
            size = len(head) + hlen + len(payload) + 2
        else:
            # A client that did not negotiate headers gets the payload alone, as nats-server does.
            if rb:
                head = b"MSG %s %s %s %d\r\n" % (sb, sid_b, rb, len(payload))
            else:
                head = b"MSG %s %s %d\r\n" % (sb, sid_b, len(payload))
            out = self._out
            out.append(head)
            size = len(head) + len(payload) + 2
        out.append(payload)
        out.append(b"\r\n")
        self.out_msgs += 1
        self.out_bytes += len(payload)
        self._out_size += size
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if self._out_size > self.server.config.max_pending:
            self._slow_consumer()

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        self._out.append(data)
        self._out_size += len(data)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        transport = self.transport
        if transport is None or self.closing or not self._out:
            return
        transport.writelines(self._out)
        self._out.clear()
        self._out_size = 0
        if transport.get_write_buffer_size() > self.server.config.max_pending:
            self._slow_consumer()

    def _slow_consumer(self) -> None:
        if self.closing:
            return
        log.warning("client %d is a slow consumer; closing", self.cid)
        self.server.slow_consumers += 1
        self._out.clear()
        self._out_size = 0
        self.close_with_error(errors.SLOW_CONSUMER)

    def close_with_error(self, message: str) -> None:
        """Send ``-ERR`` and close; a peer that does not read is cut off after a deadline."""
        transport = self.transport
        if transport is None or self.closing:
            return
        self._flush()
        self.closing = True
        transport.write(encode_err(message))
        transport.close()
        if transport.get_write_buffer_size():
            self._loop.call_later(self.server.config.write_deadline, transport.abort)

    def send_error(self, message: str) -> None:
        """A non-fatal ``-ERR``: the connection stays open."""
        self.write(encode_err(message))

    # -- timers ------------------------------------------------------------------------
    def _ping_tick(self) -> None:
        if self.closing:
            return
        cfg = self.server.config
        if self._pings_out >= cfg.max_pings_out:
            self.close_with_error(errors.STALE_CONNECTION)
            return
        if not self._got_data or self._pings_out:
            self._pings_out += 1
            self.write(PING)
        self._got_data = False
        self._ping_timer = self._loop.call_later(cfg.ping_interval, self._ping_tick)

    def _auth_expired(self) -> None:
        if not self.connected:
            self.close_with_error(errors.AUTH_TIMEOUT)

    # -- parser handler: client → server ops -----------------------------------------
    def on_connect(self, options: bytes) -> None:
        try:
            opts = _decode_json(options)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ProtocolError(errors.UNKNOWN_OPERATION) from None
        if self._auth_required and not self._authorized(opts):
            log.info("client %d: authorization violation", self.cid)
            raise ProtocolError(errors.AUTH_VIOLATION)
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.connected = True
        self.verbose = bool(opts.get("verbose", False))
        self.pedantic = bool(opts.get("pedantic", False))
        self.echo = bool(opts.get("echo", True))
        self.headers = bool(opts.get("headers", False))
        self.no_responders = bool(opts.get("no_responders", False)) and self.headers
        self.name = str(opts.get("name", "") or "")
        self.lang = str(opts.get("lang", "") or "")
        self.version = str(opts.get("version", "") or "")
        if self.verbose:
            self.write(OK)

    def _authorized(self, opts: dict[str, Any]) -> bool:
        cfg = self.server.config
        if cfg.auth_token:
            token = opts.get("auth_token")
            return isinstance(token, str) and hmac.compare_digest(
                token.encode(), cfg.auth_token.encode()
            )
        user, password = opts.get("user"), opts.get("pass")
        if not isinstance(user, str) or not isinstance(password, str):
            return False
        ok_user = hmac.compare_digest(user.encode(), (cfg.user or "").encode())
        ok_pass = hmac.compare_digest(password.encode(), (cfg.password or "").encode())
        return ok_user and ok_pass

    def _require_auth(self) -> None:
        if self._auth_required and not self.connected:
            raise ProtocolError(errors.AUTH_VIOLATION)

    def on_pub(self, subject: str, reply: str, payload: bytes) -> None:
        if self._auth_required and not self.connected:
            raise ProtocolError(errors.AUTH_VIOLATION)
        if not is_valid_subject(subject):
            self.send_error(errors.INVALID_PUBLISH_SUBJECT)
            return
        self.in_msgs += 1
        self.in_bytes += len(payload)
        self.server.router.publish(self, subject, reply, None, payload)
        if self.verbose:
            self.write(OK)

    def on_hpub(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        self._require_auth()
        if not is_valid_subject(subject):
            self.send_error(errors.INVALID_PUBLISH_SUBJECT)
            return
        if not headers.startswith(b"NATS/1.0"):
            # nats-server drops a message whose header block is not NATS/1.0.
            self.send_error("Invalid Headers")
            return
        self.in_msgs += 1
        self.in_bytes += len(payload) + len(headers)
        self.server.router.publish(self, subject, reply, headers, payload)
        if self.verbose:
            self.write(OK)

    def on_sub(self, subject: str, queue: str, sid: str) -> None:
        self._require_auth()
        if not is_valid_filter(subject) or (queue and not is_valid_subject(queue)):
            self.send_error(errors.INVALID_SUBJECT)
            return
        if sid not in self.subs:
            sub = ClientSubscription(self, subject, queue, sid)
            self.subs[sid] = sub
            self.server.router.index.add(subject, sub, queue or None)
            self.server.on_interest_change(subject)
        if self.verbose:
            self.write(OK)

    def on_unsub(self, sid: str, max_msgs: int) -> None:
        self._require_auth()
        sub = self.subs.get(sid)
        if sub is not None:
            if max_msgs and sub.delivered < max_msgs:
                sub.max_msgs = max_msgs
            else:
                self.remove_subscription(sub)
        if self.verbose:
            self.write(OK)

    def remove_subscription(self, sub: ClientSubscription) -> None:
        if self.subs.pop(sub.sid, None) is not None:
            self._unindex(sub)

    def _unindex(self, sub: ClientSubscription) -> None:
        sub.client = None
        self.server.router.index.remove(sub.subject, sub, sub.queue or None)
        self.server.on_interest_change(sub.subject)

    def on_ping(self) -> None:
        self.write(PONG)

    def on_pong(self) -> None:
        self._pings_out = 0

    # -- server → client ops are not valid from a client --------------------------------
    def on_info(self, info: bytes) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)

    def on_msg(self, subject: str, sid: str, reply: str, payload: bytes) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)

    def on_hmsg(self, subject: str, sid: str, reply: str, headers: bytes, payload: bytes) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)

    def on_ok(self) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)

    def on_err(self, message: str) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)
