"""One NATS client connection: parses its input, routes its publishes, buffers its output."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from typing import Any, Protocol, cast

import msgspec

from tether.engine.subjects import is_valid_filter, is_valid_subject
from tether.protocol.nats import errors
from tether.protocol.nats.commands import (
    OK,
    PING,
    PONG,
    encode_err,
    encode_info,
)
from tether.protocol.nats.errors import ProtocolError
from tether.protocol.nats.parser import Parser
from tether.server.config import ServerConfig
from tether.server.nats.auth.certificates import peer_names
from tether.server.nats.auth.keys import new_nonce
from tether.server.nats.auth.permissions import (
    Identity,
    Replies,
    UserPermissions,
    publish_violation,
    reply_violation,
    reserved_reply,
    subscribe_violation,
)
from tether.server.nats.auth.users import Authenticator
from tether.server.nats.requests import Int, go_text, too_deep
from tether.server.nats.router import Router
from tether.server.nats.subscriptions import (
    BatchHandler,
    ClientSubscription,
    GuardedSubscription,
)

log = logging.getLogger("tether.nats")

# Seconds a closed connection keeps reading what its peer still sends (see ``_close``).
LINGER = 2.0
NS = 1_000_000_000
FIRST_PING = 2.0  # nats-server's firstClientPingInterval
RTT_REFRESH = 3600.0  # ... and DEFAULT_RTT_MEASUREMENT_INTERVAL

CRLF = b"\r\n"
CREDENTIALS_EXPIRED = "User Authentication Expired"
_SIZE_LINES = [b"%d\r\n" % i for i in range(4096)]


class ConnectOptions(msgspec.Struct, rename={"password": "pass"}):
    """The CONNECT fields the server reads; ``None`` means "not sent" (keep what we had).

    Decoding is as strict about types as nats-server's (Go's) JSON decoding: a field
    of the wrong type fails the whole CONNECT.
    """

    verbose: bool | None = None
    pedantic: bool | None = None
    echo: bool | None = None
    headers: bool | None = None
    no_responders: bool | None = None
    protocol: Int | None = None
    tls_required: bool | None = None
    name: str | None = None
    lang: str | None = None
    version: str | None = None
    auth_token: str | None = None
    user: str | None = None
    password: str | None = None
    jwt: str | None = None
    nkey: str | None = None
    sig: str | None = None
    account: str | None = None
    new_account: bool | None = None


_decode_connect = msgspec.json.Decoder(ConnectOptions).decode
_decode_any = msgspec.json.Decoder().decode


def parse_connect(options: bytes) -> ConnectOptions:
    """CONNECT's JSON as Go decodes it into nats-server's options: bytes that are not
    UTF-8 in a string become U+FFFD, ``null`` changes nothing; anything else that does
    not decode (syntax, types, numbers beyond int64, absurd nesting) is a ProtocolError,
    which nats-server answers by closing the connection without an ``-ERR``."""
    text = go_text(options.strip())
    if text == b"null":
        return ConnectOptions()
    if too_deep(text):
        raise errors.bad_arguments("malformed CONNECT: exceeded max depth")
    try:
        return _decode_connect(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise errors.bad_arguments("malformed CONNECT") from None


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it."""

    config: ServerConfig
    router: Router
    authenticator: Authenticator
    slow_consumers: int
    pending_total: int  # what every client's transport holds, as last seen (see _account)

    def info_for(self, conn: ClientConnection, *, connect_info: bool = False) -> dict[str, Any]: ...
    def over_budget(self) -> None: ...
    def admit(self, conn: ClientConnection) -> bool: ...
    def remove(self, conn: ClientConnection) -> None: ...
    def on_interest_change(self, subject: str) -> None: ...


