"""Continuous consumption: an async iterator over a prefetch buffer kept topped up.

Pull requests go out on the subscription's wildcard inbox, each for enough messages
to bring "buffered + still owed" back to ``batch``, whenever that sum falls to
``threshold``. Messages cannot be matched to requests (their subject is rewritten),
so we count what is owed in aggregate: every message pays one back, and a request
that ends early (408 at expiry, 409 limits) reports how many it never sent in its
``Nats-Pending-Messages`` header. A reconnect or two missed heartbeats mean the
server forgot our requests: nothing is owed any more, and we pull again.

A 503 (no responders) means no consumer answered the request: the server is still
restoring its consumers after a restart, or the consumer is gone. A 409 ``Server
Shutdown`` (or ``Leadership Change``) means the server dropped every waiting request
on its way down. As in nats.go's ``Consume``, these are reported to the connection's
error callback, not raised: the requests are forgotten and pulled again after a
backoff (0.1 s doubling to 2 s) or a reconnect, so a stream rides out a server
restart. A 409 ``Consumer Deleted`` still ends the stream.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from tether.client._pull_requests import expires_ns, status_error
from tether.client.errors import ClientError, ConnectionClosed, HeartbeatMissed
from tether.client.message import (
    STATUS_CONFLICT,
    STATUS_CONTROL,
    STATUS_NO_MESSAGES,
    STATUS_NO_RESPONDERS,
    STATUS_REQUEST_TIMEOUT,
    JsMsg,
)

# Pull again this long after a 503, doubling per 503 in a row.
_RETRY_FIRST = 0.1
_RETRY_MAX = 2.0

# 409 reasons that end one request but leave the consumer usable.
_TRANSIENT_409 = ("exceeded maxwaiting", "batch completed", "message size exceeds maxbytes")
# 409 reasons that end every waiting request of ours: reported, then pulled again.
_DROPPED_409 = ("server shutdown", "leadership change")


class StreamConnection(Protocol):
    """What a message stream needs of the connection."""

    @property
    def is_connected(self) -> bool: ...
    @property
    def is_closed(self) -> bool: ...
    def _report(self, exc: Exception) -> None: ...


class FeedSource(Protocol):
    """What a message stream needs of its pull subscription: the buffer, pulls, the feed."""

    next_subject: str

    @property
    def _conn(self) -> StreamConnection: ...
    @property
    def _buffer(self) -> deque[JsMsg]: ...
    @property
    def _sink(self) -> object: ...
    def _request(self, batch: int, expires: int, heartbeat: float | None = None) -> str: ...
    def _attach(self, sink: MessageStream | None) -> None: ...
    async def _cancel_requests(self, timeout: float = 2.0) -> None: ...  # noqa: ASYNC109 - as in PullSubscription


class MessageStream:
    """Returned by :meth:`PullSubscription.messages`; iterate it, then :meth:`stop` it."""

    def __init__(
        self,
        sub: FeedSource,
        batch: int,
        threshold: int | None,
        expires: float,
        heartbeat: float | None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if heartbeat is not None and heartbeat * 2 * 1e9 > expires_ns(expires):
            raise ValueError("heartbeat must be at most half of expires")
        self._sub = sub
        self._conn = sub._conn
        self._loop = asyncio.get_running_loop()
        self.batch = batch
        self.threshold = batch // 2 if threshold is None else max(0, min(threshold, batch - 1))
        self.expires = expires
        self.heartbeat = heartbeat
        self._expires_ns = expires_ns(expires)
        self._owed = 0
        self._last_activity = self._loop.time()
        self._activity = 0
        self._seen_activity = 0
        self._retry_at = 0.0  # no pull before this loop time (after a 503)
        self._retry_delay = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._error: ClientError | None = None
        self._started = False
        self.stopped = False
        self.pulls = 0
        self.heartbeats_missed = 0

    @property
    def owed(self) -> int:
        """Messages requested and not yet received."""
        return self._owed

    def _top_up(self) -> None:
        if self.stopped or not self._conn.is_connected:
            return
        if self._retry_at:
            if self._loop.time() < self._retry_at:
                return
            self._retry_at = 0.0  # the delay doubles until a message arrives
        have = len(self._sub._buffer) + self._owed
        if have > self.threshold:
            return
        want = self.batch - have
        if not self._owed:
            self._last_activity = self._loop.time()  # heartbeats are owed from now on
        self._sub._request(want, self._expires_ns, self.heartbeat)
        self._owed += want
        self.pulls += 1

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> JsMsg:
        if not self._started:
            self._sub._attach(self)
            self._started = True
        buffer = self._sub._buffer
        while True:
            if buffer:
                msg = buffer.popleft()
                if len(buffer) + self._owed <= self.threshold:
                    self._top_up()
                return msg
            if self._error is not None:
                error, self._error = self._error, None
                await self.stop()
                raise error
            if self.stopped:
                raise StopAsyncIteration
            self._top_up()
            await self._wait()

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        timeout = self.heartbeat if self.heartbeat else self.expires
        if self._retry_at:
            timeout = min(timeout, max(0.01, self._retry_at - self._loop.time()))
        try:
            await asyncio.wait((waiter,), timeout=timeout)
        finally:
            self._waiter = None
        if self._activity != self._seen_activity:
            self._seen_activity = self._activity
            self._last_activity = self._loop.time()
        if (
            self.heartbeat
            and self._owed
            and self._loop.time() - self._last_activity > 2 * self.heartbeat
        ):
            # The server no longer serves our requests (it restarted, or the consumer
            # moved): forget them and pull afresh.
            self.heartbeats_missed += 1
            self._owed = 0
            self._conn._report(HeartbeatMissed(f"pull on {self._sub.next_subject} went silent"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- FeedSink -----------------------------------------------------------------------

    def _feed_message(self, msg: JsMsg) -> None:
        if self._owed:
            self._owed -= 1
        if self._retry_delay:
            self._retry_at = self._retry_delay = 0.0
        self._activity += 1  # turned into a time in _wait(): no clock read per message
        self._sub._buffer.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed_status(self, status: int, description: str, pending: int) -> None:
        self._last_activity = self._loop.time()
        if status == STATUS_CONTROL:
            return
        lowered = description.lower()
        if status in (STATUS_REQUEST_TIMEOUT, STATUS_NO_MESSAGES) or (
            status == STATUS_CONFLICT and lowered.startswith(_TRANSIENT_409)
        ):
            # One request ended; without a count we cannot tell how much it still owed.
            self._owed = max(0, self._owed - pending) if pending else 0
            self._wake()
            return
        if status == STATUS_NO_RESPONDERS or (
            status == STATUS_CONFLICT and lowered.startswith(_DROPPED_409)
        ):
            # Every request of ours went unanswered (or was dropped): forget them all.
            self._owed = 0
            delay = min(_RETRY_MAX, self._retry_delay * 2) if self._retry_delay else _RETRY_FIRST
            self._retry_delay = delay
            self._retry_at = self._loop.time() + delay
            self._conn._report(status_error(status, description))
            self._wake()
            return
        self._error = status_error(status, description)
        self._wake()

    def _feed_reconnected(self) -> None:
        self._owed = 0
        self._top_up()
        self._wake()

    def _feed_closed(self) -> None:
        self._error = ConnectionClosed("connection closed")
        self._wake()

    # -- stopping -----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop pulling: waiting requests are cancelled; buffered messages stay for ``fetch``."""
        if self.stopped:
            return
        self.stopped = True
        self._wake()
        if self._sub._sink is self:
            self._sub._attach(None)
        if self._owed and not self._conn.is_closed:
            await self._sub._cancel_requests()
        self._owed = 0

    async def __aenter__(self) -> MessageStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
