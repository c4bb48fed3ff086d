"""Who may do what: token checks in webhook-broker's order, gateway HMAC, body limits.

Token checks compare salted digests in constant time. The orders of the checks (and so
which error a caller sees first) are webhook-broker's; see docs/http-api.md.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tether.engine.jobs import Channel, Consumer, Producer
from tether.engine.jobs.registry import verify_token as _verify_token
from tether.protocol.numbers import parse_uint
from tether.server.http.common import NOT_FOUND, Api, text

log = logging.getLogger("tether.http")

CHANNEL_TOKEN = "x-broker-channel-token"
PRODUCER_ID = "x-broker-producer-id"
PRODUCER_TOKEN = "x-broker-producer-token"
CONSUMER_TOKEN = "x-broker-consumer-token"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# Tokens that matched a stored digest, with that digest: a producer or consumer sends
# the same token on every request, and a set lookup is cheaper than a salted SHA-256.
# Only matches are kept (a changed token has a new digest, so old entries go unused).
_MATCHED: set[tuple[str, str]] = set()
_MATCHED_MAX = 4096


def verify_token(token: str | None, stored: str) -> bool:
    """:func:`tether.engine.jobs.registry.verify_token`, remembering the matches."""
    if token is None:
        return False
    if (stored, token) in _MATCHED:
        return True
    if not _verify_token(token, stored):
        return False
    if len(_MATCHED) >= _MATCHED_MAX:
        _MATCHED.clear()
    _MATCHED.add((stored, token))
    return True


def _token_refused(kind: str, header: str, given: str | None) -> Response:
    """403, in webhook-broker's words when a token was sent; naming the header when not."""
    log.debug("http: %s token refused (%s)", kind, "missing" if not given else "no match")
    if not given:
        name = "-".join(part.capitalize() for part in header.split("-"))
        return text(403, f"{kind} token is missing: send it in the {name} header")
    return text(403, f"{kind} token does not match")


def broadcaster(
    api: Api, headers: Mapping[str, str], channel_id: str
) -> tuple[Channel, Producer] | Response:
    """Broadcast: channel 404 → channel token 403 → producer 401 → producer token 403."""
    reg = api.service.registry
    channel = reg.channels.get(channel_id)
    if channel is None:
        return text(404, NOT_FOUND)
    if not verify_token(headers.get(CHANNEL_TOKEN), channel.token_hash):
        return _token_refused("channel", CHANNEL_TOKEN, headers.get(CHANNEL_TOKEN))
    producer = reg.producers.get(headers.get(PRODUCER_ID, ""))
    if producer is None:
        return text(401, "producer could not be found")
    if not verify_token(headers.get(PRODUCER_TOKEN), producer.token_hash):
        return _token_refused("producer", PRODUCER_TOKEN, headers.get(PRODUCER_TOKEN))
    return channel, producer


def pull_consumer(
    api: Api, request: Request, channel_id: str, consumer_id: str, *, pull: bool = True
) -> Consumer | Response:
    """Pull routes: channel 404 → channel token 403 → consumer 401 → consumer token 403
    → not pull 412. With ``pull=False`` (dead-letter deletes) a missing consumer is 404
    and any type is accepted, as in webhook-broker."""
    reg = api.service.registry
    channel = reg.channels.get(channel_id)
    if channel is None:
        return text(404, NOT_FOUND)
    if not verify_token(request.headers.get(CHANNEL_TOKEN), channel.token_hash):
        return _token_refused("channel", CHANNEL_TOKEN, request.headers.get(CHANNEL_TOKEN))
    consumer = reg.consumers.get((channel_id, consumer_id))
    if consumer is None:
        return text(401, "consumer could not be found") if pull else text(404, NOT_FOUND)
    if not verify_token(request.headers.get(CONSUMER_TOKEN), consumer.token_hash):
        return _token_refused("consumer", CONSUMER_TOKEN, request.headers.get(CONSUMER_TOKEN))
    if pull and consumer.type != "pull":
        return text(412, "consumer not pull based")
    return consumer


def parse_job_id(job_id: str) -> tuple[int, int] | None:
    """Job ids are ``<consumer number>-<stream sequence>``."""
    num, sep, seq = job_id.partition("-")
    if not sep or len(job_id) > 40:
        return None
    n, s = parse_uint(num), parse_uint(seq)
    return None if n is None or s is None else (n, s)


def job_of(api: Api, consumer: Consumer, job_id: str) -> int | Response:
    """The job's sequence: 404 if there is no such job, 401 if it is another consumer's."""
    parsed = parse_job_id(job_id)
    if parsed is None:
        return text(404, "job could not be found")
    num, seq = parsed
    owner = api.service.registry.by_num.get(num)
    if owner is None:
        return text(404, "job could not be found")
    view = api.service.views.get((owner.channel, owner.id))
    if view is None or view.status(seq) is None:
        return text(404, "job could not be found")
    if owner is not consumer and (owner.channel, owner.id) != (consumer.channel, consumer.id):
        return text(401, "job could not be found")
    return seq


