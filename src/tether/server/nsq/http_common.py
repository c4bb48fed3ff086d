"""What nsqd's and nsqlookupd's HTTP APIs share: query strings read as Go reads them,
request bodies read up to a limit, and answers in their two shapes.

nsq 1.x answers with the data itself (``{"topics": [...]}``, ``OK``) and errors as
``{"message": "TOPIC_NOT_FOUND"}``, with ``X-NSQ-Content-Type: nsq; version=1.0``; this
is what a client gets by default and when it sends ``Accept: application/vnd.nsq;
version=1.0`` (pynsq and go-nsq do, and read the bare shape). Releases before 1.0
wrapped everything in ``{"status_code": 200, "status_txt": "OK", "data": ...}``; a
client asking for any other ``application/vnd.nsq`` version gets that envelope.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_plus

import msgspec

from tether.server.http.auth import Receive, Scope, Send

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_encode = msgspec.json.Encoder().encode
NSQ_CONTENT_TYPE = (b"x-nsq-content-type", b"nsq; version=1.0")


class HttpError(Exception):
    """An error answer: status and nsqd's code (``MISSING_ARG_TOPIC``)."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status = status
        self.code = code


class Query:
    """A query string as Go's ``url.ParseQuery`` reads it: a malformed escape or a
    semicolon makes it invalid (``INVALID_REQUEST``); the first value of a key counts."""

    def __init__(self, raw: bytes) -> None:
        self.values: dict[str, list[str]] = {}
        text = raw.decode("latin-1")
        if not text:
            return
        for part in text.split("&"):
            if not part:
                continue
            if ";" in part or _BAD_ESCAPE.search(part):
                raise HttpError(400, "INVALID_REQUEST")
            key, _, value = part.partition("=")
            name = unquote_plus(key, encoding="utf-8", errors="surrogateescape")
            self.values.setdefault(name, []).append(
                unquote_plus(value, encoding="utf-8", errors="surrogateescape")
            )

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def __contains__(self, key: str) -> bool:
        return key in self.values


def wants_envelope(scope: Scope) -> bool:
    """Whether the client asked for the pre-1.0 envelope (see the module docstring)."""
    for name, value in scope["headers"]:
        if name == b"accept":
            accept = value.decode("latin-1").lower()
            if "application/vnd.nsq" in accept:
                return "version=1.0" not in accept.replace(" ", "")
    return False


def header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (the rest is left unread)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away: the answer goes nowhere
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def respond(
    send: Send, status: int, data: Any, *, envelope: bool = False, plain: bool = False
) -> None:
    """nsqd's answer: ``data`` (text, bytes, JSON-able, or None) with ``status``; an
    error status makes ``data`` the error code."""
    headers: list[tuple[bytes, bytes]] = []
    if envelope:
        text = "OK" if status == 200 else str(data)
        body = _encode(
            {"status_code": status, "status_txt": text, "data": data if status == 200 else None}
        )
        headers.append((b"content-type", b"application/json; charset=utf-8"))
    elif status != 200:
        body = _encode({"message": str(data)})
        headers.append((b"content-type", b"application/json; charset=utf-8"))
    elif data is None:
        body = b""
    elif isinstance(data, str):
        body = data.encode()
        if plain:
            headers.append((b"content-type", b"text/plain; charset=utf-8"))
    elif isinstance(data, bytes):
        body = data
        if plain:
            headers.append((b"content-type", b"text/plain; charset=utf-8"))
    else:
        body = _encode(data)
        headers.append((b"content-type", b"application/json; charset=utf-8"))
    if not plain and not envelope:
        headers.append(NSQ_CONTENT_TYPE)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


Handler = Callable[[Scope, Receive, Query], Awaitable[Any]]
