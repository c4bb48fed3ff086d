"""Spark data source throughput: batch and streaming reads of a stream on ``local[2]``.

Fills a stream with ``--messages`` messages of ``--size`` bytes (SDK ``publish_async``),
then measures, each on the whole stream:

* ``fetch only``: the executor read path (Tether's block reads, batched DIRECT.GET, or
  the consumer fallback, into Arrow batches) run in this process without Spark: the
  ceiling the server and client allow with one reader;
* ``batch, Arrow``: ``spark.read.format("tether")`` with ``--partitions`` partitions,
  ``read()`` yielding Arrow record batches (what the connector does);
* ``batch, tuples``: the same reads yielding one Python tuple per row (for comparison);
* ``streaming``: ``readStream`` with ``maxOffsetsPerTrigger`` into the ``noop`` sink,
  ``availableNow`` trigger: end-to-end rows/s including micro-batch planning.

Rows/s = messages / wall time of the Spark action. Session and Python worker start are
excluded, and so is the JVM's warm-up: a first read of the whole stream (its rate is
printed as ``warm-up``) compiles the Arrow-to-row path, which otherwise slows the
first reads of a session by up to 2x. Each batch read is then repeated ``--repeat``
times (3) and the median is reported, with every run printed. Tether
and nats-server (``-js``, file store) are measured in the same run, one after the
other with the same Spark session, and a table with the ratios closes the output.

    .venv/bin/python benchmarks/spark_read.py                     # 1M x 128 B, both
    .venv/bin/python benchmarks/spark_read.py --messages 200000 --peers tether
    .venv/bin/python benchmarks/spark_read.py --read-method consumer
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fill_stream, start_nats_server, start_tether  # after the sys.path tweak above

from tether.spark import TetherDataSource, _runtime
from tether.spark._fetch import RangePartition, read_partition
from tether.spark.batch import TetherBatchReader
from tether.spark.options import read_options


async def fill(url: str, messages: int, size: int) -> float:
    """Create BENCH (direct gets allowed) and publish; returns messages per second."""
    return await fill_stream(url, messages, size, allow_direct=True)


class TupleReader(TetherBatchReader):
    """The connector's reader, but yielding a Python tuple per row (the slow path)."""

    def read(self, partition: Any) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            return
        for batch in read_partition(partition):
            yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


class TupleSource(TetherDataSource):
    @classmethod
    def name(cls) -> str:
        return "tether_tuples"

    def reader(self, schema: Any) -> Any:
        return TupleReader(read_options(self.options, streaming=False))


def fetch_only(url: str, messages: int, method: str) -> float:
    opts = read_options({"servers": url, "stream": "BENCH"}, streaming=False)
    part = RangePartition(
        opts.conn,
        "BENCH",
        1,
        messages + 1,
        (),
        False,
        method,
        opts.fetch_batch_size,
        opts.fetch_max_bytes,
    )
    start = time.perf_counter()
    rows = sum(batch.num_rows for batch in read_partition(part))
    elapsed = time.perf_counter() - start
    assert rows == messages, rows
    return rows / elapsed


def timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def batch_read(spark: Any, fmt: str, url: str, args: argparse.Namespace) -> Any:
    """The whole stream as a batch DataFrame of data source ``fmt``."""
    return (
        spark.read.format(fmt)
        .option("servers", url)
        .option("stream", "BENCH")
        .option("minPartitions", str(args.partitions))
        .option("maxRecordsPerPartition", str(max(1, args.messages // args.partitions)))
        .option("readMethod", args.read_method)
        .load()
    )


def spark_runs(spark: Any, url: str, args: argparse.Namespace) -> dict[str, float]:
    results: dict[str, float] = {}
    n = args.messages
    # Warm up: the first action of a session starts the Python workers (seconds), and
    # the JVM compiles its Arrow-to-row path during the first large reads.
    warm = batch_read(spark, "tether", url, args)
    results["warm-up (batch, Arrow)"] = n / timed(lambda: warm.selectExpr("count(*)").collect())
    for label, fmt in (("batch, Arrow", "tether"), ("batch, tuples", "tether_tuples")):
        df = batch_read(spark, fmt, url, args)
        rates = []
        for _ in range(args.repeat if fmt == "tether" else 1):
            start = time.perf_counter()
            (count,) = df.selectExpr("count(*)").collect()[0]
            elapsed = time.perf_counter() - start
            assert count == n, count
            rates.append(n / elapsed)
        if len(rates) > 1:
            print(f"  {label}: " + ", ".join(f"{r:,.0f}" for r in rates) + " rows/s")
        results[label] = statistics.median(rates)
    checkpoint = tempfile.mkdtemp(prefix="tether-spark-bench-")
    query = (
        spark.readStream.format("tether")
        .option("servers", url)
        .option("stream", "BENCH")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.per_trigger))
        .option("minPartitions", str(args.partitions))
        .option("readMethod", args.read_method)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    elapsed = timed(lambda: query.start().awaitTermination())
    results["streaming"] = n / elapsed
    shutil.rmtree(checkpoint, ignore_errors=True)
    return results


def run_against(
    server_url: str, name: str, spark: Any, args: argparse.Namespace
) -> dict[str, float]:
    results: dict[str, float] = {}
    pub = asyncio.run(fill(server_url, args.messages, args.size))
    results["publish (SDK)"] = pub
    print(f"[{name}] published {args.messages:,} x {args.size} B at {pub:,.0f} msg/s")
    methods = ("bulk", "direct", "consumer") if name == "tether" else ("direct", "consumer")
    for method in methods:
        rate = fetch_only(server_url, args.messages, method)
        results[f"fetch only, {method}"] = rate
        print(f"[{name}] fetch only, {method:<8} {rate:>10,.0f} rows/s  (one reader, no Spark)")
    _runtime.close_all()
    for label, rate in spark_runs(spark, server_url, args).items():
        results[label] = rate
        print(f"[{name}] {label:<14} {rate:>10,.0f} rows/s")
    _runtime.close_all()
    return results


def report(results: dict[str, dict[str, float]]) -> None:
    tether, peer = results.get("tether", {}), results.get("nats-server", {})
    print(f"\n{'':<22}{'Tether':>12}{'nats-server':>14}{'ratio':>8}")
    for label in dict.fromkeys([*tether, *peer]):
        t, n = tether.get(label), peer.get(label)
        ratio = f"{t / n:.2f}x" if t and n else ""
        t_text = f"{t:,.0f}" if t else "-"
        n_text = f"{n:,.0f}" if n else "-"
        print(f"{label:<22}{t_text:>12}{n_text:>14}{ratio:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="batch Arrow reads (median)")
    parser.add_argument("--store", default="memory", help="Tether store: memory or sqlite")
    parser.add_argument(
        "--peers", default="tether,nats-server", help="comma-separated: tether, nats-server"
    )
    parser.add_argument(
        "--read-method", choices=("auto", "bulk", "direct", "consumer"), default="auto"
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tether-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TupleSource)
    results: dict[str, dict[str, float]] = {}
    for name in args.peers.split(","):
        if name not in ("tether", "nats-server"):
            parser.error(f"unknown peer {name!r}")
        start = (
            start_tether(store=args.store)
            if name == "tether"
            else start_nats_server(jetstream=True)
        )
        with start as server:
            results[name] = run_against(server.url, name, spark, args)
    spark.stop()
    report(results)


if __name__ == "__main__":
    main()
