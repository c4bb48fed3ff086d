"""``/metrics`` of ``tether serve --store postgresql://...``: the storage families are
there, as for SQLite, read by prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import time

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tether.testing import PostgresServer, RunningServer, run_server

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(server: RunningServer) -> tuple[Samples, dict[str, str]]:
    text = httpx.get(server.http_url + "/metrics").text
    samples: Samples = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, kinds


async def test_storage_families_of_the_postgresql_store(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database("metrics_pg")
    with run_server(store=url) as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="PGM", subjects=["pgm.>"])
            for i in range(30):
                await js.publish("pgm.a", b"payload-%d" % i * 50)
        finally:
            await nc.close()

        # The tables' size is read in the background, after a scrape asks for it.
        deadline = time.monotonic() + 15
        samples, kinds = _scrape(server)
        while ("tether_store_disk_bytes", ()) not in samples:
            assert time.monotonic() < deadline, "tether_store_disk_bytes never appeared"
            await asyncio.sleep(0.1)
            samples, kinds = _scrape(server)

        for name in ("tether_store_commit_ops", "tether_store_commit_seconds"):
            assert kinds[name] == "histogram"
        assert kinds["tether_store_fsync_seconds"] == "histogram"
        assert kinds["tether_store_disk_bytes"] == "gauge"
        commits = samples[("tether_store_commit_seconds_count", ())]
        assert commits >= 31  # the stream, then one acked publish at a time
        assert samples[("tether_store_commit_ops_bucket", (("le", "+Inf"),))] == commits
        assert samples[("tether_store_commit_ops_sum", ())] >= 31
        assert samples[("tether_store_fsync_seconds_count", ())] == commits
        assert samples[("tether_store_fsync_seconds_sum", ())] > 0
        assert (
            samples[("tether_store_fsync_seconds_sum", ())]
            <= samples[("tether_store_commit_seconds_sum", ())]
        )
        # The tables with their indexes: more than the 30 payloads of 500+ bytes.
        assert samples[("tether_store_disk_bytes", ())] > 30 * 500
        assert samples[("tether_stream_messages", (("stream", "PGM"),))] == 30
