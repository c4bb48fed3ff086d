"""TLS for NATS clients, as nats-server does it.

By default a client first reads a plaintext ``INFO`` that says ``tls_required``, then
starts the TLS handshake on the same socket, and everything after it (``CONNECT``
first) travels inside TLS: :class:`UpgradingConnection` writes that INFO, reads nothing
more in plain text, and upgrades. With ``handshake_first`` the listener itself speaks
TLS from the first byte (see :func:`server_context`) and the INFO goes inside TLS.

A client that does not speak TLS where it must fails its handshake and is closed
without an ``-ERR`` (nats-server's bytes would be inside TLS it cannot read); one that
stays silent is closed after ``tls_timeout``. Other clients are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from tether.server.config import ServerConfig
from tether.server.nats.connection import ClientConnection

log = logging.getLogger("tether.nats")


def server_context(
    cert: str, key: str, *, ca: str | None = None, verify: bool = False
) -> ssl.SSLContext:
    """A server-side context with nats-server's floor (TLS 1.2); ``verify`` requires a
    client certificate signed by ``ca`` (the system's CAs without one)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls: cannot load the certificate, key or CA: {exc}") from None
    if verify:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not ca:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


def client_tls(cfg: ServerConfig) -> ssl.SSLContext | None:
    """The context of the client port, or ``None`` without TLS."""
    if not cfg.tls or not cfg.tls_cert or not cfg.tls_key:
        return None
    verify = cfg.tls_verify or cfg.tls_verify_and_map
    return server_context(cfg.tls_cert, cfg.tls_key, ca=cfg.tls_ca, verify=verify)


def websocket_tls(cfg: ServerConfig) -> ssl.SSLContext | None:
    """The context of the WebSocket port (``wss://``), or ``None`` for ``no_tls``."""
    if not cfg.ws_tls_cert or not cfg.ws_tls_key:
        return None
    return server_context(cfg.ws_tls_cert, cfg.ws_tls_key)


class UpgradingConnection(ClientConnection):
    """A client on a TLS-required port without ``handshake_first``: plaintext INFO, then
    the handshake; nothing is read or written in plain text in between."""

    tls_context: ssl.SSLContext  # set by the server on each instance

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # writes INFO on the plain socket
        raw = self.transport
        if raw is None or self.closing:
            return
        # Until the handshake is done the connection has no transport: what it wants to
        # write waits in its buffer, and no plaintext byte reaches the parser.
        raw.pause_reading()
        self._raw: asyncio.Transport | None = raw
        self.transport = None
        self._upgrade = self._loop.create_task(self._handshake(raw))

    async def _handshake(self, raw: asyncio.Transport) -> None:
        timeout = self.server.config.tls_timeout
        try:
            secure = await self._loop.start_tls(
                raw,
                self,
                self.tls_context,
                server_side=True,
                ssl_handshake_timeout=timeout if timeout > 0 else None,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.info("client %d: TLS handshake error: %s", self.cid, exc or type(exc).__name__)
            self._lost_in_handshake(raw)
            return
        except asyncio.CancelledError:
            self._lost_in_handshake(raw)
            raise
        self._raw = None
        if secure is None or self.closing:
            self._lost_in_handshake(raw)
            return
        self.transport = secure
        low, high = raw.get_write_buffer_limits()
        secure.set_write_buffer_limits(high=high, low=low)
        self.flush_now()

    def _lost_in_handshake(self, raw: asyncio.Transport) -> None:
        self._raw = None
        raw.abort()
        if not self.closing:
            self.connection_lost(None)

    def close_with_error(self, message: str) -> None:
        if self._handshaking():
            return  # an -ERR in plain text would not be read: the client just goes
        super().close_with_error(message)

    def close(self, *, linger: bool = True) -> None:
        if self._handshaking():
            return
        super().close(linger=linger)

    def _handshaking(self) -> bool:
        raw = getattr(self, "_raw", None)
        if raw is None or self.transport is not None:
            return False
        self._upgrade.cancel()  # the handler aborts the socket and forgets the client
        return True

    @property
    def tls_version(self) -> str:
        transport = self.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        return str(ssl_object.version()) if ssl_object is not None else ""
