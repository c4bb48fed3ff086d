"""JetStream consumers over NATS: ``CONSUMER.*`` API, pulls, acks, push delivery.

* ``$JS.API.CONSUMER.{CREATE,DURABLE.CREATE,INFO,DELETE,LIST,NAMES,PAUSE}`` are
  registered in :class:`JetStreamApi`'s route table.
* ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``, ``$JS.ACK.>`` and ``$JS.FC.>`` are
  internal subscriptions handled synchronously (no task per request): they are the
  hot path.
* This module is the consumers' :class:`DeliverySink`: it writes each delivered message
  as ``MSG``/``HMSG`` on the message's stored subject, routed to the pull request's
  reply inbox or the push deliver subject. Bodies come from the store's cache; on a
  miss they are read asynchronously and everything later for that consumer (messages,
  statuses, heartbeats) waits behind them, so a client always sees them in order.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import string
from collections import deque
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from tether.engine import errors
from tether.engine.consumers import Consumer, ConsumerRegistry
from tether.engine.consumers.ack_subject import parse_ack_subject
from tether.engine.consumers.config import (
    GROUP_NAME,
    ConsumerConfig,
    decode_request,
    durable_mismatch,
    durable_not_set,
    ephemeral_with_durable,
    filter_mismatch,
    invalid_group_name,
    path_separators,
)
from tether.engine.jobs.service import channel_id
from tether.engine.jobs.view import owned_by_http
from tether.engine.subjects import is_literal, subject_matches
from tether.protocol.nats.commands import encode
from tether.server.nats import requests
from tether.server.nats.jetstream import (
    ZERO_TIME,
    JetStreamApi,
    NoReply,
    parse_rfc3339,
    rfc3339,
)
from tether.server.nats.requests import ConsumersRequest, PauseRequest
from tether.server.nats.router import Router
from tether.server.nats.subscriptions import Client, ClientSubscription, InternalSubscription
from tether.storage.base import CorruptMessage, MessageMeta, StorageError, StoredMessage

if TYPE_CHECKING:
    from tether.server.nats.server import NatsServer

log = logging.getLogger("tether.consumers")

NAMES_LIMIT = 1024
LIST_LIMIT = 256
_READ_CHUNK = 256
_ID_CHARS = string.ascii_letters + string.digits
_encode_json = msgspec.json.Encoder().encode
_NXT = b"+NXT"
_NAK = b"-NAK"
_TERM = b"+TERM"
_GO_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9}
_GO_UNITS["h"] = 3600 * 10**9


class _NakDelay(msgspec.Struct):
    delay: int = 0


# Go's json.Unmarshal reads these two: unknown fields are ignored.
class _ResetRequest(msgspec.Struct):
    seq: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)] = 0


class _UnpinRequest(msgspec.Struct):
    group: str = ""


_decode_nak = msgspec.json.Decoder(_NakDelay).decode


def parse_go_duration(text: str) -> int:
    """Go's ``time.ParseDuration`` for the forms clients send (``1.5s``, ``1m30s``, ``250ms``)."""
    total = 0.0
    i = 0
    n = len(text)
    if n == 0:
        raise ValueError("empty duration")
    while i < n:
        j = i
        while j < n and (text[j].isdigit() or text[j] == "."):
            j += 1
        if j == i:
            raise ValueError(text)
        number = float(text[i:j])
        k = j
        while k < n and not (text[k].isdigit() or text[k] == "."):
            k += 1
        unit = text[j:k]
        if unit not in _GO_UNITS:
            raise ValueError(text)
        total += number * _GO_UNITS[unit]
        i = k
    return int(total)


_EARLY_FRAMES = 64


class _Outbox:
    """What waits behind a slow read, per consumer: (to, meta, reply, block), where
    ``block`` is a status block, or the extra header lines of a message (a pin id)."""

    __slots__ = ("items", "task")

    def __init__(self) -> None:
        self.items: deque[tuple[str, MessageMeta | None, str, bytes | None]] = deque()
        self.task: asyncio.Task[None] | None = None


