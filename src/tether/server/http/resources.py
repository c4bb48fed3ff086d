"""Producers, channels and consumers: GET/PUT (conditional), lists, consumer DELETE."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.engine.jobs.registry import Channel, Consumer, Producer, random_token, valid_id
from tether.server.http.auth import CHANNEL_TOKEN, CONSUMER_TOKEN, PRODUCER_TOKEN, revealed
from tether.server.http.common import (
    NOT_FOUND,
    UNSUPPORTED_MEDIA,
    Api,
    consumer_url,
    form_values,
    http_date,
    is_form,
    json,
    rfc3339,
    text,
    unmodified_check,
)
from tether.server.http.pagination import paginate

INVALID_ID = "invalid id: use 1 to 128 of A-Z a-z 0-9 _ -"


def _stakeholder(item_id: str, name: str, token: str, changed_ns: int) -> dict[str, Any]:
    return {"ID": item_id, "Name": name, "Token": token, "ChangedAt": rfc3339(changed_ns)}


def producer_body(p: Producer, token: str) -> dict[str, Any]:
    return _stakeholder(p.id, p.name, token, p.changed_ns)


def channel_body(c: Channel, token: str) -> dict[str, Any]:
    base = f"/channel/{c.id}"
    return {
        **_stakeholder(c.id, c.name, token, c.changed_ns),
        "ConsumersURL": f"{base}/consumers",
        "MessagesURL": f"{base}/messages",
        "BroadcastURL": f"{base}/broadcast",
        "MessagesStatusURL": f"{base}/messages-status",
    }


def consumer_body(k: Consumer, token: str) -> dict[str, Any]:
    return {
        **_stakeholder(k.id, k.name, token, k.changed_ns),
        "CallbackURL": k.callback,
        "DeadLetterQueueURL": f"{consumer_url(k.channel, k.id)}/dlq",
        "Type": k.type,
    }


def _modified(body: dict[str, Any], changed_ns: int) -> Response:
    return json(body, headers={"Last-Modified": http_date(changed_ns)})


async def _update_form(request: Request, existing_changed: int | None) -> dict[str, str] | Response:
    """415 unless a form; for an existing resource the conditional check (400/412)."""
    if not is_form(request):
        return text(415, UNSUPPORTED_MEDIA)
    if existing_changed is not None:
        refused = unmodified_check(request, existing_changed)
        if refused is not None:
            return refused
    form = await form_values(request)
    if form is None:
        return text(400, "malformed form body")
    return form


def routes(api: Api) -> list[Route]:
    service = api.service
    reg = service.registry

    async def producers(request: Request) -> Response:
        page, links = paginate(
            request, list(reg.producers.values()), lambda p: (p.id, p.created_ns)
        )
        return json({"Result": [f"/producer/{p.id}" for p in page], "Pages": links, "Links": None})

    async def producer(request: Request) -> Response:
        pid = request.path_params["producerId"]
        p = reg.producers.get(pid)
        if request.method == "GET":
            if p is None:
                return text(404, NOT_FOUND)
            return _modified(
                producer_body(p, revealed(request, PRODUCER_TOKEN, p.token_hash)), p.changed_ns
            )
        form = await _update_form(request, p.changed_ns if p else None)
        if isinstance(form, Response):
            return form
        if not valid_id(pid):
            return text(400, INVALID_ID)
        token = form.get("token") or random_token()
        p = await service.put_producer(pid, form.get("name") or pid, token)
        return _modified(producer_body(p, token), p.changed_ns)

    async def channels(request: Request) -> Response:
        page, links = paginate(request, list(reg.channels.values()), lambda c: (c.id, c.created_ns))
        return json({"Result": [f"/channel/{c.id}" for c in page], "Pages": links, "Links": None})

    async def channel(request: Request) -> Response:
        cid = request.path_params["channelId"]
        c = reg.channels.get(cid)
        if request.method == "GET":
            if c is None:
                return text(404, NOT_FOUND)
            return _modified(
                channel_body(c, revealed(request, CHANNEL_TOKEN, c.token_hash)), c.changed_ns
            )
        form = await _update_form(request, c.changed_ns if c else None)
        if isinstance(form, Response):
            return form
        if not valid_id(cid):
            return text(400, INVALID_ID)
        token = form.get("token") or random_token()
        c = await service.put_channel(cid, form.get("name") or cid, token)
        return _modified(channel_body(c, token), c.changed_ns)

    async def consumers(request: Request) -> Response:
        cid = request.path_params["channelId"]
        if cid not in reg.channels:
            return text(404, NOT_FOUND)
        page, links = paginate(request, service.consumers_of(cid), lambda k: (k.id, k.created_ns))
        urls = [consumer_url(cid, k.id) for k in page]
        return json({"Result": urls, "Pages": links, "Links": None})

    async def consumer(request: Request) -> Response:
        cid = request.path_params["channelId"]
        kid = request.path_params["consumerId"]
        k = reg.consumers.get((cid, kid))
        if request.method == "GET":
            if k is None:
                return text(404, NOT_FOUND)
            token = revealed(request, CONSUMER_TOKEN, k.token_hash)
            return _modified(consumer_body(k, token), k.changed_ns)
        if request.method == "DELETE":
            if k is None:
                return text(404, NOT_FOUND)
            refused = unmodified_check(request, k.changed_ns)
            if refused is not None:
                return refused
            await service.delete_consumer(k)
            return Response(status_code=204)
        return await _put_consumer(request, cid, kid, k)

    async def _put_consumer(request: Request, cid: str, kid: str, k: Consumer | None) -> Response:
        if not is_form(request):
            return text(415, UNSUPPORTED_MEDIA)
        if cid not in reg.channels:
            return text(404, NOT_FOUND)
        form = await _update_form(request, k.changed_ns if k else None)
        if isinstance(form, Response):
            return form
        if not valid_id(kid):
            return text(400, INVALID_ID)
        callback = form.get("callbackUrl", "")
        parts = urlsplit(callback)
        kind = form.get("type", "") or "push"
        # A pull consumer is never called back: its callbackUrl may be left out (webhook-
        # broker requires one for every consumer); one that is given must still be a URL.
        if (callback or kind != "pull") and (not parts.scheme or not parts.netloc):
            return text(400, "Bad Request: callbackUrl must be an absolute URL")
        if kind not in ("push", "pull"):
            return text(400, f"invalid consumerType: {kind}")
        if kind == "push" and parts.scheme not in ("http", "https"):
            return text(400, "Bad Request: a push consumer's callbackUrl must be http or https")
        token = form.get("token") or random_token()
        k = await service.put_consumer(cid, kid, form.get("name") or kid, token, callback, kind)  # type: ignore[arg-type]
        return _modified(consumer_body(k, token), k.changed_ns)

    return [
        Route("/producers", producers, methods=["GET"]),
        Route("/producer/{producerId}", producer, methods=["GET", "PUT"]),
        Route("/channels", channels, methods=["GET"]),
        Route("/channel/{channelId}", channel, methods=["GET", "PUT"]),
        Route("/channel/{channelId}/consumers", consumers, methods=["GET"]),
        Route(
            "/channel/{channelId}/consumer/{consumerId}", consumer, methods=["GET", "PUT", "DELETE"]
        ),
    ]
