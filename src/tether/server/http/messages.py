"""Broadcasting and reading messages: broadcast, message, messages, status, scheduled."""

from __future__ import annotations

import itertools
import re
import secrets
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.engine import errors
from tether.engine.jobs.messages import DEFAULT_CONTENT_TYPE, MessageView
from tether.engine.jobs.registry import Scheduled
from tether.engine.jobs.service import DuplicateMessage, stream_name
from tether.server.http.auth import broadcaster
from tether.server.http.common import (
    NOT_FOUND,
    NS,
    Api,
    json,
    message_url,
    path_segment,
    rfc3339,
    text,
)
from tether.server.http.pagination import paginate, seq_page

MSG_ACKNOWLEDGED, MSG_DISPATCHED = 100, 101
SCHEDULED, SCHEDULE_DISPATCHED = 100, 101
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_RESERVED = {
    "content-type",
    "content-length",
    "nats-msg-id",
    "tether-priority",
    "tether-producer",
    "x-broker-metadata-headers",
}
_XID_ALPHABET = "0123456789abcdefghijklmnopqrstuv"


# Auto ids: the time, a random number per process (39 bits) and a counter (25 bits),
# like xid's time, per-process random and counter: no random draw per message.
_ID_RANDOM = secrets.randbits(39)
_id_counter = itertools.count(secrets.randbits(25))
_id_head: tuple[int, str] = (-1, "")
_XID_PAIRS = [a + b for a in _XID_ALPHABET for b in _XID_ALPHABET]