class ConsumerApi:
    """The NATS face of the consumer registry."""

    def __init__(
        self, api: JetStreamApi, registry: ConsumerRegistry, server: NatsServer | None = None
    ) -> None:
        self.api = api
        self.router = api.router
        self.broker = api.broker
        self.registry = registry
        self.server = server
        registry.sink = self
        self._subs: list[InternalSubscription] = []
        self._outboxes: dict[int, _Outbox] = {}
        self._subject_bytes: dict[str, bytes] = {}
        # Bound once: these are called for every delivered message and every ack.
        self._match = self.router.index.match
        self._cached = self.broker.store.cached
        self._streams = registry.streams
        self._register_routes()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        sub = self.router.subscribe_internal
        self._subs = [
            sub("$JS.API.CONSUMER.MSG.NEXT.*.*", self._on_next),
            sub("$JS.ACK.>", self._on_ack, batch_handler=self._on_acks),
            sub("$JS.FC.>", self._on_flow_control),
        ]
        if self.server is not None:
            self.server.watch_interest(self._on_interest)

    async def stop(self) -> None:
        for sub in self._subs:
            self.router.unsubscribe_internal(sub)
        self._subs = []
        tasks = [o.task for o in self._outboxes.values() if o.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._outboxes.clear()

    def _register_routes(self) -> None:
        route = self.api.route
        paged = {"total": 0, "offset": 0, "limit": 0}
        route(("CONSUMER", "CREATE"), "consumer_create_response", self._create)
        route(("CONSUMER", "DURABLE", "CREATE"), "consumer_create_response", self._create_durable)
        route(("CONSUMER", "INFO"), "consumer_info_response", self._info)
        route(("CONSUMER", "DELETE"), "consumer_delete_response", self._delete)
        route(("CONSUMER", "NAMES"), "consumer_names_response", self._names, paged)
        route(("CONSUMER", "LIST"), "consumer_list_response", self._list, paged)
        route(
            ("CONSUMER", "PAUSE"),
            "consumer_pause_response",
            self._pause,
            {"paused": False, "pause_until": ZERO_TIME},
        )
        route(("CONSUMER", "UNPIN"), "consumer_unpin_response", self._unpin)
        route(("CONSUMER", "RESET"), "consumer_reset_response", self._reset, {"reset_seq": 0})

    # -- API handlers ----------------------------------------------------------------------------------
    async def _create(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        if not args or not args[0]:
            raise NoReply
        stream = args[0]
        req = decode_request(requests.checked_body(p) or b"{}")
        config = req.config
        filtered = ""
        if len(args) == 1:
            name = config.name
        else:
            name = args[1]
            filtered = ".".join(args[2:])
        if stream != req.stream_name:
            raise errors.stream_name_mismatch()
        if "\\" in name or "/" in name:
            raise path_separators()
        if not requests.is_utf8(name):
            raise errors.bad_request("consumer name is not valid UTF-8")
        if len(args) == 1:
            if config.durable_name:
                raise ephemeral_with_durable()
        else:
            if config.durable_name and config.durable_name != name:
                raise durable_mismatch()
            config.name = name
        if filtered and config.filter_subjects:
            raise errors.ApiError(
                400, 10137, "consumer with multiple subject filters cannot use subject based API"
            )
        if filtered and config.filter_subject != filtered:
            raise filter_mismatch()
        return await self._do_create(stream, config, req.action, req.pedantic)

    async def _create_durable(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        if len(args) != 2:
            raise errors.ApiError(
                400, 10016, "consumer expected to be durable but no durable name set in subject"
            )
        stream, name = args
        req = decode_request(requests.checked_body(p) or b"{}")
        if stream != req.stream_name:
            raise errors.stream_name_mismatch()
        if "\\" in name or "/" in name:
            raise path_separators()
        if not requests.is_utf8(name):
            raise errors.bad_request("consumer name is not valid UTF-8")
        config = req.config
        if not config.durable_name:
            raise durable_not_set()
        if config.durable_name != name:
            raise durable_mismatch()
        config.name = name
        return await self._do_create(stream, config, req.action, req.pedantic)

    async def _do_create(
        self, stream: str, config: ConsumerConfig, action: str, pedantic: bool = False
    ) -> Any:
        if config.num_replicas > 1:
            raise errors.ApiError(500, 10074, "replicas > 1 not supported in non-clustered mode")
        consumer, created = await self.registry.create(
            stream, config, action, activate=False, pedantic=pedantic
        )
        info = self.info(consumer)
        if created and not consumer.is_pull:
            # Deliveries start after the reply has gone out, as on nats-server.
            self.broker.clock.call_later(0, lambda: self.registry.activate(consumer))
        return info

    @staticmethod
    def _two_names(args: list[str]) -> tuple[str, str]:
        if len(args) != 2 or not args[0] or not args[1]:
            raise NoReply
        return args[0], args[1]

    async def _info(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream, name = self._two_names(args)
        requests.require_empty(p)
        return self.info(self.registry.get(stream, name))

    async def _delete(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream, name = self._two_names(args)
        requests.require_empty(p)
        consumer = self.registry.get(stream, name)
        if owned_by_http(consumer.config):
            # The HTTP consumer (token, callback, jobs) would be left without its engine.
            raise errors.managed_by_http(
                f"consumer {name!r}",
                f"DELETE /channel/{channel_id(stream)}/consumer/{name} on the HTTP API",
            )
        await self.registry.delete(stream, name)
        return {"success": True}

    def _page(self, args: list[str], p: bytes) -> tuple[list[Consumer], int]:
        if len(args) != 1 or not args[0]:
            raise NoReply
        offset = requests.decode_request(p, ConsumersRequest).offset
        # ``direct`` consumers (a mirror's or source's) are left out, as nats-server does.
        consumers = [c for c in self.registry.consumers_of(args[0]) if not c.config.direct]
        return consumers, max(0, min(offset, len(consumers)))

    async def _names(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        consumers, offset = self._page(args, p)
        page = [c.name for c in consumers[offset : offset + NAMES_LIMIT]]
        return {
            "total": len(consumers),
            "offset": offset,
            "limit": NAMES_LIMIT,
            "consumers": page,
        }

    async def _list(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        consumers, offset = self._page(args, p)
        page = [self.info(c, typed=False) for c in consumers[offset : offset + LIST_LIMIT]]
        return {
            "total": len(consumers),
            "offset": offset,
            "limit": LIST_LIMIT,
            "consumers": page,
        }

    async def _pause(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream, name = self._two_names(args)
        raw = requests.decode_request(p, PauseRequest).pause_until
        try:
            until = parse_rfc3339(raw) if raw else 0
        except (ValueError, OverflowError):
            raise errors.invalid_json(f"parsing time {raw!r}") from None
        # Any time but Go's zero time (year 1, which parses to 0 too) stays in the config as
        # on nats-server, the epoch included: nats.js resumes a consumer with it.
        kept = until > 0 or (until == 0 and raw.strip()[:4] not in ("", "0000", "0001"))
        until = max(until, 0)
        consumer = await self.registry.pause(stream, name, until if kept else None)
        now = self.broker.clock.now()
        out: dict[str, Any] = {
            "paused": until > now,
            "pause_until": consumer.config.pause_until or ZERO_TIME,
        }
        if until > now:
            out["pause_remaining"] = until - now
        return out

    async def _unpin(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream, name = self._two_names(args)
        if not p.strip():
            raise errors.invalid_json("unexpected end of JSON input")
        group = requests.decode_required(p, _UnpinRequest).group
        if not group:
            raise errors.invalid_json("consumer group not specified")
        if not GROUP_NAME.fullmatch(group):
            raise invalid_group_name()
        consumer = self.registry.get(stream, name)
        if group not in consumer.config.priority_groups:
            raise errors.ApiError(
                400, 10160, "Provided priority group does not exist for this consumer"
            )
        consumer.unpin(group)
        return {}

    async def _reset(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream, name = self._two_names(args)
        # nats-server serves RESET from each consumer's own subscription: nobody
        # answers for a consumer (or stream) that does not exist.
        consumer = self.registry.find(stream, name)
        if consumer is None or not reply:
            raise NoReply
        seq = requests.decode_required(p, _ResetRequest).seq if p.strip() else 0
        seq = await self.registry.reset(consumer, seq)
        return {**self.info(consumer, typed=False), "reset_seq": seq}

    def info(self, consumer: Consumer, typed: bool = True) -> dict[str, Any]:
        """``consumer_info`` as nats-server shapes it."""
        now = self.broker.clock.now()
        dseq, dsseq = consumer.delivered
        fseq, fsseq = consumer.ack_floor
        delivered: dict[str, Any] = {"consumer_seq": dseq, "stream_seq": dsseq}
        if consumer.last_delivered_ns:
            delivered["last_active"] = rfc3339(consumer.last_delivered_ns)
        floor: dict[str, Any] = {"consumer_seq": fseq, "stream_seq": fsseq}
        if consumer.last_ack_ns:
            floor["last_active"] = rfc3339(consumer.last_ack_ns)
        out: dict[str, Any] = {
            "stream_name": consumer.stream.name,
            "name": consumer.name,
            "created": rfc3339(consumer.created_ns),
            "config": consumer.config.to_dict(),
            "delivered": delivered,
            "ack_floor": floor,
            "num_ack_pending": consumer.num_ack_pending,
            "num_redelivered": consumer.num_redelivered,
            "num_waiting": consumer.count_waiting() if consumer.is_pull else 0,
            "num_pending": consumer.num_pending,
        }
        if not consumer.is_pull and self.has_interest(consumer.config.deliver_subject):
            out["push_bound"] = True
        if consumer.paused:
            out["paused"] = True
            out["pause_remaining"] = consumer.paused_until - now
        state = consumer.priority.state() if consumer.priority is not None else None
        if state is not None:
            group, pin_id, pinned_ns = state
            entry: dict[str, Any] = {"group": group}
            if pin_id:
                entry["pinned_client_id"] = pin_id
            entry["pinned_ts"] = rfc3339(pinned_ns)
            out["priority_groups"] = [entry]
        out["ts"] = rfc3339(now)
        return out

    # -- pulls, acks, flow control ----------------------------------------------------------------------
    def _on_next(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        if not reply:
            return
        tokens = subject.split(".")
        consumer = self.registry.find(tokens[5], tokens[6])
        if consumer is None:
            # nats-server has no subscriber for it: the requester gets no-responders.
            block = b"NATS/1.0 503\r\nNats-Subject: " + encode(subject) + b"\r\n\r\n"
            self.router.publish(None, reply, "", block, b"")
            return
        if headers is not None and consumer.is_pull and requests.api_level_unmet(headers):
            block = b"NATS/1.0 412 Required Api Level\r\n\r\n"
            self.router.publish(None, reply, "", block, b"")
            return
        consumer.pull(reply, payload)

    def _on_ack(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        target = parse_ack_subject(subject)
        if target is None:
            return
        stream, name, seq = target
        consumers = self._streams.get(stream)
        consumer = consumers.get(name) if consumers is not None else None
        if consumer is None:
            if reply:
                block = b"NATS/1.0 503\r\nNats-Subject: " + encode(subject) + b"\r\n\r\n"
                self.router.publish(None, reply, "", block, b"")
            return
        if seq < 0:
            return
        body = payload
        if not body or body == b"+ACK" or body == b"+OK":
            consumer.ack(seq)
        elif body.startswith(_NXT):
            consumer.ack(seq)
            if reply:
                consumer.pull(reply, body[len(_NXT) :])
            return
        elif body.startswith(_NAK):
            consumer.nak(seq, _nak_delay(body[len(_NAK) :].strip()))
        elif body == b"+WPI":
            consumer.progress(seq)
        elif body.startswith(_TERM):
            reason = body[len(_TERM) :].strip().decode("utf-8", "replace")
            consumer.term(seq, reason)
        else:
            return
        if reply:
            # Answered once the consumer's state holding the ack is committed, or with
            # an error status if it cannot be (a full disk): never a success before.
            self.registry.after_save(consumer, _AckReply(self.router, reply))

    def _on_acks(self, subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
        """``_on_ack`` for each of a batch of acks, in order; plain ``+ACK``s without a
        reply (nearly all of them) take the short way."""
        streams = self._streams
        for subject, reply, body in zip(subjects, replies, payloads, strict=True):
            if reply or (body and body != b"+ACK"):
                self._on_ack(subject, reply, None, body)
                continue
            target = parse_ack_subject(subject)
            if target is None:
                continue
            stream, name, seq = target
            consumers = streams.get(stream)
            consumer = consumers.get(name) if consumers is not None else None
            if consumer is not None and seq >= 0:
                consumer.ack(seq)

    def _on_flow_control(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes
    ) -> None:
        tokens = subject.split(".")
        if len(tokens) < 5:
            return
        consumer = self.registry.find(tokens[2], tokens[3])
        if consumer is not None:
            consumer.flow_control_reply(subject, headers)

    def _on_interest(self, subject: str) -> None:
        if is_literal(subject):

            def matches(s: str) -> bool:
                return s == subject

        else:

            def matches(s: str) -> bool:
                return subject_matches(subject, s)

        self.registry.interest_changed(subject, matches)

    # -- DeliverySink ---------------------------------------------------------------------------------------
    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        outbox = self._outboxes.get(id(consumer)) if self._outboxes else None
        extra = consumer.delivery_headers
        if outbox is None:
            msg = self._cached(consumer.stream.name, meta.seq)
            if msg is not None:
                self._send(consumer, to, msg, reply, extra)
                return
            outbox = self._outboxes[id(consumer)] = _Outbox()
        outbox.items.append((to, meta, reply, extra or None))
        if outbox.task is None:
            outbox.task = asyncio.ensure_future(self._drain(consumer, outbox))

    def steady(self, subject: str) -> bool:
        m = self._match(subject)
        if m.groups or len(m.plain) != 1:
            return False
        sub = m.plain[0]
        # A subscription with an UNSUB maximum may end after any message; an internal
        # one may do anything: those are delivered to one message at a time.
        return type(sub) is ClientSubscription and sub.client is not None and not sub.max_msgs

    def deliver_run(
        self, consumer: Consumer, tos: list[str], metas: list[MessageMeta], replies: list[str]
    ) -> None:
        """The frames of a run go into each connection's buffer in one go.

        Every ``to`` is steady (the consumer checked), so each is one client
        subscription that stays put during the run. A message with headers, or one that
        is not in the store's cache, takes the general path (after what came before it).
        """
        if consumer.config.headers_only or (self._outboxes and id(consumer) in self._outboxes):
            for to, meta, reply in zip(tos, metas, replies, strict=True):
                self.deliver(consumer, to, meta, reply)
            return
        cached = self._cached
        name = consumer.stream.name
        subject_bytes = self._subject_bytes
        client: Client | None = None
        sub: ClientSubscription | None = None
        frames: list[bytes] = []
        payload_bytes = 0
        last_to = ""

        def flush() -> None:
            # What was gathered goes out before anything else is written to that client.
            nonlocal payload_bytes
            if frames and client is not None:
                client.send_frames(frames, payload_bytes)
                frames.clear()
                payload_bytes = 0

        for i, meta in enumerate(metas):
            to = tos[i]
            msg = cached(name, meta.seq)
            if msg is None or msg.headers:
                flush()
                if msg is None:
                    # A slow read: from here on everything waits behind it, in order.
                    for j in range(i, len(metas)):
                        self.deliver(consumer, tos[j], metas[j], replies[j])
                    return
                self.deliver(consumer, to, meta, replies[i])
                continue
            if to != last_to:
                last_to = to
                m = self._match(to)
                found = m.plain[0] if len(m.plain) == 1 and not m.groups else None
                sub = None  # not steady after all: the general path
                if type(found) is ClientSubscription and not found.max_msgs:
                    sub = found
                if sub is not None and sub.client is not client:
                    flush()
                    client = sub.client
            if sub is None or client is None:
                flush()
                self.deliver(consumer, to, meta, replies[i])
                continue
            sb = subject_bytes.get(msg.subject)
            if sb is None:
                if len(subject_bytes) > 4096:
                    subject_bytes.clear()
                sb = subject_bytes[msg.subject] = encode(msg.subject)
            data = msg.data
            sub.delivered += 1
            frames.append(
                b"MSG %s %s %s %d\r\n%s\r\n" % (sb, sub.sid_b, replies[i].encode(), len(data), data)
            )
            payload_bytes += len(data)
            if i == _EARLY_FRAMES and len(metas) > 2 * _EARLY_FRAMES:
                # The head of a long run goes to the socket now, once: the client works
                # on it while the rest is built (a fetch of 500 would otherwise wait
                # for the whole run). One extra write per run.
                flush()
                if client is not None:
                    client.flush_now()
        flush()

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        outbox = self._outboxes.get(id(consumer))
        if outbox is not None:
            outbox.items.append((to, None, reply, block))
            return
        self.router.publish(None, to, reply, block, b"")

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        if not self.router.has_interest(subject):
            return
        event = {
            "type": body.pop("type"),
            "id": "".join(secrets.choice(_ID_CHARS) for _ in range(22)),
            "timestamp": rfc3339(self.broker.clock.now()),
            **body,
        }
        self.router.publish(None, subject, "", None, _encode_json(event))

    def has_interest(self, subject: str) -> bool:
        return self.router.has_interest(subject)

    def backlog(self, consumer: Consumer) -> int:
        outbox = self._outboxes.get(id(consumer))
        return len(outbox.items) if outbox is not None else 0

    def _send(
        self, consumer: Consumer, to: str, msg: StoredMessage, reply: str, extra: bytes = b""
    ) -> None:
        headers: bytes | None = msg.headers or None
        data = msg.data
        if consumer.config.headers_only:
            base = msg.headers[:-2] if msg.headers else b"NATS/1.0\r\n"
            headers = base + b"Nats-Msg-Size: %d\r\n\r\n" % len(data)
            data = b""
        if extra:
            # Header lines the delivery adds (``Nats-Pin-Id``), after the stored ones.
            base = headers[:-2] if headers else b"NATS/1.0\r\n"
            headers = base + extra + b"\r\n"
        subject = msg.subject
        sb = self._subject_bytes.get(subject)
        if sb is None:
            if len(self._subject_bytes) > 4096:
                self._subject_bytes.clear()
            sb = self._subject_bytes[subject] = encode(subject)
        m = self._match(to)
        rb = reply.encode()
        for sub in m.plain:
            sub.deliver(subject, reply, headers, data, sb, rb)
        for members in m.groups:
            member = members[0] if len(members) == 1 else secrets.choice(members)
            member.deliver(subject, reply, headers, data, sb, rb)

    async def _drain(self, consumer: Consumer, outbox: _Outbox) -> None:
        """Send what waits behind slow reads, in order."""
        items = outbox.items
        try:
            while items:
                # Items are only ever appended, so the chunk stays at the front while we read.
                chunk = list(itertools.islice(items, _READ_CHUNK))
                seqs = [meta.seq for _, meta, _, _ in chunk if meta is not None]
                loaded: dict[int, StoredMessage] = {}
                if seqs:
                    try:
                        for msg in await self.broker.read_many(consumer.stream, seqs):
                            loaded[msg.seq] = msg
                    except CorruptMessage:
                        loaded = await self._read_sound(consumer, seqs)
                    except Exception:
                        log.exception("reading messages for %s failed", consumer)
                for to, meta, reply, block in chunk:
                    items.popleft()
                    if meta is not None:
                        found = loaded.get(meta.seq)
                        if found is not None and not consumer.deleted:
                            self._send(consumer, to, found, reply, block or b"")
                    elif block is not None:
                        self.router.publish(None, to, reply, block, b"")
        finally:
            outbox.task = None
            if self._outboxes.get(id(consumer)) is outbox and not items:
                del self._outboxes[id(consumer)]
        if not consumer.deleted:
            consumer.sink_drained()

    async def _read_sound(self, consumer: Consumer, seqs: list[int]) -> dict[int, StoredMessage]:
        """The messages of ``seqs`` that are whole, read one by one after a batch met a
        damaged one. A damaged message is terminated: it stays as a dead letter (so an
        operator sees it and may repair the store) and is never sent, nor redelivered
        forever, while its neighbours go out as usual."""
        loaded: dict[int, StoredMessage] = {}
        for seq in seqs:
            try:
                msg = await self.broker.read(consumer.stream, seq)
            except CorruptMessage as exc:
                log.error("consumer %s > %s: %s", consumer.stream.name, consumer.name, exc)
                if not consumer.deleted:
                    consumer.term(seq, "damaged in the store (tether store check)")
                continue
            if msg is not None:
                loaded[seq] = msg
        return loaded


class _AckReply:
    """The answer to an ack with a reply subject, once its consumer's state is saved.

    Success is an empty message, as from nats-server. A failed save is a ``503``
    status with an empty body, which clients take as a failed request (nats-py's
    ``ack_sync`` raises ``NoRespondersError``, nats.go's ``AckSync`` returns
    ``ErrNoResponders``) rather than an acknowledgement; the status line says why.
    """

    __slots__ = ("reply", "router")

    def __init__(self, router: Router, reply: str) -> None:
        self.router = router
        self.reply = reply

    def __call__(self, error: StorageError | None) -> None:
        if error is None:
            self.router.publish(None, self.reply, "", None, b"")
            return
        cause = error.__cause__ if error.__cause__ is not None else error
        why = " ".join(str(cause).split())  # one line
        block = b"NATS/1.0 503 ack not stored: " + why.encode("utf-8", "replace") + b"\r\n\r\n"
        self.router.publish(None, self.reply, "", block, b"")


def _nak_delay(arg: bytes) -> int:
    """``-NAK {"delay": ns}`` or ``-NAK 5s``; a bad value means a plain nak (as nats-server)."""
    if not arg:
        return 0
    try:
        if arg[:1] == b"{":
            return max(_decode_nak(arg).delay, 0)
        return max(parse_go_duration(arg.decode()), 0)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, UnicodeDecodeError):
        return 0
