"""Driver side of a read: resolving positions and cutting ranges into partitions.

Partitions are pure functions of ``(start, end)`` and the options, so a micro-batch
replayed after a failure reads exactly the same ranges in the same tasks.
"""

from __future__ import annotations

import math

from tether.client import ClientError, NoMessageFound
from tether.client.models import StreamInfo
from tether.spark import _runtime
from tether.spark._fetch import RangePartition, split_range
from tether.spark.options import ReadOptions, TetherSparkError


async def read_method(opts: ReadOptions, info: StreamInfo) -> str:
    """How executors read: ``bulk`` (Tether's block reads) when the server is Tether,
    else ``direct`` when the stream serves DIRECT.GET, else the consumer fallback."""
    allowed = bool(info.config.allow_direct)
    wanted = opts.read_method
    if wanted == "direct" and not allowed:
        raise TetherSparkError(
            f"option 'readMethod' is 'direct' but stream {opts.stream!r} has allow_direct off; "
            "enable allow_direct on the stream or use readMethod 'auto' or 'consumer'"
        )
    if wanted in ("direct", "consumer"):
        return wanted
    tether = await _runtime.server_is_tether(opts.conn)
    if wanted == "bulk" and not tether:
        raise TetherSparkError(
            f"option 'readMethod' is 'bulk' but {opts.conn.describe()} is not a Tether server; "
            "use readMethod 'auto', 'direct' or 'consumer'"
        )
    if tether:
        return "bulk"
    return "direct" if allowed else "consumer"


async def sequence_at(opts: ReadOptions, timestamp: str, info: StreamInfo) -> int:
    """The first sequence stored at or after ``timestamp`` (end of stream if none)."""
    js = await _runtime.jetstream(opts.conn)
    try:
        resp = await js.api(f"STREAM.MSG.GET.{opts.stream}", {"start_time": timestamp})
    except NoMessageFound:
        return info.state.last_seq + 1
    except ClientError as exc:
        raise TetherSparkError(
            f"cannot resolve option 'startingTimestamp' ({timestamp}) on stream "
            f"{opts.stream!r}: {exc}"
        ) from None
    return int(resp["message"]["seq"])


def partitions(opts: ReadOptions, method: str, start: int, end: int) -> list[RangePartition]:
    """``[start, end)`` as Spark partitions: at least ``minPartitions``, and at most
    ``maxRecordsPerPartition`` sequences each."""
    span = end - start
    if span <= 0:
        return []
    count = max(opts.min_partitions, math.ceil(span / opts.max_records_per_partition))
    return [
        RangePartition(
            conn=opts.conn,
            stream=opts.stream,
            start=lo,
            end=hi,
            subjects=opts.subjects,
            include_headers=opts.include_headers,
            method=method,
            batch_size=opts.fetch_batch_size,
            max_bytes=opts.fetch_max_bytes,
        )
        for lo, hi in split_range(start, end, count)
    ]
