"""NATS over WebSocket, as nats-server's ``websocket { }`` listener serves it.

The protocol is the same: a :class:`~tether.server.nats.connection.ClientConnection`
reads the bytes of every text, binary and continuation frame as one stream (a command
may span frames, a frame may hold many), and each of its writes goes out as one binary
frame, INFO alone in the first. :class:`WebSocketProtocol` owns the socket: it answers
the upgrade request (any path; an Origin that the settings do not let in gets 403) and
hands the connection a transport (:class:`_FrameTransport`) whose ``write`` frames.

The WebSocket wire format comes from the ``websockets`` package's sans-I/O protocol:
it parses the request, negotiates permessage-deflate, masks and unmasks, answers pings
and closes, and leaves every read and write to this module, so that a write is a plain
call as on any other client connection and the socket's own buffer is what the outbound
limits measure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

from tether.server.config import ServerConfig
from tether.server.nats.connection import ClientConnection

log = logging.getLogger("tether.nats")

_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
_BROWSER_FRAME = 4096  # nats-server caps frames to browsers (User-Agent Mozilla/...)
_MAX_MESSAGE = 64 * 1024 * 1024


class WebSocketClient(ClientConnection):
    """A client connected through the WebSocket listener (INFO names that listener)."""


class OriginCheck:
    """nats-server's rules: no Origin header passes; ``same_origin`` wants the Origin's
    host and port to be the request's Host; ``allowed_origins`` lists scheme, host and
    port (each default port filled in)."""

    def __init__(self, same_origin: bool, allowed: list[str], tls: bool) -> None:
        self.same_origin = same_origin
        self.tls = tls
        self.allowed: dict[str, tuple[str, int]] = {}
        for url in allowed:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            self.allowed[host] = (parts.scheme, parts.port or _default_port(parts.scheme))

    @property
    def active(self) -> bool:
        return self.same_origin or bool(self.allowed)

    def refuses(self, headers: Headers) -> str | None:
        """Why the request's Origin is not let in, or ``None``."""
        if not self.active:
            return None
        origin = headers.get("Origin") or headers.get("Sec-WebSocket-Origin")
        if not origin:
            return None
        try:
            parts = urlsplit(origin)
            host = (parts.hostname or "").lower()
            port = parts.port or _default_port(parts.scheme)
        except ValueError:
            return "invalid origin"
        if not parts.scheme or not host:
            return "invalid origin"
        if self.same_origin:
            try:
                own = urlsplit(("https://" if self.tls else "http://") + headers.get("Host", ""))
                own_host, own_port = (own.hostname or "").lower(), own.port
            except ValueError:
                return "invalid host"
            if (host, port) != (own_host, own_port or (443 if self.tls else 80)):
                return "not same origin"
        if self.allowed:
            allowed = self.allowed.get(host)
            if allowed is None or allowed != (parts.scheme, port):
                return "not in the allowed list"
        return None


def _default_port(scheme: str) -> int:
    return 443 if scheme in ("https", "wss") else 80


class WebSocketSettings:
    """What every connection of one WebSocket listener shares."""

    def __init__(self, cfg: ServerConfig, tls: bool) -> None:
        self.tls = tls
        self.origins = OriginCheck(cfg.ws_same_origin, cfg.ws_allowed_origins, tls)
        self.compression = cfg.ws_compression
        self.handshake_timeout = cfg.ws_handshake_timeout
        self.max_message = min(8 * cfg.max_payload, _MAX_MESSAGE)

    def protocol(self) -> ServerProtocol:
        extensions = None
        if self.compression:
            # nats-server's reply: no context takeover either way.
            extensions = [
                ServerPerMessageDeflateFactory(
                    server_no_context_takeover=True, client_no_context_takeover=True
                )
            ]
        return ServerProtocol(extensions=extensions, max_size=self.max_message)


class WebSocketProtocol(asyncio.Protocol):
    """The socket of one WebSocket client: the upgrade, then frames both ways."""

    def __init__(
        self, settings: WebSocketSettings, new_client: Callable[[], ClientConnection]
    ) -> None:
        self._settings = settings
        self._new_client = new_client
        self._ws = settings.protocol()
        self._raw: asyncio.Transport | None = None
        self._client: ClientConnection | None = None
        self._frame_cap = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- the socket ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]
        timeout = self._settings.handshake_timeout
        if timeout > 0:
            self._timer = asyncio.get_running_loop().call_later(timeout, self._too_slow)

    def _too_slow(self) -> None:
        if self._client is None and self._raw is not None:
            self._raw.abort()

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Request):
                self._upgrade(event)
            elif isinstance(event, Frame) and event.opcode in _DATA:
                client = self._client
                if client is not None and event.data:
                    client.data_received(bytes(event.data))
        self._send_pending()

    def eof_received(self) -> bool | None:
        self._ws.receive_eof()
        self._send_pending()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        client, self._client = self._client, None
        self._raw = None
        if client is not None:
            client.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._client is not None:
            self._client.pause_writing()

    def resume_writing(self) -> None:
        if self._client is not None:
            self._client.resume_writing()

    # -- the upgrade -----------------------------------------------------------------------
    def _upgrade(self, request: Request) -> None:
        ws = self._ws
        why = self._settings.origins.refuses(request.headers)
        if why is not None:
            log.info("websocket handshake error: origin not allowed: %s", why)
            response = ws.reject(403, "Forbidden\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        self._send_pending()
        if response.status_code != 101 or self._raw is None:
            self._raw_close()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        agent = request.headers.get("User-Agent", "")
        self._frame_cap = _BROWSER_FRAME if agent.startswith("Mozilla/") else 0
        client = self._new_client()
        self._client = client
        client.connection_made(_FrameTransport(self, self._raw))

    # -- output ------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """One write of the client: one binary frame (several for a browser)."""
        ws = self._ws
        cap = self._frame_cap
        if cap and len(data) > cap:
            view = memoryview(data)
            for start in range(0, len(data), cap):
                ws.send_binary(view[start : start + cap])
        else:
            ws.send_binary(data)
        self._send_pending()

    def close(self) -> None:
        """A close frame, then the socket once it is written."""
        if self._raw is None:
            return
        try:
            self._ws.send_close(1000)
        except Exception:  # already closing: the socket goes anyway
            log.debug("websocket close frame not sent", exc_info=True)
        self._send_pending()
        self._raw_close()

    def _raw_close(self) -> None:
        if self._raw is not None:
            self._raw.close()

    def _send_pending(self) -> None:
        raw = self._raw
        chunks = self._ws.data_to_send()
        if raw is None or not chunks:
            return
        if chunks[-1] == b"":  # the protocol says the socket is done
            chunks.pop()
            if chunks:
                raw.write(b"".join(chunks))
            raw.close()
            return
        raw.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))


class _FrameTransport(asyncio.Transport):
    """What the client connection sees: writes become binary frames; everything else is
    the socket's."""

    def __init__(self, owner: WebSocketProtocol, raw: asyncio.Transport) -> None:
        super().__init__()
        self._owner = owner
        self._sock = raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._sock.is_closing():
            self._owner.send(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False  # a close frame ends the conversation instead

    def write_eof(self) -> None:
        self._owner.close()

    def close(self) -> None:
        self._owner.close()

    def abort(self) -> None:
        self._sock.abort()

    def is_closing(self) -> bool:
        return self._sock.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._sock.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._sock.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._sock.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._sock.pause_reading()

    def resume_reading(self) -> None:
        self._sock.resume_reading()

    def is_reading(self) -> bool:
        return self._sock.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("a WebSocket client keeps its protocol")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._owner
