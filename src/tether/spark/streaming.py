"""Streaming reads: ``spark.readStream.format("tether")``.

Offsets are ``{"stream": <name>, "seq": <next sequence to read>}``; a micro-batch
reads sequences ``[start.seq, end.seq)``. Spark stores them verbatim in the
checkpoint, and the checkpoint alone is the query's position.

Facts of Spark's Python streaming API that shape this class:

* ``initialOffset()`` is called more than once, and again after a restart. It
  returns a *constant*: ``seq: 0`` (earliest), ``seq: -1`` (latest) or an explicit
  sequence. ``latestOffset`` resolves the "latest" sentinel into a bookmark batch
  with no data, which the offset log then records, so a restart never skips messages
  published while the query was down, nor re-reads any.
* ``commit(end)`` runs one micro-batch late and never for the last batch of a run;
  ``stop()`` is never called. So commit only mirrors the position to the optional
  ``durable`` consumer; nothing depends on it.
* ``partitions(start, end)`` and ``read()`` are pure functions of the offsets:
  replaying a batch after a failure reads the same ranges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from tether.client.models import StreamInfo
from tether.spark import _durable, _runtime, planning
from tether.spark._fetch import RangePartition, read_partition
from tether.spark.options import EARLIEST, LATEST, ReadOptions, TetherSparkError

log = logging.getLogger("tether.spark")


class TetherStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source over one stream, with admission control and availableNow."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: int | None = None  # end of an availableNow run
        self._last_batch_at = time.monotonic()  # for minOffsetsPerTrigger/maxTriggerDelay
        self._latest: int | None = None

    # -- offsets ------------------------------------------------------------------------

    def _offset(self, seq: int) -> dict[str, Any]:
        return {"stream": self.opts.stream, "seq": seq}

    def _seq(self, offset: dict[str, Any], which: str) -> int:
        stream = offset.get("stream")
        seq = offset.get("seq")
        if stream != self.opts.stream:
            raise TetherSparkError(
                f"the checkpoint's {which} offset is for stream {stream!r}, but option 'stream' "
                f"is {self.opts.stream!r}: use a new checkpoint location for another stream"
            )
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < LATEST:
            raise TetherSparkError(f"malformed {which} offset in the checkpoint: {offset!r}")
        return seq

    def _info(self) -> StreamInfo:
        return _runtime.run(_runtime.stream_info(self.opts.conn, self.opts.stream))

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        if opts.starting_timestamp is not None:
            # The first message at or after a time does not move as messages arrive.
            info = self._info()
            seq = _runtime.run(planning.sequence_at(opts, opts.starting_timestamp, info))
            return self._offset(seq)
        return self._offset(opts.start)

    def getDefaultReadLimit(self) -> ReadLimit:
        opts = self.opts
        if opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        if opts.min_offsets_per_trigger is not None:
            return ReadMinRows(opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything up to the end of the stream as of now; later messages wait for
        # the next run.
        self._target = self._info().state.last_seq + 1

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.opts
        seq = self._seq(start, "start")
        state = self._info().state
        end_of_stream = state.last_seq + 1
        if self._target is not None:
            end_of_stream = min(end_of_stream, self._target)
        self._latest = end_of_stream
        if seq == LATEST:
            return self._offset(end_of_stream)  # the bookmark batch: no data
        first = state.first_seq or 1
        skipped = False
        if seq == EARLIEST:
            effective = first
        else:
            if seq > state.last_seq + 1:
                raise TetherSparkError(
                    f"stream {opts.stream!r} ends at sequence {state.last_seq} but the query is "
                    f"at {seq}: the stream was deleted and recreated (start the query with a "
                    "new checkpoint location), or option 'startingOffsets' points past its end"
                )
            effective = seq
            if seq < first:
                self._data_loss(seq, first)
                effective, skipped = first, True
        end = end_of_stream
        if isinstance(limit, ReadMaxRows):
            end = min(end, effective + limit.max_rows)
        if not isinstance(limit, ReadAllAvailable) and self._target is None:
            min_rows = (
                limit.min_rows if isinstance(limit, ReadMinRows) else opts.min_offsets_per_trigger
            )
            waited = time.monotonic() - self._last_batch_at
            if min_rows and end - effective < min_rows and waited < opts.max_trigger_delay:
                return start
        if end <= effective and not skipped:
            return start  # nothing new
        # (After skipping lost messages the batch may be empty: it moves past the gap.)
        self._last_batch_at = time.monotonic()
        return self._offset(end)

    def _data_loss(self, seq: int, first: int) -> None:
        message = (
            f"messages {seq}..{first - 1} of stream {self.opts.stream!r} were removed "
            "(retention or purge) before the query read them"
        )
        if self.opts.fail_on_data_loss:
            raise TetherSparkError(message + "; set option 'failOnDataLoss' to false to skip them")
        log.warning("%s; skipping them (failOnDataLoss is false)", message)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else self._offset(self._latest)

    # -- planning and reading -----------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first = self._seq(start, "start")
        last = self._seq(end, "end")
        if first == LATEST:
            return []  # the bookmark batch
        lo = max(first, 1)
        if last <= lo:
            return []
        info = self._info()
        stream_first = info.state.first_seq or 1
        if first != EARLIEST and stream_first > lo and self.opts.fail_on_data_loss:
            # Retention removed part of a batch being (re)planned.
            self._data_loss(lo, min(stream_first, last))
        method = _runtime.run(planning.read_method(self.opts, info))
        return planning.partitions(self.opts, method, lo, last)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        if self.opts.durable is None:
            return
        seq = self._seq(end, "end") - 1
        if seq < 1:
            return
        try:
            acked = _runtime.run(_durable.ack_through(self.opts, seq))
        except Exception as exc:  # a hint: never fail the query over it
            log.warning("could not move durable consumer %r to %d: %s", self.opts.durable, seq, exc)
        else:
            log.debug("durable consumer %r acknowledged %d messages", self.opts.durable, acked)

    def stop(self) -> None:
        # Spark rarely calls this (the planner process is killed); connections are
        # process-wide and die with it.
        pass