def revealed(request: Request, header: str, token_hash: str) -> str:
    """A token is shown only to a caller that sent it (it is stored hashed): GETs of
    producers, channels and consumers otherwise answer ``Token: ""``."""
    given = request.headers.get(header)
    return given if given and verify_token(given, token_hash) else ""


# -- middleware ------------------------------------------------------------------------------------

# X-Request-IDs are correlation ids, not secrets: a random prefix per process and a
# counter (20 hex digits, as before) instead of a getrandom syscall per request.
_RID_PREFIX = secrets.token_hex(5)
_rid_counter = itertools.count(secrets.randbits(32))


def new_request_id() -> bytes:
    return f"{_RID_PREFIX}{next(_rid_counter) & 0xFF_FFFF_FFFF:010x}".encode()


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` (already read) once, then defers to
    ``receive`` (for the disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class GatewayMiddleware:
    """In front of every route: echo ``X-Request-ID`` (or a new one), cap the request
    body (413, read whole before any handler runs, so nothing half-reads), and when a
    secret is set check webhook-broker's gateway HMAC: ``X-Broker-Signature:
    t=<unix>,v1=<hex>`` over ``"{t}.{raw body}"``; missing/malformed 401, stale or
    wrong 403; paths under an exempt prefix pass."""

    def __init__(
        self,
        app: AsgiApp,
        max_body: int,
        secret: str | None = None,
        tolerance: float = 300.0,
        exempt: list[str] | None = None,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.secret = secret.encode() if secret else None
        self.tolerance = tolerance
        self.exempt = tuple(exempt or ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = b""
        signature = ""
        length = -1
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value[:128]
            elif name == b"content-length":
                length = content_length(value)
            elif name == b"x-broker-signature":
                signature = value.decode("latin-1")
        rid = rid or new_request_id()
        body = await self.admit(scope, receive, send, rid, length, signature)
        if body is None:
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, replay_body(body, receive), send_with_id)

    async def admit(
        self, scope: Scope, receive: Receive, send: Send, rid: bytes, length: int, signature: str
    ) -> bytes | None:
        """The whole request body, or None when the request has been answered (413, the
        gateway's 401/403) or the client went away. ``rid``, ``length`` and ``signature``
        are the last ``X-Request-ID`` (or a new id), ``Content-Length`` (-1 if absent or
        not digits) and ``X-Broker-Signature`` of the request."""
        if length > self.max_body:
            await _reply(send, 413, "request body too large", rid)
            return None
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client went away
        body: bytes = message.get("body", b"")
        if len(body) > self.max_body:
            await _reply(send, 413, "request body too large", rid)
            return None
        if message.get("more_body", False):
            chunks = [body]
            size = len(body)
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body:
                    await _reply(send, 413, "request body too large", rid)
                    return None
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
        if self.secret is not None and not str(scope["path"]).startswith(self.exempt):
            refusal = self._check(signature, body)
            if refusal is not None:
                log.debug("http: %s refused by the gateway: %s", scope["path"], refusal[1])
                await _reply(send, *refusal, rid)
                return None
        return body

    def verify(self, path: str, header: str, body: bytes) -> tuple[int, str] | None:
        """The gateway's refusal of a request it did not read itself (status and text),
        or None: the signature is good, not needed (no secret), or the path is exempt."""
        if self.secret is None or path.startswith(self.exempt):
            return None
        return self._check(header, body)

    def _check(self, header: str, body: bytes) -> tuple[int, str] | None:
        assert self.secret is not None
        if not header:
            return 401, "missing X-Broker-Signature header"
        parsed = _parse_signature(header)
        if parsed is None:
            return 401, "malformed X-Broker-Signature header"
        stamp, signature = parsed
        if abs(time.time() - stamp) > self.tolerance:
            return 403, "request timestamp outside tolerance window"
        expected = hmac.new(self.secret, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            return 403, "invalid signature"
        return None


async def _reply(send: Send, status: int, message: str, rid: bytes) -> None:
    body = message.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", rid),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def content_length(value: bytes) -> int:
    """The declared body length, or -1 when there is none worth believing."""
    length = parse_uint(value)
    return -1 if length is None else length


def _parse_signature(header: str) -> tuple[int, str] | None:
    parts = header.split(",")
    if len(parts) != 2:
        return None
    stamp: int | None = None
    signature: str | None = None
    for part in (p.strip() for p in parts):
        if part.startswith("t="):
            stamp = parse_uint(part[2:])
            if stamp is None:
                return None
        elif part.startswith("v1="):
            signature = part[3:]
    if stamp is None or signature is None:
        return None
    return stamp, signature


def signature_header(secret: str, body: bytes, stamp: int | None = None) -> str:
    """The header a caller sends (for tests and clients)."""
    t = int(time.time()) if stamp is None else stamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"
