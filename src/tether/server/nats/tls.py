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
from tether.server.tls_transport import TLSError, TLSSession

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
    the handshake; nothing is read or written in plain text in between.

    The socket keeps this protocol throughout (see :mod:`tether.server.tls_transport`):
    until the handshake ends the connection has no transport, so what it wants to write
    waits in its buffer and no plaintext byte reaches the parser.
    """

    tls_context: ssl.SSLContext  # set by the server on each instance

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # writes INFO on the plain socket
        raw = self.transport
        self._tls: TLSSession | None = None
        if raw is None or self.closing:
            return
        if self._auth_timer is not None:  # bounded by tls_timeout until the handshake ends
            self._auth_timer.cancel()
            self._auth_timer = None
        self._tls = TLSSession(raw, self.tls_context)
        self.transport = None
        timeout = self.server.config.tls_timeout
        self._tls_timer: asyncio.TimerHandle | None = (
            self._loop.call_later(timeout, self._handshake_expired) if timeout > 0 else None
        )

    def data_received(self, data: bytes) -> None:
        session = getattr(self, "_tls", None)
        if session is None:
            super().data_received(data)
            return
        was_done = session.handshake_done
        try:
            chunks = session.feed(data)
        except TLSError as exc:
            log.info("client %d: TLS %s error: %s", self.cid, _stage(was_done), exc)
            self._drop(session)
            return
        if not was_done and session.handshake_done:
            self._established(session)
        for chunk in chunks:
            if self.closing:
                return
            super().data_received(chunk)
        if session.closed_by_peer and not self.closing:
            self.close(linger=False)

    def _established(self, session: TLSSession) -> None:
        if self._tls_timer is not None:
            self._tls_timer.cancel()
            self._tls_timer = None
        secure = session.transport
        self.transport = secure
        cfg = self.server.config
        if cfg.auth_required and not self.connected:
            # The client's time to authenticate starts once TLS is up (nats-server gives
            # it tls timeout + 1 s from the start; this is at least as long).
            self._auth_timer = self._loop.call_later(cfg.auth_timeout, self._auth_expired)
        self.flush_now()

    def _handshake_expired(self) -> None:
        self._tls_timer = None
        session = self._tls
        if session is not None and not session.handshake_done:
            log.info("client %d: TLS handshake error: timeout", self.cid)
            self._drop(session)

    def _drop(self, session: TLSSession) -> None:
        """Gone without an -ERR: a client whose TLS failed could not read one."""
        session.raw.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_tls_timer", None)
        if timer is not None:
            timer.cancel()
            self._tls_timer = None
        super().connection_lost(exc)

    def close_with_error(self, message: str) -> None:
        if self._handshaking():
            return  # an -ERR in plain text would not be read: the client just goes
        super().close_with_error(message)

    def close(self, *, linger: bool = True) -> None:
        if self._handshaking():
            return
        super().close(linger=linger)

    def _handshaking(self) -> bool:
        session = getattr(self, "_tls", None)
        if session is None or session.handshake_done:
            return False
        self._drop(session)
        return True

    @property
    def tls_version(self) -> str:
        session = getattr(self, "_tls", None)
        if session is None or not session.handshake_done:
            return ""
        return str(session.ssl_object.version() or "")


def _stage(done: bool) -> str:
    return "record" if done else "handshake"
