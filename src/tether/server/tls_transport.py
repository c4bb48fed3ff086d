"""TLS started in the middle of a plain connection, driven through memory buffers.

NATS (after a plaintext ``INFO``) and NSQ (after ``IDENTIFY``) switch a connection that
is already open to TLS. ``loop.start_tls`` can do that, but it hands the socket to a new
transport between two reads, and under uvloop a read that lands in that gap stalled the
handshake until the client gave up. Here the socket's transport and protocol never
change: the protocol feeds what it reads into an :class:`ssl.SSLObject` through
:class:`ssl.MemoryBIO` and writes what the TLS engine produces itself, so no byte can
fall between two owners. :class:`TLSSession` runs the handshake; once it is done its
:class:`TLSTransport` stands in for the plain transport (writes are encrypted, reads
come back decrypted from :meth:`TLSSession.feed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

_READ = 65536


class TLSError(Exception):
    """The peer's TLS is broken (bad handshake, bad record): the connection must go."""


class TLSSession:
    """The server side of one connection's TLS, fed by the protocol's ``data_received``."""

    def __init__(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        self.raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl_object = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshake_done = False
        self.closed_by_peer = False  # close_notify received
        self.transport = TLSTransport(self)

    def feed(self, data: bytes) -> list[bytes]:
        """Take bytes read from the socket; answer the application data they complete.

        Before the handshake is done this advances it (and ``handshake_done`` turns true
        when it ends); bytes the peer sent after its last handshake message come back in
        the same call. Raises :class:`TLSError` when the peer's TLS is broken.
        """
        self._incoming.write(data)
        try:
            if not self.handshake_done:
                try:
                    self.ssl_object.do_handshake()
                except ssl.SSLWantReadError:
                    return []
                self.handshake_done = True
            return self._read_all()
        except ssl.SSLError as exc:
            raise TLSError(exc.reason or str(exc)) from None
        finally:
            self.flush()

    def _read_all(self) -> list[bytes]:
        chunks: list[bytes] = []
        while True:
            try:
                chunk = self.ssl_object.read(_READ)
            except ssl.SSLWantReadError:
                return chunks
            except ssl.SSLZeroReturnError:
                self.closed_by_peer = True
                return chunks
            if not chunk:  # how read() reports the peer's close_notify (no raise)
                self.closed_by_peer = True
                return chunks
            chunks.append(chunk)

    def encrypt(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = self.ssl_object.write(view)
            view = view[written:]
        self.flush()

    def flush(self) -> None:
        """Write what the TLS engine produced (records, alerts, tickets) to the socket."""
        pending = self._outgoing.read()
        if pending and not self.raw.is_closing():
            self.raw.write(pending)

    def close_notify(self) -> None:
        """Tell the peer the TLS session ends (no wait for its own close_notify)."""
        # unwrap wants the peer's close_notify too and raises; ours is written already.
        with contextlib.suppress(ssl.SSLError):
            self.ssl_object.unwrap()
        self.flush()


class TLSTransport(asyncio.Transport):
    """The plain transport's stand-in once the handshake is done: writes go through TLS,
    flow control and buffer sizes are the socket's own."""

    def __init__(self, session: TLSSession) -> None:
        super().__init__()
        self._session = session
        self._raw = session.raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._raw.is_closing():
            return
        self._session.encrypt(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close: close_notify ends both ways

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot half-close")

    def close(self) -> None:
        if not self._raw.is_closing():
            self._session.close_notify()
        self._raw.close()

    def abort(self) -> None:
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high=high, low=low)

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._raw.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._raw.set_protocol(protocol)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        ssl_object = self._session.ssl_object
        if name == "ssl_object":
            return ssl_object
        if name == "peercert":
            return ssl_object.getpeercert()
        if name == "cipher":
            return ssl_object.cipher()
        if name == "compression":
            return ssl_object.compression()
        if name == "sslcontext":
            return ssl_object.context
        return self._raw.get_extra_info(name, default)
