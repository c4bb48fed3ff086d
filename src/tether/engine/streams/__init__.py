"""Streams: append-only logs of messages captured from subjects, with limits,
retention, deduplication and the publish expectations of JetStream."""

from tether.engine.streams.config import StreamConfig
from tether.engine.streams.listener import StreamListener
from tether.engine.streams.stream import Stream

__all__ = ["Stream", "StreamConfig", "StreamListener"]