def _base32(value: int, chars: int) -> str:
    out = []
    for _ in range(chars):
        out.append(_XID_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_message_id() -> str:
    """A 20-character sortable id like webhook-broker's xid (time first): the base-32
    digits of ``seconds << 64 | process random << 25 | counter``."""
    global _id_head
    secs = int(time.time())
    n = next(_id_counter) & 0x1FF_FFFF
    if _id_head[0] != secs:
        _id_head = (secs, _base32((secs << 39) | _ID_RANDOM, 15))
    pairs = _XID_PAIRS
    return _id_head[1] + _XID_ALPHABET[n >> 20] + pairs[(n >> 10) & 1023] + pairs[n & 1023]


def payload_text(payload: bytes) -> str:
    return payload.decode("utf-8", "replace")


def message_body(api: Api, channel_id: str, view: MessageView) -> dict[str, Any]:
    reg = api.service.registry
    producer = reg.producers.get(view.producer)
    jobs = []
    for k in api.service.consumers_of(channel_id):
        jobs_view = api.service.views.get((k.channel, k.id))
        info = jobs_view.info(view.seq) if jobs_view is not None else None
        if info is not None:
            jobs.append(
                {
                    "ListenerEndpoint": k.callback,
                    "ListenerName": k.name,
                    "Status": info.status,
                    "StatusChangedAt": rfc3339(info.changed or view.ts),
                }
            )
    return {
        "ID": view.message_id,
        "Payload": payload_text(view.payload),
        "ContentType": view.content_type,
        "ProducedBy": producer.name if producer else view.producer,
        "ReceivedAt": rfc3339(view.ts),
        "DispatchedAt": rfc3339(view.ts),
        "Status": "DISPATCHED",
        "Jobs": jobs,
        "Headers": view.metadata,
    }


def _parse_schedule(raw: str) -> int | None:
    try:
        when = datetime.fromisoformat(raw.strip().replace("z", "Z"))
    except ValueError:
        return None
    if when.tzinfo is None or "T" not in raw.upper():
        return None
    return int(when.timestamp() * NS)


def _metadata(headers: Mapping[str, str]) -> dict[str, str] | Response:
    names = headers.get("x-broker-metadata-headers", "")
    if not names:
        return {}
    out: dict[str, str] = {}
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if not _TOKEN.fullmatch(name) or name.lower() in _RESERVED:
            return text(400, f"invalid metadata header name: {name!r}")
        value = headers.get(name.lower(), "")
        if value:
            out[name] = value
    return out


async def broadcast_message(
    api: Api, cid: str, headers: Mapping[str, str], body: bytes
) -> Response | str:
    """``POST /channel/{cid}/broadcast``: the message's ``Location`` once it is durable
    (the route answers 201 with it), else the refusal, in webhook-broker's order.
    ``headers`` maps lower-case names to the first value sent (Starlette's ``Headers``
    or the lean route's dict)."""
    checked = broadcaster(api, headers, cid)
    if isinstance(checked, Response):
        return checked
    producer = checked[1]
    metadata = _metadata(headers)
    if isinstance(metadata, Response):
        return metadata
    raw_priority = headers.get("x-broker-message-priority", "").strip()
    try:
        priority = abs(int(raw_priority)) if raw_priority else 0
    except ValueError:
        return text(400, "invalid X-Broker-Message-Priority: not an integer")
    if priority > 1_000_000:
        return text(400, "invalid X-Broker-Message-Priority: above 1000000")
    content_type = headers.get("content-type", "") or DEFAULT_CONTENT_TYPE
    settings = api.settings
    if len(body) > settings.max_payload:
        return text(413, "message payload too large")
    scheduled_for = headers.get("x-broker-scheduled-for", "")
    due = 0
    if scheduled_for:
        parsed = _parse_schedule(scheduled_for)
        if parsed is None:
            return text(
                400,
                "invalid date format for X-Broker-Scheduled-For, expected ISO-8601/RFC3339 format",
            )
        if parsed < time.time_ns() + int(settings.min_schedule_delay * NS):
            return text(412, "scheduled time must be at least the minimum delay in the future")
        due = parsed
    message_id = headers.get("x-broker-message-id", "") or new_message_id()
    if len(message_id) > 255:
        return text(400, "X-Broker-Message-ID is longer than 255 characters")
    service = api.service
    try:
        if due:
            await service.schedule(
                Scheduled(
                    channel=cid,
                    message_id=message_id,
                    producer=producer.id,
                    content_type=content_type,
                    priority=priority,
                    headers=metadata,
                    payload=body,
                    due_ns=due,
                    created_ns=time.time_ns(),
                )
            )
            return f"/channel/{cid}/scheduled-message/{path_segment(message_id)}"
        await service.broadcast(
            cid, producer.id, body, content_type, priority, message_id, metadata
        )
    except DuplicateMessage:
        return text(409, "duplicate message id for channel")
    except errors.ApiError as exc:
        return text(503 if exc.code >= 500 else 400, exc.description)
    return message_url(cid, message_id)


def routes(api: Api) -> list[Route]:
    service = api.service
    reg = service.registry

    async def broadcast(request: Request) -> Response:
        body = await request.body()
        result = await broadcast_message(
            api, request.path_params["channelId"], request.headers, body
        )
        if isinstance(result, Response):
            return result
        return Response(status_code=201, headers={"Location": result})

    async def message(request: Request) -> Response:
        cid = request.path_params["channelId"]
        seq = service.message_seq(cid, request.path_params["messageId"])
        view = await service.read(cid, seq) if seq is not None and cid in reg.channels else None
        if view is None:
            return text(404, NOT_FOUND)
        return json(message_body(api, cid, view))

    async def messages(request: Request) -> Response:
        cid = request.path_params["channelId"]
        stream = service.broker.streams.get(stream_name(cid))
        if cid not in reg.channels or stream is None:
            return text(404, NOT_FOUND)
        statuses = request.query_params.getlist("status")
        if statuses and str(MSG_DISPATCHED) not in statuses:
            return json({"Result": [], "Pages": {}, "Links": None})

        def older(seq: int, n: int) -> list[int]:
            out: list[int] = []
            while seq >= stream.first_seq and seq > 0 and len(out) < n:
                if stream.meta(seq) is not None:
                    out.append(seq)
                seq -= 1
            return out

        def newer(seq: int, n: int) -> list[int]:
            out: list[int] = []
            for s in stream.seqs(max(seq, 1)):
                out.append(s)
                if len(out) >= n:
                    break
            return out

        def ts_of(seq: int) -> int:
            meta = stream.meta(seq)
            return meta.ts if meta is not None else 0

        page, links = seq_page(request, stream.last_seq, older, newer, ts_of)
        views = await service.read_many(cid, page)
        by_seq = {v.seq: v for v in views}
        urls = [message_url(cid, by_seq[s].message_id) for s in page if s in by_seq]
        return json({"Result": urls, "Pages": links, "Links": None})

    async def messages_status(request: Request) -> Response:
        cid = request.path_params["channelId"]
        stream = service.broker.streams.get(stream_name(cid))
        if cid not in reg.channels or stream is None:
            return text(404, NOT_FOUND)
        counts: dict[str, Any] = {}
        if len(stream):
            counts["DISPATCHED"] = {
                "Count": len(stream),
                "Links": {"messages": f"/channel/{cid}/messages?status={MSG_DISPATCHED}"},
            }
        waiting = [s for s in reg.scheduled.values() if s.channel == cid]
        for label, code, group in (
            ("SCHEDULED_SCHEDULED", SCHEDULED, [s for s in waiting if not s.dispatched_ns]),
            ("SCHEDULED_DISPATCHED", SCHEDULE_DISPATCHED, [s for s in waiting if s.dispatched_ns]),
        ):
            if group:
                counts[label] = {
                    "Count": len(group),
                    "Links": {"messages": f"/channel/{cid}/scheduled-messages?status={code}"},
                }
        out: dict[str, Any] = {"counts": counts}
        pending = [s.due_ns for s in waiting if not s.dispatched_ns]
        if pending:
            out["next_scheduled_message_at"] = rfc3339(min(pending))
        return json(out)

    def scheduled_body(s: Scheduled) -> dict[str, Any]:
        return {
            "id": s.message_id,
            "messageId": s.message_id,
            "contentType": s.content_type,
            "priority": s.priority,
            "producedBy": s.producer,
            "dispatchSchedule": rfc3339(s.due_ns),
            "dispatchedAt": rfc3339(s.dispatched_ns) if s.dispatched_ns else None,
            "status": "DISPATCHED" if s.dispatched_ns else "SCHEDULED",
            "payload": payload_text(s.payload),
            "headers": s.headers,
        }

    async def scheduled_messages(request: Request) -> Response:
        cid = request.path_params["channelId"]
        if cid not in reg.channels:
            return text(404, NOT_FOUND)
        items = [s for s in reg.scheduled.values() if s.channel == cid]
        status = request.query_params.get("status", "")
        if status in (str(SCHEDULED), str(SCHEDULE_DISPATCHED)):
            want_dispatched = status == str(SCHEDULE_DISPATCHED)
            items = [s for s in items if bool(s.dispatched_ns) == want_dispatched]
        page, links = paginate(request, items, lambda s: (s.message_id, s.created_ns))
        urls = [f"/channel/{cid}/scheduled-message/{path_segment(s.message_id)}" for s in page]
        return json({"result": urls, "pages": links})

    async def scheduled_message(request: Request) -> Response:
        cid = request.path_params["channelId"]
        s = reg.scheduled.get((cid, request.path_params["messageId"]))
        if s is None:
            return text(404, NOT_FOUND)
        return json(scheduled_body(s))

    return [
        Route("/channel/{channelId}/broadcast", broadcast, methods=["POST"]),
        Route("/channel/{channelId}/message/{messageId:path}", message, methods=["GET"]),
        Route("/channel/{channelId}/messages", messages, methods=["GET"]),
        Route("/channel/{channelId}/messages-status", messages_status, methods=["GET"]),
        Route("/channel/{channelId}/scheduled-messages", scheduled_messages, methods=["GET"]),
        Route(
            "/channel/{channelId}/scheduled-message/{messageId:path}",
            scheduled_message,
            methods=["GET"],
        ),
    ]
