"""What a consumer needs from the outside: a sink for its output, a host for its fate.

A front door implements :class:`DeliverySink` (send messages and status blocks, check
interest); the registry implements :class:`ConsumerHost` (persistence, retention,
deletion). Keeping them this small keeps the engine free of I/O and easy to fake.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from tether.storage.base import MessageMeta

# The consumer as the outside knows it. The sinks and the host are generic in it so
# that this module, and the consumer's parts that talk to them, need not import the
# consumer: each part passes itself along as an opaque ``C``.
C = TypeVar("C", contravariant=True)
Me = TypeVar("Me")


class DeliverySink(Protocol[C]):
    """Where a consumer's output goes (a front door)."""

    def deliver(self, consumer: C, to: str, meta: MessageMeta, reply: str) -> None:
        """Send message ``meta.seq`` to ``to`` with ``reply`` as its ack subject."""

    def control(self, consumer: C, to: str, block: bytes, reply: str = "") -> None:
        """Send a status/heartbeat/flow-control header block to ``to``, in order."""

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        """Publish a JetStream advisory (only if someone listens)."""

    def has_interest(self, subject: str) -> bool:
        """Whether anything is subscribed to ``subject``."""

    def backlog(self, consumer: C) -> int:
        """How many deliveries the sink still holds for ``consumer`` (slow reads)."""


@runtime_checkable
class RunSink(DeliverySink[C], Protocol[C]):
    """A sink that also takes a run of messages at once (optional: the NATS front door).

    A pull consumer delivers new messages in runs; with such a sink, it decides the
    whole run first and hands it over in one call instead of one ``deliver`` each.
    """

    def steady(self, subject: str) -> bool:
        """Whether ``subject`` has interest, and delivering to it changes nothing else
        at once (no subscription that ends after a number of messages, no server-side
        subscriber): then deliveries to it may be decided before they are written."""

    def deliver_run(
        self, consumer: C, tos: list[str], metas: list[MessageMeta], replies: list[str]
    ) -> None:
        """``deliver(consumer, tos[i], metas[i], replies[i])`` for each ``i`` in order."""


class ConsumerHost(Protocol[C]):
    """The registry that owns consumers."""

    def consumer_changed(self, consumer: C) -> None:
        """The consumer's state changed and should be saved (once per tick is enough)."""

    def consumer_acked(self, consumer: C, seqs: list[int]) -> None:
        """Messages were acked (only called when the stream's retention needs it)."""

    def consumer_inactive(self, consumer: C) -> None:
        """The consumer passed its inactive threshold and should be deleted."""
