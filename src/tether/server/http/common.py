"""Shared pieces of the webhook-broker HTTP API: responses, dates, forms, settings.

Conventions are webhook-broker's: JSON bodies with Go's PascalCase field names and
plain-text error bodies (the error string), never JSON errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import msgspec
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from tether.engine.jobs import WebhookService

NS = 1_000_000_000
FORM = "application/x-www-form-urlencoded"
NOT_FOUND = "Request resource not found"
UNSUPPORTED_MEDIA = "Media type not supported"
MISSING_CONDITION = "Bad Request: Update is missing `If-Unmodified-Since` header "
CONDITION_FAILED = "Update failed due to mismatch of `If-Unmodified-Since` header value"

_encoder = msgspec.json.Encoder()
S = TypeVar("S", bound=msgspec.Struct)


@dataclass(slots=True)
class ApiSettings:
    """What the HTTP handlers need besides the service."""

    token_header: str = "X-Broker-Consumer-Token"
    min_schedule_delay: float = 120.0
    max_payload: int = 1024 * 1024
    max_claim: int = 100
    max_claim_wait: float = 30.0


@dataclass(slots=True)
class Api:
    """The handlers' context: the service plus the waiters of long-polling claims."""

    service: WebhookService
    settings: ApiSettings
    # Consumer key → futures of claims waiting for jobs.
    waiters: dict[tuple[str, str], set[Any]] = field(default_factory=dict)

    def wake(self, key: tuple[str, str]) -> None:
        for fut in self.waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)


def decode_body(body: bytes, type_: type[S], empty_ok: bool = False) -> S:
    """A JSON request body as ``type_`` (a struct whose fields carry their limits).

    Raises ValueError with a message for the client on anything else: empty when a body
    is required, not JSON, wrong types or ranges, or nested too deeply to decode.
    """
    if not body.strip():
        if empty_ok:
            return msgspec.convert({}, type_)
        raise ValueError("a JSON body is required")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid JSON body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise ValueError("malformed JSON body: nested too deeply") from None


def text(status: int, message: str = "") -> Response:
    return Response(message, status_code=status, media_type="text/plain; charset=utf-8")


def json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, media_type="application/json", headers=headers
    )


# The last second formatted: a claim answers every job's deadline, mostly the same second.
_last_second: tuple[int, str] = (-1, "")


def rfc3339(ns: int) -> str:
    """Go's ``time.Time`` JSON form (RFC 3339 with nanoseconds, trailing zeros cut)."""
    global _last_second
    if ns <= 0:
        return "0001-01-01T00:00:00Z"
    secs, frac = divmod(ns, NS)
    cached_secs, base = _last_second
    if secs != cached_secs:
        base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _last_second = (secs, base)
    if not frac:
        return base + "Z"
    return f"{base}.{frac:09d}".rstrip("0") + "Z"


def http_date(ns: int) -> str:
    return formatdate(ns // NS, usegmt=True)


def unmodified_check(request: Request, changed_ns: int) -> Response | None:
    """webhook-broker's conditional update: missing header 400, different 412."""
    given = request.headers.get("if-unmodified-since", "")
    if not given:
        return text(400, MISSING_CONDITION)
    if given == http_date(changed_ns):
        return None
    try:
        when = parsedate_to_datetime(given)
    except (TypeError, ValueError):
        return text(412, CONDITION_FAILED)
    if when.tzinfo is None or int(when.timestamp()) != changed_ns // NS:
        return text(412, CONDITION_FAILED)
    return None


def is_form(request: Request) -> bool:
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return ctype == FORM


async def form_values(request: Request) -> dict[str, str] | None:
    """The urlencoded form (first value per key), or None if it cannot be parsed."""
    try:
        form = await request.form(max_files=0, max_fields=100)
    except Exception:  # malformed bodies must give a 400, whatever the parser raises
        return None
    out: dict[str, str] = {}
    for key, value in form.multi_items():
        if isinstance(value, str):
            out.setdefault(key, value)
    return out


def path_segment(value: str) -> str:
    if value.isalnum() and value.isascii():
        return value  # generated ids and most given ones: nothing to escape
    return quote(value, safe="")


def channel_url(channel: str) -> str:
    return f"/channel/{channel}"


def consumer_url(channel: str, consumer: str) -> str:
    return f"/channel/{channel}/consumer/{consumer}"


def message_url(channel: str, message_id: str) -> str:
    return f"/channel/{channel}/message/{path_segment(message_id)}"


def job_url(channel: str, consumer: str, job_id: str) -> str:
    return f"{consumer_url(channel, consumer)}/job/{job_id}"
