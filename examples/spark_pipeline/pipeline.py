"""Orders → revenue per region and minute, with Spark Structured Streaming on Tether.

    .venv/bin/python examples/spark_pipeline/pipeline.py --servers nats://127.0.0.1:4222 \\
        --checkpoint /tmp/orders-ck --sink stream        # results to SHOP_REVENUE
    .venv/bin/python examples/spark_pipeline/pipeline.py ... --sink parquet --output /tmp/revenue

Reads the SHOP_ORDERS stream (JSON orders, see ``produce_orders.py``), parses them,
aggregates count and revenue per region over 1-minute event-time windows, and
writes the aggregates:

* ``--sink stream``: to the SHOP_REVENUE stream, one message per (region, window) on
  subject ``shop.revenue.<region>.<window start, epoch seconds>``;
* ``--sink parquet``: Parquet files.

Both run in ``append`` mode (the only mode Spark offers Python data source sinks):
a window is written once, when the watermark (``--watermark`` behind the newest
order seen) has passed its end. The newest windows therefore wait for later orders.

``--trigger once`` (default) processes everything available and stops; run it again
after producing more orders and it continues from the checkpoint. ``--trigger
continuous`` keeps running, one micro-batch every ``--interval``.

Messages that are not orders (not JSON, or missing a field) are skipped and
reported on stderr with their count and the first of them; the exit status is then
1 (the checkpoint has moved past them, so the next run does not report them again).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

from tether.client import StreamNotFound, connect

ORDERS = "SHOP_ORDERS"
RESULTS = "SHOP_REVENUE"
ORDER_SCHEMA = "id string, customer string, region string, amount double, created timestamp"


def build(spark: Any, args: argparse.Namespace) -> Any:
    """The streaming DataFrame of (region, window, orders, revenue)."""
    from pyspark.sql import functions as F

    messages = (
        spark.readStream.format("tether")
        .option("servers", args.servers)
        .option("stream", ORDERS)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_per_trigger))
        .load()
        .select("seq", "subject", F.col("value").cast("string").alias("text"))
        .withColumn("order", F.from_json("text", ORDER_SCHEMA))
    )
    fields = ("id", "region", "amount", "created")
    is_order = F.lit(True)
    for name in fields:
        is_order = is_order & F.col(f"order.{name}").isNotNull()
    # Per micro-batch: how many messages were not orders, and the first of them
    # (reported in the query's progress, see report()).
    checked = messages.observe(
        "parsing",
        F.count(F.when(~is_order, 1)).alias("bad"),
        F.min_by(F.struct("seq", "subject", "text"), F.when(~is_order, F.col("seq"))).alias(
            "first_bad"
        ),
    )
    orders = checked.where(is_order).select("order.*")
    return (
        orders.withWatermark("created", args.watermark)
        .groupBy("region", F.window("created", "1 minute"))
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
    )


def to_results_stream(aggregates: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    start = F.unix_timestamp(F.col("window.start"))
    messages = aggregates.select(
        F.concat_ws(".", F.lit("shop.revenue"), "region", start.cast("string")).alias("subject"),
        F.to_json(
            F.struct(
                "region",
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "orders",
                "revenue",
            )
        ).alias("value"),
    )
    return (
        messages.writeStream.format("tether")
        .option("servers", args.servers)
        .option("stream", RESULTS)  # publish only if SHOP_REVENUE captures the subject
        .outputMode("append")
    )


def to_parquet(aggregates: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    rows = aggregates.select(
        "region",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "orders",
        "revenue",
    )
    return rows.writeStream.format("parquet").option("path", args.output).outputMode("append")


def show_results(spark: Any, args: argparse.Namespace) -> None:
    """Read SHOP_REVENUE back with a batch read and print the aggregate of every window."""
    from pyspark.sql import functions as F

    schema = "region string, window_start timestamp, orders long, revenue double"
    results = (
        spark.read.format("tether")
        .option("servers", args.servers)
        .option("stream", RESULTS)
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("r"))
        .select("r.*")
        .orderBy("window_start", "region")
    )
    print(f"{RESULTS} holds {results.count()} windows:")
    results.show(100, truncate=False)


@dataclass
class Totals:
    """What the micro-batches of this run read, from the query's progress reports."""

    batches: set[int] = field(default_factory=set)
    messages: int = 0
    bad: int = 0
    first_bad: Any = None
    late: int = 0

    def add(self, progress: list[Any]) -> None:
        for p in progress:
            if p.batchId in self.batches:
                continue
            self.batches.add(p.batchId)
            self.messages += p.numInputRows
            self.late += sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
            parsing = p.observedMetrics.get("parsing")
            if parsing is None or not parsing["bad"]:
                continue
            self.bad += parsing["bad"]
            first = parsing["first_bad"]
            if self.first_bad is None or first["seq"] < self.first_bad["seq"]:
                self.first_bad = first
            print(
                f"warning: batch {p.batchId}: {parsing['bad']} of {p.numInputRows} messages "
                f"are not orders and were skipped (first: {describe(first)})",
                file=sys.stderr,
            )


def describe(row: Any) -> str:
    text = row["text"] if len(row["text"]) <= 200 else row["text"][:200] + "..."
    return f"seq {row['seq']} on {row['subject']}: {text!r}"


async def prepare_streams(servers: str) -> None:
    nc = await connect(servers)
    try:
        js = nc.jetstream()
        try:
            await js.stream_info(ORDERS)
        except StreamNotFound:
            sys.exit(f"no stream {ORDERS} on {servers}: run produce_orders.py first")
        # Creating a stream that exists with this configuration is a no-op.
        await js.add_stream(
            name=RESULTS, subjects=["shop.revenue.>"], max_msgs_per_subject=1, allow_direct=True
        )
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="nats://127.0.0.1:4222")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--sink", choices=("stream", "parquet"), default="stream")
    parser.add_argument("--output", help="Parquet directory (with --sink parquet)")
    parser.add_argument("--trigger", choices=("once", "continuous"), default="once")
    parser.add_argument("--interval", default="5 seconds")
    parser.add_argument("--watermark", default="2 minutes")
    parser.add_argument("--max-per-trigger", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    if args.sink == "parquet" and not args.output:
        parser.error("--sink parquet needs --output")
    asyncio.run(prepare_streams(args.servers))

    import tether.spark

    # Spark's Python processes run this interpreter, which has tether installed.
    spark = tether.spark.session(
        args.master,
        "tether-orders-pipeline",
        config={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    spark.sparkContext.setLogLevel("WARN")
    aggregates = build(spark, args)
    if args.sink == "stream":
        writer = to_results_stream(aggregates, args)
    else:
        writer = to_parquet(aggregates, args)
    writer = writer.option("checkpointLocation", args.checkpoint)
    if args.trigger == "once":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.interval)
    query = writer.start()
    totals = Totals()
    try:
        while not query.awaitTermination(1):
            totals.add(query.recentProgress)
    except KeyboardInterrupt:
        query.stop()
    totals.add(query.recentProgress)
    print(
        f"read {totals.messages} messages from {ORDERS} in {len(totals.batches)} micro-batch(es) "
        f"({totals.late} orders behind the watermark, {totals.bad} messages not orders)"
    )
    if args.sink == "stream":
        show_results(spark, args)
    spark.stop()
    if totals.bad:
        print(
            f"error: {totals.bad} messages in {ORDERS} are not orders and were skipped; "
            f"the first: {describe(totals.first_bad)}",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
