"""Request bodies at the NATS front door, read the way nats-server reads them.

nats-server decodes every JSON body with Go's ``encoding/json`` into a typed struct:

* bytes that are not UTF-8 inside a string become U+FFFD (they never fail a request),
* a ``null`` leaves a field at its zero value (a ``null`` body is an empty request),
* a number must fit the field's Go type (``int`` is int64, sequences are uint64),
* the ``$JS.API`` handlers refuse unknown fields (2.15 runs them in strict mode).

Everything a client can get wrong in a body ends here as a :class:`BodyError` (the
API handlers answer it with 400/10025 ``invalid JSON``), never as an exception
escaping a handler: bodies nested deeper than :data:`MAX_DEPTH` are refused before
they reach a decoder, whose recursion would otherwise be the interpreter's limit.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec

from tether.engine import errors

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
MAX_DEPTH = 64  # real requests nest 4 or 5 levels (a stream source's transforms)

Int = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]  # Go's int
# Go's uint64, to the extent msgspec checks bounds (int64): no store gets that far.
Seq = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]

_decode_any = msgspec.json.Decoder().decode
_encode_any = msgspec.json.Encoder().encode
# A JSON string (so that brackets inside one do not count towards the depth).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


# The JetStream API level (ADR-44) whose features Tether implements: reported as
# ``api.level`` in account info, and what ``Nats-Required-Api-Level`` is checked against.
API_LEVEL = 4  # nats-server 2.14's
_REQUIRED_LEVEL = b"\r\nNats-Required-Api-Level:"
_GO_ATOI = re.compile(rb"[+-]?[0-9]+")


def api_level_unmet(headers: bytes | None) -> bool:
    """A request needs a higher API level than :data:`API_LEVEL` (or names one that is not
    a number), as nats-server's ``errorOnRequiredApiLevel`` decides."""
    if not headers:
        return False
    i = headers.find(_REQUIRED_LEVEL)
    if i < 0:
        return False
    start = i + len(_REQUIRED_LEVEL)
    end = headers.find(b"\r\n", start)
    value = headers[start : end if end >= 0 else len(headers)].lstrip(b" \t")
    if not value:
        return False
    return _GO_ATOI.fullmatch(value) is None or int(value) > API_LEVEL


def required_api_level() -> errors.ApiError:
    return errors.ApiError(412, 10185, "JetStream minimum api level required")


class BodyError(ValueError):
    """A body nats-server would not decode; ``str(exc)`` says why (Go's words where
    they are known)."""


def go_text(body: bytes) -> bytes:
    """``body`` with every sequence that is not UTF-8 replaced by U+FFFD, as Go's JSON
    decoder reads strings (outside strings such bytes stay a syntax error)."""
    if body.isascii():
        return body
    try:
        body.decode()
    except UnicodeDecodeError:
        return body.decode("utf-8", "replace").encode()
    return body


def is_utf8(text: str) -> bool:
    """Whether ``text`` came from valid UTF-8: the parser keeps other bytes of a subject
    as surrogate escapes, which neither storage nor JSON can hold."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects in ``body`` nest deeper than ``limit``."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the common case: too few brackets to nest that deep
    depth = 0
    for byte in _STRING.sub(b"", body).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def checked_json(body: bytes) -> bytes:
    """A body fit for a JSON decoder (valid UTF-8, bounded depth); BodyError if not.

    For bodies handed on to the engine's own decoders (stream and consumer configs).
    """
    text = go_text(body.strip())
    if too_deep(text):
        raise BodyError("exceeded max depth")
    return text


def load(body: bytes) -> Any:
    """Any JSON document, checked as :func:`checked_json` checks it."""
    try:
        return _decode_any(checked_json(body))
    except msgspec.DecodeError as exc:
        raise BodyError(str(exc)) from None


def encode_json(doc: Any) -> bytes:
    """A reply as JSON. A string holding surrogates (bytes a client sent that were not
    UTF-8, kept as escapes) is written with U+FFFD in their place, as Go writes them."""
    try:
        return _encode_any(doc)
    except UnicodeEncodeError:
        return _encode_any(_go_strings(doc))


def _go_strings(doc: Any) -> Any:
    if isinstance(doc, str):
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in doc)
    if isinstance(doc, dict):
        return {_go_strings(k): _go_strings(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_go_strings(v) for v in doc]
    return doc


R = TypeVar("R", bound=msgspec.Struct)


def decode_as(body: bytes, kind: type[R]) -> R:
    """A JSON object into ``kind``; ``null`` (the body or a field) keeps the defaults.

    Unknown fields are refused when ``kind`` forbids them, as nats-server's strict
    decoding does; BodyError for anything else that does not fit.
    """
    doc = load(body)
    if doc is None:
        return kind()
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if v is not None}
    try:
        return msgspec.convert(doc, kind)  # anything but an object: "Expected `object`"
    except msgspec.ValidationError as exc:
        raise BodyError(str(exc)) from None


def is_json_object_or_array(payload: bytes) -> bool:
    """nats-server's ``isJSONObjectOrArray``: bodies that are anything else are ignored."""
    return payload.lstrip().startswith((b"{", b"["))


