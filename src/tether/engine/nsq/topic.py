"""An NSQ topic: a stream, and the channels that consume it."""

from __future__ import annotations

from tether.engine.nsq.channel import Channel
from tether.engine.nsq.names import stream_name, subject
from tether.protocol.nsq.names import is_ephemeral


class Topic:
    """One topic. ``#ephemeral`` topics live in a memory stream and are deleted with
    their last channel; the others are file streams that stay until deleted."""

    __slots__ = (
        "channels",
        "ephemeral",
        "message_bytes",
        "message_count",
        "name",
        "paused",
        "stream_name",
        "subject",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.stream_name = stream_name(name)
        self.subject = subject(name)
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        self.paused = False  # /topic/pause: kept in the stream's metadata
        self.message_count = 0  # messages committed to the topic since startup
        self.message_bytes = 0

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"
