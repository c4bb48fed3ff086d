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
from typing import cast

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
        if self._auth_timer is not None:  # bounded by tls_timeout until the handshake ends
            self._auth_timer.cancel()
            self._auth_timer = None
        self._raw: asyncio.Transport | None = raw
        self._early: list[bytes] = []
        self.transport = None
        self._upgrade = self._loop.create_task(self._handshake(raw))

    async def _handshake(self, raw: asyncio.Transport) -> None:
        timeout = self.server.config.tls_timeout
        starting = asyncio.ensure_future(
            self._loop.start_tls(
                raw,
                self,
                self.tls_context,
                server_side=True,
                ssl_handshake_timeout=timeout if timeout > 0 else None,
            )
        )
        try:
            # start_tls gives the socket to its TLS protocol (reading paused), then runs
            # that protocol's connection_made and resumes reading: after both, the bytes
            # read before go first.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            early, self._early = b"".join(self._early), []
            if early:
                _feed(raw.get_protocol(), early)
            secure = await starting
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.info("client %d: TLS handshake error: %s", self.cid, exc or type(exc).__name__)
            self._lost_in_handshake(raw)
            return
        except asyncio.CancelledError:
            starting.cancel()
            self._lost_in_handshake(raw)
            raise
        self._raw = None
        if secure is None or self.closing:
            self._lost_in_handshake(raw)
            return
        self.transport = secure
        low, high = raw.get_write_buffer_limits()
        secure.set_write_buffer_limits(high=high, low=low)
        cfg = self.server.config
        if cfg.auth_required and not self.connected:
            # The client's time to authenticate starts once TLS is up (nats-server gives
            # it tls timeout + 1 s from the start; this is at least as long).
            self._auth_timer = self._loop.call_later(cfg.auth_timeout, self._auth_expired)
        self.flush_now()

    def _lost_in_handshake(self, raw: asyncio.Transport) -> None:
        self._raw = None
        raw.abort()
        if not self.closing:
            self.connection_lost(None)

    def data_received(self, data: bytes) -> None:
        if self.transport is None and getattr(self, "_raw", None) is not None:
            # The start of the handshake, read before the TLS layer took the socket
            # over (uvloop may read once after connection_made): it is handed on.
            self._early.append(bytes(data))
            return
        super().data_received(data)

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


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Bytes into a protocol as its transport would hand them over."""
    get_buffer = getattr(protocol, "get_buffer", None)
    if get_buffer is None:
        cast(asyncio.Protocol, protocol).data_received(data)
        return
    view = memoryview(data)
    while view:
        buf = get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        cast(asyncio.BufferedProtocol, protocol).buffer_updated(n)
        view = view[n:]
