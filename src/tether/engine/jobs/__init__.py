"""Jobs: webhook-broker's channels, producers, consumers and jobs as a view over
streams and durable consumers."""

from tether.engine.jobs.registry import Channel, Consumer, Producer
from tether.engine.jobs.service import ServiceSettings, WebhookService
from tether.engine.jobs.view import JobSettings, JobView

__all__ = [
    "Channel",
    "Consumer",
    "JobSettings",
    "JobView",
    "Producer",
    "ServiceSettings",
    "WebhookService",
]
