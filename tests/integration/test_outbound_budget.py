"""The server-wide outbound budget against real sockets: many subscribers that never
read are cut off once together they hold ``max_pending_total``, long before each
reaches its own ``max_pending``, while a subscriber that keeps up gets every message."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import nats
from natspy_support import flush_subscriptions

from tether.testing import run_server

MiB = 1024 * 1024
BUDGET = 16 * MiB
SLOW = 10
CHUNK = b"x" * 65536
MESSAGES = 1024  # 64 MiB offered to each subscriber
BURST = 8  # messages between round trips: what a subscriber that keeps up lags by
# What may wait beyond the budget for a moment: the messages of one read of the
# publisher's socket, copied for every subscriber before the next flush enforces it.
SLACK = (SLOW + 1) * 4 * len(CHUNK)
CONNECT = b'CONNECT {"verbose":false,"pedantic":false}\r\n'


async def _varz(http: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await http.get("/varz")).json()
    return body


async def test_slow_readers_stay_within_the_budget() -> None:
    args = ["--max-pending-total", str(BUDGET)]  # max_pending stays 64 MiB per client
    with run_server(store="memory", args=args) as srv:
        slow: list[socket.socket] = []
        healthy = await nats.connect(srv.url)
        publisher = await nats.connect(srv.url)
        got = 0
        done = asyncio.Event()

        async def count(msg: Any) -> None:
            nonlocal got
            got += 1
            if got == MESSAGES:
                done.set()

        try:
            for _ in range(SLOW):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect((srv.host, srv.port))
                sock.sendall(CONNECT + b"SUB flood 1\r\n")  # and never reads again
                slow.append(sock)
            await healthy.subscribe("flood", cb=count)
            await flush_subscriptions(healthy)
            async with httpx.AsyncClient(base_url=srv.http_url, timeout=10) as http:
                assert (await _varz(http))["max_pending_total"] == BUDGET
                highest = 0
                for i in range(MESSAGES):
                    await publisher.publish("flood", CHUNK)
                    if i % BURST == BURST - 1:
                        await publisher.flush()
                        highest = max(highest, (await _varz(http))["pending_bytes"])
                await publisher.flush()
                await asyncio.wait_for(done.wait(), 30)
                stats = await _varz(http)
            # Unbounded, ten readers that take nothing would hold ~600 MiB here.
            assert highest <= BUDGET + SLACK, highest
            assert stats["slow_consumers"] >= SLOW // 2
            assert got == MESSAGES and healthy.is_connected
            assert "Traceback" not in srv.stderr
        finally:
            for sock in slow:
                sock.close()
            await publisher.close()
            await healthy.close()
