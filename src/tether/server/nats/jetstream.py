"""The ``$JS.API`` front door: JetStream requests in, broker calls, replies out.

Requests arrive through an internal subscription on ``$JS.API.>``; streams capture
their subjects through internal subscriptions too, so routing, no-responders and
queue semantics are exactly those of core NATS. Handlers are looked up in a table
keyed by the API tokens, so other modules (consumers) register theirs the same way.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.consumers import ConsumerRegistry
from tether.engine.consumers.config import parse_rfc3339 as parse_time
from tether.engine.jobs.view import owned_by_http
from tether.engine.sourcing import SourcingService
from tether.engine.streams import Stream
from tether.engine.subjects import filters_overlap
from tether.protocol.nats.commands import encode
from tether.server.nats import requests
from tether.server.nats.connection import ClientConnection
from tether.server.nats.fast_batch import FastBatches
from tether.server.nats.requests import (
    BodyError,
    DirectGetRequest,
    MsgDeleteRequest,
    MsgGetRequest,
    PagedRequest,
    PurgeRequest,
    StreamInfoRequest,
    decode_as,
    decode_request,
    decode_required,
    is_empty_request,
)
from tether.server.nats.router import Router
from tether.server.nats.subscriptions import InternalSubscription
from tether.storage.base import StorageError, StoredMessage

log = logging.getLogger("tether.jetstream")

API_PREFIX = "$JS.API."
# nats-server's lifecycle advisories (sent only while someone subscribes to them).
ADVISORY_PREFIX = "$JS.EVENT.ADVISORY."
API_AUDIT = ADVISORY_PREFIX + "API"
_encode_json = msgspec.json.Encoder().encode
# How a fast-ingest batch message's reply subject ends (ADR-50).
FAST_BATCH = ".$FI"

Handler = Callable[[list[str], str, bytes | None, bytes], Awaitable[dict[str, Any] | None]]


ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, which nats-server reports
MAX_SUBJECT_DETAILS = 100_000  # subjects per STREAM.INFO page (JSMaxSubjectDetails)
NAMES_LIMIT = 1024
LIST_LIMIT = 256
DIRECT_MAX_BYTES = 64 * 1024 * 1024  # a batch's default byte budget (nats-server's MaxPending)
MULTI_LAST_LIMIT = 1024  # results of one multi_last DIRECT.GET
INT64_MAX = (1 << 63) - 1


def multi_last_seqs(stream: Stream, filters: list[str], up_to: int) -> list[int] | None:
    """The last sequence at or below ``up_to`` of each subject matching ``filters``, in
    order; None past :data:`MULTI_LAST_LIMIT` results (nats-server's 413)."""
    found: set[int] = set()
    meta_of = stream.meta
    for f in filters:
        for subject in stream.matching_subjects((f,)):
            seq = stream.last_by_subject(subject)
            if seq > up_to:
                # Walk back to the subject's last message at or below the ceiling.
                seq = next(
                    (
                        s
                        for s in range(up_to, stream.first_seq - 1, -1)
                        if (m := meta_of(s)) is not None and m.subject == subject
                    ),
                    0,
                )
            if seq:
                found.add(seq)
        if len(found) > MULTI_LAST_LIMIT:
            return None
    return sorted(found)


def _direct_headers(
    name: bytes, msg: StoredMessage, stamp: bytes, pending: int = -1, last: int = 0
) -> bytes:
    """The header block of a DIRECT.GET reply: the stored headers plus the ``Nats-*``
    ones (with the pending count and the previous sequence in a batch)."""
    base = msg.headers[:-2] if msg.headers else b"NATS/1.0\r\n"
    block = (
        b"%sNats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\n"
        % (
            base,
            name,
            encode(msg.subject),
            msg.seq,
            stamp,
        )
    )
    if pending >= 0:
        block += b"Nats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n" % (pending, last)
    return block + b"\r\n"


@functools.lru_cache(maxsize=1024)
def _second(secs: int) -> str:
    # Messages stored in the same second share this prefix; strftime is the costly part.
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def rfc3339(ns: int) -> str:
    """Go's RFC3339Nano in UTC: trailing zeros of the fraction trimmed; 0 is Go's zero time."""
    if ns <= 0:
        return ZERO_TIME
    secs, frac = divmod(ns, 1_000_000_000)
    base = _second(secs)
    if not frac:
        return base + "Z"
    return f"{base}.{frac:09d}".rstrip("0") + "Z"


def parse_rfc3339(text: str) -> int:
    """An RFC 3339 timestamp (up to nanoseconds) as ns since the epoch; ValueError if bad.

    The engine's one strict parser (ASCII digits, the whole text), so a time a request
    carries reads the same as one in a consumer's configuration.
    """
    return parse_time(text)


class NoReply(Exception):
    """Raised by a handler whose request nats-server ignores (no reply at all)."""


class JetStreamApi:
    """Serves ``$JS.API.*`` and stores what streams capture."""

    def __init__(self, router: Router, broker: Broker, consumers: ConsumerRegistry) -> None:
        self.router = router
        self.broker = broker
        self.consumers = consumers
        self.routes: dict[tuple[str, ...], tuple[str, Handler]] = {}
        # Fields nats-server's error replies carry besides ``error`` (its Go structs
        # embed paging and counters without omitempty), by response type.
        self.error_fields: dict[str, dict[str, Any]] = {}
        self._pub_ack_prefix: dict[str, bytes] = {}
        self._captures: dict[str, list[InternalSubscription]] = {}
        self._api_sub: InternalSubscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.api_total = 0
        self.api_errors = 0
        # The server's id, which API audit advisories name (set by whoever runs the server).
        self.server_id = ""
        # Mirrors' and sources' state for stream infos (set by whoever runs them).
        self.sourcing: SourcingService | None = None
        self._advising = False  # stream advisories, once the streams at start are loaded
        self._register_stream_routes()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._api_sub = self.router.subscribe_internal(API_PREFIX + ">", self._on_api)
        self.broker.listeners.append(self)
        self.broker.republisher.sink = self._republish
        self.broker.batches.on_abandoned = self._batch_abandoned
        self.broker.batches.api_level = requests.API_LEVEL
        self._fast_batches = FastBatches(self.broker, self._send_reply)
        for stream in self.broker.streams.values():
            self.on_stream_changed(stream)
        self._advising = True  # streams loaded at start are not news

    def _send_reply(self, to: str, body: bytes) -> None:
        self.router.publish(None, to, "", None, body)

    def _batch_abandoned(self, batch: Any, reason: str) -> None:
        """nats-server's advisory for an atomic batch dropped before its commit."""
        self.consumers.sink.advisory(
            f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{batch.stream}",
            {
                "type": "io.nats.jetstream.advisory.v1.stream_batch_abandoned",
                "stream": batch.stream,
                "batch": batch.id,
                "reason": reason,
            },
        )

    def _republish(self, subject: str, headers: bytes, payload: bytes) -> None:
        """A stream's ``republish``: to core NATS subscribers, as nats-server sends it."""
        self.router.publish(None, subject, "", headers, payload)

    async def stop(self) -> None:
        if self.broker.republisher.sink == self._republish:
            self.broker.republisher.sink = None
        if self._api_sub is not None:
            self.router.unsubscribe_internal(self._api_sub)
        for subs in self._captures.values():
            for sub in subs:
                self.router.unsubscribe_internal(sub)
        self._captures.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def route(
        self,
        tokens: tuple[str, ...],
        response_type: str,
        handler: Handler,
        error_fields: dict[str, Any] | None = None,
    ) -> None:
        """Register ``handler`` for ``$JS.API.<tokens…>.<args…>``.

        A handler returns the reply body, raises :class:`errors.ApiError` for an error
        reply (plus ``error_fields``) or :class:`NoReply` to send nothing.
        """
        self.routes[tokens] = (response_type, handler)
        if error_fields:
            self.error_fields[response_type] = error_fields

    # -- broker listener ------------------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        old = self._captures.pop(stream.name, None)
        for sub in old or []:
            self.router.unsubscribe_internal(sub)
        name = stream.name
        subs: list[InternalSubscription] = []

        def capture(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
            self._capture(name, subject, reply, headers, payload)

        def capture_run(subject: str, replies: list[str], payloads: list[bytes]) -> None:
            self._capture_run(name, subject, replies, payloads)

        # One for all of the stream's subjects: a run may go from one to another.
        def capture_mixed(subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
            self._capture_mixed(name, subjects, replies, payloads)

        def capture_headered(
            subject: str, replies: list[str], blocks: list[bytes], payloads: list[bytes]
        ) -> None:
            self._capture_headered(name, subject, replies, blocks, payloads)

        for subject in stream.config.subjects:
            subs.append(
                self.router.subscribe_internal(
                    subject,
                    capture,
                    run_handler=capture_run,
                    batch_handler=capture_mixed,
                    headered_handler=capture_headered,
                )
            )
        if stream.config.allow_direct:

            def direct(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
                if reply and requests.api_level_unmet(headers):
                    self._status(reply, b"NATS/1.0 412 Required Api Level\r\n\r\n")
                    return
                self._spawn(self._direct_get(name, subject, reply, payload))

            prefix = f"{API_PREFIX}DIRECT.GET.{name}"
            subs.append(self.router.subscribe_internal(prefix, direct))
            subs.append(self.router.subscribe_internal(prefix + ".>", direct))
        self._captures[name] = subs
        # Advised here rather than by the API handlers: a stream made or changed through
        # the HTTP or NSQ front door is announced to NATS subscribers as well.
        if self._advising:
            if old is None:
                self._stream_action(name, "create", "CREATED")
            else:
                self._stream_action(name, "modify", "UPDATED")

    def on_stream_deleted(self, stream: Stream) -> None:
        for sub in self._captures.pop(stream.name, []):
            self.router.unsubscribe_internal(sub)
        if self._advising:
            self._stream_action(stream.name, "delete", "DELETED")
        self._pub_ack_prefix.pop(stream.name, None)
        self._fast_batches.drop_stream(stream.name)

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        pass

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        pass

    # -- publishing into streams --------------------------------------------------------------
    def _capture(
        self, name: str, subject: str, reply: str, headers: bytes | None, payload: bytes
    ) -> None:
        stream = self.broker.streams.get(name)
        if stream is None:
            return
        answer = bool(reply) and not stream.config.no_ack
        if not requests.is_utf8(subject):
            # nats-server stores any bytes; a subject here is text in the store, in
            # JSON replies and over HTTP, so one that is not UTF-8 is refused.
            if answer:
                self.pub_failed(name, [reply], errors.bad_request("subject is not valid UTF-8"))
            return
        if reply.endswith(FAST_BATCH):
            # A fast-ingest batch message (allow_batched): its protocol is in the reply.
            self._fast_batches.publish(stream, subject, reply, headers, payload)
            return
        try:
            if not answer:
                self.broker.publish(stream, subject, headers, payload, None)
                return
            cfg = stream.config
            if cfg.allow_atomic or cfg.allow_msg_counter:
                # PubAcks with more than a sequence (a batch's, a counter's total).
                self.broker.publish(
                    stream, subject, headers, payload, self._extended_answer(name, reply)
                )
                return
            self.broker.publish_reply(stream, subject, headers, payload, self, reply)
        except Exception as exc:
            self._publish_raised(name, subject, reply if answer else "", exc)

    def _extended_answer(self, name: str, reply: str) -> Callable[[PubAck | errors.ApiError], None]:
        def answered(result: PubAck | errors.ApiError) -> None:
            self._answer_extended(name, reply, result)

        return answered

    def _publish_raised(self, name: str, subject: str, reply: str, exc: Exception) -> None:
        """A publish the engine raised on; ``reply`` ("" when nobody is answered) hears."""
        if isinstance(exc, ValueError):
            # A header value the engine could not read (every check runs before the
            # message is stored): this publish is refused, the connection goes on.
            log.debug("publish to %s refused: %s", subject, exc)
            if reply:
                self.pub_failed(name, [reply], errors.bad_request("invalid header value"))
            return
        log.error("publish to %s failed", subject, exc_info=exc)
        if reply:
            self.pub_failed(name, [reply], errors.ApiError(500, 10051, "internal server error"))

    def _capture_run(
        self, name: str, subject: str, replies: list[str], payloads: list[bytes]
    ) -> None:
        """A run of header-less publishes: as :meth:`_capture` for each, in one call."""
        stream = self.broker.streams.get(name)
        if stream is None:
            return
        if any(reply.endswith(FAST_BATCH) for reply in replies):
            for reply, payload in zip(replies, payloads, strict=True):
                self._capture(name, subject, reply, None, payload)
            return
        sink = None if stream.config.no_ack else self
        self.broker.publish_many(stream, subject, payloads, replies, sink)

    def _capture_mixed(
        self, name: str, subjects: list[str], replies: list[str], payloads: list[bytes]
    ) -> None:
        """A run of header-less publishes, each to its own subject: as :meth:`_capture`
        for each, in one call."""
        stream = self.broker.streams.get(name)
        if stream is None:
            return
        if any(reply.endswith(FAST_BATCH) for reply in replies):
            for subject, reply, payload in zip(subjects, replies, payloads, strict=True):
                self._capture(name, subject, reply, None, payload)
            return
        sink = None if stream.config.no_ack else self
        self.broker.publish_mixed(stream, subjects, payloads, replies, sink)

    def _capture_headered(
        self,
        name: str,
        subject: str,
        replies: list[str],
        blocks: list[bytes],
        payloads: list[bytes],
    ) -> None:
        """A run of publishes with headers to one subject: as :meth:`_capture` for each.
        The broker takes the messages it can as a run; each one it leaves (headers with
        their own handling) is captured on its own, then the run goes on after it."""
        stream = self.broker.streams.get(name)
        if stream is None:
            return
        cfg = stream.config
        odd = (
            not requests.is_utf8(subject)
            or (FAST_BATCH + "\n") in "\n".join(replies) + "\n"  # any reply ending so
        )
        if cfg.allow_atomic and not cfg.allow_msg_counter and not odd:
            self._capture_atomic(name, stream, subject, replies, blocks, payloads)
            return
        if cfg.allow_atomic or cfg.allow_msg_counter or odd:
            # PubAcks with more than a sequence, or refusals: message by message.
            for reply, block, payload in zip(replies, blocks, payloads, strict=True):
                self._capture(name, subject, reply, block or None, payload)
            return
        sink = None if cfg.no_ack else self
        publish = self.broker.publish_headered
        n = len(payloads)
        i = 0
        while i < n:
            i = publish(stream, subject, blocks, payloads, replies, sink, i)
            if i < n:
                self._capture(name, subject, replies[i], blocks[i] or None, payloads[i])
                i += 1
                if self.broker.streams.get(name) is not stream:
                    # Deleted or changed by what that message did: the rest as usual.
                    for k in range(i, n):
                        self._capture(name, subject, replies[k], blocks[k] or None, payloads[k])
                    return

    def _capture_atomic(
        self,
        name: str,
        stream: Stream,
        subject: str,
        replies: list[str],
        blocks: list[bytes],
        payloads: list[bytes],
    ) -> None:
        """A run of publishes with headers to a stream taking atomic batches: as
        :meth:`_capture` for each, but the messages that only continue an open batch
        are staged a stretch at a time, and any other batch message with nothing but
        its batch headers goes to the broker without the general publish path."""
        publish = self.broker.publish_batch_message
        stage_run = self.broker.stage_batch_run
        streams = self.broker.streams
        n = len(payloads)
        i = 0
        while i < n:
            if streams.get(name) is not stream:
                # Deleted or changed by what a message did: the rest as usual.
                for k in range(i, n):
                    self._capture(name, subject, replies[k], blocks[k] or None, payloads[k])
                return
            i = stage_run(stream, subject, blocks, payloads, replies, i)
            if i >= n:
                return
            # A message the stretch could not take: on its own, as every message was.
            asked = reply = replies[i]
            block = blocks[i]
            payload = payloads[i]
            i += 1
            if reply and stream.config.no_ack:
                reply = ""
            try:
                target = self._extended_answer(name, reply) if reply else None
                if publish(stream, subject, block, payload, target):
                    continue
            except Exception as exc:
                self._publish_raised(name, subject, reply, exc)
                continue
            self._capture(name, subject, asked, block or None, payload)

    def _ack_prefix(self, name: str) -> bytes:
        prefix = self._pub_ack_prefix.get(name)
        if prefix is None:
            prefix = self._pub_ack_prefix[name] = b'{"stream":%s,"seq":' % _encode_json(name)
        return prefix

    # PubAckSink: the broker's answers to publishers, a run at a time.
    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        prefix = self._ack_prefix(stream)
        if duplicate:
            body = b'%s%d,"duplicate":true}' % (prefix, first_seq)
            self.router.publish_replies(replies, [body] * len(replies))
        else:
            self.router.publish_acks(replies, prefix, first_seq)

    def _answer_extended(self, stream: str, reply: str, result: PubAck | errors.ApiError) -> None:
        """A PubAck as nats-server writes one for a batch (``batch``, ``count``) or a
        counter (``val``); a staged batch message gets an empty reply."""
        if isinstance(result, errors.ApiError):
            self.pub_failed(stream, [reply], result)
            return
        if result.staged:
            self.router.publish(None, reply, "", None, b"")
            return
        if result.duplicate:
            self.pub_acked(stream, result.seq, [reply], True)
            return
        body = b"%s%d" % (self._ack_prefix(stream), result.seq)
        if result.batch:
            body += b',"batch":%s,"count":%d' % (_encode_json(result.batch), result.count)
        if result.val:
            body += b',"val":"%s"' % result.val.encode()
        self.router.publish(None, reply, "", None, body + b"}")

    def pub_failed(self, stream: str, replies: list[str], error: errors.ApiError) -> None:
        body = requests.encode_json({"error": error.to_dict(), "stream": stream, "seq": 0})
        self.router.publish_replies(replies, [body] * len(replies))

    # -- API dispatch ------------------------------------------------------------------------------
    def _on_api(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        tokens = subject[len(API_PREFIX) :].split(".")
        for n in (3, 2, 1):
            entry = self.routes.get(tuple(tokens[:n]))
            if entry is not None:
                break
        else:
            if tokens[:2] == ["DIRECT", "GET"] and len(tokens) > 2:
                self._direct_get_unserved(tokens[2], subject, reply)
            return  # unknown API subjects get no reply, as on nats-server
        response_type, handler = entry
        self.api_total += 1
        self._spawn(
            self._call(handler, response_type, tokens[n:], reply, headers, payload, subject)
        )

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(
        self,
        handler: Handler,
        response_type: str,
        args: list[str],
        reply: str,
        headers: bytes | None,
        payload: bytes,
        subject: str = "",
    ) -> None:
        rtype = f"io.nats.jetstream.api.v1.{response_type}"
        try:
            if headers is not None and requests.api_level_unmet(headers):
                raise requests.required_api_level()
            body = await handler(args, reply, headers, payload)
        except NoReply:
            return
        except errors.ApiError as exc:
            self.api_errors += 1
            body = {"error": exc.to_dict(), **self.error_fields.get(response_type, {})}
        except StorageError as exc:
            # A damaged message or a failed read: the store's words, never the content.
            log.error("JetStream API: %s", exc)
            self.api_errors += 1
            failed = errors.ApiError(500, 10051, str(exc)).to_dict()
            body = {"error": failed, **self.error_fields.get(response_type, {})}
        except Exception:
            log.exception("JetStream API handler failed")
            self.api_errors += 1
            body = {"error": errors.ApiError(500, 10051, "internal server error").to_dict()}
        if body is None:
            return
        if not self.router.has_interest(API_AUDIT):
            if reply:
                self.reply(reply, {"type": rtype, **body})
            return
        response = requests.encode_json({"type": rtype, **body})
        if reply:
            self.router.publish(None, reply, "", None, response)
        self._audit(subject, reply, payload, response)

    def _audit(self, subject: str, reply: str, request: bytes, response: bytes) -> None:
        """nats-server's ``api_audit`` advisory: one per answered API request."""
        event: dict[str, Any] = {
            "type": "io.nats.jetstream.advisory.v1.api_audit",
            "server": self.server_id,
            "client": self._requester(reply),
            "subject": subject,
        }
        if request:
            event["request"] = request.decode("utf-8", "replace")
        event["response"] = response.decode("utf-8", "replace")
        self.consumers.sink.advisory(API_AUDIT, event)

    def _requester(self, reply: str) -> dict[str, Any]:
        """The audit's ``client``: the connection subscribed to the reply subject.

        An internal subscription does not see who published, so the requester is found
        by its reply inbox (looked up only for an audit somebody listens to).
        """
        conn: ClientConnection | None = None
        if reply:
            for sub in self.router.index.match(reply).plain:
                if isinstance(sub.client, ClientConnection):
                    conn = sub.client
                    break
        info: dict[str, Any] = {}
        if conn is not None:
            info["start"] = rfc3339(int(conn.started_at * 1_000_000_000))
            info["host"] = conn.remote[0]
            info["id"] = conn.cid
        info["acc"] = "$G"
        if conn is not None:
            if conn.user:
                info["user"] = conn.user
            if conn.name:
                info["name"] = conn.name
            if conn.lang:
                info["lang"] = conn.lang
            if conn.version:
                info["ver"] = conn.version
            if conn.rtt_ns:
                info["rtt"] = conn.rtt_ns
        info["server"] = self.server_id
        info["kind"] = "Client"
        if conn is not None:
            info["client_type"] = "nats"
        return info

    def _stream_action(self, name: str, action: str, past: str) -> None:
        """``STREAM.CREATED`` / ``UPDATED`` / ``DELETED``, as nats-server sends them."""
        subject = f"{ADVISORY_PREFIX}STREAM.{past}.{name}"
        if self.router.has_interest(subject):
            self.consumers.sink.advisory(
                subject,
                {
                    "type": "io.nats.jetstream.advisory.v1.stream_action",
                    "stream": name,
                    "action": action,
                },
            )

    def reply(self, reply: str, body: dict[str, Any]) -> None:
        self.router.publish(None, reply, "", None, requests.encode_json(body))

    # -- stream handlers -----------------------------------------------------------------------------
    def _register_stream_routes(self) -> None:
        paged = {"total": 0, "offset": 0, "limit": 0}
        self.route(("INFO",), "account_info_response", self._account_info)
        self.route(("STREAM", "CREATE"), "stream_create_response", self._stream_create)
        self.route(("STREAM", "UPDATE"), "stream_update_response", self._stream_update)
        self.route(("STREAM", "INFO"), "stream_info_response", self._stream_info, paged)
        self.route(("STREAM", "DELETE"), "stream_delete_response", self._stream_delete)
        self.route(("STREAM", "PURGE"), "stream_purge_response", self._stream_purge, {"purged": 0})
        self.route(
            ("STREAM", "LIST"),
            "stream_list_response",
            self._stream_list,
            {**paged, "streams": []},
        )
        self.route(
            ("STREAM", "NAMES"),
            "stream_names_response",
            self._stream_names,
            {**paged, "streams": None},
        )
        self.route(("STREAM", "MSG", "GET"), "stream_msg_get_response", self._msg_get)
        self.route(("STREAM", "MSG", "DELETE"), "stream_msg_delete_response", self._msg_delete)

    @staticmethod
    def _one_name(args: list[str]) -> str:
        """The one name token after the API tokens; anything else gets no reply."""
        if len(args) != 1 or not args[0]:
            raise NoReply
        return args[0]

    def stream_info(
        self,
        stream: Stream,
        subjects_filter: str = "",
        offset: int = 0,
        deleted_details: bool = False,
    ) -> dict[str, Any]:
        """A ``stream_info`` body (without ``type``), paged as nats-server pages subjects."""
        state = stream.info_state()
        state["first_ts"] = rfc3339(state["first_ts"])
        state["last_ts"] = rfc3339(state["last_ts"])
        total = offset_out = limit = 0
        if subjects_filter:
            subjects = stream.subjects_state(subjects_filter)
            if subjects:
                total, offset_out, limit = len(subjects), offset, MAX_SUBJECT_DETAILS
                if offset or len(subjects) > MAX_SUBJECT_DETAILS:
                    names = sorted(subjects)[offset : offset + MAX_SUBJECT_DETAILS]
                    subjects = {name: subjects[name] for name in names}
                if subjects:
                    state["subjects"] = subjects
        if deleted_details:
            deleted = stream.deleted()
            if deleted:
                state["deleted"] = deleted
        info: dict[str, Any] = {
            "total": total,
            "offset": offset_out,
            "limit": limit,
            "config": stream.config.to_dict(),
            "created": rfc3339(stream.created_ns),
            "state": state,
            "ts": rfc3339(self.broker.clock.now()),
        }
        if self.sourcing is not None and (stream.config.mirror or stream.config.sources):
            info.update(self.sourcing.info(stream))
        return info

    def _stream_body(self, stream: Stream) -> dict[str, Any]:
        """A stream info as create, update and list return it (no paging fields)."""
        info = self.stream_info(stream)
        for key in ("total", "offset", "limit"):
            del info[key]
        return info

    async def _account_info(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        usage = self.broker.account_usage()
        return {
            **usage,  # reserved_*: the streams' max_bytes, as the server's limits count them
            "api": {
                "level": requests.API_LEVEL,
                "total": self.api_total,
                "errors": self.api_errors,
            },
            "limits": {
                "max_memory": -1,
                "max_storage": -1,
                "max_streams": -1,
                "max_consumers": -1,
                "max_ack_pending": -1,
                "memory_max_stream_bytes": -1,
                "storage_max_stream_bytes": -1,
                "max_bytes_required": False,
            },
        }

    async def _stream_create(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        stream, _ = await self.broker.create_stream(name, requests.checked_body(p))
        # nats-server answers an identical re-create exactly like the create.
        return {**self._stream_body(stream), "did_create": True}

    async def _stream_update(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        stream = await self.broker.update_stream(name, requests.checked_body(p))
        return self._stream_body(stream)

    async def _stream_info(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = decode_request(p, StreamInfoRequest)
        stream = self.broker.get_stream(name)
        return self.stream_info(
            stream, req.subjects_filter, max(0, req.offset), req.deleted_details
        )

    async def _stream_delete(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        requests.require_empty(p)
        if name in self.broker.streams:
            owned = [c.name for c in self.consumers.consumers_of(name) if owned_by_http(c.config)]
            if owned:
                raise errors.managed_by_http(
                    f"stream {name!r} (a channel with HTTP consumers {', '.join(owned)})",
                    "the HTTP API to delete its consumers first",
                )
        await self.broker.delete_stream(name)
        return {"success": True}

    async def _stream_purge(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = decode_request(p, PurgeRequest)
        purged = await self.broker.purge_stream(name, req.filter, req.seq, req.keep)
        return {"success": True, "purged": purged}

    def _matching_streams(self, subject: str) -> list[Stream]:
        streams = sorted(self.broker.streams.values(), key=lambda s: s.name)
        if not subject:
            return streams
        return [s for s in streams if any(filters_overlap(subject, f) for f in s.config.subjects)]

    async def _stream_names(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        req = decode_request(p, PagedRequest)
        streams = self._matching_streams(req.subject)
        offset = min(max(0, req.offset), len(streams))
        page = [s.name for s in streams[offset : offset + NAMES_LIMIT]]
        return {
            "total": len(streams),
            "offset": offset,
            "limit": NAMES_LIMIT,
            "streams": page or None,
        }

    async def _stream_list(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        req = decode_request(p, PagedRequest)
        streams = self._matching_streams(req.subject)
        offset = min(max(0, req.offset), len(streams))
        page = [self._stream_body(s) for s in streams[offset : offset + LIST_LIMIT]]
        return {"total": len(streams), "offset": offset, "limit": LIST_LIMIT, "streams": page}

    @staticmethod
    def _get_request(payload: bytes) -> MsgGetRequest:
        """MSG.GET's body: required, strict, one way of choosing the message."""
        if is_empty_request(payload):
            raise errors.bad_request()
        req = decode_required(payload, MsgGetRequest)
        if req.batch > 0 or req.max_bytes > 0 or req.multi_last:
            raise errors.bad_request()  # batches are DIRECT.GET's
        if (
            (req.seq and req.last_by_subj)
            or (
                not req.seq and not req.last_by_subj and not req.next_by_subj and not req.start_time
            )
            or (req.seq and req.start_time)
            or (req.start_time and req.last_by_subj)
            or (req.last_by_subj and req.next_by_subj)
        ):
            raise errors.bad_request()
        return req

    def _start_seq(self, stream: Stream, req: DirectGetRequest) -> int:
        if req.start_time is None:
            return req.seq
        try:
            when = parse_rfc3339(req.start_time)
        except ValueError:
            raise errors.invalid_json("parsing time: invalid start_time") from None
        # No message at or after that time: a sequence past the end finds nothing.
        return stream.seq_from_time(when) or stream.last_seq + 1

    async def _msg_get(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = self._get_request(p)
        stream = self.broker.get_stream(name)
        msg = await self.broker.get_message(
            name,
            seq=self._start_seq(stream, req),
            last_by_subj=req.last_by_subj,
            next_by_subj=req.next_by_subj,
        )
        out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.headers and not req.no_hdr:
            out["hdrs"] = base64.b64encode(msg.headers).decode()
        if msg.data:
            out["data"] = base64.b64encode(msg.data).decode()
        out["time"] = rfc3339(msg.ts)
        return {"message": out}

    async def _msg_delete(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        if is_empty_request(p):
            raise errors.bad_request()
        req = decode_required(p, MsgDeleteRequest)
        await self.broker.delete_message(name, req.seq)
        return {"success": True}

    # -- DIRECT.GET -----------------------------------------------------------------------------------
    def _direct_get_unserved(self, name: str, subject: str, reply: str) -> None:
        """DIRECT.GET to a stream that does not serve it: 503 no responders, as nats-server
        (whose API catch-all does not cover DIRECT.GET) sends it."""
        stream = self.broker.streams.get(name)
        if not reply or (stream is not None and stream.config.allow_direct):
            return
        block = b"NATS/1.0 503\r\nNats-Subject: " + encode(subject) + b"\r\n\r\n"
        match = self.router.index.match(reply)
        for sub in (*match.plain, *(s for group in match.groups for s in group)):
            client = sub.client
            if client is not None and client.no_responders:
                sub.deliver(reply, "", block, b"", encode(reply), b"")
                return

    async def _direct_get(self, name: str, subject: str, reply: str, payload: bytes) -> None:
        if not reply:
            return
        tail = subject[len(f"{API_PREFIX}DIRECT.GET.{name}") :]
        try:
            if tail.startswith("."):
                await self._direct_last_by_subject(name, tail[1:], reply, payload)
                return
            if not payload:
                self._status(reply, b"NATS/1.0 408 Empty Request\r\n\r\n")
                return
            try:
                req = decode_as(payload, DirectGetRequest)
            except BodyError:
                self._status(reply, b"NATS/1.0 408 Malformed Request\r\n\r\n")
                return
            if not (
                req.seq or req.last_by_subj or req.next_by_subj or req.multi_last or req.start_time
            ):
                self._status(reply, b"NATS/1.0 408 Empty Request\r\n\r\n")
                return
            if (
                (req.seq and req.last_by_subj)
                or (req.seq and req.start_time)
                or (req.start_time and req.last_by_subj)
                or (req.last_by_subj and req.next_by_subj)
                or (req.last_by_subj and req.batch > 0)
                or (req.last_by_subj and req.multi_last)
                or (req.next_by_subj and req.multi_last)
                or (req.up_to_seq and req.up_to_time)
            ):
                self._status(reply, b"NATS/1.0 408 Bad Request\r\n\r\n")
                return
            stream = self.broker.get_stream(name)
            if req.multi_last:
                await self._direct_multi_last(stream, reply, req)
                return
            start = self._start_seq(stream, req)
            if req.batch > 0:
                await self._direct_batch(stream, reply, req, start)
                return
            msg = await self.broker.get_message(
                name, seq=start, last_by_subj=req.last_by_subj, next_by_subj=req.next_by_subj
            )
            self._send_direct(reply, name, msg, no_headers=req.no_hdr)
        except errors.ApiError:
            self._status(reply, b"NATS/1.0 404 Message Not Found\r\n\r\n")
        except StorageError as exc:
            # A damaged message is an error status, never its bytes, and always an answer.
            log.error("DIRECT.GET %s: %s", name, exc)
            text = " ".join(str(exc).split()).encode("ascii", "replace")[:200]
            self._status(reply, b"NATS/1.0 500 " + text + b"\r\n\r\n")

    async def _direct_last_by_subject(
        self, name: str, subject: str, reply: str, payload: bytes
    ) -> None:
        """DIRECT.GET.<stream>.<subject>: the last message on ``subject``."""
        req = DirectGetRequest()
        if payload:
            try:
                req = decode_as(payload, DirectGetRequest)
            except BodyError:
                self._status(reply, b"NATS/1.0 408 Malformed Request\r\n\r\n")
                return
        if (
            req.last_by_subj
            or req.next_by_subj
            or req.multi_last
            or req.seq
            or req.batch
            or req.start_time
            or req.up_to_seq
            or req.up_to_time
        ):
            self._status(reply, b"NATS/1.0 408 Bad Request\r\n\r\n")
            return
        msg = await self.broker.get_message(name, last_by_subj=subject)
        self._send_direct(reply, name, msg, no_headers=req.no_hdr)

    async def _direct_batch(
        self, stream: Stream, reply: str, req: DirectGetRequest, start: int
    ) -> None:
        """Batched DIRECT.GET: each message carries the pending count and the sequence of
        the one before it; an end-of-batch status closes the batch."""
        filters = (req.next_by_subj,) if req.next_by_subj else ()
        max_bytes = req.max_bytes if req.max_bytes > 0 else DIRECT_MAX_BYTES
        pending = stream.count_matching(start, filters)
        seqs = self.broker.select_batch(stream, start, req.batch, max_bytes, req.next_by_subj)
        msgs = await self.broker.read_many(stream, seqs)
        if not msgs:
            self._status(reply, b"NATS/1.0 404 Message Not Found\r\n\r\n")
            return
        last = 0
        blocks: list[bytes] = []
        payloads: list[bytes] = []
        name = encode(stream.name)
        stamp_ns, stamp = -1, b""
        for msg in msgs:
            pending = max(0, pending - 1)
            if req.no_hdr:
                self.router.publish(None, reply, "", None, msg.data)
            else:
                if msg.ts != stamp_ns:  # the messages of one commit share their time
                    stamp_ns, stamp = msg.ts, rfc3339(msg.ts).encode()
                blocks.append(_direct_headers(name, msg, stamp, pending, last))
                payloads.append(msg.data)
            last = msg.seq
        if blocks:
            self.router.publish_headered(reply, blocks, payloads)
        if stream.last_seq > msgs[-1].seq:
            pending = stream.count_matching(last + 1, filters)
        self._status(
            reply,
            b"NATS/1.0 204 EOB\r\nNats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n\r\n"
            % (pending, last),
        )

    async def _direct_multi_last(self, stream: Stream, reply: str, req: DirectGetRequest) -> None:
        """``multi_last``: the last message of each subject matching the filters (at or
        below ``up_to_seq`` / before ``up_to_time``), in stream order, batched as
        nats-server's ``getDirectMulti`` sends them; ``seq`` skips those below it."""
        up_to = req.up_to_seq
        if req.up_to_time is not None:
            try:
                when = parse_rfc3339(req.up_to_time)
            except ValueError:
                raise errors.invalid_json("parsing time: invalid up_to_time") from None
            first_at = stream.seq_from_time(when) or stream.last_seq + 1
            # A time past int64 nanoseconds (year 2262) wraps in nats-server's store
            # and finds nothing: the same answer here.
            if first_at <= stream.first_seq or when > INT64_MAX:
                self._status(reply, b"NATS/1.0 404 No Results\r\n\r\n")
                return
            up_to = first_at - 1
        if up_to == 0:
            up_to = stream.last_seq
        seqs = multi_last_seqs(stream, req.multi_last or [], up_to)
        if seqs is None:
            self._status(reply, b"NATS/1.0 413 Too Many Results\r\n\r\n")
            return
        if not seqs:
            self._status(reply, b"NATS/1.0 404 No Results\r\n\r\n")
            return
        max_bytes = req.max_bytes if req.max_bytes > 0 else DIRECT_MAX_BYTES
        pending = len(seqs)
        chosen: list[tuple[int, int]] = []  # (seq, pending after it)
        sent_bytes = 0
        for seq in seqs:
            pending -= 1
            if seq < req.seq:
                continue
            chosen.append((seq, pending))
            meta = stream.meta(seq)
            sent_bytes += meta.size - meta.overhead if meta is not None else 0
            if sent_bytes >= max_bytes or (req.batch > 0 and len(chosen) >= req.batch):
                break
        loaded = {m.seq: m for m in await self.broker.read_many(stream, [c[0] for c in chosen])}
        name = encode(stream.name)
        last = 0
        blocks: list[bytes] = []
        payloads: list[bytes] = []
        for seq, left in chosen:
            msg = loaded.get(seq)
            if msg is None:
                self._status(reply, b"NATS/1.0 404 Message Not Found\r\n\r\n")
                return
            # Headers always (nats-server's multi_last does not apply ``no_hdr``).
            blocks.append(_direct_headers(name, msg, rfc3339(msg.ts).encode(), left, last))
            payloads.append(msg.data)
            last = seq
        if blocks:
            self.router.publish_headered(reply, blocks, payloads)
        left = chosen[-1][1] if chosen else 0
        self._status(
            reply,
            b"NATS/1.0 204 EOB\r\nNats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n"
            b"Nats-UpTo-Sequence: %d\r\n\r\n" % (left, last, up_to),
        )

    def _send_direct(self, reply: str, name: str, msg: StoredMessage, no_headers: bool) -> None:
        if no_headers:
            self.router.publish(None, reply, "", None, msg.data)
            return
        block = _direct_headers(encode(name), msg, rfc3339(msg.ts).encode())
        self.router.publish(None, reply, "", block, msg.data)

    def _status(self, reply: str, block: bytes) -> None:
        self.router.publish(None, reply, "", block, b"")