class ClientConnection(asyncio.Protocol):
    """asyncio protocol for one client; implements the parser's handler interface."""

    def __init__(self, server: ConnectionHost, cid: int) -> None:
        self.server = server
        self.cid = cid
        cfg = server.config
        self.parser = Parser(
            self,
            max_payload=cfg.max_payload,
            max_control_line=cfg.max_control_line,
            server_side=True,
        )
        self.transport: asyncio.Transport | None = None
        self.subs: dict[str, ClientSubscription] = {}
        self.connected = False  # CONNECT received and accepted
        self.closing = False
        # nats-server's defaults until a CONNECT says otherwise (a telnet user gets +OK).
        self.verbose = True
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.protocol = 0
        self.name = ""
        self.lang = ""
        self.version = ""
        self.remote = ("", 0)
        # For the monitoring endpoints (/connz): when it connected, when it last sent.
        self.started_at = time.time()
        self.last_read = self.started_at
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        self._out: list[bytes] = []
        self._out_size = 0
        self._buffered = 0  # what the transport held at the last look (server-wide budget)
        self._flush_handle: asyncio.Handle | None = None
        self._pings_out = 0
        self._got_data = False
        # Round trip to the client in ns (/connz "rtt"): estimated at CONNECT, measured
        # by each PING this server sends; 0 until then.
        self.rtt_ns = 0
        self._rtt_start = 0.0  # when the last PING went out (0: never)
        self._first_pong_sent = False
        self._ping_timer: asyncio.TimerHandle | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        # Only CONNECT may come first, unless a client without credentials is a user
        # anyway (no_auth_user), as nats-server has it.
        self._auth_required = cfg.auth_required and cfg.no_auth_user is None
        # Who the client is (see on_connect): what it may publish and subscribe to, and
        # the replies it may send (allow_responses). None: anything.
        auth = server.authenticator
        self.nonce = new_nonce() if auth.nonce_required else ""
        self.user = ""
        self._perms: UserPermissions | None = None
        self._pub_perms: UserPermissions | None = None  # when publishing is restricted
        self._replies: Replies | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        if auth.no_auth is not None:
            self._apply_identity(auth.no_auth)
        self._loop = asyncio.get_running_loop()
        self._publish = server.router.publish
        # Header-less PUBs of one read to one subject, handed to the router as a run
        # (see on_pub). Only for clients that want neither +OK nor pedantic checks:
        # those write something per PUB, which must come in order with deliveries.
        self._runs = False
        self._run_subject = ""
        self._run_replies: list[str] = []
        self._run_payloads: list[bytes] = []
        self._publish_many = server.router.publish_many
        # A run may go on to other subjects that the same stream captures (a publisher
        # cycling through subjects): then each message's subject is in _run_subjects
        # and the run goes to that capture's batch handler, _run_target.
        self._run_subjects: list[str] | None = None
        self._run_target: BatchHandler | None = None
        self._batch_target = server.router.batch_target

    @property
    def pending_bytes(self) -> int:
        """Bytes buffered for the client and not yet written to its socket (/connz)."""
        transport = self.transport
        held = transport.get_write_buffer_size() if transport is not None else 0
        return self._out_size + held

    @property
    def takes_async_info(self) -> bool:
        """Whether the server may send an INFO at any time: nats-server's rule is a
        CONNECT with protocol 1 and the first PONG sent."""
        return self._first_pong_sent and self.protocol >= 1

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # pause_writing as soon as anything waits in the transport, resume_writing once
        # it is all written: the server-wide count of what waits then stays exact.
        self.transport.set_write_buffer_limits(high=0)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote = (str(peer[0]), int(peer[1]))
        self.transport.write(encode_info(self.server.info_for(self)))
        log.debug("%s:%d - cid:%d - Client connection created", *self.remote, self.cid)
        if not self.server.admit(self):
            self.close_with_error(errors.MAX_CONNECTIONS)
            return
        cfg = self.server.config
        if cfg.auth_required:
            self._auth_timer = self._loop.call_later(cfg.auth_timeout, self._auth_expired)
        if cfg.ping_interval > 0:
            self._ping_timer = self._loop.call_later(cfg.ping_interval, self._ping_tick)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self._got_data = True
        self.last_read = time.time()
        try:
            # Until it authenticates, the only thing a client may send is CONNECT;
            # nats-server rejects anything else on its first byte.
            if (
                self._auth_required
                and not self.connected
                and not self.parser.pending
                and data[:1] not in (b"C", b"c")
            ):
                raise ProtocolError(errors.AUTH_VIOLATION)
            try:
                self.parser.feed(data)
            finally:
                # The PUBs before an error were received: they are routed like any other.
                if self._run_payloads:
                    self._end_run()
        except ProtocolError as exc:
            log.debug("client %d protocol error: %s", self.cid, exc.message)
            if exc.silent:
                self.close()
            else:
                self.close_with_error(exc.message)
        except Exception:
            # A bug behind a handler must cost this client its connection, never the server.
            log.exception("client %d: internal error while handling input", self.cid)
            self.close_with_error("Internal Server Error")

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        log.debug(
            "%s:%d - cid:%d - Client connection closed%s",
            *self.remote,
            self.cid,
            f": {exc}" if exc is not None else "",
        )
        for timer in (self._ping_timer, self._auth_timer, self._expiry_timer):
            if timer is not None:
                timer.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        subs = list(self.subs.values())
        self.subs.clear()
        if subs:
            for sub in subs:
                sub.client = None
            # One sweep of the match cache for all of them, not one per subscription.
            self.server.router.index.remove_many((s.subject, s, s.queue or None) for s in subs)
            for sub in subs:
                self.server.on_interest_change(sub.subject)
        self._out.clear()
        self._forget_buffered()
        self.server.remove(self)

    def pause_writing(self) -> None:
        pass  # the outbound bounds are enforced in _flush via get_write_buffer_size

    def resume_writing(self) -> None:
        # Everything the transport held is written: out of the server-wide count.
        if self._buffered:
            self._forget_buffered()

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
        if self._replies is not None and rb:
            self._track_reply(rb.decode("utf-8", "surrogateescape"))
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if self._out_size > self.server.config.max_pending:
            self._slow_consumer()

    def send_plain(self, head: bytes, payload: bytes) -> None:
        """A MSG without reply or headers; ``head`` is the cached ``MSG <subject> <sid> ``."""
        plen = len(payload)
        self._out += (head, _SIZE_LINES[plen] if plen < 4096 else b"%d\r\n" % plen, payload, CRLF)
        self.out_msgs += 1
        self.out_bytes += plen
        self._out_size += len(head) + plen + 8
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if self._out_size > self.server.config.max_pending:
            self._slow_consumer()

    def send_frames(self, frames: list[bytes], payload_bytes: int) -> None:
        """Complete ``MSG`` frames (one message each), appended in one go."""
        size = self._out_size + sum(map(len, frames))
        self._out += frames
        self.out_msgs += len(frames)
        self.out_bytes += payload_bytes
        self._out_size = size
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if size > self.server.config.max_pending:
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
        out = self._out
        transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        self._out_size = 0
        held = transport.get_write_buffer_size()
        if held > self.server.config.max_pending:
            self._slow_consumer()
        elif held != self._buffered:  # a client that keeps up: 0 both times
            self._account(held)

    def _account(self, held: int) -> None:
        """Count what this client's transport holds in the server's total; over the
        server-wide budget, the server cuts off the largest backlogs."""
        server = self.server
        server.pending_total += held - self._buffered
        self._buffered = held
        limit = server.config.max_pending_total
        if limit and server.pending_total > limit:
            server.over_budget()

    def _forget_buffered(self) -> None:
        self.server.pending_total -= self._buffered
        self._buffered = 0

    def measure_buffered(self) -> int:
        """What the transport holds now, recorded as this client's share of the total
        (the caller puts the total right)."""
        transport = self.transport
        self._buffered = transport.get_write_buffer_size() if transport is not None else 0
        return self._buffered

    def flush_now(self) -> None:
        """Hand everything buffered to the transport (used before a shutdown)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()

    def _slow_consumer(self, why: str = "") -> None:
        """Cut off a client that does not keep up, as nats-server does: at once, dropping
        what it is owed, without an ``-ERR`` (it would queue behind all the rest); the
        client sees the connection close and may reconnect."""
        transport = self.transport
        if self.closing or transport is None:
            return
        log.warning(
            "client %d is a slow consumer (%s); closing",
            self.cid,
            why or f"more than {self.server.config.max_pending} bytes pending",
        )
        self.server.slow_consumers += 1
        self.closing = True
        self._out.clear()
        self._out_size = 0
        transport.abort()
        self._forget_buffered()

    def cut_off(self, why: str) -> None:
        """Treat this client as a slow consumer now (the server-wide budget is spent)."""
        if self.closing and self.transport is not None:
            # Closing already, still draining its last words: those go too.
            self.transport.abort()
            self._forget_buffered()
            return
        self._slow_consumer(why)

    def close_with_error(self, message: str) -> None:
        """Send ``-ERR`` and close; a peer that does not read is cut off after a deadline."""
        self._close(encode_err(message))

    def close(self, *, linger: bool = True) -> None:
        """Close after flushing what is buffered, without an error line."""
        self._close(b"", linger)

    def _close(self, last: bytes, linger: bool = True) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        self._flush()
        self.closing = True
        if last:
            transport.write(last)
        if linger and transport.can_write_eof():
            # A lingering close: our FIN follows the last words, and we keep reading (and
            # discarding) until the peer closes too. Closing with its input unread would
            # make the kernel reset the connection, and the peer could lose the -ERR.
            transport.write_eof()
            deadline = self.server.config.write_deadline if transport.get_write_buffer_size() else 0
            self._loop.call_later(max(deadline, LINGER), transport.abort)
        else:
            transport.close()
            if transport.get_write_buffer_size():
                self._loop.call_later(self.server.config.write_deadline, transport.abort)

    def send_error(self, message: str) -> None:
        """A non-fatal ``-ERR``: the connection stays open."""
        self.write(encode_err(message))

    # -- timers ------------------------------------------------------------------------
    def _first_ping(self) -> None:
        """As nats-server does once a client connects: the first PING goes out soon
        (at most 2 s, plus up to a fifth at random so that many clients connecting at
        once are not pinged at once) to measure the round trip; later ones every
        ``ping_interval``."""
        interval = self.server.config.ping_interval
        if interval <= 0:
            return
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        delay = min(interval, FIRST_PING)
        delay += random.uniform(0, delay / 5)
        self._ping_timer = self._loop.call_later(delay, self._ping_tick)

    def _ping_tick(self) -> None:
        if self.closing:
            return
        cfg = self.server.config
        # A round trip not measured yet, or measured over an hour ago, is worth a PING
        # even to a busy client.
        need_rtt = not self._rtt_start or time.time() - self._rtt_start > RTT_REFRESH
        got_data, self._got_data = self._got_data, False
        # Data from the client within the interval proves it alive: no PING needed.
        if need_rtt or not got_data:
            if self._pings_out + 1 > cfg.max_pings_out:
                self.close_with_error(errors.STALE_CONNECTION)
                return
            self._pings_out += 1
            self._rtt_start = time.time()
            self.write(PING)
        self._ping_timer = self._loop.call_later(cfg.ping_interval, self._ping_tick)

    def _auth_expired(self) -> None:
        if not self.connected:
            self.close_with_error(errors.AUTH_TIMEOUT)

    def _credentials_expired(self) -> None:
        self.close_with_error(CREDENTIALS_EXPIRED)

    # -- parser handler: client → server ops -----------------------------------------
    def on_connect(self, options: bytes) -> None:
        if self._run_payloads:
            self._end_run()
        opts = parse_connect(options)
        # verify_and_map: a verified client certificate names the user (auth/certificates.py).
        names = peer_names(self.transport) if self.server.config.tls_verify_and_map else []
        if self.server.config.auth_required and names:
            identity = self.server.authenticator.certificate_user(names)
            if identity is None:
                log.info("client %d: no user for its certificate (%s)", self.cid, names[0])
                raise ProtocolError(errors.AUTH_VIOLATION)
            self._apply_identity(identity)
        elif self.server.config.auth_required:
            identity = self.server.authenticator.authenticate(
                user=opts.user,
                password=opts.password,
                token=opts.auth_token,
                nkey=opts.nkey,
                jwt=opts.jwt,
                sig=opts.sig,
                nonce=self.nonce,
            )
            if identity is None:
                log.info("client %d: authorization violation", self.cid)
                raise ProtocolError(errors.AUTH_VIOLATION)
            self._apply_identity(identity)
        if opts.account or opts.new_account:
            # nats-server no longer lets a client pick its account.
            raise ProtocolError(errors.AUTH_VIOLATION)
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.connected = True
        self.rtt_ns = max(1, int((time.time() - self.started_at) * NS))
        self._first_ping()
        # Like Go's JSON decoding into the existing options: absent fields keep their value.
        if opts.verbose is not None:
            self.verbose = opts.verbose
        if opts.pedantic is not None:
            self.pedantic = opts.pedantic
        if opts.echo is not None:
            self.echo = opts.echo
        if opts.headers is not None:
            self.headers = opts.headers
        if opts.no_responders is not None:
            self.no_responders = opts.no_responders
        if opts.protocol is not None:
            self.protocol = opts.protocol
        if opts.name is not None:
            self.name = opts.name
        if opts.lang is not None:
            self.lang = opts.lang
        if opts.version is not None:
            self.version = opts.version
        if not 0 <= self.protocol <= 1:
            raise ProtocolError(errors.BAD_CLIENT_PROTOCOL)
        if self.no_responders and not self.headers:
            raise ProtocolError(errors.NO_RESPONDERS_REQUIRES_HEADERS)
        self._runs = not self.verbose and not self.pedantic
        if self.verbose:
            self.write(OK)

    def _apply_identity(self, identity: Identity) -> None:
        self.user = identity.name
        perms = identity.permissions
        self._perms = perms
        self._pub_perms = perms if perms is not None and perms.restricts_publish else None
        self._replies = None
        if perms is not None and perms.responses is not None:
            self._replies = Replies(*perms.responses)
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if identity.expires is not None:
            delay = max(identity.expires - time.time(), 0.0)
            self._expiry_timer = self._loop.call_later(delay, self._credentials_expired)

    # -- permissions -----------------------------------------------------------------------
    def _may_publish(self, subject: str) -> bool:
        """Whether the user may publish to ``subject``; if not, the client is told (the
        connection stays open) and the message is dropped. Called only with publish
        permissions in place."""
        perms = self._pub_perms
        if perms is None or perms.may_publish(subject):
            return True
        if self._replies is not None and self._replies.use(subject):
            return True
        if self._run_payloads:
            self._end_run()  # what came before is delivered before the -ERR
        log.info("client %d: publish to %r denied", self.cid, subject)
        self.send_error(publish_violation(subject))
        return False

    def _reply_refused(self, reply: str) -> bool:
        """A reply subject nats-server reserves: the message is dropped with an -ERR
        and the connection stays, as for a publish permission."""
        if not reply or not reserved_reply(reply):
            return False
        if self._run_payloads:
            self._end_run()  # what came before is delivered before the -ERR
        log.info("client %d: publish with reply %r refused", self.cid, reply)
        self.send_error(reply_violation(reply))
        return True

    def _track_reply(self, reply: str) -> None:
        """A request delivered with a reply subject: publishable as a response."""
        perms = self._pub_perms
        if self._replies is not None and (perms is None or not perms.may_publish(reply)):
            self._replies.received(reply)

    def on_pub(self, subject: str, reply: str, payload: bytes) -> None:
        perms = self._pub_perms
        if self._runs:
            if (
                perms is not None
                and perms.pub_cache.get(subject) is not True
                and not self._may_publish(subject)
            ):
                self.in_msgs += 1
                self.in_bytes += len(payload)
                return
            if reply and self._reply_refused(reply):
                self.in_msgs += 1
                self.in_bytes += len(payload)
                return
            # Deferred to the end of the run (the next op of another kind, another
            # subject, or the end of this read), which routes it exactly as here: nothing
            # else happens in between, and every other op ends the run first.
            self.in_msgs += 1
            self.in_bytes += len(payload)
            if subject != self._run_subject:
                if self._run_payloads and not self._run_goes_on(subject):
                    self._end_run()
                self._run_subject = subject
            if self._run_subjects is not None:
                self._run_subjects.append(subject)
            self._run_replies.append(reply)
            self._run_payloads.append(payload)
            return
        if self.pedantic and not is_valid_subject(subject):
            # nats-server reports it, then routes the message all the same.
            self.send_error(errors.INVALID_PUBLISH_SUBJECT)
        self.in_msgs += 1
        self.in_bytes += len(payload)
        if perms is not None and not self._may_publish(subject):
            return
        if reply and self._reply_refused(reply):
            return
        if self.verbose:
            self.write(OK)
        self._publish(self, subject, reply, None, payload)  # the router checks the subject

    def on_pub_run(self, subject: str, replies: list[str], payloads: list[bytes]) -> None:
        """Consecutive PUBs to ``subject`` parsed in one go: ``on_pub`` for each."""
        perms = self._pub_perms
        if (
            not self._runs
            or (perms is not None and perms.pub_cache.get(subject) is not True)
            or _any_reserved(replies)
        ):
            for reply, payload in zip(replies, payloads, strict=True):
                self.on_pub(subject, reply, payload)
            return
        self.in_msgs += len(payloads)
        self.in_bytes += sum(map(len, payloads))
        if subject != self._run_subject:
            if self._run_payloads and not self._run_goes_on(subject):
                self._end_run()
            self._run_subject = subject
        if self._run_subjects is not None:
            self._run_subjects += [subject] * len(payloads)
        if self._run_payloads:
            self._run_replies += replies
            self._run_payloads += payloads
        else:  # the parser hands the lists over
            self._run_replies = replies
            self._run_payloads = payloads

    def on_pub_batch(self, subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
        """Consecutive PUBs, each to its own subject (acks), parsed in one go: ``on_pub``
        for each."""
        perms = self._pub_perms
        if (
            not self._runs
            or (perms is not None and not all(perms.pub_cache.get(s) is True for s in subjects))
            or _any_reserved(replies)
        ):
            for subject, reply, payload in zip(subjects, replies, payloads, strict=True):
                self.on_pub(subject, reply, payload)
            return
        if self._run_payloads:
            self._end_run()
        self.in_msgs += len(payloads)
        self.in_bytes += sum(map(len, payloads))
        self.server.router.publish_batch(self, subjects, replies, payloads)

    def _run_goes_on(self, subject: str) -> bool:
        """Whether the current run (of another subject) can take a PUB to ``subject``:
        both go to one stream capture and nothing else (see Router.batch_target)."""
        target = self._batch_target(subject)
        if target is None:
            return False
        if self._run_subjects is None:
            if self._batch_target(self._run_subject) is not target:
                return False
            self._run_target = target
            self._run_subjects = [self._run_subject] * len(self._run_payloads)
            return True
        return target is self._run_target

    def _end_run(self) -> None:
        replies, payloads = self._run_replies, self._run_payloads
        self._run_replies = []
        self._run_payloads = []
        subjects, target = self._run_subjects, self._run_target
        if subjects is None or target is None:
            self._publish_many(self, self._run_subject, replies, payloads)
            return
        self._run_subjects = None
        self._run_target = None
        target(subjects, replies, payloads)

    def on_hpub(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        if self._run_payloads:
            self._end_run()
        if not self.headers:
            raise errors.bad_arguments("HPUB without headers support")
        if self.pedantic and not is_valid_subject(subject):
            self.send_error(errors.INVALID_PUBLISH_SUBJECT)
        self.in_msgs += 1
        self.in_bytes += len(payload) + len(headers)
        if self._pub_perms is not None and not self._may_publish(subject):
            return
        if reply and self._reply_refused(reply):
            return
        if self.verbose:
            self.write(OK)
        if ".." in subject or subject[0] == "." or subject[-1] == ".":
            self.server.router.no_interest(self, subject, reply)
            return
        # An empty header block is a plain message, as nats-server delivers it.
        self.server.router.publish(self, subject, reply, headers or None, payload)

    def on_hpub_run(
        self, subject: str, replies: list[str], headers: list[bytes], payloads: list[bytes]
    ) -> None:
        """Consecutive HPUBs to ``subject`` parsed in one go: ``on_hpub`` for each."""
        perms = self._pub_perms
        if (
            not self._runs
            or not self.headers
            or (perms is not None and perms.pub_cache.get(subject) is not True)
            or ".." in subject
            or subject[0] == "."
            or subject[-1] == "."
            or _any_reserved(replies)
        ):
            for reply, block, payload in zip(replies, headers, payloads, strict=True):
                self.on_hpub(subject, reply, block, payload)
            return
        if self._run_payloads:
            self._end_run()
        self.in_msgs += len(payloads)
        self.in_bytes += sum(map(len, payloads)) + sum(map(len, headers))
        self.server.router.publish_headered_run(self, subject, replies, headers, payloads)

    def on_sub(self, subject: str, queue: str, sid: str) -> None:
        if self._run_payloads:
            self._end_run()
        # nats-server validates the subject only; any queue name is accepted.
        if not is_valid_filter(subject):
            self.send_error(errors.INVALID_SUBJECT)
            return
        perms = self._perms
        if perms is not None and not perms.may_subscribe(subject, queue):
            log.info("client %d: subscription to %r denied", self.cid, subject)
            self.send_error(subscribe_violation(subject, queue))
            return
        if sid not in self.subs:
            sub: ClientSubscription
            if perms is not None and perms.needs_delivery_check(subject, queue):
                sub = GuardedSubscription(self, subject, queue, sid, perms.delivery_denied)
            else:
                sub = ClientSubscription(self, subject, queue, sid)
            self.subs[sid] = sub
            self.server.router.index.add(subject, sub, queue or None)
            self.server.on_interest_change(subject)
        if self.verbose:
            self.write(OK)

    def on_unsub(self, sid: str, max_msgs: int) -> None:
        if self._run_payloads:
            self._end_run()
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
        if self._run_payloads:
            self._end_run()
        self.write(PONG)
        if self.connected and not self._first_pong_sent:
            # nats-server follows the first PONG after CONNECT with an INFO confirming
            # the connection, for clients that speak protocol 1.
            self._first_pong_sent = True
            if self.protocol >= 1:
                self.write(encode_info(self.server.info_for(self, connect_info=True)))

    def on_pong(self) -> None:
        if self._run_payloads:
            self._end_run()
        self._pings_out = 0
        if self._rtt_start:
            self.rtt_ns = max(1, int((time.time() - self._rtt_start) * NS))

    # -- ops a client sends only by mistake; handled as nats-server handles them ---------
    def on_info(self, info: bytes) -> None:
        if self._run_payloads:
            self._end_run()
        try:
            text = go_text(info.strip())
            if too_deep(text):
                raise errors.bad_arguments("malformed INFO: exceeded max depth")
            _decode_any(text)
        except msgspec.DecodeError:
            raise errors.bad_arguments("malformed INFO") from None

    def on_ok(self) -> None:
        if self._run_payloads:
            self._end_run()

    def on_err(self, message: str) -> None:
        if self._run_payloads:
            self._end_run()
        log.info("client %d sent an error: %s", self.cid, message)
        raise errors.bad_arguments("client error")

    def on_msg(self, subject: str, sid: str, reply: str, payload: bytes) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)  # the server-side parser never calls it

    def on_hmsg(self, subject: str, sid: str, reply: str, headers: bytes, payload: bytes) -> None:
        raise ProtocolError(errors.UNKNOWN_OPERATION)  # the server-side parser never calls it


def _any_reserved(replies: list[str]) -> bool:
    # Most runs carry no reply at all: ``any`` over the strings answers that in C.
    return any(replies) and any(map(reserved_reply, filter(None, replies)))
