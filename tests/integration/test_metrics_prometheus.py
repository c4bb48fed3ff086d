"""``/metrics`` read by prometheus_client's own parser, its numbers checked against
``CONSUMER.INFO`` and ``STREAM.INFO`` of the same moment; the start lines of the log;
JSON log lines; debug lines for connections and stream/consumer changes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import nats
import pytest
from nats.js import api
from prometheus_client.parser import text_string_to_metric_families

from tether.testing import RunningServer, run_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(args=["--log-level", "debug", "--log-format", "json"]) as srv:
        yield srv


def _scrape(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(server.http_url + "/metrics").text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _consumer(samples: dict, name: str, stream: str, consumer: str) -> float:  # type: ignore[type-arg]
    return samples[(name, (("consumer", consumer), ("stream", stream)))]  # type: ignore[no-any-return]


async def test_metrics_match_consumer_info(server: RunningServer) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="METRICS", subjects=["metrics.>"])
        for i in range(50):
            await js.publish("metrics.a", b"payload-%d" % i)
        sub = await js.pull_subscribe(
            "metrics.a",
            durable="worker",
            stream="METRICS",
            config=api.ConsumerConfig(max_deliver=2, ack_wait=30),
        )
        msgs = await sub.fetch(20, timeout=5)
        for msg in msgs[:12]:
            await msg.ack_sync()
        await msgs[12].nak()
        await msgs[13].term()
        again = await sub.fetch(1, timeout=5)  # the nak'd one, redelivered
        assert again[0].metadata.num_delivered == 2
        await js.add_consumer("METRICS", api.ConsumerConfig(durable_name="idle"))

        info = await js.consumer_info("METRICS", "worker")
        stream = await js.stream_info("METRICS")
        samples = _scrape(server)

        def c(name: str, consumer: str = "worker") -> float:
            return _consumer(samples, name, "METRICS", consumer)

        assert c("tether_consumer_pending") == info.num_pending == 30
        assert c("tether_consumer_ack_pending") == info.num_ack_pending
        assert c("tether_consumer_redelivered") == info.num_redelivered == 1
        assert c("tether_consumer_waiting") == info.num_waiting
        assert c("tether_consumer_delivered_total") == info.delivered.consumer_seq == 21
        assert c("tether_consumer_acked_total") == 12
        assert c("tether_consumer_redelivered_total") == 1
        assert c("tether_consumer_dead") == 1
        assert c("tether_consumer_pending", "idle") == 50
        labels = (("stream", "METRICS"),)
        assert samples[("tether_stream_messages", labels)] == stream.state.messages == 50
        assert samples[("tether_stream_bytes", labels)] == stream.state.bytes
        assert samples[("tether_stream_first_seq", labels)] == stream.state.first_seq
        assert samples[("tether_stream_last_seq", labels)] == stream.state.last_seq == 50
        assert samples[("tether_stream_published_total", labels)] == 50
        assert samples[("tether_stream_consumers", labels)] == 2
        assert samples[("tether_server_connections", ())] >= 1
        assert samples[("tether_server_in_msgs_total", ())] >= 50
        assert samples[("tether_store_commit_seconds_count", ())] > 0
        assert samples[("tether_store_fsync_seconds_count", ())] > 0
        assert samples[("tether_store_commit_ops_bucket", (("le", "+Inf"),))] > 0
        assert samples[("tether_store_disk_bytes", ())] > 0
        assert samples[("tether_metrics_consumers_omitted", ())] == 0
        assert ("queued_job_count", ()) in samples  # the job metrics are still there
    finally:
        await nc.close()


def test_log_lines(server: RunningServer) -> None:
    # Collected over the module's run: the tests above made connections and changes
    # (the last close may take a moment to be logged).
    deadline = time.monotonic() + 5
    while "Client connection closed" not in server.stderr and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in server.stderr.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert all({"time", "level", "logger", "pid", "msg"} <= line.keys() for line in lines)
    assert any(m.strip().startswith("Version:") for m in messages)
    store = next(m for m in messages if m.strip().startswith("Store:"))
    assert "sqlite:///" in store  # the absolute data directory
    assert any(m.strip().startswith("Sync:") for m in messages)
    assert any(m.startswith("Dashboard on http://") for m in messages)
    assert any("Client connection created" in m for m in messages)
    assert any("Client connection closed" in m for m in messages)
    assert "stream METRICS created (subjects metrics.>)" in messages
    assert "consumer METRICS > idle created" in messages
    assert any(m.startswith("Loaded the store:") for m in messages)


def test_consumer_limit_bounds_the_series() -> None:
    with run_server(store="memory", args=["--config", str(_limit_config())]) as srv:
        import asyncio

        async def make() -> None:
            nc = await nats.connect(srv.url)
            js = nc.jetstream()
            await js.add_stream(name="MANY", subjects=["many.>"])
            for i in range(5):
                await js.add_consumer("MANY", api.ConsumerConfig(durable_name=f"c{i}"))
            await nc.close()

        asyncio.run(make())
        samples = _scrape(srv)
        kept = [k for k in samples if k[0] == "tether_consumer_pending"]
        assert len(kept) == 3
        assert samples[("tether_metrics_consumers_omitted", ())] == 2


def _limit_config() -> str:
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="tether-metrics-")) / "tether.toml"
    path.write_text("metrics_max_consumers = 3\n")
    return str(path)
