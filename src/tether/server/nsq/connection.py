"""One NSQ client connection (protocol V2): each wire command is a method named after
its verb, answered with nsqd's frames and errors.

Commands are parsed a read at a time (runs of ``PUB`` and ``FIN`` come as one command,
see :mod:`tether.protocol.nsq.parser`) and executed in order. Responses go out in the
order of their commands even when some wait: a ``PUB``'s ``OK`` is sent once its group
commit is durable (like a PubAck), a ``SUB`` once its channel exists; each response
takes a numbered slot and slots are written in order as they fill. Message frames are
not responses and go out as soon as they are dealt.

A command that must wait before the next may run (``SUB``, a ``PUB`` to a topic that
does not exist yet) holds the commands after it until it is done. An error other than
``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` is fatal, as in nsqd: its
frame is the last thing sent and the connection closes.

Heartbeats go out every ``heartbeat_interval``; a client that sends nothing for twice
that long is disconnected (nsqd's read deadline). Output is bounded: a client whose
unsent bytes pass ``max_pending`` is cut off (a slow consumer).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, ClassVar, Protocol, cast

import msgspec

from tether.engine import errors as api_errors
from tether.engine.broker import Broker
from tether.engine.nsq import Channel, Member, NsqService
from tether.engine.nsq.names import subject as topic_subject
from tether.engine.streams import Stream
from tether.protocol.nsq import errors
from tether.protocol.nsq.commands import Command, DPub, FinRun, MPub, PubRun
from tether.protocol.nsq.errors import Failure, go_quote
from tether.protocol.nsq.frames import (
    CLOSE_WAIT,
    HEARTBEAT,
    MSG_ID_LENGTH,
    OK,
    error,
    message_head,
    response,
)
from tether.protocol.nsq.names import is_valid_name
from tether.protocol.nsq.parser import Limits, Parsed, Parser
from tether.server.config import ServerConfig
from tether.server.nsq import identify
from tether.server.nsq.compression import Codec, CompressionError, Deflate, Snappy
from tether.server.nsq.tls import (
    HANDSHAKE_TIMEOUT,
    TLS_NOT_REQUIRED,
    TlsError,
    TlsLayer,
    tls_required,
)
from tether.storage.base import MessageMeta, StoredMessage

log = logging.getLogger("tether.nsq")

MS = 1_000_000
_INIT, _SUBSCRIBED, _CLOSING = 0, 1, 2


class NsqError(Exception):
    """An error frame: ``code`` and text; all but three codes are fatal."""

    def __init__(self, code: bytes, text: bytes) -> None:
        super().__init__(code, text)
        self.data = code + b" " + text if text else code
        self.fatal = code not in errors.NON_FATAL


def _invalid(text: str) -> NsqError:
    return NsqError(errors.E_INVALID, text.encode())


def _digits(raw: bytes) -> int | None:
    return int(raw) if raw.isdigit() and raw.isascii() else None


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it."""

    config: ServerConfig
    service: NsqService
    broker: Broker
    limits: identify.ServerLimits
    parser_limits: Limits
    slow_consumers: int
    tls_context: ssl.SSLContext | None  # offered to clients asking tls_v1

    def admit(self, conn: NsqConnection) -> bool: ...
    def remove(self, conn: NsqConnection) -> None: ...


