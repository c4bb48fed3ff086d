"""The ``$JS.API`` front door: JetStream requests in, broker calls, replies out.

Requests arrive through an internal subscription on ``$JS.API.>``; streams capture
their subjects through internal subscriptions too, so routing, no-responders and
queue semantics are exactly those of core NATS. Handlers are looked up in a table
keyed by the API tokens, so other modules (consumers) register theirs the same way.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.stream import Stream
from tether.engine.subjects import filters_overlap, is_valid_filter, subject_matches
from tether.protocol.nats.commands import encode
from tether.storage.base import StoredMessage
from tether.server.nats.router import InternalSubscription, Router

log = logging.getLogger("tether.jetstream")

API_PREFIX = "$JS.API."
_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder(dict[str, Any]).decode

Handler = Callable[[list[str], str, bytes | None, bytes], Awaitable[dict[str, Any] | None]]


def rfc3339(ns: int) -> str:
    """nats-server's timestamp format: RFC 3339 with nanoseconds, UTC."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}Z"


def parse_body(payload: bytes) -> dict[str, Any]:
    if not payload.strip():
        return {}
    try:
        return _decode_json(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise errors.invalid_json() from None


class JetStreamApi:
    """Serves ``$JS.API.*`` and stores what streams capture."""

    def __init__(self, router: Router, broker: Broker) -> None:
        self.router = router
        self.broker = broker
        self.routes: dict[tuple[str, ...], tuple[str, Handler]] = {}
        self._captures: dict[str, list[InternalSubscription]] = {}
        self._api_sub: InternalSubscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.api_total = 0
        self.api_errors = 0
        self._register_stream_routes()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._api_sub = self.router.subscribe_internal(API_PREFIX + ">", self._on_api)
        self.broker.listeners.append(self)
        for stream in self.broker.streams.values():
            self.on_stream_changed(stream)

    async def stop(self) -> None:
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

    def route(self, tokens: tuple[str, ...], response_type: str, handler: Handler) -> None:
        """Register ``handler`` for ``$JS.API.<tokens…>.<args…>``."""
        self.routes[tokens] = (response_type, handler)

    # -- broker listener ------------------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        for sub in self._captures.pop(stream.name, []):
            self.router.unsubscribe_internal(sub)
        name = stream.name
        subs: list[InternalSubscription] = []

        def capture(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
            self._capture(name, subject, reply, headers, payload)

        for subject in stream.config.subjects:
            subs.append(self.router.subscribe_internal(subject, capture))
        if stream.config.allow_direct:

            def direct(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
                self._spawn(self._direct_get(name, subject, reply, payload))

            prefix = f"{API_PREFIX}DIRECT.GET.{name}"
            subs.append(self.router.subscribe_internal(prefix, direct))
            subs.append(self.router.subscribe_internal(prefix + ".>", direct))
        self._captures[name] = subs

    def on_stream_deleted(self, stream: Stream) -> None:
        for sub in self._captures.pop(stream.name, []):
            self.router.unsubscribe_internal(sub)

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
        if not reply:
            self.broker.publish(stream, subject, headers, payload, None)
            return
        router = self.router

        def acked(result: PubAck | errors.ApiError) -> None:
            if isinstance(result, PubAck):
                if result.duplicate:
                    body = b'{"stream":%s,"seq":%d,"duplicate":true}' % (
                        _encode_json(result.stream),
                        result.seq,
                    )
                else:
                    body = b'{"stream":%s,"seq":%d}' % (_encode_json(result.stream), result.seq)
            else:
                body = _encode_json({"error": result.to_dict(), "stream": name, "seq": 0})
            router.publish(None, reply, "", None, body)

        self.broker.publish(stream, subject, headers, payload, acked)

    # -- API dispatch ------------------------------------------------------------------------------
    def _on_api(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        tokens = subject[len(API_PREFIX) :].split(".")
        for n in (3, 2, 1):
            entry = self.routes.get(tuple(tokens[:n]))
            if entry is not None:
                break
        else:
            return  # unknown API subjects get no reply, as on nats-server
        response_type, handler = entry
        self.api_total += 1
        self._spawn(self._call(handler, response_type, tokens[n:], reply, headers, payload))

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
    ) -> None:
        rtype = f"io.nats.jetstream.api.v1.{response_type}"
        try:
            body = await handler(args, reply, headers, payload)
        except errors.ApiError as exc:
            self.api_errors += 1
            body = {"error": exc.to_dict()}
        except Exception:
            log.exception("JetStream API handler failed")
            self.api_errors += 1
            body = {"error": errors.ApiError(500, 10011, "internal server error").to_dict()}
        if body is None or not reply:
            return
        self.reply(reply, {"type": rtype, **body})

    def reply(self, reply: str, body: dict[str, Any]) -> None:
        self.router.publish(None, reply, "", None, _encode_json(body))

    # -- stream handlers -----------------------------------------------------------------------------
    def _register_stream_routes(self) -> None:
        self.route(("INFO",), "account_info_response", self._account_info)
        self.route(("STREAM", "CREATE"), "stream_create_response", self._stream_create)
        self.route(("STREAM", "UPDATE"), "stream_update_response", self._stream_update)
        self.route(("STREAM", "INFO"), "stream_info_response", self._stream_info)
        self.route(("STREAM", "DELETE"), "stream_delete_response", self._stream_delete)
        self.route(("STREAM", "PURGE"), "stream_purge_response", self._stream_purge)
        self.route(("STREAM", "LIST"), "stream_list_response", self._stream_list)
        self.route(("STREAM", "NAMES"), "stream_names_response", self._stream_names)
        self.route(("STREAM", "MSG", "GET"), "stream_msg_get_response", self._msg_get)
        self.route(("STREAM", "MSG", "DELETE"), "stream_msg_delete_response", self._msg_delete)

    @staticmethod
    def _one_name(args: list[str]) -> str:
        if len(args) != 1 or not args[0]:
            raise errors.bad_request()
        return args[0]

    def stream_info(self, stream: Stream, subjects_filter: str = "") -> dict[str, Any]:
        state = stream.info_state()
        state["first_ts"] = rfc3339(state["first_ts"]) if state["first_ts"] else rfc3339(0)
        state["last_ts"] = rfc3339(state["last_ts"]) if state["last_ts"] else rfc3339(0)
        if subjects_filter:
            state["subjects"] = stream.subjects_state(subjects_filter) or None
        return {
            "config": stream.config.to_dict(),
            "created": rfc3339(stream.created_ns),
            "state": state,
            "ts": rfc3339(self.broker.clock.now()),
        }

    async def _account_info(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        usage = self.broker.account_usage()
        return {
            **usage,
            "reserved_memory": 0,
            "reserved_storage": 0,
            "domain": "",
            "api": {"level": 1, "total": self.api_total, "errors": self.api_errors},
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
        stream, created = await self.broker.create_stream(name, p)
        info = self.stream_info(stream)
        if created:
            info["did_create"] = True
        return info

    async def _stream_update(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream = await self.broker.update_stream(self._one_name(args), p)
        return self.stream_info(stream)

    async def _stream_info(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        stream = self.broker.get_stream(self._one_name(args))
        req = parse_body(p)
        return self.stream_info(stream, str(req.get("subjects_filter") or ""))

    async def _stream_delete(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        await self.broker.delete_stream(self._one_name(args))
        return {"success": True}

    async def _stream_purge(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = parse_body(p)
        filter_ = str(req.get("filter") or "")
        if filter_ and not is_valid_filter(filter_):
            raise errors.bad_request("invalid purge subject")
        purged = await self.broker.purge_stream(
            name, filter_, int(req.get("seq") or 0), int(req.get("keep") or 0)
        )
        return {"success": True, "purged": purged}

    def _matching_streams(self, subject: str) -> list[Stream]:
        streams = sorted(self.broker.streams.values(), key=lambda s: s.name)
        if not subject:
            return streams
        return [
            s
            for s in streams
            if any(
                filters_overlap(subject, f) or subject_matches(subject, f)
                for f in s.config.subjects
            )
        ]

    async def _stream_names(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        req = parse_body(p)
        offset = max(0, int(req.get("offset") or 0))
        streams = self._matching_streams(str(req.get("subject") or ""))
        page = [s.name for s in streams[offset : offset + 1024]]
        return {"total": len(streams), "offset": offset, "limit": 1024, "streams": page or None}

    async def _stream_list(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        req = parse_body(p)
        offset = max(0, int(req.get("offset") or 0))
        streams = self._matching_streams(str(req.get("subject") or ""))
        page = [self.stream_info(s) for s in streams[offset : offset + 256]]
        return {"total": len(streams), "offset": offset, "limit": 256, "streams": page}

    async def _msg_get(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = parse_body(p)
        msg = await self.broker.get_message(
            name,
            seq=int(req.get("seq") or 0),
            last_by_subj=str(req.get("last_by_subj") or ""),
            next_by_subj=str(req.get("next_by_subj") or ""),
        )
        out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.headers:
            out["hdrs"] = base64.b64encode(msg.headers).decode()
        if msg.data:
            out["data"] = base64.b64encode(msg.data).decode()
        out["time"] = rfc3339(msg.ts)
        return {"message": out}

    async def _msg_delete(self, args: list[str], reply: str, h: bytes | None, p: bytes) -> Any:
        name = self._one_name(args)
        req = parse_body(p)
        seq = int(req.get("seq") or 0)
        if seq <= 0:
            raise errors.bad_request("sequence required")
        await self.broker.delete_message(name, seq)
        return {"success": True}

    # -- DIRECT.GET -----------------------------------------------------------------------------------
    async def _direct_get(self, name: str, subject: str, reply: str, payload: bytes) -> None:
        if not reply:
            return
        tail = subject[len(f"{API_PREFIX}DIRECT.GET.{name}") :]
        try:
            if tail.startswith("."):
                # DIRECT.GET.<stream>.<subject>: last message on that subject.
                msg = await self.broker.get_message(name, last_by_subj=tail[1:])
                self._send_direct(reply, name, msg)
                return
            req = parse_body(payload)
            batch = int(req.get("batch") or 0)
            if batch > 0:
                await self._direct_batch(name, reply, req, batch)
                return
            msg = await self.broker.get_message(
                name,
                seq=int(req.get("seq") or 0),
                last_by_subj=str(req.get("last_by_subj") or ""),
                next_by_subj=str(req.get("next_by_subj") or ""),
            )
            self._send_direct(reply, name, msg)
        except errors.ApiError as exc:
            if exc.code == 404:
                self._status(reply, b"NATS/1.0 404 Message Not Found\r\n\r\n")
            else:
                desc = exc.description.encode()
                self._status(reply, b"NATS/1.0 %d %s\r\n\r\n" % (exc.code, desc))
        except (ValueError, TypeError):
            self._status(reply, b"NATS/1.0 408 Bad Request\r\n\r\n")

    async def _direct_batch(self, name: str, reply: str, req: dict[str, Any], batch: int) -> None:
        stream = self.broker.get_stream(name)
        start = int(req.get("seq") or 0) or stream.first_seq
        filter_ = str(req.get("next_by_subj") or "")
        msgs = await self.broker.get_batch(
            name, start, batch, int(req.get("max_bytes") or 0), filter_
        )
        if not msgs:
            self._status(reply, b"NATS/1.0 404 Message Not Found\r\n\r\n")
            return
        filters = (filter_,) if filter_ else ()
        last = msgs[-1].seq
        remaining = stream.count_matching(last + 1, filters)
        for i, msg in enumerate(msgs):
            pending = remaining + len(msgs) - 1 - i
            self._send_direct(reply, name, msg, pending)
        self._status(
            reply,
            b"NATS/1.0 204 EOB\r\nNats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n\r\n"
            % (remaining, last),
        )

    def _send_direct(self, reply: str, name: str, msg: StoredMessage, pending: int = -1) -> None:
        base = msg.headers[:-2] if msg.headers else b"NATS/1.0\r\n"
        extra = (
            b"Nats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\n"
            % (
                encode(name),
                encode(msg.subject),
                msg.seq,
                rfc3339(msg.ts).encode(),
            )
        )
        if pending >= 0:
            extra += b"Nats-Num-Pending: %d\r\n" % pending
        self.router.publish(None, reply, "", base + extra + b"\r\n", msg.data)

    def _status(self, reply: str, block: bytes) -> None:
        self.router.publish(None, reply, "", block, b"")
