"""TLS for NSQ clients, as nsqd does it: a client asks for ``tls_v1`` in IDENTIFY, reads
the (plaintext) IDENTIFY response, then starts the handshake on the same socket; the
server's next ``OK`` is the first frame inside TLS. Compression negotiated in the same
IDENTIFY runs inside TLS.

TLS is done here with ``ssl.MemoryBIO`` rather than ``loop.start_tls``: the connection
keeps its transport and passes the bytes through :class:`TlsLayer` both ways, so no byte
read before or during the upgrade can go astray (the handshake's first bytes may come in
the same read as the IDENTIFY).

The server's certificate is ``nsq_tls_cert``/``nsq_tls_key``, else the NATS port's
``tls_cert``/``tls_key`` (nsqd's ``--tls-cert``/``--tls-key``); with
``nsq_tls_client_auth_policy = "require-verify"`` a client must present a certificate
signed by ``tls_ca`` (nsqd's ``--tls-client-auth-policy``/``--tls-root-ca-file``).
"""

from __future__ import annotations

import contextlib
import ssl

from tether.server.config import ServerConfig
from tether.server.nats.tls import server_context

HANDSHAKE_TIMEOUT = 5.0  # seconds, nsqd's deadline for the handshake
# nsqd's --tls-required values (its TLSRequired constants)
TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED = 0, 1, 2
_READ_SIZE = 256 * 1024


def tls_required(cfg: ServerConfig) -> int:
    """nsqd's TLSRequired: ``nsq_tls_required = true`` is :data:`TLS_REQUIRED` (the TCP
    port and nsqd's HTTP routes on a plain port), ``"tcp-https"`` the TCP port only; a
    client auth policy alone means :data:`TLS_REQUIRED`, as nsqd decides."""
    if cfg.nsq_tls_required == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    if cfg.nsq_tls_required or cfg.nsq_tls_client_auth_policy:
        return TLS_REQUIRED
    return TLS_NOT_REQUIRED


def client_tls(cfg: ServerConfig) -> ssl.SSLContext:
    """How this node reaches a peer's nsqd HTTPS port (after its ``403 TLS_REQUIRED``):
    the peer's certificate checked against ``tls_ca`` (else the system's CAs), and this
    node's NSQ certificate offered, for a peer that wants a client certificate."""
    ctx = ssl.create_default_context(cafile=cfg.tls_ca or None)
    cert = cfg.nsq_tls_cert or cfg.tls_cert
    key = cfg.nsq_tls_key or cfg.tls_key
    if cert and key:
        with contextlib.suppress(OSError, ssl.SSLError):  # the server's own load says why
            ctx.load_cert_chain(cert, key)
    return ctx


class TlsError(Exception):
    """The handshake failed or the peer's TLS stream is broken."""


def nsq_tls(cfg: ServerConfig) -> ssl.SSLContext | None:
    """The context NSQ clients upgrade with, or ``None`` when TLS is not offered."""
    cert = cfg.nsq_tls_cert or cfg.tls_cert
    key = cfg.nsq_tls_key or cfg.tls_key
    if not cert or not key:
        return None
    verify = cfg.nsq_tls_client_auth_policy == "require-verify"
    return server_context(cert, key, ca=cfg.tls_ca, verify=verify)


class TlsLayer:
    """The server side of one TLS session over a connection's byte stream.

    :meth:`receive` takes bytes from the socket and returns the plaintext they held and
    the bytes to send back (handshake records, alerts); :meth:`send` turns plaintext
    into records. Plaintext sent before the handshake is over waits for it.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False
        self.closed = False  # the peer sent close_notify
        self._waiting: list[bytes] = []

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """(plaintext, bytes to write to the socket). Raises :class:`TlsError`."""
        if data:
            self._incoming.write(data)
        try:
            if not self.established:
                try:
                    self._ssl.do_handshake()
                except ssl.SSLWantReadError:
                    return b"", self._outgoing.read()
                self.established = True
                waiting, self._waiting = self._waiting, []
                for chunk in waiting:
                    self._write(chunk)
            chunks: list[bytes] = []
            while True:
                try:
                    chunk = self._ssl.read(_READ_SIZE)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    chunk = b""
                if not chunk:
                    # The peer's close_notify (with a memory BIO, "no data yet" is
                    # SSLWantReadError): ours goes back with the reply bytes.
                    self.closed = True
                    self._shutdown()
                    break
                chunks.append(chunk)
        except ssl.SSLError as exc:
            raise TlsError(exc.reason or str(exc)) from None
        return b"".join(chunks), self._outgoing.read()

    def send(self, data: bytes) -> bytes:
        """The records carrying ``data`` (nothing until the handshake is over)."""
        if not self.established:
            self._waiting.append(data)
            return b""
        try:
            self._write(data)
        except ssl.SSLError as exc:
            raise TlsError(exc.reason or str(exc)) from None
        return self._outgoing.read()

    def unsent(self) -> bytes:
        """What the TLS layer still has to send (a failed handshake's alert)."""
        return self._outgoing.read()

    def close(self) -> bytes:
        """The close_notify to send before the socket closes (b"" before the handshake)."""
        if not self.established or self.closed:
            return b""
        self.closed = True
        self._shutdown()
        return self._outgoing.read()

    def _shutdown(self) -> None:
        with contextlib.suppress(ssl.SSLError):  # wants the peer's close_notify: not waited for
            self._ssl.unwrap()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._ssl.write(view)
            view = view[n:]

    @property
    def version(self) -> str:
        return str(self._ssl.version() or "") if self.established else ""
