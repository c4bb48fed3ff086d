"""The transport layer under :class:`~tether.client.connection.Connection`.

One :class:`_Wire` (an ``asyncio.Protocol``) per TCP connection attempt; events from a
wire that is no longer current are ignored, so a late ``connection_lost`` from a
replaced socket can never disturb the connection that replaced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, cast

from tether.client.errors import ProtocolViolation
from tether.client.options import Options, Server
from tether.protocol.nats import PING, Handler, ProtocolError, encode_connect
from tether.protocol.nats.client_reader import ClientReader

_MAX_INBOUND_PAYLOAD = 64 * 1024 * 1024


class _Wire(asyncio.Protocol):
    def __init__(self, owner: Reader) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.owner._data(self, data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.owner._lost(self, exc)

    def pause_writing(self) -> None:
        if self.owner._wire is self:
            self.owner._paused = True

    def resume_writing(self) -> None:
        if self.owner._wire is self:
            self.owner._paused = False
            self.owner._on_resume_writing()


class Reader:
    """Owns the current transport and parser, and performs the INFO/CONNECT handshake."""

    options: Options
    server_info: dict[str, Any]

    def __init__(self) -> None:
        self._wire: _Wire | None = None
        self._transport: asyncio.Transport | None = None
        self._parser: ClientReader | None = None
        self._paused = False
        self._handshake_info: asyncio.Future[dict[str, Any]] | None = None
        self._handshake_pong: asyncio.Future[None] | None = None

    # Implemented by the connection.
    def _on_lost(self, exc: Exception | None) -> None:
        raise NotImplementedError

    def _on_resume_writing(self) -> None:
        raise NotImplementedError

    def _connect_options(self, server: Server) -> dict[str, Any]:
        raise NotImplementedError

    def _tls_context(self, server: Server) -> ssl.SSLContext | None:
        """The TLS context asked for (a context in the options, a ``tls://`` URL), or None."""
        if self.options.tls is not None:
            return self.options.tls
        if server.tls or self.options.tls_handshake_first:
            return ssl.create_default_context()
        return None

    async def _handshake(self, server: Server) -> None:
        """Open a socket to ``server``, read INFO, upgrade to TLS when either side asks,
        send CONNECT+PING, wait for PONG."""
        loop = asyncio.get_running_loop()
        tls = self._tls_context(server)
        hostname = self.options.tls_hostname or server.host
        first = tls is not None and self.options.tls_handshake_first
        wire = _Wire(self)
        self._wire = wire
        self._transport = None
        self._paused = False
        self._parser = ClientReader(cast(Handler, self), max_payload=_MAX_INBOUND_PAYLOAD)
        self._handshake_info = loop.create_future()
        self._handshake_pong = None
        try:
            async with asyncio.timeout(self.options.connect_timeout):
                await loop.create_connection(
                    lambda: wire,
                    server.host,
                    server.port,
                    ssl=tls if first else None,
                    server_hostname=hostname if first else None,
                )
                self.server_info = await self._handshake_info
                assert wire.transport is not None
                if not first and (tls is not None or self.server_info.get("tls_required")):
                    # The server reads nothing more in plain text: TLS starts here.
                    upgraded = await loop.start_tls(
                        wire.transport,
                        wire,
                        tls or ssl.create_default_context(),
                        server_hostname=hostname,
                    )
                    if upgraded is None:
                        raise ConnectionResetError("connection lost during the TLS handshake")
                    wire.transport = upgraded
                self._handshake_pong = loop.create_future()
                wire.transport.write(encode_connect(self._connect_options(server)) + PING)
                await self._handshake_pong
        except BaseException:
            self._wire = None
            if wire.transport is not None:
                wire.transport.abort()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(wire.lost), 1.0)
            raise
        finally:
            self._handshake_info = None
            self._handshake_pong = None
        self._transport = wire.transport

    def _fail_handshake(self, exc: Exception) -> bool:
        """Fail whichever handshake step is waiting; False when not handshaking."""
        for fut in (self._handshake_info, self._handshake_pong):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                return True
        return False

    def _data(self, wire: _Wire, data: bytes) -> None:
        if wire is not self._wire or self._parser is None:
            return
        try:
            self._parser.feed(data)
        except ProtocolError as exc:
            violation = ProtocolViolation(f"server sent invalid protocol: {exc.message}")
            if not self._fail_handshake(violation):
                self._protocol_error(violation)
            if wire.transport is not None:
                wire.transport.abort()

    def _protocol_error(self, exc: ProtocolViolation) -> None:
        raise NotImplementedError

    def _lost(self, wire: _Wire, exc: Exception | None) -> None:
        if wire is not self._wire:
            return
        if self._fail_handshake(ConnectionResetError("connection lost during handshake")):
            return
        self._wire = None
        self._transport = None
        self._paused = False
        self._on_lost(exc)

    async def _close_transport(self) -> None:
        wire = self._wire
        self._wire = None
        self._transport = None
        if wire is None or wire.transport is None:
            return
        wire.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(wire.lost), 2.0)
        except TimeoutError:
            wire.transport.abort()
