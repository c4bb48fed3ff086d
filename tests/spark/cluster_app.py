"""The Spark application of the standalone-cluster test, run with ``spark-submit``.

Usage: ``spark-submit --master spark://HOST:PORT cluster_app.py SERVERS EVIDENCE_DIR``.

It reads stream ``CIN`` in a batch query, copies it to stream ``COUT`` with a streaming
query (``availableNow``) through the tether sink, and writes 4,000 rows to stream
``CSINK`` with a batch write whose tasks wait before they finish, so that the test can
kill a worker while some of them have published and not yet committed. Each task
writes one line of evidence (which executor process ran it) into EVIDENCE_DIR. The
results are printed as one JSON line starting with ``RESULT``.

The tether source and sink are wrapped by subclasses defined here (Spark ships them to
the executors by value) that only add the evidence.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tether.spark.batch import TetherBatchReader
from tether.spark.source import TetherDataSource
from tether.spark.streaming import TetherStreamReader
from tether.spark.writer import TetherBatchWriter

SINK_ROWS = 4000
SINK_PARTITIONS = 4
EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def executor_process() -> tuple[int, str]:
    """(pid, executor id) of the executor JVM this Python worker runs under, found by
    walking up the process tree; (0, "") when there is none (the driver)."""
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        if EXECUTOR_MAIN in argv and b"--executor-id" in argv:
            return pid, argv[argv.index(b"--executor-id") + 1].decode()
        pid = parent
    return 0, ""


def record(evidence: str, job: str, what: str) -> None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    jvm, executor = executor_process()
    line = {
        "job": job,
        "what": what,
        "pid": os.getpid(),
        "executor_pid": jvm,
        "executor": executor,
        "partition": ctx.partitionId() if ctx else -1,
        "attempt": ctx.attemptNumber() if ctx else -1,
    }
    name = f"{job}-{what}-{uuid.uuid4().hex}.json"
    # Not "*.json" until renamed: pathlib's glob in the test matches dot files too.
    tmp = os.path.join(evidence, name + ".part")
    with open(tmp, "w") as f:
        json.dump(line, f)
    os.rename(tmp, os.path.join(evidence, name))  # the test never sees half a line


class ProbeBatchReader(TetherBatchReader):
    evidence = ""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        record(self.evidence, "batch", "read")
        return super().read(partition)


class ProbeStreamReader(TetherStreamReader):
    evidence = ""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        record(self.evidence, "stream", "read")
        return super().read(partition)


class SlowBatchWriter(TetherBatchWriter):
    """Publishes its partition, says so, then waits before the task finishes."""

    evidence = ""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        message = super().write(iterator)
        record(self.evidence, "sink", "published")
        time.sleep(2.5)
        record(self.evidence, "sink", "done")
        return message


class ProbeSource(TetherDataSource):
    """The tether source and sink with the evidence option (taken out before the
    tether source checks its options)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.evidence = str(options.pop("evidence", ""))
        super().__init__(options)

    @classmethod
    def name(cls) -> str:
        return "tether_probe"

    def reader(self, schema: StructType) -> DataSourceReader:
        inner = super().reader(schema)
        probe = ProbeBatchReader(inner.opts)  # type: ignore[attr-defined]
        probe.evidence = self.evidence
        return probe

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        inner = super().streamReader(schema)
        probe = ProbeStreamReader(inner.opts)  # type: ignore[attr-defined]
        probe.evidence = self.evidence
        return probe

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        inner = super().writer(schema, overwrite)
        slow = SlowBatchWriter(inner.opts)  # type: ignore[attr-defined]
        slow.evidence = self.evidence
        return slow


def main() -> None:
    servers, evidence = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.appName("tether-cluster-test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ProbeSource)
    result: dict[str, Any] = {"master": spark.sparkContext.master}

    # 1. Batch read: one task per range, read in the executors.
    batch = (
        spark.read.format("tether_probe")
        .option("servers", servers)
        .option("evidence", evidence)
        .option("minPartitions", "4")
        .load("CIN")
    )
    rows = batch.select("seq", "value").collect()
    result["batch_rows"] = len(rows)
    result["batch_distinct"] = len({r.seq for r in rows})

    # 2. Streaming read through the exactly-once sink, until caught up.
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("tether_probe")
            .option("servers", servers)
            .option("evidence", evidence)
            .option("minPartitions", "4")
            .option("startingOffsets", "earliest")
            .load("CIN")
            .selectExpr("concat('COUT.', subject) AS subject", "value")
            .writeStream.format("tether")
            .option("servers", servers)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        result["stream_batches"] = len(query.recentProgress)

    # 3. A batch write whose tasks linger after publishing (a worker dies meanwhile).
    rows_out = spark.range(0, SINK_ROWS, numPartitions=SINK_PARTITIONS).selectExpr(
        "concat('CSINK.', CAST(id % 4 AS STRING)) AS subject", "CAST(id AS STRING) AS value"
    )
    rows_out.write.format("tether_probe").option("servers", servers).option(
        "evidence", evidence
    ).mode("append").save()
    result["sink_rows"] = SINK_ROWS
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
