"""Orders → revenue per region and minute, with Spark Structured Streaming on Tether.

    python examples/spark_pipeline/pipeline.py --servers nats://127.0.0.1:4222 \\
        --checkpoint /tmp/orders-ck --sink stream        # results to the RESULTS stream
    python examples/spark_pipeline/pipeline.py ... --sink parquet --output /tmp/revenue

Reads the ORDERS stream (JSON orders, see ``produce_orders.py``), parses them,
aggregates count and revenue per region over 1-minute event-time windows, and
writes the aggregates:

* ``--sink stream``: to the RESULTS stream, one message per (region, window) on
  subject ``results.<region>.<window start, epoch seconds>``;
* ``--sink parquet``: Parquet files.

Both run in ``append`` mode (the only mode Spark offers Python data source sinks):
a window is written once, when the watermark (``--watermark`` behind the newest
order seen) has passed its end. The newest windows therefore wait for later orders.

``--trigger once`` (default) processes everything available and stops; run it again
after producing more orders and it continues from the checkpoint. ``--trigger
continuous`` keeps running, one micro-batch every ``--interval``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from tether.client import connect


def build(spark: Any, args: argparse.Namespace) -> Any:
    """The streaming DataFrame of (region, window, orders, revenue)."""
    from pyspark.sql import functions as F

    order = "id long, customer string, region string, amount double, created timestamp"
    orders = (
        spark.readStream.format("tether")  # registered by the pyspark_tether module
        .option("servers", args.servers)
        .option("stream", "ORDERS")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_per_trigger))
        .load()
        .select(F.from_json(F.col("value").cast("string"), order).alias("o"))
        .select("o.*")
        .where(F.col("id").isNotNull())  # drop messages that are not orders
    )
    return (
        orders.withWatermark("created", args.watermark)
        .groupBy("region", F.window("created", "1 minute"))
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
    )


def to_results_stream(aggregates: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    start = F.unix_timestamp(F.col("window.start"))
    messages = aggregates.select(
        F.concat_ws(".", F.lit("results"), "region", start.cast("string")).alias("subject"),
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
        .option("stream", "RESULTS")  # publish only if RESULTS captures the subject
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
    """Read RESULTS back with a batch read and print the latest aggregate per window."""
    from pyspark.sql import functions as F

    schema = "region string, window_start timestamp, orders long, revenue double"
    results = (
        spark.read.format("tether")
        .option("servers", args.servers)
        .option("stream", "RESULTS")
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("r"))
        .select("r.*")
        .orderBy("window_start", "region")
    )
    results.show(50, truncate=False)


async def ensure_results_stream(servers: str) -> None:
    nc = await connect(servers)
    try:
        await nc.jetstream().add_stream(
            name="RESULTS", subjects=["results.>"], max_msgs_per_subject=1, allow_direct=True
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

    # Python workers must use this interpreter (it has tether and pyarrow installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.master)
        .appName("tether-orders-pipeline")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    aggregates = build(spark, args)
    if args.sink == "stream":
        asyncio.run(ensure_results_stream(args.servers))
        writer = to_results_stream(aggregates, args)
    else:
        writer = to_parquet(aggregates, args)
    writer = writer.option("checkpointLocation", args.checkpoint)
    if args.trigger == "once":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.interval)
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    progress = query.lastProgress
    if progress:
        print(f"last batch {progress['batchId']}: {progress['numInputRows']} orders read")
    if args.sink == "stream":
        show_results(spark, args)
    spark.stop()


if __name__ == "__main__":
    main()