class NsqConnection(asyncio.Protocol):
    """asyncio protocol for one NSQ client."""

    def __init__(self, server: ConnectionHost, cid: int) -> None:
        self.server = server
        self.cid = cid
        self.service = server.service
        self.broker = server.broker
        self.parser = Parser(server.parser_limits)
        self.settings = identify.ClientSettings.defaults(server.limits)
        self.transport: asyncio.Transport | None = None
        self.remote = ("", 0)
        self.connected_at = time.time()
        self.last_read = time.monotonic()
        self.state = _INIT
        self.closing = False
        self.authed = not server.limits.auth_required
        self.channel: Channel | None = None
        self.member: Member | None = None
        self.pub_counts: dict[str, int] = {}
        self._loop = asyncio.get_running_loop()
        self._codec: Codec | None = None
        self._tls: TlsLayer | None = None
        # nsq_tls_required (or a client auth policy, as in nsqd): every command but
        # IDENTIFY is refused until TLS is up.
        required = tls_required(server.config) != TLS_NOT_REQUIRED
        self._plain_refused = required and server.tls_context is not None
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_handle: asyncio.Handle | None = None
        self._max_pending = server.config.max_pending
        # Responses in command order: slot number → frame (None until it is known).
        self._slots: dict[int, bytes | None] = {}
        self._next_slot = 0
        self._head = 0
        self._fatal_slot = -1  # the slot whose frame ends the connection
        self._mpub_slots: set[int] = set()
        self._dpub_slots: set[int] = set()
        # Commands held while one waits (SUB, a PUB creating its topic).
        self._held: deque[Parsed] = deque()
        self._waiting = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._streams: dict[bytes, tuple[Stream, str, str]] = {}
        self._cached = self.broker.store.cached

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote = (str(peer[0]), int(peer[1]))
        self.settings.client_id = self.settings.hostname = self.remote[0]
        log.debug("nsq client %d: connected from %s:%d", self.cid, *self.remote)
        if not self.server.admit(self):
            self.transport.abort()
            return
        self._arm_timers()

    def data_received(self, data: bytes) -> None:
        if self.closing or self._fatal_slot >= 0:
            return
        self.last_read = time.monotonic()
        if self._tls is not None or self._codec is not None:
            plain = self._unwrap(data)
            if not plain:
                return
            data = plain
        try:
            parsed = self.parser.feed(data)
            if self._waiting:
                self._held.extend(parsed)
            else:
                self._run(parsed)
        except Exception:
            log.exception("nsq client %d: internal error while handling input", self.cid)
            self._fail(NsqError(errors.E_INVALID, b"internal error"))

    def _unwrap(self, data: bytes) -> bytes:
        """Bytes read → protocol bytes: out of TLS, then decompressed (b"" on failure)."""
        if self._tls is not None:
            try:
                data, reply = self._tls.receive(data)
            except TlsError as exc:
                log.info("nsq client %d: TLS error: %s", self.cid, exc)
                alert = self._tls.unsent()  # the peer learns why, as from nsqd
                if alert and self.transport is not None:
                    self.transport.write(alert)
                self._close()
                return b""
            if reply and self.transport is not None:
                self.transport.write(reply)
            if self._tls.closed:
                self._close()
                return b""
            if self._tls.established and self._out and self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush)
        if self._codec is not None and data:
            try:
                data = self._codec.decompress(data)
            except CompressionError as exc:
                log.debug("nsq client %d: %s", self.cid, exc)
                self._abort()
                return b""
        return data

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        log.debug("nsq client %d: disconnected%s", self.cid, f" ({exc})" if exc else "")
        for timer in (self._heartbeat, self._deadline, self._flush_handle):
            if timer is not None:
                timer.cancel()
        self._flush_handle = None
        for task in self._tasks:
            task.cancel()
        if self.channel is not None and self.member is not None:
            self.service.unsubscribe(self.channel, self.member)
        self.channel = None
        self._out.clear()
        self._held.clear()
        self.server.remove(self)

    # -- running commands -------------------------------------------------------------------------
    def _run(self, parsed: list[Parsed]) -> None:
        """Execute commands in order until one has to wait (the rest are held)."""
        i = 0
        n = len(parsed)
        while i < n:
            cmd = parsed[i]
            i += 1
            try:
                kind = type(cmd)
                if self._plain_refused:
                    self._refuse_plain(cmd)
                if kind is PubRun:
                    self.PUB(cast(PubRun, cmd))
                elif kind is FinRun:
                    self.FIN(cast(FinRun, cmd).ids)
                elif kind is Command:
                    command = cast(Command, cmd)
                    handler = self._verbs.get(command.verb)
                    if handler is None:  # the parser lets only known verbs through
                        raise _invalid(f"invalid command {command.verb.decode(errors='replace')}")
                    handler(self, command)
                elif kind is MPub:
                    self.MPUB(cast(MPub, cmd))
                elif kind is DPub:
                    self.DPUB(cast(DPub, cmd))
                else:
                    failure = cast(Failure, cmd)
                    if failure.code:
                        self._fail(NsqError(failure.code, failure.text))
                    else:
                        self._close()
                    return
            except NsqError as exc:
                if exc.fatal:
                    self._fail(exc)
                    return
                self._respond(error(exc.data))
            if self.closing:
                return
            if self._waiting:
                self._held.extend(parsed[i:])
                return

    def _refuse_plain(self, cmd: Parsed) -> None:
        """nsqd's TLS policy: only IDENTIFY before the upgrade."""
        if isinstance(cmd, Command):
            if cmd.verb == b"IDENTIFY":
                return
            verb = cmd.verb.decode(errors="replace")
        elif isinstance(cmd, Failure):
            return
        else:
            verb = {PubRun: "PUB", FinRun: "FIN", MPub: "MPUB", DPub: "DPUB"}[type(cmd)]
        raise _invalid(f"cannot {verb} in current state (TLS required)")

    def _wait_for(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` before any later command."""
        self._waiting = True
        task = asyncio.ensure_future(self._then_resume(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _then_resume(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except NsqError as exc:
            self._waiting = False
            self._held.clear()
            if exc.fatal:
                self._fail(exc)
                return
            self._respond(error(exc.data))
        except Exception:
            log.exception("nsq client %d: internal error", self.cid)
            self._fail(NsqError(errors.E_INVALID, b"internal error"))
            return
        self._waiting = False
        if self._held and not self.closing and self._fatal_slot < 0:
            held = list(self._held)
            self._held.clear()
            self._run(held)

    # -- responses, in command order -------------------------------------------------------------------
    def _slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        self._slots[slot] = None
        return slot

    def _respond(self, frame: bytes) -> None:
        if self._head == self._next_slot:  # nothing waits ahead of it
            self._head += 1
            self._next_slot += 1
            self.write(frame)
            return
        self._fill(self._slot(), frame)

    def _fill(self, slot: int, frame: bytes) -> None:
        if slot not in self._slots:
            return
        self._slots[slot] = frame
        if slot == self._head:
            self._drain()

    def _drain(self) -> None:
        slots = self._slots
        head = self._head
        while head in slots:
            frame = slots[head]
            if frame is None:
                break
            del slots[head]
            self.write(frame)
            if head == self._fatal_slot:
                self._head = head + 1
                self._close()
                return
            head += 1
        self._head = head

    def _fail(self, exc: NsqError) -> None:
        """A fatal error: its frame goes out after the responses before it, then we close."""
        if self._fatal_slot >= 0 or self.closing:
            return
        log.debug("nsq client %d: %s", self.cid, exc.data.decode(errors="replace"))
        self._held.clear()
        slot = self._slot()
        self._fatal_slot = slot
        self._fill(slot, error(exc.data))

    # -- output --------------------------------------------------------------------------------------------
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
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if self._codec is not None:
            data = self._codec.compress(data)
        if self._tls is not None:
            try:
                data = self._tls.send(data)
            except TlsError as exc:
                log.info("nsq client %d: TLS error: %s", self.cid, exc)
                self._abort()
                return
            if not data:
                return
        transport.write(data)
        if transport.get_write_buffer_size() > self._max_pending:
            self._slow_consumer()

    def _slow_consumer(self) -> None:
        log.warning(
            "nsq client %d is a slow consumer (more than %d bytes pending); closing",
            self.cid,
            self._max_pending,
        )
        self.server.slow_consumers += 1
        self._abort()

    def _abort(self) -> None:
        self.closing = True
        self._out.clear()
        self._out_size = 0
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()
        self.closing = True
        if self._tls is not None:
            with contextlib.suppress(TlsError):
                transport.write(self._tls.close())
        transport.close()
        if transport.get_write_buffer_size():
            self._loop.call_later(self.server.config.write_deadline, transport.abort)

    def flush_now(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()

    # -- heartbeats and the read deadline --------------------------------------------------------------
    def _arm_timers(self) -> None:
        for timer in (self._heartbeat, self._deadline):
            if timer is not None:
                timer.cancel()
        self._heartbeat = self._deadline = None
        interval = self.settings.heartbeat_interval_ms / 1000
        if interval > 0:
            self._heartbeat = self._loop.call_later(interval, self._beat)
            self._deadline = self._loop.call_later(2 * interval, self._check_deadline)

    def _beat(self) -> None:
        if self.closing:
            return
        self.write(HEARTBEAT)
        self._heartbeat = self._loop.call_later(
            self.settings.heartbeat_interval_ms / 1000, self._beat
        )

    def _check_deadline(self) -> None:
        if self.closing:
            return
        window = 2 * self.settings.heartbeat_interval_ms / 1000
        idle = time.monotonic() - self.last_read
        if idle >= window:
            log.info("nsq client %d: nothing read for %.1fs; closing", self.cid, idle)
            self._close()
            return
        self._deadline = self._loop.call_later(window - idle, self._check_deadline)

    # -- message delivery (the channel's MessageSink) --------------------------------------------------
    def send_messages(
        self, metas: list[MessageMeta], ids: list[bytes], attempts: list[int]
    ) -> None:
        if self.closing or self.channel is None:
            return
        stream = self.channel.consumer.stream.name
        cached = self._cached
        out = self._out
        size = self._out_size
        missing: list[tuple[MessageMeta, bytes, int]] = []
        for meta, msg_id, n in zip(metas, ids, attempts, strict=True):
            msg = cached(stream, meta.seq)
            if msg is None:
                missing.append((meta, msg_id, n))
                continue
            body = msg.data
            out.append(message_head(len(body), msg.ts, n))
            out.append(msg_id)
            out.append(body)
            size += len(body) + 34
        self._out_size = size
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if size > self._max_pending:
            self._slow_consumer()
            return
        if missing:
            task = asyncio.ensure_future(self._send_read(self.channel.consumer.stream, missing))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_read(
        self, stream: Stream, missing: list[tuple[MessageMeta, bytes, int]]
    ) -> None:
        """Messages not in the store's cache: read, then sent (a message deleted since
        times out unanswered, and the consumer forgets it)."""
        found: dict[int, StoredMessage] = {}
        for i in range(0, len(missing), 1000):
            seqs = [m.seq for m, _, _ in missing[i : i + 1000]]
            for msg in await self.broker.read_many(stream, seqs):
                found[msg.seq] = msg
        for meta, msg_id, n in missing:
            stored = found.get(meta.seq)
            if stored is not None:
                self.write(message_head(len(stored.data), stored.ts, n) + msg_id + stored.data)

    def channel_gone(self) -> None:
        """The channel or its topic was deleted: nsqd closes its clients too."""
        self.channel = None
        self.member = None
        self._close()

    # -- the commands ----------------------------------------------------------------------------------------
    def IDENTIFY(self, cmd: Command) -> None:
        if self.state != _INIT:
            raise _invalid("cannot IDENTIFY in current state")
        try:
            data = identify.decode(cmd.body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise NsqError(errors.E_BAD_BODY, b"IDENTIFY failed to decode JSON body") from None
        limits = self.server.limits
        try:
            identify.apply(self.settings, data, limits)
        except identify.IdentifyError as exc:
            raise NsqError(errors.E_BAD_BODY, f"IDENTIFY {exc}".encode()) from None
        self._arm_timers()
        if not data.feature_negotiation:
            self._respond(OK)
            self._resume_parsing()
            return
        if self._codec is not None:  # already compressed: nothing more to switch on
            data.deflate = data.snappy = False
        context = self.server.tls_context
        tls = data.tls_v1 and context is not None and self._tls is None
        try:
            answer, codec = identify.negotiate(self.settings, data, limits, tls=tls)
        except identify.NegotiationError as exc:
            raise NsqError(errors.E_IDENTIFY_FAILED, str(exc).encode()) from None
        self._respond(response(answer))
        if not codec and not tls:
            self._resume_parsing()
            return
        # The answer goes out as is. Then, as nsqd: TLS, with an OK as its first frame;
        # compression (inside TLS when both), with an OK as its first frame.
        self.flush_now()
        if tls and context is not None:
            self._start_tls(context)
            self._respond(OK)
            self.flush_now()  # this OK is not compressed
        if codec:
            new: Codec = Deflate(self.settings.deflate_level) if codec == "deflate" else Snappy()
            self._codec = new
            self._respond(OK)
        self._resume_parsing()

    def _start_tls(self, context: ssl.SSLContext) -> None:
        self._tls = TlsLayer(context)
        self._plain_refused = False
        self._loop.call_later(HANDSHAKE_TIMEOUT, self._check_handshake)

    def _check_handshake(self) -> None:
        if self._tls is not None and not self._tls.established and not self.closing:
            log.info("nsq client %d: TLS handshake timed out", self.cid)
            self._abort()

    def _resume_parsing(self) -> None:
        """Parse what followed the IDENTIFY in the same read (the parser stops there)."""
        rest = self.parser.rest()
        if not rest:
            return
        if self._tls is not None or self._codec is not None:
            rest = self._unwrap(rest)
            if not rest:
                return
        parsed = self.parser.feed(rest)
        if self._waiting:
            self._held.extend(parsed)
        else:
            self._run(parsed)  # IDENTIFY was the last command of the current run

    def AUTH(self, cmd: Command) -> None:
        if self.state != _INIT:
            raise _invalid("cannot AUTH in current state")
        if not self.server.limits.auth_required:
            raise NsqError(errors.E_AUTH_DISABLED, b"AUTH disabled")
        if self.authed:
            raise _invalid("AUTH already set")
        identity = self._check_secret(cmd.body)
        if identity is None:
            raise NsqError(errors.E_AUTH_FAILED, b"AUTH failed")
        self.authed = True
        answer = {"identity": identity, "identity_url": "", "permission_count": 1}
        self._respond(response(msgspec.json.encode(answer)))

    def _check_secret(self, secret: bytes) -> str | None:
        """The server's token, or ``user:password``: the identity it proves, or None."""
        cfg = self.server.config
        if cfg.auth_token and hmac.compare_digest(secret, cfg.auth_token.encode()):
            return "token"
        if cfg.user:
            expected = f"{cfg.user}:{cfg.password or ''}".encode()
            if hmac.compare_digest(secret, expected):
                return cfg.user
        return None

    def _check_auth(self, verb: str) -> None:
        if not self.authed:
            raise NsqError(errors.E_AUTH_FIRST, f"AUTH required before {verb}".encode())

    def SUB(self, cmd: Command) -> None:
        if self.state != _INIT:
            raise _invalid("cannot SUB in current state")
        if self.settings.heartbeat_interval_ms <= 0:
            raise _invalid("cannot SUB with heartbeats disabled")
        params = cmd.params
        if len(params) < 2:
            raise _invalid("SUB insufficient number of parameters")
        topic, channel = params[0], params[1]
        if not is_valid_name(topic):
            raise NsqError(errors.E_BAD_TOPIC, b"SUB topic name %s is not valid" % go_quote(topic))
        if not is_valid_name(channel):
            raise NsqError(
                errors.E_BAD_CHANNEL, b"SUB channel name %s is not valid" % go_quote(channel)
            )
        self._check_auth("SUB")
        self.state = _SUBSCRIBED  # no second SUB, even while this one waits
        slot = self._slot()
        self._wait_for(self._subscribe(slot, topic.decode(), channel.decode()))

    async def _subscribe(self, slot: int, topic: str, channel: str) -> None:
        try:
            self.channel, self.member = await self.service.subscribe(
                topic, channel, self, self.settings.msg_timeout_ms * MS, self.settings.sample_rate
            )
        except api_errors.ApiError as exc:
            failed = NsqError(errors.E_SUB_FAILED, f"SUB failed {exc.description}".encode())
            self._fail_slot(slot, failed)
            return
        if self.closing:
            self.service.unsubscribe(self.channel, self.member)
            return
        self._fill(slot, OK)

    def RDY(self, cmd: Command) -> None:
        if self.state == _CLOSING:
            return  # nsqd ignores RDY after CLS
        if self.state != _SUBSCRIBED or self.member is None or self.channel is None:
            raise _invalid("cannot RDY in current state")
        count = 1
        if cmd.params:
            parsed = _digits(cmd.params[0])
            if parsed is None:
                raise _invalid(
                    f"RDY could not parse count {cmd.params[0].decode(errors='replace')}"
                )
            count = parsed
        max_rdy = self.server.limits.max_rdy_count
        if count > max_rdy:
            raise _invalid(f"RDY count {count} out of range 0-{max_rdy}")
        self.channel.ready(self.member, count)

    def _subscribed(self, verb: str) -> tuple[Channel, Member]:
        if self.state == _INIT or self.channel is None or self.member is None:
            raise _invalid(f"cannot {verb} in current state")
        return self.channel, self.member

    def FIN(self, ids: list[bytes]) -> None:
        channel, member = self._subscribed("FIN")
        for msg_id, why in channel.finish(member, ids):
            self._respond(error(b"E_FIN_FAILED FIN %s failed %s" % (msg_id, why)))

    def _FIN_line(self, cmd: Command) -> None:
        """A FIN the parser did not put in a run: a missing or malformed id."""
        self._subscribed("FIN")
        if not cmd.params:
            raise _invalid("FIN insufficient number of params")
        if len(cmd.params[0]) != MSG_ID_LENGTH:
            raise _invalid("invalid message ID")
        self.FIN([cmd.params[0]])

    def REQ(self, cmd: Command) -> None:
        channel, member = self._subscribed("REQ")
        if len(cmd.params) < 2:
            raise _invalid("REQ insufficient number of params")
        msg_id = cmd.params[0]
        if len(msg_id) != MSG_ID_LENGTH:
            raise _invalid("invalid message ID")
        ms = _digits(cmd.params[1])
        if ms is None:
            raise _invalid(f"REQ could not parse timeout {cmd.params[1].decode(errors='replace')}")
        ms = min(ms, self.server.parser_limits.max_req_timeout_ms)  # clamped, as nsqd does
        why = channel.requeue(member, msg_id, ms * MS)
        if why is not None:
            raise NsqError(errors.E_REQ_FAILED, b"REQ %s failed %s" % (msg_id, why))

    def TOUCH(self, cmd: Command) -> None:
        channel, member = self._subscribed("TOUCH")
        if not cmd.params:
            raise _invalid("TOUCH insufficient number of params")
        msg_id = cmd.params[0]
        if len(msg_id) != MSG_ID_LENGTH:
            raise _invalid("invalid message ID")
        why = channel.touch(member, msg_id)
        if why is not None:
            raise NsqError(errors.E_TOUCH_FAILED, b"TOUCH %s failed %s" % (msg_id, why))

    def CLS(self, cmd: Command) -> None:
        if self.state != _SUBSCRIBED or self.channel is None or self.member is None:
            raise _invalid("cannot CLS in current state")
        self.channel.close(self.member)
        self.state = _CLOSING
        self._respond(CLOSE_WAIT)

    def NOP(self, cmd: Command) -> None:
        pass

    # -- publishing ---------------------------------------------------------------------------------------
    def _topic(self, topic: bytes) -> tuple[Stream, str, str] | None:
        """(stream, subject, topic name) of an existing topic, remembered per connection."""
        known = self._streams.get(topic)
        if known is not None and known[0] is self.broker.streams.get(known[0].name):
            return known
        name = topic.decode()
        stream = self.service.stream_of(name)
        if stream is None:
            return None
        known = self._streams[topic] = (stream, topic_subject(name), name)
        return known

    def PUB(self, run: PubRun) -> None:
        self._check_auth("PUB")
        target = self._topic(run.topic)
        first = self._next_slot
        n = len(run.bodies)
        for _ in range(n):
            self._slots[self._next_slot] = None
            self._next_slot += 1
        replies = [str(slot) for slot in range(first, first + n)]
        if target is None:
            self._wait_for(self._create_then_publish(run.topic, run.bodies, replies))
            return
        self._publish(target, run.bodies, replies)

    def MPUB(self, cmd: MPub) -> None:
        self._check_auth("MPUB")
        target = self._topic(cmd.topic)
        slot = self._slot()
        self._mpub_slots.add(slot)
        replies = [""] * (len(cmd.bodies) - 1) + [str(slot)]
        if target is None:
            self._wait_for(self._create_then_publish(cmd.topic, cmd.bodies, replies))
            return
        self._publish(target, cmd.bodies, replies)

    def DPUB(self, cmd: DPub) -> None:
        self._check_auth("DPUB")
        slot = self._slot()
        self._dpub_slots.add(slot)
        if cmd.defer_ms == 0:
            target = self._topic(cmd.topic)
            if target is None:
                self._wait_for(self._create_then_publish(cmd.topic, [cmd.body], [str(slot)]))
                return
            self._publish(target, [cmd.body], [str(slot)])
            return
        task = asyncio.ensure_future(self._defer(slot, cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _defer(self, slot: int, cmd: DPub) -> None:
        try:
            await self.service.defer(cmd.topic.decode(), cmd.body, cmd.defer_ms * MS)
        except Exception as exc:
            self._dpub_slots.discard(slot)
            self._fail_slot(slot, NsqError(errors.E_DPUB_FAILED, f"DPUB failed {exc}".encode()))
            return
        self._dpub_slots.discard(slot)
        self._count(cmd.topic.decode(), 1)
        self._fill(slot, OK)

    async def _create_then_publish(
        self, topic: bytes, bodies: list[bytes], replies: list[str]
    ) -> None:
        try:
            await self.service.topic_stream(topic.decode())
        except api_errors.ApiError as exc:
            self.pub_failed("", replies, exc)
            return
        target = self._topic(topic)
        if target is not None:
            self._publish(target, bodies, replies)

    def _publish(
        self, target: tuple[Stream, str, str], bodies: list[bytes], replies: list[str]
    ) -> None:
        stream, subject, name = target
        self._count(name, len(bodies))
        self.broker.publish_many(stream, subject, bodies, replies, self)

    def _count(self, topic: str, n: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n

    # PubAckSink: the broker's answers once the commit holding the messages is durable.
    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        slots = self._slots
        for reply in replies:
            if reply:
                slot = int(reply)
                if slot in slots:
                    slots[slot] = OK
                    self._mpub_slots.discard(slot)
                    self._dpub_slots.discard(slot)
        if self._head in slots and slots[self._head] is not None:
            self._drain()

    def pub_failed(self, stream: str, replies: list[str], error_: api_errors.ApiError) -> None:
        for reply in replies:
            if not reply:
                continue
            slot = int(reply)
            if slot in self._mpub_slots:
                code, verb = errors.E_MPUB_FAILED, "MPUB"
            elif slot in self._dpub_slots:
                code, verb = errors.E_DPUB_FAILED, "DPUB"
            else:
                code, verb = errors.E_PUB_FAILED, "PUB"
            self._fail_slot(slot, NsqError(code, f"{verb} failed {error_.description}".encode()))

    def _fail_slot(self, slot: int, exc: NsqError) -> None:
        """A waiting response turned into a fatal error."""
        if slot not in self._slots or self.closing:
            return
        if self._fatal_slot < 0 or slot < self._fatal_slot:
            self._fatal_slot = slot
        self._held.clear()
        self._fill(slot, error(exc.data))

    _verbs: ClassVar[dict[bytes, Any]] = {
        b"IDENTIFY": IDENTIFY,
        b"AUTH": AUTH,
        b"SUB": SUB,
        b"RDY": RDY,
        b"FIN": _FIN_line,
        b"REQ": REQ,
        b"TOUCH": TOUCH,
        b"CLS": CLS,
        b"NOP": NOP,
    }
