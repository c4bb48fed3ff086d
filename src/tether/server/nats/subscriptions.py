"""Subscriptions: what the router delivers a published message to.

A client's SUB writes MSG/HMSG frames into its connection's output; the server's own
subscriptions (the JetStream API, streams capturing subjects) call a handler. Both
live in the router's one subject index. A subscription knows its connection only as
a :class:`Client`, the few output calls the router and the front doors make on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tether.protocol.nats.commands import encode


class Client(Protocol):
    """A client connection, as the router and subscriptions write to it."""

    headers: bool
    echo: bool
    no_responders: bool

    def send_plain(self, head: bytes, payload: bytes) -> None: ...
    def send_msg(
        self, sid: bytes, subject: bytes, reply: bytes, headers: bytes | None, payload: bytes
    ) -> None: ...
    def send_frames(self, frames: list[bytes], payload_bytes: int) -> None: ...
    def flush_now(self) -> None: ...
    def remove_subscription(self, sub: ClientSubscription) -> None: ...


class Subscriber(Protocol):
    """Anything the router can deliver to (hashed by identity)."""

    def __hash__(self) -> int: ...

    client: Client | None
    queue: str

    def deliver(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes, sb: bytes, rb: bytes
    ) -> None: ...


InternalHandler = Callable[[str, str, bytes | None, bytes], None]
# (subject, replies, payloads): a run of header-less messages to one subject, in order.
RunHandler = Callable[[str, list[str], list[bytes]], None]
# (subjects, replies, payloads): a batch of header-less messages, each to its subject.
BatchHandler = Callable[[list[str], list[str], list[bytes]], None]
# (subject, replies, header blocks, payloads): a run of messages with headers to one
# subject, in order.
HeaderedRunHandler = Callable[[str, list[str], list[bytes], list[bytes]], None]


class InternalSubscription:
    """A server-side subscriber: calls ``handler(subject, reply, headers, payload)``.

    With a ``run_handler``, a run of messages without headers published to one subject
    by one connection (see :meth:`Router.publish_many`) is handed over in one call,
    which must have the effect of ``handler`` called for each message in turn. A
    ``batch_handler`` does the same for a batch of acks, each to its own subject (see
    :meth:`Router.publish_batch`), and a ``headered_handler`` for a run of messages with
    headers to one subject (see :meth:`Router.publish_headered_run`).
    """

    __slots__ = (
        "batch_handler",
        "client",
        "handler",
        "headered_handler",
        "queue",
        "run_handler",
        "subject",
    )

    def __init__(
        self,
        subject: str,
        handler: InternalHandler,
        queue: str = "",
        run_handler: RunHandler | None = None,
        batch_handler: BatchHandler | None = None,
        headered_handler: HeaderedRunHandler | None = None,
    ) -> None:
        self.subject = subject
        self.handler = handler
        self.queue = queue
        self.run_handler = run_handler
        self.batch_handler = batch_handler
        self.headered_handler = headered_handler
        self.client: Client | None = None

    def deliver(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes, sb: bytes, rb: bytes
    ) -> None:
        self.handler(subject, reply, headers, payload)


class ClientSubscription:
    """A client's SUB: delivers MSG/HMSG frames into the client's output buffer."""

    __slots__ = ("client", "delivered", "heads", "max_msgs", "queue", "sid", "sid_b", "subject")

    def __init__(self, client: Client, subject: str, queue: str, sid: str) -> None:
        self.client: Client | None = client
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.sid_b = encode(sid)
        self.max_msgs = 0
        self.delivered = 0
        self.heads: dict[bytes, bytes] = {}  # subject bytes -> b"MSG <subject> <sid> "

    def deliver(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes, sb: bytes, rb: bytes
    ) -> None:
        client = self.client
        if client is None:
            return
        self.delivered += 1
        if headers is None and not rb:
            head = self.heads.get(sb)
            if head is None:
                if len(self.heads) >= 256:
                    self.heads.clear()
                head = self.heads[sb] = b"MSG %s %s " % (sb, self.sid_b)
            client.send_plain(head, payload)
        else:
            client.send_msg(self.sid_b, sb, rb, headers, payload)
        if self.max_msgs and self.delivered >= self.max_msgs:
            client.remove_subscription(self)


class GuardedSubscription(ClientSubscription):
    """A client's SUB that its user's subscribe deny list overlaps (a wildcard, or a
    queue group): each subject is checked when delivered, as nats-server does."""

    __slots__ = ("denied",)

    def __init__(
        self, client: Client, subject: str, queue: str, sid: str, denied: Callable[[str, str], bool]
    ) -> None:
        super().__init__(client, subject, queue, sid)
        self.denied = denied

    def deliver(
        self, subject: str, reply: str, headers: bytes | None, payload: bytes, sb: bytes, rb: bytes
    ) -> None:
        if not self.denied(subject, self.queue):
            super().deliver(subject, reply, headers, payload, sb, rb)
