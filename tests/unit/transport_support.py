"""A connection of the NATS front door over a fake transport that records what it
writes: for tests that compare what two publish paths write back."""

from __future__ import annotations

from typing import Any

from tether.server.nats.connection import ClientConnection
from tether.server.nats.server import NatsServer


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


def connect(server: NatsServer) -> tuple[ClientConnection, FakeTransport]:
    """A new client of ``server`` over a :class:`FakeTransport`."""
    transport = FakeTransport()
    conn = server._new_connection()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport
