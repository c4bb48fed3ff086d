"""The server-wide outbound budget (``max_pending_total``), with fake transports whose
write buffers are set by hand: the total is kept as buffers change, and going over it
cuts off the largest backlogs, never a client that holds little or nothing."""

from __future__ import annotations

from typing import Any

from tether.server.config import ServerConfig
from tether.server.nats.connection import ClientConnection
from tether.server.nats.server import NatsServer


class Transport:
    """What a connection writes goes nowhere; ``held`` is what it holds unwritten."""

    def __init__(self) -> None:
        self.held = 0
        self.aborted = False
        self.limits: tuple[int | None, int | None] = (None, None)

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True
        self.held = 0

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.aborted

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.held

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


def server(budget: int, max_pending: int = 10_000) -> NatsServer:
    return NatsServer(ServerConfig(max_pending=max_pending, max_pending_total=budget))


def connect(srv: NatsServer) -> tuple[ClientConnection, Transport]:
    transport = Transport()
    conn = srv._new_connection()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def holds(conn: ClientConnection, transport: Transport, held: int) -> None:
    """The connection writes something and its transport is left holding ``held``."""
    transport.held = held
    conn.write(b"x")
    conn.flush_now()


async def test_the_largest_backlog_goes_first() -> None:
    srv = server(budget=1000)
    (a, ta), (b, tb), (c, tc), (fast, tf) = (connect(srv) for _ in range(4))
    assert ta.limits == (0, None)  # every write that waits is reported
    holds(a, ta, 600)
    holds(b, tb, 300)
    holds(fast, tf, 0)
    assert srv.pending_total == 900 and srv.slow_consumers == 0
    holds(c, tc, 400)  # 1300: over
    assert ta.aborted and not (tb.aborted or tc.aborted or tf.aborted)
    assert srv.pending_total == 700 and srv.slow_consumers == 1
    holds(b, tb, 900)  # 1300 again: b is now the largest
    assert tb.aborted and not tc.aborted
    assert srv.pending_total == 400 and srv.slow_consumers == 2


async def test_only_as_many_as_it_takes() -> None:
    srv = server(budget=1000)
    conns = [connect(srv) for _ in range(5)]
    for conn, transport in conns[:4]:
        holds(conn, transport, 240)  # 960
    holds(*conns[4], 900)  # 1860: the 900 goes, and 960 fits
    assert [t.aborted for _, t in conns] == [False, False, False, False, True]
    holds(*conns[0], 1000)  # 240 * 3 + 1000 = 1720: only that one goes
    assert [t.aborted for _, t in conns] == [True, False, False, False, True]
    assert srv.pending_total == 720


async def test_a_stale_count_is_measured_again_before_anyone_is_cut() -> None:
    srv = server(budget=1000)
    (a, ta), (b, tb) = connect(srv), connect(srv)
    holds(a, ta, 800)
    ta.held = 0  # written out, but no write since, nor a resume_writing
    holds(b, tb, 500)  # 1300 as counted, 500 in fact
    assert not ta.aborted and not tb.aborted
    assert srv.pending_total == 500


async def test_drained_and_closed_clients_leave_the_count() -> None:
    srv = server(budget=1000)
    (a, ta), (b, tb) = connect(srv), connect(srv)
    holds(a, ta, 300)
    holds(b, tb, 200)
    ta.held = 0
    a.resume_writing()  # asyncio: everything written
    assert srv.pending_total == 200
    b.connection_lost(None)
    assert srv.pending_total == 0
    assert srv.stats()["pending_bytes"] == 0
    assert srv.stats()["max_pending_total"] == 1000


async def test_stats_count_what_waits() -> None:
    srv = server(budget=1000)
    conn, transport = connect(srv)
    holds(conn, transport, 250)
    conn.write(b"abc")  # not flushed yet
    assert srv.stats()["pending_bytes"] == 253
    assert conn.pending_bytes == 253


async def test_no_budget() -> None:
    srv = server(budget=0)
    conns = [connect(srv) for _ in range(3)]
    for conn, transport in conns:
        holds(conn, transport, 9_000)  # each under max_pending
    assert not any(t.aborted for _, t in conns)
    assert srv.pending_total == 27_000


async def test_a_closing_client_over_the_budget_is_dropped() -> None:
    srv = server(budget=1000)
    (a, ta), (b, tb) = connect(srv), connect(srv)
    holds(a, ta, 700)
    a.close()  # lingering: still holds its last bytes
    holds(b, tb, 400)
    assert ta.aborted and not tb.aborted
    assert srv.slow_consumers == 0  # it was leaving anyway
