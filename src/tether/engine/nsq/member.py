"""One client subscribed to a channel: its RDY count and the messages it has in flight.

RDY is a cap, as in nsqd: the client is sent messages while it has fewer than RDY in
flight. A message is in flight for one client until that client finishes or requeues
it, or its deadline (delivery + the client's ``msg_timeout``, moved by ``TOUCH``)
passes; only its owner may act on it. The in-flight table is insertion ordered, which
is deadline order (every delivery and touch gets ``now + msg_timeout``), so timeouts
are found at its front.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from tether.storage.base import MessageMeta


class InFlight(NamedTuple):
    """A message one client holds: which delivery of it, and until when."""

    seq: int
    attempts: int
    deadline: int
    delivered: int


class MessageSink(Protocol):
    """Where a member's messages go (its connection)."""

    def send_messages(
        self, metas: list[MessageMeta], ids: list[bytes], attempts: list[int]
    ) -> None:
        """Send these messages, in this order (bodies are the sink's to fetch)."""

    def channel_gone(self) -> None:
        """The channel (or its topic) was deleted: the client must go."""


class Member:
    """One client's share of a channel."""

    __slots__ = (
        "closing",
        "finish_count",
        "in_flight",
        "message_count",
        "msg_timeout",
        "rdy",
        "requeue_count",
        "sample_rate",
        "sink",
    )

    def __init__(self, sink: MessageSink, msg_timeout_ns: int, sample_rate: int = 0) -> None:
        self.sink = sink
        self.msg_timeout = msg_timeout_ns
        self.sample_rate = sample_rate  # percent of messages kept; 0 keeps all
        self.rdy = 0  # a client starts at RDY 0: nothing is sent until it says RDY
        self.closing = False  # after CLS: nothing more is sent
        self.in_flight: dict[bytes, InFlight] = {}
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0

    @property
    def capacity(self) -> int:
        """How many more messages may be sent now."""
        if self.closing:
            return 0
        return self.rdy - len(self.in_flight)

    def expire(self, now: int) -> int:
        """Drop the messages whose deadline passed (the channel requeues them); how many."""
        in_flight = self.in_flight
        dropped = 0
        while in_flight:
            msg_id = next(iter(in_flight))
            if in_flight[msg_id].deadline > now:
                break
            del in_flight[msg_id]
            dropped += 1
        return dropped
