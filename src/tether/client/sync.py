"""A thin synchronous facade: the asyncio client on a private event-loop thread.

For scripts, notebooks and thread-based code::

    from tether.client.sync import connect

    with connect("nats://127.0.0.1:4222") as nc:
        js = nc.jetstream()
        js.publish("orders.new", b"hello")
        sub = js.pull_subscribe("ORDERS", "worker")
        for msg in sub.fetch(10, timeout=1):
            msg.ack()

Every call blocks until the asyncio operation finished; nothing is duplicated: each
method forwards to its ``async`` counterpart.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tether.client.connection import Connection
from tether.client.connection import connect as connect_async
from tether.client.jetstream import JetStream
from tether.client.message import JsMsg, JsMsgView, Msg
from tether.client.models import ConsumerInfo, PubAck, StreamInfo
from tether.client.pull import PullSubscription

T = TypeVar("T")


class _Portal:
    """An event loop running in a daemon thread; ``call`` runs a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tether-client", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class SyncMsg(JsMsgView):
    """A JetStream message with blocking ack methods."""

    __slots__ = ("_portal",)

    def __init__(self, portal: _Portal, msg: JsMsg) -> None:
        super().__init__(msg)
        self._portal = portal

    def ack(self) -> None:
        self._portal.call(self.msg.ack())

    def ack_sync(self, timeout: float = 5.0) -> None:
        self._portal.call(self.msg.ack_sync(timeout))

    def nak(self, delay: float | None = None) -> None:
        self._portal.call(self.msg.nak(delay))

    def in_progress(self) -> None:
        self._portal.call(self.msg.in_progress())

    def term(self, reason: str = "") -> None:
        self._portal.call(self.msg.term(reason))


class SyncPullSubscription:
    """Blocking :class:`~tether.client.pull.PullSubscription`."""

    def __init__(self, portal: _Portal, sub: PullSubscription) -> None:
        self._portal = portal
        self.sub = sub

    def fetch(
        self, batch: int = 1, timeout: float = 5.0, *, no_wait: bool = False
    ) -> list[SyncMsg]:
        msgs = self._portal.call(self.sub.fetch(batch, timeout, no_wait=no_wait))
        return [SyncMsg(self._portal, m) for m in msgs]

    def unsubscribe(self) -> None:
        self._portal.call(self.sub.unsubscribe())


class SyncJetStream:
    """Blocking :class:`~tether.client.jetstream.JetStream`."""

    def __init__(self, portal: _Portal, js: JetStream) -> None:
        self._portal = portal
        self.js = js

    def add_stream(self, **config: Any) -> StreamInfo:
        return self._portal.call(self.js.add_stream(**config))

    def stream_info(self, name: str) -> StreamInfo:
        return self._portal.call(self.js.stream_info(name))

    def delete_stream(self, name: str) -> bool:
        return self._portal.call(self.js.delete_stream(name))

    def add_consumer(self, stream: str, **config: Any) -> ConsumerInfo:
        return self._portal.call(self.js.add_consumer(stream, **config))

    def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return self._portal.call(self.js.consumer_info(stream, name))

    def publish(self, subject: str, payload: bytes = b"", **options: Any) -> PubAck:
        return self._portal.call(self.js.publish(subject, payload, **options))

    def pull_subscribe(self, stream: str, consumer: str) -> SyncPullSubscription:
        sub = self._portal.call(self.js.pull_subscribe(stream, consumer))
        return SyncPullSubscription(self._portal, sub)


class SyncConnection:
    """Blocking :class:`~tether.client.connection.Connection`; close it (or use ``with``)."""

    def __init__(self, portal: _Portal, conn: Connection) -> None:
        self._portal = portal
        self.conn = conn

    def publish(
        self, subject: str, payload: bytes = b"", *, headers: dict[str, str] | None = None
    ) -> None:
        self._portal.call(self.conn.publish(subject, payload, headers=headers))

    def request(self, subject: str, payload: bytes = b"", *, timeout: float = 5.0) -> Msg:
        return self._portal.call(self.conn.request(subject, payload, timeout=timeout))

    def flush(self, timeout: float | None = None) -> None:
        self._portal.call(self.conn.flush(timeout))

    def jetstream(self, **options: Any) -> SyncJetStream:
        return SyncJetStream(self._portal, self.conn.jetstream(**options))

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if not self._portal.loop.is_closed():
            self._portal.call(self.conn.close())
            self._portal.stop()

    def __enter__(self) -> SyncConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(servers: str | list[str] | None = None, **options: Any) -> SyncConnection:
    """Connect (blocking); same arguments as :func:`tether.client.connect`."""
    portal = _Portal()
    try:
        conn = portal.call(connect_async(servers, **options))
    except BaseException:
        portal.stop()
        raise
    return SyncConnection(portal, conn)
