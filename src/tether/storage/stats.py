"""What a store measures about its own writes, for ``/metrics``: group commit sizes and
latencies, the time the durable part of a commit takes, and its size on disk.

Observations are a few integer additions on the writer thread, once per commit (never
per message); readers (a scrape on the event loop) copy the counts as they are. A count
read mid-update is off by one commit at most, which a scrape every few seconds cannot
tell from a commit that landed a moment later.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

# Seconds: from a tmpfs commit (tens of µs) to a stalled disk.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
# Ops (messages, acks, consumer states) in one transaction.
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


@dataclass(slots=True)
class Histogram:
    """A Prometheus histogram's state: per-bucket counts (not cumulative), sum, count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as the text format wants them, ``+Inf`` last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass(slots=True)
class StoreStats:
    """A store's write measurements; ``sync_seconds`` stays empty for a backend whose
    commits are not made durable by a separate step (the memory store)."""

    commit_ops: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))
    commit_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    sync_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))


def disk_bytes(directory: Path) -> int:
    """Bytes of the files directly in ``directory`` (database, WAL, manifest): a few
    ``stat`` calls, cheap enough for every scrape."""
    total = 0
    try:
        for entry in directory.iterdir():
            try:
                if entry.is_file():
                    total += entry.stat().st_size
            except OSError:
                continue
    except OSError:
        return 0
    return total
