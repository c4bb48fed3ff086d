"""Streaming reads through Spark: micro-batches, restarts from a checkpoint, data loss.

Results go to ``foreachBatch`` keyed by batch id: a replayed batch overwrites its
earlier output, as an idempotent sink would, so "exactly once" means every sequence
appears in exactly one batch of the final result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tether.testing import RunningServer

pytestmark = pytest.mark.spark


class Collector:
    """A foreachBatch sink: sequences per batch id (a replay replaces its batch)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[int]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = sorted(r.seq for r in df.select("seq").collect())

    def all_seqs(self) -> list[int]:
        return sorted(s for seqs in self.batches.values() for s in seqs)

    def sizes(self) -> list[int]:
        return [len(self.batches[b]) for b in sorted(self.batches)]


def stream_query(
    spark: Any, url: str, stream: str, checkpoint: Path, sink: Callable[..., None], **options: str
) -> Any:
    return (
        spark.readStream.format("tether")
        .option("servers", url)
        .option("stream", stream)
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
    )


def available_now(spark: Any, *args: Any, **options: str) -> None:
    query = stream_query(spark, *args, **options).trigger(availableNow=True).start()
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def test_available_now_respects_max_offsets_per_trigger(
    spark: Any, server: RunningServer, tools: Any, tmp_path: Path
) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 100))
    sink = Collector()
    available_now(
        spark,
        server.url,
        name,
        tmp_path / "ck",
        sink,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="30",
    )
    assert sink.sizes() == [30, 30, 30, 10]
    assert sink.all_seqs() == list(range(1, 101))


def test_restart_from_checkpoint_processes_each_message_once(
    spark: Any, server: RunningServer, tools: Any, tmp_path: Path
) -> None:
    """Default start (latest): messages published while the query is down are read on
    restart, none twice; the durable consumer follows the checkpoint."""
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 20))
    sink = Collector()
    args = (spark, server.url, name, tmp_path / "ck", sink)
    options = {"maxOffsetsPerTrigger": "25", "durable": "spark_orders"}
    available_now(*args, **options)
    assert sink.all_seqs() == []  # started at the end: the bookmark batch only
    tools.publish(server.url, tools.numbered(f"{name}.a", 20, 40))  # while stopped
    available_now(*args, **options)
    assert sink.all_seqs() == list(range(21, 61))
    tools.publish(server.url, tools.numbered(f"{name}.b", 60, 15))
    available_now(*args, **options)
    assert sink.all_seqs() == list(range(21, 76))
    # Commit runs one batch late: the consumer trails the checkpoint, never leads it.
    info = tools.api(server.url, f"CONSUMER.INFO.{name}.spark_orders")
    assert 20 <= info["ack_floor"]["stream_seq"] <= 75


def test_continuous_trigger_picks_up_new_messages(
    spark: Any, server: RunningServer, tools: Any, tmp_path: Path
) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 10))
    sink = Collector()
    query = (
        stream_query(spark, server.url, name, tmp_path / "ck", sink, startingOffsets="earliest")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while len(sink.all_seqs()) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        tools.publish(server.url, tools.numbered(f"{name}.a", 10, 5))
        while len(sink.all_seqs()) < 15 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
    assert sink.all_seqs() == list(range(1, 16))


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss(
    fail: bool, spark: Any, server: RunningServer, tools: Any, tmp_path: Path
) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 10))
    sink = Collector()
    args = (spark, server.url, name, tmp_path / "ck", sink)
    options = {"startingOffsets": "earliest", "failOnDataLoss": str(fail).lower()}
    available_now(*args, **options)
    assert sink.all_seqs() == list(range(1, 11))
    tools.publish(server.url, tools.numbered(f"{name}.a", 10, 10))
    tools.api(server.url, f"STREAM.PURGE.{name}", {"seq": 15})  # 11..14 never read
    if fail:
        with pytest.raises(Exception, match=r"messages 11\.\.14 .*'failOnDataLoss'"):
            available_now(*args, **options)
    else:
        available_now(*args, **options)
        assert sink.all_seqs() == [*range(1, 11), *range(15, 21)]
