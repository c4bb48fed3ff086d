"""Consumers: durable cursors over a stream with per-message delivery state (pull
and push delivery, acks, redelivery with backoff, dead letters)."""

from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.registry import ConsumerRegistry, StreamOwner
from tether.engine.consumers.sinks import ConsumerHost, DeliverySink, RunSink

__all__ = [
    "Consumer",
    "ConsumerConfig",
    "ConsumerHost",
    "ConsumerRegistry",
    "DeliverySink",
    "RunSink",
    "StreamOwner",
]
