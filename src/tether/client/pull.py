"""Pull subscriptions, following the NATS pull-subscribe ADR to the byte.

``fetch(n)`` (n > 1) uses a fresh inbox per call::

    SUB <inbox> <sid>
    PUB $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> <inbox> {"batch":n,"no_wait":true}
      ← messages now available, or a 404 status
    UNSUB <sid> <n+1>               (after a 404: the status already counted as one message)
    PUB ...MSG.NEXT... <inbox> {"batch":n,"expires":<timeout - 100ms in ns>}
      ← messages, until n arrived (the server drops the interest itself) or a status
    UNSUB <sid>                     (when we stop early: timeout or a status)

``fetch(1)`` first asks with ``no_wait`` on this subscription's own wildcard inbox
(``<inbox>.*``, subscribed once), then falls back to a one-message request on a
unique inbox. Status messages (404, 408, 409, 503, 100 ...) never reach the caller
as messages: they end a batch or raise a typed error. With ``heartbeat=``, the
server sends idle heartbeats and a pull that goes silent for two intervals raises
:class:`HeartbeatMissed`; auto-unsubscribe counts are then not used, since
heartbeats would count against them.

The same wildcard inbox carries the continuous feed behind :meth:`messages` and the
:class:`~tether.client.worker.Worker`: requests carry a token in the reply subject,
messages arrive with their stored subject (so they cannot be matched to a request),
and the caller keeps aggregate accounting of how many messages are still owed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from tether.client._listener import Listener
from tether.client._pull_requests import (
    expires_ns,
    long_request,
    no_wait_request,
    pending_messages,
    status_error,
)
from tether.client.consume import MessageStream
from tether.client.errors import (
    BadSubscription,
    ClientError,
    ConnectionClosed,
    HeartbeatMissed,
    Timeout,
)
from tether.client.message import (
    STATUS_CONTROL,
    STATUS_NO_MESSAGES,
    STATUS_REQUEST_TIMEOUT,
    JsMsg,
    description_of,
    status_of,
)
from tether.client.subscription import RawHandler, Subscription, SubscriptionConnection
from tether.protocol.nats import encode_pub


class PullConnection(SubscriptionConnection, Protocol):
    """What pull subscriptions need of the connection: inboxes, raw subscriptions, events."""

    @property
    def is_connected(self) -> bool: ...
    def new_inbox(self) -> str: ...
    def _subscribe_raw(
        self, subject: str, handler: RawHandler, queue: str = ""
    ) -> Subscription: ...
    def _listen(self, listener: Listener) -> None: ...
    def _unlisten(self, listener: Listener) -> None: ...


class PullContext(Protocol):
    """What a pull subscription needs of its JetStream context: the connection, the API prefix."""

    @property
    def conn(self) -> PullConnection: ...
    @property
    def prefix(self) -> str: ...


class FeedSink(Protocol):
    """Receives what arrives on the wildcard inbox in continuous mode."""

    def _feed_message(self, msg: JsMsg) -> None: ...
    def _feed_status(self, status: int, description: str, pending: int) -> None: ...
    def _feed_reconnected(self) -> None: ...
    def _feed_closed(self) -> None: ...


class _Batch:
    """One fetch in progress."""

    __slots__ = (
        "deadline",
        "description",
        "done",
        "heartbeat",
        "last_activity",
        "lingering",
        "msgs",
        "reply",
        "status",
        "token",
        "want",
    )

    def __init__(self, want: int, reply: str, token: str = "") -> None:
        loop = asyncio.get_running_loop()
        self.want = want
        self.reply = reply
        self.token = token
        self.msgs: list[JsMsg] = []
        self.status = 0
        self.description = ""
        self.done: asyncio.Future[None] = loop.create_future()
        self.last_activity = loop.time()
        self.lingering = False
        self.deadline = 0.0
        self.heartbeat: float | None = None

    def request(self) -> bytes:
        """The pull request for what this fetch still waits for (re-sent after a reconnect)."""
        want = self.want - len(self.msgs)
        if not self.lingering:
            return no_wait_request(want)
        remaining = self.deadline - asyncio.get_running_loop().time()
        return long_request(want, expires_ns(max(remaining, 0.01)), self.heartbeat)

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def restart(self) -> None:
        self.status = 0
        self.description = ""
        self.done = asyncio.get_running_loop().create_future()


class PullSubscription:
    """Pulls messages from one consumer. Get it with ``js.pull_subscribe(stream, consumer)``."""

    def __init__(self, js: PullContext, stream: str, consumer: str) -> None:
        self._js = js
        self._conn = js.conn
        self.stream = stream
        self.consumer = consumer
        self.next_subject = f"{js.prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._buffer: deque[JsMsg] = deque()
        self._fetch: _Batch | None = None
        self._inbox_batches: set[_Batch] = set()
        self._sink: FeedSink | None = None
        self._stream: MessageStream | None = None
        self._seq = 0
        self._closed = False
        self._prefix = ""
        self._wild: Subscription | None = None
        self._subscribe_wildcard()
        self._conn._listen(self)

    # -- the wildcard inbox -------------------------------------------------------------

    def _subscribe_wildcard(self) -> None:
        prefix = self._prefix = self._conn.new_inbox() + "."

        def on_wildcard(subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
            if hdr is not None:
                status = status_of(hdr)
                if status:
                    if subject.startswith(prefix):
                        self._on_wildcard_status(subject[len(prefix) :], status, hdr)
                    return
            msg = JsMsg(self._conn, subject, reply, data, hdr)
            sink = self._sink
            if sink is not None:
                sink._feed_message(msg)
                return
            batch = self._fetch
            if batch is not None and not batch.done.done():
                batch.msgs.append(msg)
                if len(batch.msgs) >= batch.want:
                    batch.finish()
            else:
                self._buffer.append(msg)  # a late reply: keep it for the next fetch

        self._wild = self._conn._subscribe_raw(prefix + "*", on_wildcard)

    def _on_wildcard_status(self, token: str, status: int, hdr: bytes) -> None:
        sink = self._sink
        if sink is not None:
            if status == STATUS_CONTROL:
                sink._feed_status(status, "", 0)
            else:
                sink._feed_status(status, description_of(hdr), pending_messages(hdr))
            return
        batch = self._fetch
        if batch is None or batch.token != token:
            return  # a status for a request we no longer wait for
        if status == STATUS_CONTROL:
            batch.last_activity = asyncio.get_running_loop().time()
            return
        batch.status = status
        batch.description = description_of(hdr)
        batch.finish()

    def _next_token(self) -> str:
        self._seq += 1
        return str(self._seq)

    def _request(self, batch: int, expires: int, heartbeat: float | None = None) -> str:
        """Send one lingering pull on the wildcard inbox (continuous mode); returns its token."""
        token = self._next_token()
        self._conn._send(
            encode_pub(
                self.next_subject, long_request(batch, expires, heartbeat), self._prefix + token
            )
        )
        return token

    async def _cancel_requests(self, timeout: float = 2.0) -> None:  # noqa: ASYNC109 - sent to the server as the pull expiry / API timeout
        """Make the server drop every waiting request of this subscription.

        The old wildcard interest is removed, and its subscription keeps routing until a
        PING round trip proves the server saw the UNSUB, so nothing sent before that
        is lost; a new wildcard inbox takes over.
        """
        old = self._wild
        self._subscribe_wildcard()
        if old is None or old.closed:
            return
        self._conn._unsubscribe(old, 0)
        with contextlib.suppress(ClientError):
            await self._conn.flush(timeout)
        self._conn._forget(old)

    def _attach(self, sink: FeedSink | None) -> None:
        if sink is not None and (self._sink is not None or self._fetch or self._inbox_batches):
            raise BadSubscription("this pull subscription is already being consumed")
        self._sink = sink

    # -- fetch --------------------------------------------------------------------------

    async def fetch(
        self,
        batch: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109 - becomes the pull's expires
        *,
        heartbeat: float | None = None,
        no_wait: bool = False,
    ) -> list[JsMsg]:
        """Up to ``batch`` messages; :class:`Timeout` if none arrived within ``timeout``.

        Messages already at the server come back at once; otherwise the pull lingers
        until ``batch`` messages arrived or the timeout. With ``no_wait=True`` only what
        is available now is returned, possibly nothing (no lingering pull).
        """
        if self._closed:
            raise BadSubscription("pull subscription is closed")
        if batch < 1 or timeout <= 0:
            raise ValueError("fetch needs batch >= 1 and timeout > 0")
        if heartbeat is not None and heartbeat * 2 * 1e9 > expires_ns(timeout):
            raise ValueError("heartbeat must be at most half of the pull's expiry")
        if self._sink is not None or self._fetch is not None or self._inbox_batches:
            raise BadSubscription("another fetch or message stream is using this subscription")
        if self._buffer:
            return [self._buffer.popleft() for _ in range(min(batch, len(self._buffer)))]
        if batch == 1:
            return await self._fetch_one(timeout, heartbeat, no_wait)
        return await self._fetch_on_inbox(
            batch, timeout, heartbeat, no_wait_first=True, only_no_wait=no_wait
        )

    async def next(self, timeout: float = 5.0) -> JsMsg:  # noqa: ASYNC109 - the NATS client API
        """One message (``fetch(1)``)."""
        return (await self.fetch(1, timeout))[0]

    async def _fetch_one(
        self,
        timeout: float,  # noqa: ASYNC109 - becomes the pull's expires
        heartbeat: float | None,
        no_wait: bool,
    ) -> list[JsMsg]:
        """Pull(1): no_wait on the wildcard inbox, then one lingering request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        token = self._next_token()
        batch = _Batch(1, self._prefix + token, token)
        self._fetch = batch
        try:
            self._conn._send(encode_pub(self.next_subject, no_wait_request(1), batch.reply))
            await _wait(batch.done, deadline - loop.time())
        finally:
            self._fetch = None
        if batch.msgs:
            return batch.msgs
        if batch.status and batch.status not in (STATUS_NO_MESSAGES, STATUS_REQUEST_TIMEOUT):
            raise status_error(batch.status, batch.description)
        if not batch.status:
            raise Timeout(
                f"no reply to a pull from {self.stream}/{self.consumer} within {timeout}s"
            )
        if no_wait:
            return []
        return await self._fetch_on_inbox(1, timeout, heartbeat, no_wait_first=False)

    async def _fetch_on_inbox(
        self,
        want: int,
        timeout: float,  # noqa: ASYNC109 - becomes the pull's expires
        heartbeat: float | None,
        *,
        no_wait_first: bool,
        only_no_wait: bool = False,
    ) -> list[JsMsg]:
        conn = self._conn
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        inbox = conn.new_inbox()
        batch = _Batch(want, inbox)

        def on_inbox(subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
            status = status_of(hdr)
            if status:
                batch.last_activity = loop.time()
                if status != STATUS_CONTROL and not batch.done.done():
                    batch.status = status
                    batch.description = description_of(hdr) if hdr else ""
                    batch.finish()
                return
            msg = JsMsg(conn, subject, reply, data, hdr)
            batch.last_activity = loop.time()
            if batch.done.done():
                self._buffer.append(msg)
                return
            batch.msgs.append(msg)
            if len(batch.msgs) >= batch.want:
                batch.finish()

        sub = conn._subscribe_raw(inbox, on_inbox)
        self._inbox_batches.add(batch)
        try:
            if no_wait_first:
                conn._send(encode_pub(self.next_subject, no_wait_request(want), inbox))
                await _wait(batch.done, deadline - loop.time())
                if batch.msgs or batch.status not in (STATUS_NO_MESSAGES, STATUS_REQUEST_TIMEOUT):
                    return self._result(batch, timeout)
                if only_no_wait:
                    return []
                batch.restart()
                if heartbeat is None:
                    await sub.unsubscribe(want + 1)  # the 404 already counted as one
            elif heartbeat is None:
                await sub.unsubscribe(want)
            batch.lingering = True
            batch.heartbeat = heartbeat
            batch.deadline = loop.time() + timeout
            conn._send(
                encode_pub(
                    self.next_subject, long_request(want, expires_ns(timeout), heartbeat), inbox
                )
            )
            await self._linger(batch, batch.deadline, heartbeat)
            return self._result(batch, timeout)
        finally:
            self._inbox_batches.discard(batch)
            if not sub.closed:
                await sub.unsubscribe()

    async def _linger(self, batch: _Batch, deadline: float, heartbeat: float | None) -> None:
        loop = asyncio.get_running_loop()
        while not batch.done.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await _wait(batch.done, remaining if heartbeat is None else min(remaining, heartbeat))
            if (
                heartbeat is not None
                and not batch.done.done()
                and loop.time() - batch.last_activity > 2 * heartbeat
            ):
                raise HeartbeatMissed(
                    f"no heartbeat from {self.stream}/{self.consumer} for {2 * heartbeat}s"
                )

    def _result(self, batch: _Batch, timeout: float) -> list[JsMsg]:
        if batch.msgs:
            return batch.msgs
        status = batch.status
        if status in (STATUS_REQUEST_TIMEOUT, STATUS_NO_MESSAGES) or not status:
            if self._closed:
                raise ConnectionClosed("pull subscription closed while fetching")
            raise Timeout(f"no messages from {self.stream}/{self.consumer} within {timeout}s")
        raise status_error(status, batch.description)

    # -- continuous consumption -----------------------------------------------------------

    def messages(
        self,
        *,
        batch: int = 500,
        threshold: int | None = None,
        expires: float = 30.0,
        heartbeat: float | None = 5.0,
    ) -> MessageStream:
        """An endless async iterator of messages with a prefetch buffer kept topped up.

        Up to ``batch`` messages are requested ahead; a new pull goes out when buffered
        plus still-owed messages fall to ``threshold`` (default: half of ``batch``).
        Use it as ``async with sub.messages() as stream: async for msg in stream``.
        """
        if self._stream is not None and not self._stream.stopped:
            raise BadSubscription("a message stream is already running on this subscription")
        stream = MessageStream(self, batch, threshold, expires, heartbeat)
        self._stream = stream
        return stream

    # -- connection events --------------------------------------------------------------

    def _on_disconnected(self) -> None:
        pass

    def _on_reconnected(self) -> None:
        # The server forgot our waiting requests with the old connection: ask again.
        for batch in [self._fetch, *self._inbox_batches]:
            if batch is not None and not batch.done.done():
                self._conn._send(encode_pub(self.next_subject, batch.request(), batch.reply))
        if self._sink is not None:
            self._sink._feed_reconnected()

    def _on_closed(self) -> None:
        self._closed = True
        for batch in [self._fetch, *self._inbox_batches]:
            if batch is not None:
                batch.finish()
        if self._sink is not None:
            self._sink._feed_closed()

    @property
    def buffered(self) -> int:
        """Messages delivered to us but not yet handed out."""
        return len(self._buffer)

    async def unsubscribe(self, *, nak_buffered: bool = True) -> None:
        """Stop: drop server-side interest; buffered messages are naked for prompt redelivery."""
        if self._stream is not None:
            await self._stream.stop()
        self._closed = True
        self._conn._unlisten(self)
        wild = self._wild
        if wild is not None and not wild.closed and not self._conn.is_closed:
            await wild.unsubscribe()
        while self._buffer:
            msg = self._buffer.popleft()
            if nak_buffered and not self._conn.is_closed:
                with contextlib.suppress(ClientError):
                    msg._settle()
                    self._conn._send(encode_pub(msg.reply, b"-NAK"))


async def _wait(fut: asyncio.Future[None], timeout: float) -> None:  # noqa: ASYNC109 - sent to the server as the pull expiry / API timeout
    """Wait for ``fut`` up to ``timeout`` seconds without cancelling it."""
    if fut.done() or timeout <= 0:
        return
    await asyncio.wait((fut,), timeout=timeout)
