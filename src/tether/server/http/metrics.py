"""``/metrics`` in Prometheus' text format, and the status summaries.

Gauges are computed when scraped from the consumers (no bookkeeping on the hot path);
counters come from the service's monotonic :class:`Counters`. Each server has its own
registry, so several servers in one process (tests) never share series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from tether.engine.jobs import WebhookService
from tether.engine.jobs.view import DEAD, DELIVERED, INFLIGHT, QUEUED, STATUS_CODES
from tether.server.http.common import rfc3339

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class JobsCollector(Collector):
    """webhook-broker's ``queued_job_count`` and ``dead_job_count{channel,consumer}``
    plus Tether's per-status gauges and broker counters."""

    def __init__(self, service: WebhookService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        queued = GaugeMetricFamily("queued_job_count", "The current number of jobs in the queue")
        dead = GaugeMetricFamily(
            "dead_job_count", "Number of dead jobs per consumer", labels=["channel", "consumer"]
        )
        jobs = GaugeMetricFamily(
            "tether_jobs", "Jobs per consumer and status", labels=["channel", "consumer", "status"]
        )
        total_queued = 0
        for (channel, consumer), view in service.views.items():
            counts = view.counts()
            total_queued += counts[QUEUED]
            dead.add_metric([channel, consumer], counts[DEAD])
            for status in (QUEUED, INFLIGHT, DEAD):
                jobs.add_metric([channel, consumer, status], counts[status])
        queued.add_metric([], total_queued)
        yield queued
        yield dead
        yield jobs
        c = service.counters
        for name, help_text, value in (
            ("tether_http_broadcasts", "Messages broadcast over HTTP", c.broadcasts),
            ("tether_http_duplicate_messages", "Broadcasts refused as duplicates", c.duplicates),
            ("tether_http_scheduled_messages", "Messages scheduled for later", c.scheduled),
            ("tether_http_jobs_claimed", "Jobs handed out by the claim route", c.claimed),
            ("tether_webhook_deliveries_ok", "Push deliveries answered 2xx", c.deliveries_ok),
            (
                "tether_webhook_deliveries_failed",
                "Push deliveries that failed",
                c.deliveries_failed,
            ),
        ):
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], value)
            yield counter


def metrics_endpoint(service: WebhookService):  # type: ignore[no-untyped-def]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(service))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    return metrics


def job_status(service: WebhookService) -> dict[str, dict[str, list[dict[str, object]]]]:
    """``/job-status``: counts per channel, consumer and status (webhook-broker's codes)."""
    out: dict[str, dict[str, list[dict[str, object]]]] = {}
    for (channel, consumer), view in service.views.items():
        rows: list[dict[str, object]] = []
        for status, stamps in view.stamps().items():
            if stamps:
                rows.append(
                    {
                        "status": STATUS_CODES[status],
                        "count": len(stamps),
                        "oldestItemTimestamp": rfc3339(min(stamps)),
                        "newestItemTimestamp": rfc3339(max(stamps)),
                    }
                )
        delivered = view.delivered_count()
        if delivered:
            # Delivery times are kept for the most recent deliveries (view.py); jobs
            # delivered over NATS have the consumer's last ack time at least.
            stamps = view.delivered_stamps() or [view.consumer.last_ack_ns]
            rows.append(
                {
                    "status": STATUS_CODES[DELIVERED],
                    "count": delivered,
                    "oldestItemTimestamp": rfc3339(min(stamps)),
                    "newestItemTimestamp": rfc3339(max(stamps)),
                }
            )
        if rows:
            out.setdefault(channel, {})[consumer] = rows
    return out


def dlq_status(service: WebhookService) -> dict[str, list[dict[str, object]]]:
    reg = service.registry
    consumers = []
    for (channel, consumer), view in sorted(service.views.items()):
        k = reg.consumers.get((channel, consumer))
        c = reg.channels.get(channel)
        dead_count = view.counts()[DEAD]
        if k is None or not dead_count:
            continue
        consumers.append(
            {
                "channelId": channel,
                "channelName": c.name if c else channel,
                "consumerId": consumer,
                "consumerName": k.name,
                "deadCount": dead_count,
            }
        )
    return {"consumers": consumers}
