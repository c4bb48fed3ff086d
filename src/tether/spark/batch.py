"""Batch reads: ``spark.read.format("tether")``.

The range is fixed when Spark plans the query: ``startingOffsets`` (or
``startingTimestamp``) up to ``endingOffsets``, where ``latest`` means the stream's
last sequence at planning time. Messages published later are not part of the read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from tether.spark import _runtime, planning
from tether.spark._fetch import RangePartition, read_partition
from tether.spark.options import EARLIEST, LATEST, ReadOptions, TetherSparkError


class TetherBatchReader(DataSourceReader):
    """Plans sequence ranges on the driver; executors read them (block reads on Tether,
    batched DIRECT.GET or a consumer elsewhere)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return _runtime.run(self._plan())

    async def _plan(self) -> list[RangePartition]:
        opts = self.opts
        info = await _runtime.stream_info(opts.conn, opts.stream)
        method = await planning.read_method(opts, info)
        state = info.state
        if opts.starting_timestamp is not None:
            start = await planning.sequence_at(opts, opts.starting_timestamp, info)
        elif opts.start == EARLIEST:
            start = state.first_seq or 1
        elif opts.start == LATEST:  # rejected by the option parser for batch reads
            raise TetherSparkError("option 'startingOffsets': 'latest' is not valid for batch")
        else:
            start = opts.start
        # Nothing past the stream's end exists yet; don't plan tasks for it.
        end = state.last_seq + 1 if opts.end == LATEST else min(opts.end, state.last_seq + 1)
        start = max(start, state.first_seq or 1)
        return planning.partitions(opts, method, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_partition(partition)
