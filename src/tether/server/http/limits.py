"""Bounds on what one HTTP client may cost: header size and count, slow or idle
connections, and how many connections at once.

uvicorn's httptools protocol has no header limit of its own (a 100 MB header is read
into memory and answered), and nothing times out a client that sends its request a
byte at a time. :func:`bounded_protocol` returns its subclass with nginx-like bounds:

* the request line and headers together at most ``max_header_bytes`` (nginx: 4 buffers of
  8 KiB, 32 KiB), at most ``max_headers`` header lines → ``431`` and the connection
  closed;
* the whole head within ``header_timeout`` seconds of its first byte (nginx's
  ``client_header_timeout``, 60 s), then at most ``body_timeout`` seconds between two
  reads of the body (``client_body_timeout``, 60 s) → ``408`` and closed;
* ``idle_timeout`` seconds for a kept-alive connection between requests (nginx's
  ``keepalive_timeout``, 75 s), and ``max_connections`` connections at once; past that
  a request is answered ``503`` (both uvicorn's own mechanisms).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout: float = 60.0
    body_timeout: float = 60.0
    idle_timeout: float = 75.0
    max_connections: int = 1024


def _reply(status: bytes, text: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(text), text)
    )


_TOO_LARGE = _reply(b"431 Request Header Fields Too Large", b"request header fields too large")
_TIMEOUT = _reply(b"408 Request Timeout", b"request timeout")


class _BoundedProtocol(HttpToolsProtocol):
    limits = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._in_body = False
        self._head_bytes = 0
        self._head_parsed = 0  # the head's bytes as parsed (a read may hold body bytes too)
        self._header_count = 0
        self._too_large = False
        self._deadline: asyncio.TimerHandle | None = None

    # -- timers ------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if (self._in_head or self._in_body) and not self.transport.is_closing():
            self._refuse(_TIMEOUT)

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        self._in_head = self._in_body = False
        self.transport.write(response)
        self.transport.close()

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A client that connects and says nothing is timed out like a slow head.
        self._in_head = True
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self._in_head:
            self._head_bytes += len(data)
        elif self._in_body:
            self._arm(self.limits.body_timeout)
        super().data_received(data)
        if self._too_large or (self._in_head and self._head_bytes > self.limits.max_header_bytes):
            self._refuse(_TOO_LARGE)

    # -- parser callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_count = 0
        self._head_parsed = 0
        self._arm(self.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._head_parsed += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_parsed += len(name) + len(value) + 4  # ": " and CRLF
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._too_large = True
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        # The reads so far may end with body bytes: the head is what the parser took.
        self._head_bytes = 0
        if self._too_large or self._head_parsed > self.limits.max_header_bytes:
            self._too_large = True
            return  # answered 431 once the parser returns, no request is started
        self._in_body = True
        self._arm(self.limits.body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        if self._too_large:
            return
        super().on_message_complete()

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        super().on_body(body)


def bounded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``limits`` applied."""
    return type("BoundedHttpProtocol", (_BoundedProtocol,), {"limits": limits})
