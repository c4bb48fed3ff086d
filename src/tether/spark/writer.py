"""The sink: ``df.write.format("tether")`` and ``df.writeStream.format("tether")``.

Input columns: ``value`` (binary or string, required), ``subject`` (string; or the
``subject`` option for rows without one), optional ``headers`` (``map<string,string>``
or ``array<struct<key:string,value:binary|string>>``, the read schema's form) and
optional ``msg_id`` (string). Rows are published with the SDK's ``publish_async``:
at most ``maxPendingAcks`` publishes await their ack, further ones wait for a slot
(backpressure), and a task succeeds only once every message of it is acknowledged.

Idempotence (option ``idempotent``, on by default): each message carries a
``Nats-Msg-Id``, the ``msg_id`` column when present, otherwise
``"{queryId}:{batchId}:{partition}:{i}"`` for streaming writes and
``"{writeId}:{partition}:{i}"`` for batch writes (one ``writeId`` per ``save()``).
The server drops a message whose id it saw within the stream's
``duplicate_window``, so a retried task or a micro-batch replayed after a crash
does not publish twice, provided the replay happens within that window and
produces the same rows in the same partitions in the same order (true for a
deterministic query over a replayable source). See ``docs/spark.md``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from tether.client import ClientError, JetStream, NoStreamResponse, PubAckFuture
from tether.spark import _runtime
from tether.spark.options import TetherSparkError, WriteOptions

log = logging.getLogger("tether.spark")

SINK_COLUMNS = ("subject", "value", "headers", "msg_id")


def check_sink_schema(schema: StructType, opts: WriteOptions) -> None:
    """Fail on the driver, before any task runs, if the columns cannot be published."""
    types = {f.name: f.dataType for f in schema.fields}
    for name in types:
        if name not in SINK_COLUMNS:
            raise TetherSparkError(
                f"column {name!r} is not used by the tether sink; select only "
                f"{', '.join(SINK_COLUMNS)}"
            )
    if "value" not in types:
        raise TetherSparkError("the tether sink needs a 'value' column (binary or string)")
    if not isinstance(types["value"], BinaryType | StringType):
        raise TetherSparkError(f"column 'value' must be binary or string, not {types['value']}")
    if "subject" in types:
        if not isinstance(types["subject"], StringType):
            raise TetherSparkError(f"column 'subject' must be a string, not {types['subject']}")
    elif opts.subject is None:
        raise TetherSparkError("the tether sink needs a 'subject' column or the 'subject' option")
    if "msg_id" in types and not isinstance(types["msg_id"], StringType):
        raise TetherSparkError(f"column 'msg_id' must be a string, not {types['msg_id']}")
    if "headers" in types and not _headers_type_ok(types["headers"]):
        raise TetherSparkError(
            "column 'headers' must be map<string,string> or "
            f"array<struct<key:string,value:binary>>, not {types['headers'].simpleString()}"
        )


def _headers_type_ok(dt: DataType) -> bool:
    if isinstance(dt, MapType):
        return isinstance(dt.keyType, StringType) and isinstance(dt.valueType, StringType)
    if isinstance(dt, ArrayType) and isinstance(dt.elementType, StructType):
        fields = {f.name: f.dataType for f in dt.elementType.fields}
        return (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType | StringType)
        )
    return False


def _header_dict(raw: Any) -> dict[str, str] | None:
    """A row's headers as the SDK takes them (for a repeated key, the last value wins)."""
    if not raw:
        return None
    out: dict[str, str] = {}
    for item in raw:
        key, value = (item["key"], item["value"]) if isinstance(item, dict) else item
        if key is None or value is None:
            continue
        out[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out or None


@dataclass
class TetherCommitMessage(WriterCommitMessage):
    """What one task published."""

    partition: int
    published: int
    duplicates: int


@dataclass
class _Publishing:
    """One task's publishing state, used on the runtime's loop."""

    opts: WriteOptions
    js: JetStream | None = None
    inflight: list[tuple[PubAckFuture, str]] = field(default_factory=list)
    published: int = 0
    duplicates: int = 0

    def settle(self, wait_all: bool) -> None:
        """Count acknowledged publishes; raise the first failure."""
        keep = []
        for fut, subject in self.inflight:
            if not fut.done():
                keep.append((fut, subject))
                continue
            exc = fut.exception()
            if exc is not None:
                raise _publish_error(exc, subject, self.opts)
            self.published += 1
            self.duplicates += fut.result().duplicate
        if wait_all and keep:
            raise TetherSparkError(f"{len(keep)} publishes were not acknowledged")
        self.inflight = keep


def _publish_error(exc: BaseException, subject: str, opts: WriteOptions) -> TetherSparkError:
    if isinstance(exc, NoStreamResponse):
        return TetherSparkError(
            f"no stream on {opts.conn.describe()} captures subject {subject!r} "
            "(column 'subject' or option 'subject')"
        )
    return TetherSparkError(f"publishing to {subject!r} failed: {exc}")


async def _publish_rows(
    state: _Publishing,
    subjects: list[str | None],
    values: list[Any],
    headers: list[dict[str, str] | None] | None,
    ids: list[str | None] | None,
) -> None:
    opts = state.opts
    if state.js is None:
        conn = await _runtime.connection(opts.conn)
        state.js = conn.jetstream(timeout=opts.conn.timeout, max_pending_acks=opts.max_pending_acks)
    js = state.js
    for i, value in enumerate(values):
        subject = subjects[i] or opts.subject
        if subject is None:
            raise TetherSparkError("a row has a null 'subject' and no 'subject' option is set")
        payload = value.encode() if isinstance(value, str) else (value or b"")
        try:
            fut = await js.publish_async(
                subject,
                payload,
                headers=headers[i] if headers is not None else None,
                msg_id=ids[i] if ids is not None else None,
                expected_stream=opts.stream,
            )
        except ClientError as exc:
            raise _publish_error(exc, subject, opts) from None
        state.inflight.append((fut, subject))
    state.settle(wait_all=False)


async def _finish(state: _Publishing) -> None:
    if state.js is not None:
        try:
            await state.js.publish_async_completed(timeout=state.opts.conn.timeout)
        except ClientError as exc:
            raise TetherSparkError(f"publishes were not acknowledged: {exc}") from None
    state.settle(wait_all=True)


def publish_partition(
    opts: WriteOptions, batches: Iterator[Any], partition: int, id_prefix: str
) -> TetherCommitMessage:
    """Publish every row of a task's Arrow batches; returns once all are acknowledged."""
    state = _Publishing(opts)
    row = 0
    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        names = batch.schema.names
        values = batch.column(names.index("value")).to_pylist()
        subjects: list[str | None] = (
            batch.column(names.index("subject")).to_pylist() if "subject" in names else [None] * n
        )
        headers = None
        if "headers" in names:
            headers = [_header_dict(h) for h in batch.column(names.index("headers")).to_pylist()]
        ids: list[str | None] | None = None
        if opts.idempotent:
            given = (
                batch.column(names.index("msg_id")).to_pylist() if "msg_id" in names else [None] * n
            )
            ids = [g if g else f"{id_prefix}:{row + k}" for k, g in enumerate(given)]
        _runtime.run(_publish_rows(state, subjects, values, headers, ids))
        row += n
    _runtime.run(_finish(state))
    return TetherCommitMessage(partition, state.published, state.duplicates)


def _task() -> tuple[int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise TetherSparkError("the tether sink must run inside a Spark task")
    return ctx.partitionId(), ctx


def _totals(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, TetherCommitMessage)]
    return sum(m.published for m in done), sum(m.duplicates for m in done)


class TetherBatchWriter(DataSourceArrowWriter):
    """``df.write``: one write id per save, so task retries reuse their message ids."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        partition, _ = _task()
        return publish_partition(self.opts, iterator, partition, f"{self.write_id}:{partition}")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published, duplicates = _totals(messages)
        log.info(
            "tether write %s: %d published, %d duplicates", self.write_id, published, duplicates
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published, _ = _totals(messages)
        log.warning("tether write %s aborted after %d messages", self.write_id, published)


class TetherStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: message ids from the query id, batch id and partition."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        partition, ctx = _task()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if self.opts.idempotent and (query_id is None or batch_id is None):
            raise TetherSparkError("streaming write without a query or batch id")
        prefix = f"{query_id}:{batch_id}:{partition}"
        return publish_partition(self.opts, iterator, partition, prefix)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published, duplicates = _totals(messages)
        log.info("tether batch %d: %d published, %d duplicates", batchId, published, duplicates)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published, _ = _totals(messages)
        log.warning("tether batch %d aborted after %d messages", batchId, published)
