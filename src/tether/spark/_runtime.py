"""Process-wide client runtime for Spark's Python workers.

Spark calls the data source from plain synchronous code (``read``, ``write``,
``latestOffset``...). The SDK is asyncio, so each process runs one event loop in a
daemon thread and keeps one connection per :class:`ConnectionSpec` on it. Python
workers are reused across tasks, and this module is imported from an installed
package, so the loop and its connections outlive a task: the second task of a worker
does not pay for a TCP handshake. A forked child (Spark's daemon forks workers) gets
a fresh loop, since threads do not survive ``fork``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tether.client import (
    AuthorizationError,
    ClientError,
    Connection,
    JetStream,
    NoServersAvailable,
    StreamNotFound,
    connect,
)
from tether.client.models import StreamInfo
from tether.spark.options import ConnectionSpec, TetherSparkError

T = TypeVar("T")


class _Loop:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.conns: dict[ConnectionSpec, Connection] = {}
        self.locks: dict[ConnectionSpec, asyncio.Lock] = {}
        thread = threading.Thread(target=self.loop.run_forever, name="tether-spark", daemon=True)
        thread.start()


_state: _Loop | None = None
_guard = threading.Lock()


def _loop() -> _Loop:
    global _state
    with _guard:
        if _state is None or _state.pid != os.getpid():
            _state = _Loop()
        return _state


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the runtime's loop; the caller waits on the future."""
    return asyncio.run_coroutine_threadsafe(coro, _loop().loop)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the runtime's loop and wait for its result (from any thread)."""
    return submit(coro).result()


async def connection(spec: ConnectionSpec) -> Connection:
    """The pooled connection for ``spec`` (connects on first use, reconnects if closed)."""
    state = _loop()
    lock = state.locks.setdefault(spec, asyncio.Lock())
    async with lock:
        conn = state.conns.get(spec)
        if conn is not None and not conn.is_closed:
            return conn
        try:
            conn = await connect(
                list(spec.servers),
                user=spec.user,
                password=spec.password,
                token=spec.token,
                name="tether-spark",
                connect_timeout=min(spec.timeout, 5.0),
                # A task that cannot reach the server should fail (Spark retries it)
                # rather than hang in a reconnect loop.
                max_reconnect_attempts=5,
            )
        except AuthorizationError as exc:
            raise TetherSparkError(
                f"server {spec.describe()} refused the credentials "
                f"(options 'user'/'password'/'token'): {exc}"
            ) from None
        except (NoServersAvailable, OSError, ClientError) as exc:
            raise TetherSparkError(
                f"cannot connect to option 'servers' = {spec.describe()!r}: {exc}"
            ) from None
        state.conns[spec] = conn
        return conn


async def server_is_tether(spec: ConnectionSpec) -> bool:
    """Whether the server behind ``spec`` is Tether (it names itself in INFO's ``go``)."""
    conn = await connection(spec)
    return str(conn.server_info.get("go", "")).startswith("tether/")


async def jetstream(spec: ConnectionSpec) -> JetStream:
    """A JetStream context on the pooled connection."""
    conn = await connection(spec)
    return conn.jetstream(timeout=spec.timeout)


async def stream_info(spec: ConnectionSpec, stream: str) -> StreamInfo:
    """The stream's info; a missing stream is a :class:`TetherSparkError` naming the option."""
    js = await jetstream(spec)
    try:
        return await js.stream_info(stream)
    except StreamNotFound:
        raise TetherSparkError(
            f"stream {stream!r} (option 'stream') does not exist on {spec.describe()}"
        ) from None
    except ClientError as exc:
        raise TetherSparkError(
            f"cannot read the info of stream {stream!r} on {spec.describe()}: {exc}"
        ) from None


def close_all() -> None:
    """Close every pooled connection of this process (tests, benchmarks)."""
    state = _state
    if state is None or state.pid != os.getpid():
        return

    async def _close() -> None:
        conns = list(state.conns.values())
        state.conns.clear()
        for conn in conns:
            await conn.close()

    asyncio.run_coroutine_threadsafe(_close(), state.loop).result(timeout=10)
