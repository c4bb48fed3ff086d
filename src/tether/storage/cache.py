"""The byte-bounded cache of committed messages behind the durable stores' ``cached()``.

Filled as commits complete and kept in step with deletes, so it never holds anything
that a read of the database would not return (SQLite and PostgreSQL stores)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tether.storage.base import StoredMessage
from tether.storage.group_commit import APPEND, DELETE_MESSAGES, DELETE_RANGE, DELETE_STREAM, Op

__all__ = ["MessageCache", "MiB"]

MiB = 1024 * 1024


def _size(m: StoredMessage) -> int:
    return len(m.subject) + len(m.headers) + len(m.data) + 16


class MessageCache:
    """Recently committed messages, oldest evicted first once over ``limit`` bytes.

    Only touched on the loop thread: filled and trimmed as commits complete, in commit
    order, so it mirrors the committed state of the messages it holds. One dict per
    stream, keyed by sequence; the order of arrival is kept as runs of sequences
    (``(stream, first, last)``), one per stretch of consecutive appends, so filling it
    costs one dict operation per message.
    """

    __slots__ = ("_limit", "_runs", "_size", "_streams")

    def __init__(self, limit: int) -> None:
        self._streams: dict[str, dict[int, StoredMessage]] = {}
        self._runs: deque[tuple[str, int, int]] = deque()
        self._limit = limit
        self._size = 0

    def get(self, stream: str, seq: int) -> StoredMessage | None:
        messages = self._streams.get(stream)
        return None if messages is None else messages.get(seq)

    def __len__(self) -> int:
        return sum(map(len, self._streams.values()))

    def clear(self) -> None:
        self._streams.clear()
        self._runs.clear()
        self._size = 0

    def apply(self, ops: list[Op]) -> None:
        """Mirror the ops of a committed batch."""
        streams, runs, limit = self._streams, self._runs, self._limit
        size = self._size
        name = ""  # the run of appends being recorded: name, first .. last
        first = last = 0
        messages: dict[int, StoredMessage] = {}
        for op in ops:
            if op[0] == APPEND:
                m = op[2]
                seq = m.seq
                if op[1] != name or seq != last + 1:
                    if name:
                        runs.append((name, first, last))
                    name = op[1]
                    first = seq
                    messages = streams.get(name) or streams.setdefault(name, {})
                last = seq
                prev = messages.setdefault(seq, m)
                if prev is not m:  # a sequence stored again replaces the old one
                    size -= _size(prev)
                    messages[seq] = m
                m_size = len(m.subject) + len(m.headers) + len(m.data) + 16
                if m_size <= limit:
                    size += m_size
                else:
                    del messages[seq]
                continue
            if name:
                runs.append((name, first, last))
                name = ""
            if op[0] == DELETE_MESSAGES:
                size -= self._drop(op[1], op[2])
            elif op[0] == DELETE_RANGE:
                size -= self._drop_range(op[1], op[2], op[3])
            elif op[0] == DELETE_STREAM:
                gone = streams.pop(op[1], None)
                if gone:
                    size -= sum(map(_size, gone.values()))
        if name:
            runs.append((name, first, last))
        if len(runs) > 1024 and len(runs) > len(self):
            self._compact()
            runs = self._runs
        while size > limit and runs:
            stream, seq, end = runs.popleft()
            messages = streams.get(stream) or {}
            pop = messages.pop
            while seq <= end:
                old = pop(seq, None)
                seq += 1
                if old is not None:
                    size -= _size(old)
                    if size <= limit:
                        break
            if seq <= end:
                runs.appendleft((stream, seq, end))  # the rest stays for next time
        self._size = size

    def _compact(self) -> None:
        """Forget the runs whose messages are all gone (deleted, not evicted), and
        narrow the others to what is left, so deletes cannot grow the runs for ever."""
        streams = self._streams
        kept: deque[tuple[str, int, int]] = deque()
        for stream, first, last in self._runs:
            messages = streams.get(stream)
            if not messages:
                continue
            live = [seq for seq in range(first, last + 1) if seq in messages]
            if live:
                kept.append((stream, live[0], live[-1]))
        self._runs = kept

    def _drop(self, stream: str, seqs: Iterable[int]) -> int:
        messages = self._streams.get(stream)
        if not messages:
            return 0
        pop = messages.pop
        dropped = 0
        for seq in seqs:
            old = pop(seq, None)
            if old is not None:
                dropped += _size(old)
        return dropped

    def _drop_range(self, stream: str, first: int, last: int) -> int:
        messages = self._streams.get(stream)
        if not messages:
            return 0
        if last - first < len(messages):
            return self._drop(stream, range(first, last + 1))
        # A purge-sized range: walking the cache beats walking the range.
        return self._drop(stream, [seq for seq in messages if first <= seq <= last])
