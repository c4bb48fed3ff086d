"""``ClientConnection`` driven directly, with a fake transport: what it writes back,
when it closes, and the bounds it enforces (the timers are fired by hand)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tether.server.config import ServerConfig
from tether.server.nats.connection import ClientConnection
from tether.server.nats.server import NatsServer


class FakeTransport:
    """Records what the connection writes; the write buffer size is settable."""

    def __init__(self, supports_eof: bool = False) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.eof = False
        self.buffered = 0
        self.supports_eof = supports_eof

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, lines: list[bytes]) -> None:
        for line in lines:
            self.written += line

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return self.supports_eof

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


class Harness:
    def __init__(self, **config: Any) -> None:
        self.server = NatsServer(ServerConfig(**config))

    def connect(self, supports_eof: bool = False) -> tuple[ClientConnection, FakeTransport]:
        transport = FakeTransport(supports_eof)
        conn = self.server._new_connection()
        conn.connection_made(transport)  # type: ignore[arg-type]
        return conn, transport


def output(conn: ClientConnection, transport: FakeTransport) -> bytes:
    """Everything written since the last call (the connection flushes on the next loop
    tick; flush it now)."""
    conn.flush_now()
    out = bytes(transport.written)
    transport.written.clear()
    return out


def drop_info(data: bytes) -> bytes:
    assert data.startswith(b"INFO ")
    return data[data.index(b"\r\n") + 2 :]


def gone(conn: ClientConnection, transport: FakeTransport) -> None:
    """The transport closed: tell the connection, as asyncio would."""
    assert transport.closed
    conn.connection_lost(None)


async def test_info_first() -> None:
    h = Harness(port=4222, max_payload=1000)
    conn, transport = h.connect()
    line = output(conn, transport)
    assert line.startswith(b"INFO {") and line.endswith(b"} \r\n")
    info = json.loads(line[5:])
    assert info["max_payload"] == 1000
    assert info["headers"] is True
    assert info["client_id"] == conn.cid
    assert info["client_ip"] == "127.0.0.1"
    assert "auth_required" not in info and "jetstream" not in info
    assert list(info)[:8] == [
        "server_id",
        "server_name",
        "version",
        "proto",
        "go",
        "host",
        "port",
        "headers",
    ]


async def test_verbose_until_connect_says_otherwise() -> None:
    conn, transport = Harness().connect()
    output(conn, transport)
    conn.data_received(b"SUB a 1\r\nPUB a 1\r\nx\r\n")
    assert output(conn, transport) == b"+OK\r\n+OK\r\nMSG a 1 1\r\nx\r\n"
    conn.data_received(b'CONNECT {"verbose":false}\r\nPUB a 1\r\ny\r\n')
    assert output(conn, transport) == b"MSG a 1 1\r\ny\r\n"
    conn.data_received(b"CONNECT {}\r\nPUB a 1\r\nz\r\n")  # absent fields keep their value
    assert output(conn, transport) == b"MSG a 1 1\r\nz\r\n"


async def test_connect_info_after_first_pong() -> None:
    conn, transport = Harness().connect()
    output(conn, transport)
    conn.data_received(b"PING\r\n")  # before CONNECT: a bare PONG
    assert output(conn, transport) == b"PONG\r\n"
    conn.data_received(b'CONNECT {"verbose":false,"protocol":1}\r\nPING\r\nPING\r\n')
    out = output(conn, transport)
    assert out.startswith(b"PONG\r\nINFO ") and out.endswith(b" \r\nPONG\r\n")
    info = json.loads(out[len(b"PONG\r\nINFO ") : out.index(b" \r\nPONG")])
    assert info["connect_info"] is True and info["remote_account"] == "$G"


@pytest.mark.parametrize("first", [b"PING\r\n", b"SUB a 1\r\n", b"xyz", b"P"])
async def test_auth_gate(first: bytes) -> None:
    conn, transport = Harness(auth_token="t").connect()
    info = json.loads(output(conn, transport)[5:])
    assert info["auth_required"] is True
    conn.data_received(first)
    assert output(conn, transport) == b"-ERR 'Authorization Violation'\r\n"
    gone(conn, transport)


async def test_auth_gate_lets_connect_in_pieces() -> None:
    h = Harness(user="u", password="p")
    conn, transport = h.connect()
    output(conn, transport)
    conn.data_received(b"CONN")
    conn.data_received(b'ECT {"user":"u","pass":"p","verbose":false}\r')
    conn.data_received(b"\nSUB a 1\r\nPUB a 1\r\nx\r\n")
    assert output(conn, transport) == b"MSG a 1 1\r\nx\r\n"
    assert not transport.closed


@pytest.mark.parametrize(
    "options",
    [
        {"user": "u", "pass": "wrong"},
        {"user": "x", "pass": "p"},
        {"user": "u"},
        {"auth_token": "p"},
        {},
    ],
)
async def test_bad_credentials(options: dict[str, str]) -> None:
    conn, transport = Harness(user="u", password="p").connect()
    output(conn, transport)
    conn.data_received(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
    assert output(conn, transport) == b"-ERR 'Authorization Violation'\r\n"
    gone(conn, transport)


async def test_auth_timeout() -> None:
    h = Harness(auth_token="t", auth_timeout=1000)
    conn, transport = h.connect()
    output(conn, transport)
    conn._auth_expired()
    assert output(conn, transport) == b"-ERR 'Authentication Timeout'\r\n"
    gone(conn, transport)


async def test_silent_close_on_malformed_arguments() -> None:
    conn, transport = Harness().connect()
    output(conn, transport)
    conn.data_received(b'CONNECT {"verbose":false}\r\nPUB foo -1\r\n')
    assert output(conn, transport) == b""
    gone(conn, transport)


async def test_max_connections() -> None:
    h = Harness(max_connections=2)
    first = [h.connect() for _ in range(2)]
    conn, transport = h.connect()
    out = drop_info(output(conn, transport))
    assert out == b"-ERR 'maximum connections exceeded'\r\n"
    assert transport.closed
    conn.connection_lost(None)
    assert len(h.server.connections) == 2
    # One leaves: room again.
    c0, _ = first[0]
    c0.connection_lost(None)
    conn, transport = h.connect()
    assert not transport.closed
    assert len(h.server.connections) == 2


async def test_slow_consumer_by_pending_messages() -> None:
    h = Harness(max_pending=1000)
    sub, sub_t = h.connect()
    pub, pub_t = h.connect()
    sub.data_received(b'CONNECT {"verbose":false}\r\nSUB a 1\r\n')
    pub.data_received(b'CONNECT {"verbose":false}\r\n')
    output(sub, sub_t)
    output(pub, pub_t)
    # Within one loop tick nothing is flushed: the buffer alone trips the bound.
    for _ in range(12):
        pub.data_received(b"PUB a 100\r\n" + b"x" * 100 + b"\r\n")
    # Cut off at once, what it was owed dropped, and no -ERR (as nats-server does).
    assert sub_t.aborted
    assert b"-ERR" not in sub_t.written
    assert h.server.slow_consumers == 1
    sub.connection_lost(None)
    assert not pub_t.closed
    pub.data_received(b"PING\r\n")
    assert output(pub, pub_t) == b"PONG\r\n"


async def test_slow_consumer_by_transport_buffer() -> None:
    h = Harness(max_pending=1000)
    conn, transport = h.connect()
    conn.data_received(b'CONNECT {"verbose":false}\r\nSUB a 1\r\n')
    transport.buffered = 5000  # the peer stopped reading
    conn.data_received(b"PUB a 1\r\nx\r\n")
    conn.flush_now()
    assert transport.aborted
    assert b"-ERR" not in transport.written


async def test_stale_connection() -> None:
    conn, transport = Harness(max_pings_out=2).connect()
    conn.data_received(b'CONNECT {"verbose":false}\r\n')
    output(conn, transport)
    assert conn.rtt_ns > 0  # estimated from connecting until CONNECT
    conn._ping_tick()  # the first PING goes out anyway: it measures the round trip
    assert output(conn, transport) == b"PING\r\n"
    conn.data_received(b"PONG\r\n")
    conn._ping_tick()  # data arrived within the interval: no PING needed
    assert output(conn, transport) == b""
    conn._ping_tick()
    conn._ping_tick()
    assert output(conn, transport) == b"PING\r\nPING\r\n"
    conn._ping_tick()  # a third unanswered PING would exceed the limit
    assert output(conn, transport) == b"-ERR 'Stale Connection'\r\n"
    gone(conn, transport)


async def test_rtt_is_measured_by_the_servers_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    conn, transport = Harness().connect()
    conn.data_received(b'CONNECT {"verbose":false}\r\n')
    output(conn, transport)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    conn._ping_tick()
    assert output(conn, transport) == b"PING\r\n"
    monkeypatch.setattr(time, "time", lambda: now + 0.0025)
    conn.data_received(b"PONG\r\n")
    assert conn.rtt_ns == pytest.approx(2_500_000, abs=1000)
    # Busy clients are not pinged again within the hour ...
    conn._ping_tick()
    assert output(conn, transport) == b""
    # ... but past it the round trip is measured afresh.
    monkeypatch.setattr(time, "time", lambda: now + 3601)
    conn.data_received(b"SUB a 1\r\n")
    conn._ping_tick()
    assert output(conn, transport) == b"PING\r\n"


async def test_pong_resets_the_count() -> None:
    conn, transport = Harness(max_pings_out=2).connect()
    conn.data_received(b'CONNECT {"verbose":false}\r\n')
    conn._ping_tick()
    for _ in range(5):
        conn._ping_tick()
        conn.data_received(b"PONG\r\n")
        conn._got_data = False  # the PONG itself must be what keeps it alive
    assert not transport.closed


async def test_connection_lost_removes_subscriptions() -> None:
    h = Harness()
    conn, _ = h.connect()
    conn.data_received(b'CONNECT {"verbose":false}\r\nSUB a 1\r\nSUB b q 2\r\n')
    assert len(h.server.router.index) == 2
    changed: list[str] = []
    h.server.watch_interest(changed.append)
    conn.connection_lost(None)
    assert len(h.server.router.index) == 0
    assert sorted(changed) == ["a", "b"]
    assert h.server.connections == {}


async def test_lingering_close() -> None:
    # Where the transport can half-close, an error is followed by our FIN while input
    # keeps being read (and ignored) until the peer closes, or until a deadline.
    conn, transport = Harness().connect(supports_eof=True)
    output(conn, transport)
    conn.data_received(b"BAD\r\n")
    assert transport.written == b"-ERR 'Unknown Protocol Operation'\r\n"
    assert transport.eof and not transport.closed and not transport.aborted
    conn.data_received(b"PING\r\n" * 100)  # ignored
    assert output(conn, transport) == b"-ERR 'Unknown Protocol Operation'\r\n"
    conn.connection_lost(None)
    assert conn.server.connections == {}
