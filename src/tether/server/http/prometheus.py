"""``/metrics``: every stream, consumer, the server and its store, in Prometheus' text format.

Nothing is counted on the hot path for this page: the values are read from the engine
when a scrape arrives (a stream's state, a consumer's cursor and delivery state, the
store's commit histograms), so a broker nobody scrapes pays nothing. The webhook-broker
job metrics (:mod:`tether.server.http.metrics`) come first, through prometheus_client;
the per-stream and per-consumer families are written here directly, as plain lines,
because prometheus_client builds a sample object per value and 10,000 consumers make
70,000 of them (several times the 100 ms a scrape may cost).

Labels are bounded: ``stream`` and ``consumer`` names only (never subjects, clients or
message ids). Past ``metrics_max_consumers`` consumers the per-consumer families stop
(the first ones by stream and name are kept) and ``tether_metrics_consumers_omitted``
says how many were left out. docs/operations.md lists every family.
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.engine.broker import Broker
from tether.engine.consumers import ConsumerRegistry
from tether.engine.jobs import WebhookService
from tether.server.config import ServerConfig
from tether.server.http.metrics import CONTENT_TYPE, JobsCollector
from tether.server.http.monitor import rss_bytes
from tether.server.nats.server import NatsServer
from tether.storage import Store
from tether.storage.stats import Histogram, StoreStats
from tether.version import __version__


class Observed(Protocol):
    """What ``/metrics`` reads (the process, which passes itself)."""

    config: ServerConfig
    nats: NatsServer
    store: Store | None
    broker: Broker | None
    consumers: ConsumerRegistry | None
    webhooks: WebhookService | None


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


class _Family:
    """One metric family's lines, header first."""

    __slots__ = ("lines", "name")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, labels: str, value: float) -> None:
        self.lines.append(f"{self.name}{labels} {value}")


def _histogram(name: str, help_text: str, hist: Histogram) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for le, count in hist.cumulative():
        lines.append(f'{name}_bucket{{le="{le}"}} {count}')
    lines.append(f"{name}_sum {hist.total}")
    lines.append(f"{name}_count {hist.count}")
    return lines


# name (without the tether_consumer_ prefix), type, help; in the order of _consumer_row
_CONSUMER_FAMILIES: list[tuple[str, str, str]] = [
    ("pending", "gauge", "Messages of the stream the consumer has not delivered yet (its lag)"),
    ("ack_pending", "gauge", "Messages delivered and waiting for an ack"),
    ("redelivered", "gauge", "Messages waiting for an ack that were delivered more than once"),
    ("dead", "gauge", "Dead letters: messages given up on (max_deliver reached, or terminated)"),
    ("waiting", "gauge", "Pull requests waiting for messages"),
    ("delivered_total", "counter", "Deliveries, redeliveries included (the consumer sequence)"),
    ("redelivered_total", "counter", "Redeliveries since the server started"),
    ("acked_total", "counter", "Messages acknowledged since the server started"),
    ("last_active_seconds", "gauge", "Unix time of the last delivery or ack (0: never)"),
]
NS = 1_000_000_000


def render(app: Observed, jobs: CollectorRegistry | None) -> bytes:
    """The whole page."""
    out: list[str] = []
    _server(app, out)
    broker, registry = app.broker, app.consumers
    if broker is not None:
        _streams(broker, registry, out)
    if registry is not None:
        _consumers(registry, app.config.metrics_max_consumers, out)
    if app.store is not None:
        _store(app.store, out)
    out.append("")
    body = "\n".join(out).encode()
    if jobs is not None:
        body = generate_latest(jobs) + body
    return body


def _server(app: Observed, out: list[str]) -> None:
    nats = app.nats
    stats = nats.stats()
    out.append("# HELP tether_info The running server (value 1)")
    out.append("# TYPE tether_info gauge")
    out.append(
        f'tether_info{{version="{_escape(__version__)}",server_id="{nats.server_id}",'
        f'server_name="{_escape(nats.server_name)}"}} 1'
    )
    out.append("# HELP tether_start_time_seconds Unix time the server started")
    out.append("# TYPE tether_start_time_seconds gauge")
    out.append(f"tether_start_time_seconds {nats.started_at}")
    for name, kind, help_text, key in (
        ("connections", "gauge", "NATS client connections open now", "connections"),
        ("connections_total", "counter", "NATS client connections accepted", "total_connections"),
        ("subscriptions", "gauge", "NATS subscriptions", "subscriptions"),
        ("in_msgs_total", "counter", "Messages received from NATS clients", "in_msgs"),
        ("out_msgs_total", "counter", "Messages sent to NATS clients", "out_msgs"),
        ("in_bytes_total", "counter", "Payload bytes received from NATS clients", "in_bytes"),
        ("out_bytes_total", "counter", "Payload bytes sent to NATS clients", "out_bytes"),
        ("slow_consumers_total", "counter", "Clients cut off as slow consumers", "slow_consumers"),
        ("pending_bytes", "gauge", "Outbound bytes not yet written to clients", "pending_bytes"),
    ):
        family = _Family(f"tether_server_{name}", kind, help_text)
        family.add("", stats[key])
        out.extend(family.lines)
    out.append("# HELP tether_process_resident_memory_bytes Resident memory of the process")
    out.append("# TYPE tether_process_resident_memory_bytes gauge")
    out.append(f"tether_process_resident_memory_bytes {rss_bytes()}")
    times = os.times()
    out.append("# HELP tether_process_cpu_seconds_total CPU time of the process")
    out.append("# TYPE tether_process_cpu_seconds_total counter")
    out.append(f"tether_process_cpu_seconds_total {times.user + times.system}")


