"""A set of integers stored as sorted, disjoint, inclusive ranges.

Delivered jobs are remembered this way: deliveries mostly follow the stream order, so
millions of delivered sequences collapse into a handful of ranges, which keeps a
ledger's persisted state small however long the consumer has been running.
"""

from __future__ import annotations

import bisect


class IntervalSet:
    """Sorted disjoint ranges ``[starts[i], ends[i]]``."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    @classmethod
    def from_flat(cls, flat: list[int]) -> IntervalSet:
        out = cls()
        for i in range(0, len(flat) - 1, 2):
            out.add_range(flat[i], flat[i + 1])
        return out

    def flat(self) -> list[int]:
        out: list[int] = []
        for a, b in zip(self.starts, self.ends, strict=True):
            out.append(a)
            out.append(b)
        return out

    def __contains__(self, value: int) -> bool:
        i = bisect.bisect_right(self.starts, value) - 1
        return i >= 0 and value <= self.ends[i]

    def __len__(self) -> int:
        return sum(b - a + 1 for a, b in zip(self.starts, self.ends, strict=True))

    @property
    def ranges(self) -> int:
        return len(self.starts)

    def add(self, value: int) -> None:
        self.add_range(value, value)

    def add_range(self, lo: int, hi: int) -> None:
        """Add ``lo..hi`` (inclusive), merging with touching or overlapping ranges."""
        if hi < lo:
            return
        starts, ends = self.starts, self.ends
        # Fast path: appending at the end (deliveries in stream order).
        if not starts or lo > ends[-1] + 1:
            starts.append(lo)
            ends.append(hi)
            return
        if lo == ends[-1] + 1:
            ends[-1] = hi
            return
        i = bisect.bisect_left(ends, lo - 1)  # first range that ends at or after lo - 1
        j = bisect.bisect_right(starts, hi + 1)  # ranges before j start at or before hi + 1
        if i >= j:
            starts.insert(i, lo)
            ends.insert(i, hi)
            return
        new_lo = min(lo, starts[i])
        new_hi = max(hi, ends[j - 1])
        starts[i:j] = [new_lo]
        ends[i:j] = [new_hi]

    def count_between(self, lo: int, hi: int) -> int:
        """How many members lie in ``lo..hi``."""
        total = 0
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        for k in range(i, len(self.starts)):
            a, b = self.starts[k], self.ends[k]
            if a > hi:
                break
            a, b = max(a, lo), min(b, hi)
            if b >= a:
                total += b - a + 1
        return total
