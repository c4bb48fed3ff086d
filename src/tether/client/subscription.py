"""Subscriptions: a queue to iterate, a callback, or an internal raw handler.

Internal consumers (request mux, pull subscriptions) install a *raw handler*: a plain
function called inline by the reader with the frame's fields, so the hot path builds
exactly the objects it needs and never schedules a task per message. User code gets
:class:`Msg` objects, either through ``async for`` / :meth:`next_msg` or a callback (a
synchronous callback runs inline; an async one runs in one task per subscription).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from tether.client.errors import BadSubscription, ConnectionClosed, SlowConsumer, Timeout
from tether.client.message import Msg, MsgConnection

RawHandler = Callable[[str, str, "bytes | None", bytes], None]
"""``handler(subject, reply, header_block_or_None, payload)``, called inline by the reader."""

MsgCallback = Callable[[Msg], "Awaitable[None] | None"]

DEFAULT_PENDING_MSGS_LIMIT = 512 * 1024


class SubscriptionConnection(MsgConnection, Protocol):
    """What a subscription needs of its connection (besides what its messages need)."""

    @property
    def is_closed(self) -> bool: ...
    def _report(self, exc: Exception) -> None: ...
    def _unsubscribe(self, sub: Subscription, limit: int) -> None: ...
    def _forget(self, sub: Subscription) -> None: ...
    async def flush(self, timeout: float | None = None) -> None: ...  # noqa: ASYNC109 - the NATS client API


class Subscription:
    """Interest in a subject. Iterate it (``async for msg in sub``), call
    :meth:`next_msg`, or pass ``cb=`` when subscribing."""

    __slots__ = (
        "_cb",
        "_cb_task",
        "_closed",
        "_conn",
        "_handler",
        "_max",
        "_pending_limit",
        "_queue",
        "_received",
        "_slow",
        "_waiter",
        "queue",
        "sid",
        "subject",
    )

    def __init__(
        self,
        conn: SubscriptionConnection,
        sid: str,
        subject: str,
        queue: str = "",
        *,
        handler: RawHandler | None = None,
        cb: MsgCallback | None = None,
        pending_msgs_limit: int = DEFAULT_PENDING_MSGS_LIMIT,
    ) -> None:
        self._conn = conn
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self._handler = handler
        self._cb = cb
        self._pending_limit = pending_msgs_limit
        self._queue: deque[Msg] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._max = 0
        self._received = 0
        self._closed = False
        self._slow = False
        self._cb_task: asyncio.Task[None] | None = None
        if cb is not None and inspect.iscoroutinefunction(cb):
            self._cb_task = asyncio.get_running_loop().create_task(self._run_callback())

    # -- state ------------------------------------------------------------------------

    @property
    def received(self) -> int:
        """Messages delivered to this subscription so far."""
        return self._received

    @property
    def pending(self) -> int:
        """Messages queued and not yet taken."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        """No more messages will arrive (unsubscribed, auto-unsubscribed or connection closed)."""
        return self._closed

    @property
    def max_msgs(self) -> int:
        """The auto-unsubscribe limit (0: none)."""
        return self._max

    # -- delivery (called by the connection's reader) ---------------------------------

    def _deliver(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        self._received += 1
        if self._max and self._received >= self._max:
            self._conn._forget(self)
        handler = self._handler
        if handler is not None:
            handler(subject, reply, hdr, data)
            return
        msg = Msg(self._conn, subject, reply, data, hdr)
        cb = self._cb
        if cb is not None and self._cb_task is None:
            try:
                cb(msg)
            except Exception as exc:
                self._conn._report(exc)
            return
        if len(self._queue) >= self._pending_limit:
            if not self._slow:
                self._slow = True
                self._conn._report(SlowConsumer(self.subject, self.sid))
            return
        self._slow = False
        self._queue.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _close(self) -> None:
        """No more deliveries: wake whoever waits."""
        self._closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _auto_unsubscribe(self, limit: int) -> None:
        self._max = limit

    # -- consuming ----------------------------------------------------------------------

    async def next_msg(self, timeout: float | None = 1.0) -> Msg:  # noqa: ASYNC109 - the NATS client API
        """The next message; :class:`Timeout` after ``timeout`` seconds (None: forever)."""
        if self._handler is not None or self._cb is not None:
            raise BadSubscription("subscription delivers to a callback")
        while not self._queue:
            if self._closed:
                if self._conn.is_closed:
                    raise ConnectionClosed("connection closed")
                raise BadSubscription("subscription is closed")
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise Timeout(f"no message on {self.subject!r} within {timeout}s") from None
            finally:
                self._waiter = None
        return self._queue.popleft()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Msg:
        try:
            return await self.next_msg(timeout=None)
        except (BadSubscription, ConnectionClosed):
            raise StopAsyncIteration from None

    async def _run_callback(self) -> None:
        cb = self._cb
        assert cb is not None
        while True:
            while self._queue:
                msg = self._queue.popleft()
                try:
                    result = cb(msg)
                    if result is not None:
                        await result
                except Exception as exc:
                    self._conn._report(exc)
            if self._closed:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # -- ending -------------------------------------------------------------------------

    async def unsubscribe(self, limit: int = 0) -> None:
        """Remove interest now, or after ``limit`` messages in total."""
        if self._closed:
            return
        if limit and limit > self._received:
            self._max = limit
            self._conn._unsubscribe(self, limit)
            return
        self._conn._unsubscribe(self, 0)
        self._conn._forget(self)

    async def drain(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - the NATS client API
        """Unsubscribe, receive what the server already sent, then wait until every
        queued message was taken or handled."""
        if not self._closed:
            self._conn._unsubscribe(self, 0)
            with contextlib.suppress(ConnectionClosed, Timeout):
                await self._conn.flush(timeout)
            self._conn._forget(self)
        task = self._cb_task
        if task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout)

    async def _stop_callback(self) -> None:
        task = self._cb_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def __repr__(self) -> str:
        return f"<Subscription sid={self.sid} subject={self.subject!r} queue={self.queue!r}>"
