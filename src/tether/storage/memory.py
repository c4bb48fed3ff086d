"""An in-memory backend, for tests and for brokers that need no durability.

Writes go through the same group commit as the durable backends and are applied
when the tick's batch is handed off (once the tick is over), so what a read sees and
when a write's future completes follow exactly the same rules as elsewhere.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import cast

import msgspec

from tether.storage.base import (
    MEMORY_SIZING,
    ConsumerRecord,
    MessageColumns,
    MessageMeta,
    Sizing,
    StorageError,
    StoredMessage,
    StreamRecord,
    subject_size,
)
from tether.storage.group_commit import (
    APPEND,
    DELETE_CONSUMER,
    DELETE_MESSAGES,
    DELETE_RANGE,
    DELETE_STREAM,
    PUT_CONSUMER,
    PUT_CONSUMER_STATE,
    PUT_STREAM,
    Batch,
    BatchingStore,
    Op,
)

__all__ = ["MemoryStore"]


class _Log:
    """The messages of one stream: a dict by sequence plus a sorted list of sequences.

    Deleting only removes from the dict; the list keeps the dead sequence until the
    dead outnumber the live, then it is rebuilt. That keeps deletes O(1) (acks of a
    work queue delete at the head all the time) and range reads a bisect plus a scan.
    """

    __slots__ = ("dead", "msgs", "seqs")

    def __init__(self) -> None:
        self.msgs: dict[int, StoredMessage] = {}
        self.seqs: list[int] = []
        self.dead = 0

    def add(self, message: StoredMessage) -> None:
        seq = message.seq
        msgs = self.msgs
        if seq not in msgs:
            seqs = self.seqs
            if not seqs or seq > seqs[-1]:
                seqs.append(seq)
            else:  # out of order, which the engine never does; stay correct anyway
                i = bisect_left(seqs, seq)
                if i < len(seqs) and seqs[i] == seq:
                    self.dead -= 1  # a dead entry comes back to life
                else:
                    seqs.insert(i, seq)
        msgs[seq] = message

    def delete(self, seqs: Sequence[int]) -> None:
        pop = self.msgs.pop
        for seq in seqs:
            if pop(seq, None) is not None:
                self.dead += 1
        self._maybe_compact()

    def delete_range(self, first: int, last: int) -> None:
        seqs = self.seqs
        i = bisect_left(seqs, first)
        j = bisect_right(seqs, last)
        pop = self.msgs.pop
        live = 0
        for k in range(i, j):
            if pop(seqs[k], None) is not None:
                live += 1
        self.dead -= (j - i) - live  # dead entries of the slice go away with it
        del seqs[i:j]

    def start(self, seq: int) -> int:
        return bisect_left(self.seqs, seq)

    def _maybe_compact(self) -> None:
        if self.dead > 64 and self.dead > len(self.msgs):
            # Dict order is append order, i.e. already ascending: sorting is linear.
            self.seqs = sorted(self.msgs)
            self.dead = 0


class MemoryStore(BatchingStore):
    """Keeps everything in dicts; ``cached()`` always hits for committed messages."""

    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._streams: dict[str, StreamRecord] = {}
        self._logs: dict[str, _Log] = {}
        self._consumers: dict[str, dict[str, ConsumerRecord]] = {}
        self._last_seq: dict[str, int] = {}
        self._state = "new"

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        if self._state == "closed":
            raise StorageError("the store is closed and cannot be reopened")
        self._group.bind(asyncio.get_running_loop())
        self._state = "open"

    async def close(self) -> None:
        if self._state != "open":
            self._state = "closed"
            return
        await self._drain()
        self._group.close()
        self._state = "closed"

    def _check_open(self) -> None:
        if self._state != "open":
            raise StorageError(f"the store is {self._state}, not open")

    # -- loading ---------------------------------------------------------------------
    async def load_streams(self) -> list[StreamRecord]:
        self._check_open()
        return [self._streams[name] for name in sorted(self._streams)]

    async def load_index(self, stream: str, sizing: Sizing = MEMORY_SIZING) -> list[MessageMeta]:
        self._check_open()
        log = self._logs.get(stream)
        if log is None:
            return []
        msgs = log.msgs
        out: list[MessageMeta] = []
        for m in (msgs.get(seq) for seq in log.seqs):
            if m is not None:
                extra = sizing.overhead(m.headers)
                size = subject_size(m.subject) + len(m.headers) + len(m.data) + extra
                out.append(MessageMeta(m.seq, m.subject, size, m.ts, m.priority, extra))
        return out

    async def load_consumers(self, stream: str) -> list[ConsumerRecord]:
        self._check_open()
        consumers = self._consumers.get(stream, {})
        return [consumers[name] for name in sorted(consumers)]

    async def load_last_seq(self, stream: str) -> int:
        self._check_open()
        return self._last_seq.get(stream, 0)

    # -- reads -----------------------------------------------------------------------
    async def read(self, stream: str, seq: int) -> StoredMessage | None:
        self._check_open()
        return self.cached(stream, seq)

    async def read_range(
        self, stream: str, start_seq: int, limit: int, max_bytes: int = 0
    ) -> list[StoredMessage]:
        self._check_open()
        log = self._logs.get(stream)
        out: list[StoredMessage] = []
        if log is None or limit <= 0:
            return out
        msgs, seqs = log.msgs, log.seqs
        total = 0
        for k in range(log.start(start_seq), len(seqs)):
            message = msgs.get(seqs[k])
            if message is None:
                continue
            if max_bytes > 0:
                total += message.size
                if out and total > max_bytes:
                    break
            out.append(message)
            if len(out) >= limit:
                break
        return out

    async def read_columns(
        self, stream: str, start_seq: int, last_seq: int, limit: int
    ) -> MessageColumns:
        self._check_open()
        log = self._logs.get(stream)
        if log is None or limit <= 0:
            return MessageColumns.of([])
        msgs, seqs = log.msgs, log.seqs
        k, hi = log.start(start_seq), bisect_right(seqs, last_seq)
        found: list[StoredMessage] = []
        # Whole slices through C-level map()s: no Python frame per row.
        while k < hi and len(found) < limit:
            end = min(hi, k + limit - len(found))
            chunk = list(map(msgs.get, seqs[k:end]))
            if None in chunk:  # dead entries stay in ``seqs`` until compaction
                found += [m for m in chunk if m is not None]
            else:
                found += cast("list[StoredMessage]", chunk)
            k = end
        return MessageColumns.of(found)

    async def read_many(self, stream: str, seqs: Sequence[int]) -> list[StoredMessage]:
        self._check_open()
        log = self._logs.get(stream)
        if log is None:
            return []
        msgs = log.msgs
        return [m for m in (msgs.get(seq) for seq in sorted(set(seqs))) if m is not None]

    def cached(self, stream: str, seq: int) -> StoredMessage | None:
        log = self._logs.get(stream)
        return None if log is None else log.msgs.get(seq)

    # -- the commit ------------------------------------------------------------------
    def _hand_off(self, batch: Batch) -> None:
        try:
            self._apply(batch.ops)
        except Exception as exc:  # a bug, not an I/O failure; report it to the writers
            error = StorageError(f"commit failed: {exc!r}")
            error.__cause__ = exc
            self._group.settle(batch, error)
        else:
            self._group.settle(batch, None)

    def _apply(self, ops: list[Op]) -> None:
        logs, last_seq = self._logs, self._last_seq
        for op in ops:
            if op[0] == APPEND:
                stream, message = op[1], op[2]
                log = logs.get(stream)
                if log is None:
                    log = logs[stream] = _Log()
                log.add(message)
                if message.seq > last_seq.get(stream, 0):
                    last_seq[stream] = message.seq
            elif op[0] == PUT_CONSUMER_STATE:
                consumers = self._consumers.get(op[1])
                record = None if consumers is None else consumers.get(op[2])
                if consumers is not None and record is not None:
                    consumers[op[2]] = msgspec.structs.replace(record, state=op[3])
            elif op[0] == DELETE_MESSAGES:
                log = logs.get(op[1])
                if log is not None:
                    log.delete(op[2])
            elif op[0] == DELETE_RANGE:
                log = logs.get(op[1])
                if log is not None:
                    log.delete_range(op[2], op[3])
            elif op[0] == PUT_STREAM:
                self._streams[op[1].name] = op[1]
            elif op[0] == DELETE_STREAM:
                stream = op[1]
                self._streams.pop(stream, None)
                logs.pop(stream, None)
                self._consumers.pop(stream, None)
                last_seq.pop(stream, None)
            elif op[0] == PUT_CONSUMER:
                record = op[1]
                self._consumers.setdefault(record.stream, {})[record.name] = record
            elif op[0] == DELETE_CONSUMER:
                consumers = self._consumers.get(op[1])
                if consumers is not None:
                    consumers.pop(op[2], None)
