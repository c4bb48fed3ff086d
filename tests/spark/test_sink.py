"""The sink: batch and streaming writes, idempotent message ids, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tether.testing import RunningServer

pytestmark = pytest.mark.spark


def count(tools: Any, url: str, stream: str) -> int:
    return int(tools.api(url, f"STREAM.INFO.{stream}")["state"]["messages"])


def read_back(spark: Any, url: str, stream: str, **options: str) -> list[Any]:
    df = spark.read.format("tether").option("servers", url).options(**options).load(stream)
    return sorted(df.collect(), key=lambda r: r.seq)


def test_batch_write_columns_and_options(spark: Any, server: RunningServer, tools: Any) -> None:
    name = tools.unique("OUT")
    tools.make_stream(server.url, name, [f"{name}.>"])
    df = spark.createDataFrame(
        [(f"{name}.a", "one", {"K": "1"}), (None, "two", None)],
        "subject string, value string, headers map<string,string>",
    )
    (
        df.write.format("tether")
        .option("servers", server.url)
        .option("subject", f"{name}.default")  # for rows whose subject is null
        .option("stream", name)
        .mode("append")
        .save()
    )
    rows = read_back(spark, server.url, name, includeHeaders="true")
    got = {(r.subject, bytes(r.value)) for r in rows}
    assert got == {(f"{name}.a", b"one"), (f"{name}.default", b"two")}
    one = next(r for r in rows if bytes(r.value) == b"one")
    keys = [h.key for h in one.headers]
    assert ("K", b"1") in [(h.key, bytes(h.value)) for h in one.headers]
    assert "Nats-Msg-Id" in keys  # the idempotence id is stored with the message


def test_msg_id_column_deduplicates_rewrites(spark: Any, server: RunningServer, tools: Any) -> None:
    name = tools.unique("OUT")
    tools.make_stream(server.url, name, [f"{name}.>"])
    df = spark.createDataFrame(
        [(f"{name}.x", bytearray(b"v%d" % i), f"order-{i}") for i in range(50)],
        "subject string, value binary, msg_id string",
    ).repartition(3)
    for _ in range(2):  # the second save repeats every id: the server drops them all
        df.write.format("tether").option("servers", server.url).mode("append").save()
    assert count(tools, server.url, name) == 50


def test_streaming_sink_replay_after_a_crash_publishes_no_duplicates(
    spark: Any, server: RunningServer, tools: Any, tmp_path: Path
) -> None:
    """A micro-batch dies after part of it was published (a task fails mid-partition
    while the other partition has finished); the restarted query replays the batch
    from the checkpoint with the same query id, batch id and partitions, so every
    message id repeats and the target stream ends with each message exactly once."""
    from pyspark.sql import functions as F

    src, dst = tools.unique("SRC"), tools.unique("DST")
    tools.make_stream(server.url, src, [f"{src}.>"], tools.numbered(f"{src}.o", 0, 200))
    tools.make_stream(server.url, dst, [f"{dst}.>"])
    flag = tmp_path / "crash"
    flag.write_text("1")

    @F.udf("boolean", useArrow=False)  # arrow UDFs need pandas
    def crash_once(seq: int) -> bool:
        import os
        import time

        if seq == 180 and os.path.exists(str(flag)):
            time.sleep(1.5)  # let the other partition finish publishing first
            raise RuntimeError("simulated executor crash")
        return True

    def start() -> Any:
        return (
            spark.readStream.format("tether")
            .option("servers", server.url)
            .option("stream", src)
            .option("startingOffsets", "earliest")
            .option("minPartitions", "2")
            .load()
            .where(crash_once(F.col("seq")))
            .select(F.concat(F.lit(f"{dst}."), F.col("subject")).alias("subject"), "value")
            .writeStream.format("tether")
            .option("servers", server.url)
            .option("stream", dst)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        with pytest.raises(Exception, match="simulated executor crash"):
            start().awaitTermination(120)
        partial = count(tools, server.url, dst)
        assert 0 < partial < 200  # the batch was cut short
        flag.unlink()
        start().awaitTermination(120)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    rows = read_back(spark, server.url, dst)
    assert len(rows) == 200
    assert sorted(bytes(r.value) for r in rows) == sorted(b"m%d" % i for i in range(200))


@pytest.mark.parametrize(
    ("ddl", "options", "mode", "message"),
    [
        ("subject string", {}, "append", "needs a 'value' column"),
        ("value binary", {}, "append", "needs a 'subject' column or the 'subject' option"),
        ("value binary, key string", {"subject": "a"}, "append", "column 'key' is not used"),
        ("value int", {"subject": "a"}, "append", "column 'value' must be binary or string"),
        ("value binary", {"subject": "a", "topic": "b"}, "append", "unknown option 'topic'"),
        ("value binary", {"subject": "a"}, "overwrite", "only appends"),
    ],
)
def test_bad_sink_input(
    spark: Any,
    server: RunningServer,
    ddl: str,
    options: dict[str, str],
    mode: str,
    message: str,
) -> None:
    df = spark.createDataFrame([], ddl)
    writer = df.write.format("tether").option("servers", server.url).options(**options)
    with pytest.raises(Exception, match=message):
        writer.mode(mode).save()


def test_subject_without_stream_is_a_clear_error(spark: Any, server: RunningServer) -> None:
    df = spark.createDataFrame([("nowhere.x", "v")], "subject string, value string")
    with pytest.raises(Exception, match=r"no stream .* captures subject 'nowhere\.x'"):
        df.write.format("tether").option("servers", server.url).mode("append").save()