def _streams(broker: Broker, registry: ConsumerRegistry | None, out: list[str]) -> None:
    families = [
        _Family("tether_stream_messages", "gauge", "Messages in the stream"),
        _Family("tether_stream_bytes", "gauge", "Bytes of the stream's messages"),
        _Family("tether_stream_first_seq", "gauge", "Sequence of the oldest message"),
        _Family("tether_stream_last_seq", "gauge", "Sequence of the newest message"),
        _Family(
            "tether_stream_published_total",
            "counter",
            "Messages stored since the stream was created (its last sequence)",
        ),
        _Family("tether_stream_consumers", "gauge", "Consumers of the stream"),
    ]
    messages, size, first, last, published, consumers = families
    for name in sorted(broker.streams):
        stream = broker.streams[name]
        st = stream.state
        labels = f'{{stream="{_escape(name)}"}}'
        messages.add(labels, st.msgs)
        size.add(labels, st.bytes)
        first.add(labels, st.first_seq)
        last.add(labels, st.last_seq)
        published.add(labels, st.last_seq)
        consumers.add(labels, len(registry.consumers_of(name)) if registry is not None else 0)
    for family in families:
        out.extend(family.lines)


# (stream, consumer) -> its label set as written: built once per consumer, not per scrape.
_LABELS: dict[tuple[str, str], str] = {}


def _label(stream: str, consumer: str) -> str:
    text = f'{{stream="{_escape(stream)}",consumer="{_escape(consumer)}"}}'
    _LABELS[(stream, consumer)] = text
    return text


def _consumers(registry: ConsumerRegistry, limit: int, out: list[str]) -> None:
    everyone = registry.all()
    chosen: list[Any] = everyone
    omitted = 0
    if len(everyone) > limit:
        everyone.sort(key=lambda c: (c.stream.name, c.name))
        chosen = everyone[:limit]
        omitted = len(everyone) - limit
    # One tuple of numbers per consumer, then one list comprehension per family: the
    # cheapest shape CPython has for 100,000 lines (see the module's docstring).
    labels = _LABELS
    if len(labels) > 2 * len(everyone) + 1024:
        labels.clear()  # consumers come and go: drop the names of the gone ones
    rows = [
        (
            labels.get((c.stream.name, c.name)) or _label(c.stream.name, c.name),
            c.cursor.num_pending,
            len(st.pending),
            c.num_redelivered if st.rdc else 0,
            len(st.dead),
            len(c.waiting) if c.is_pull else 0,
            c.dseq,
            c.redelivered_count,
            c.acked_count,
            (c.last_delivered_ns if c.last_delivered_ns > c.last_ack_ns else c.last_ack_ns) // NS,
        )
        for c in chosen
        for st in [c.state]
    ]
    for i, (name, kind, help_text) in enumerate(_CONSUMER_FAMILIES, 1):
        full = f"tether_consumer_{name}"
        out.append(f"# HELP {full} {help_text}")
        out.append(f"# TYPE {full} {kind}")
        if rows:
            out.append("\n".join([f"{full}{row[0]} {row[i]}" for row in rows]))
    out.append(
        "# HELP tether_metrics_consumers_omitted Consumers past metrics_max_consumers, "
        "left out of the per-consumer families"
    )
    out.append("# TYPE tether_metrics_consumers_omitted gauge")
    out.append(f"tether_metrics_consumers_omitted {omitted}")


def _store(store: Store, out: list[str]) -> None:
    stats_of = getattr(store, "stats", None)
    stats = stats_of() if callable(stats_of) else None
    if isinstance(stats, StoreStats):
        out.extend(
            _histogram(
                "tether_store_commit_ops",
                "Writes (messages, acks, consumer states) per group commit",
                stats.commit_ops,
            )
        )
        out.extend(
            _histogram(
                "tether_store_commit_seconds",
                "Time of one group commit, from the writer taking it to durable",
                stats.commit_seconds,
            )
        )
        out.extend(
            _histogram(
                "tether_store_fsync_seconds",
                "Time of the COMMIT statement alone, the durability point: SQLite's WAL write"
                " (and its fsync with sync=always); PostgreSQL's COMMIT round trip (its WAL"
                " flush, per synchronous_commit)",
                stats.sync_seconds,
            )
        )
    disk_of = getattr(store, "disk_bytes", None)
    size = disk_of() if callable(disk_of) else None
    if size is not None:  # PostgreSQL's: None until its first (background) read is done
        out.append(
            "# HELP tether_store_disk_bytes Bytes of the store on disk: SQLite's files, or"
            " pg_total_relation_size of Tether's PostgreSQL tables (read every few seconds)"
        )
        out.append("# TYPE tether_store_disk_bytes gauge")
        out.append(f"tether_store_disk_bytes {size}")


def routes(app: Observed) -> list[Route]:
    """``/metrics`` (replacing the job metrics alone, which it includes)."""
    jobs: CollectorRegistry | None = None
    if app.webhooks is not None:
        jobs = CollectorRegistry(auto_describe=False)
        jobs.register(JobsCollector(app.webhooks))

    async def metrics(request: Request) -> Response:
        started = time.perf_counter()
        body = render(app, jobs)
        took = time.perf_counter() - started
        tail = (
            "# HELP tether_metrics_scrape_seconds Time this page took to build\n"
            "# TYPE tether_metrics_scrape_seconds gauge\n"
            f"tether_metrics_scrape_seconds {took}\n"
        )
        return Response(body + tail.encode(), media_type=CONTENT_TYPE)

    return [Route("/metrics", metrics, methods=["GET"])]