def is_empty_request(payload: bytes) -> bool:
    """nats-server's ``isEmptyRequest``: no body, or a JSON object without fields."""
    body = payload.strip()
    if not body or body == b"{}":
        return True
    try:
        doc = load(body)
    except BodyError:
        return False
    return isinstance(doc, dict) and not doc


def decode_request(payload: bytes, kind: type[R]) -> R:
    """An API request body; like nats-server, one that is not a JSON object or array
    is ignored (the defaults). Bad ones get 10025."""
    if not is_json_object_or_array(payload):
        return kind()
    return decode_required(payload, kind)


def decode_required(payload: bytes, kind: type[R]) -> R:
    """An API request body that is always decoded (an empty one is refused before)."""
    try:
        return decode_as(payload, kind)
    except BodyError as exc:
        raise errors.invalid_json(str(exc)) from None


def require_empty(payload: bytes) -> None:
    """Requests that take no body (delete, consumer info): 10038 for one, as nats-server."""
    if not is_empty_request(payload):
        raise errors.ApiError(400, 10038, "expected an empty request payload")


def checked_body(payload: bytes) -> bytes:
    """A body for the engine's config decoders: 10025 unless :func:`checked_json`
    passes it or if it holds a number no Go integer field holds; a ``null`` body
    (which Go decodes as nothing) is an empty object."""
    try:
        body = checked_json(payload)
    except BodyError as exc:
        raise errors.invalid_json(str(exc)) from None
    if body == b"null":
        return b"{}"
    if body:
        try:
            doc = _decode_any(body)
        except msgspec.DecodeError:
            return body  # the engine's decoder says what is wrong with it
        big = _past_int64(doc)
        if big is not None:
            raise errors.invalid_json(f"json: cannot unmarshal number {big} into an int64")
    return body


def _past_int64(doc: Any) -> int | None:
    """The first integer in ``doc`` outside int64, if any (every integer field of a
    stream or consumer configuration is an int64 or a sequence the store keeps as one)."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


# -- the bodies --------------------------------------------------------------------------------


class StreamInfoRequest(msgspec.Struct, forbid_unknown_fields=True):
    deleted_details: bool = False
    subjects_filter: str = ""
    offset: Int = 0


class PagedRequest(msgspec.Struct, forbid_unknown_fields=True):
    """STREAM.NAMES / STREAM.LIST."""

    offset: Int = 0
    subject: str = ""


class ConsumersRequest(msgspec.Struct, forbid_unknown_fields=True):
    """CONSUMER.NAMES / CONSUMER.LIST."""

    offset: Int = 0


class PurgeRequest(msgspec.Struct, forbid_unknown_fields=True):
    filter: str = ""
    seq: Seq = 0
    keep: Seq = 0


class MsgDeleteRequest(msgspec.Struct, forbid_unknown_fields=True):
    seq: Seq = 0
    no_erase: bool = False


class PauseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """CONSUMER.PAUSE: a Go ``time.Time`` is a JSON string (RFC 3339)."""

    pause_until: str = ""


class DirectGetRequest(msgspec.Struct):
    """DIRECT.GET's body (nats-server decodes it leniently: unknown fields pass)."""

    seq: Seq = 0
    last_by_subj: str = ""
    next_by_subj: str = ""
    batch: Int = 0
    max_bytes: Int = 0
    start_time: str | None = None
    multi_last: list[str] | None = None
    up_to_seq: Seq = 0
    up_to_time: str | None = None
    no_hdr: bool = False


class MsgGetRequest(DirectGetRequest, forbid_unknown_fields=True):
    """STREAM.MSG.GET's body (strict)."""
