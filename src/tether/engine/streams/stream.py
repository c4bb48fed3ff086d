"""A stream's in-memory index and rules: append, limits, retention, dedup, purge.

The stream decides; storage persists. A :class:`Stream` holds the metadata of every
live message (sequence, subject, size, timestamp, priority) but no payloads, so every
rule (limits, per-subject history, last-by-subject, dedup, pending counts) is answered
without I/O. The broker turns the decisions into storage writes.
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import repeat
from typing import Any

from tether.engine import errors
from tether.engine.streams.config import StreamConfig
from tether.engine.streams.expiry import MessageTTLs
from tether.engine.subjects import is_literal, subject_matches
from tether.storage.base import MessageMeta, sizing

# Headers the publish path reads (exact spelling as clients send them).
MSG_ID = b"Nats-Msg-Id"
EXPECTED_STREAM = b"Nats-Expected-Stream"
EXPECTED_LAST_SEQ = b"Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJ_SEQ = b"Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJ_SEQ_SUBJECT = b"Nats-Expected-Last-Subject-Sequence-Subject"
EXPECTED_LAST_MSG_ID = b"Nats-Expected-Last-Msg-Id"
ROLLUP = b"Nats-Rollup"
MSG_TTL = b"Nats-TTL"
PRIORITY = b"Tether-Priority"
# What a Tether-Priority value may be: what the store holds (a signed 64-bit integer).
PRIORITY_RANGE = "must be a decimal integer from -9223372036854775808 to 9223372036854775807"


class StreamState:
    """Counters nats-server reports in ``state``."""

    __slots__ = ("bytes", "first_seq", "first_ts", "last_seq", "last_ts", "msgs")

    def __init__(self) -> None:
        self.msgs = 0
        self.bytes = 0
        self.first_seq = 0
        self.first_ts = 0
        self.last_seq = 0
        self.last_ts = 0


class BytesHeld:
    """The bytes a set of streams hold: the broker keeps one per storage kind, which
    each of its streams adds to and takes from as its own bytes change (nats-server's
    ``storeUsed`` / ``memUsed``), so the server's bound is checked without a pass over
    every stream."""

    __slots__ = ("bytes",)

    def __init__(self, held: int = 0) -> None:
        self.bytes = held


class Stream:
    """One stream: configuration plus the index of its live messages."""

    def __init__(self, config: StreamConfig, created_ns: int) -> None:
        self.config = config
        self.created_ns = created_ns
        self.name = config.name
        # What each message counts beyond subject + headers + payload: nats-server's
        # formula for the configured storage (which an update cannot change).
        self.sizing = sizing(config.storage)
        self.state = StreamState()
        # Where its bytes are counted with its storage kind's (set by the broker that
        # holds it; its own until then): every change of ``state.bytes`` goes here too.
        self.held = BytesHeld()
        self._msgs: dict[int, MessageMeta] = {}
        # Sequences in append order; deletions are lazy (skipped when no longer in _msgs),
        # because deleting from the front of a dict makes later scans slow.
        self._order: deque[int] = deque()
        self._by_subject: dict[str, deque[int]] = {}
        # Dedup window: msg id -> (seq, ts) and the ids in arrival order for expiry.
        self._dedup: dict[str, tuple[int, int]] = {}
        self._dedup_order: deque[tuple[int, str]] = deque()
        # The msg id of the last message (for Nats-Expected-Last-Msg-Id).
        self.last_msg_id = ""
        self.consumer_count = 0
        # The highest sequence storage is known to hold as its high-water mark (loaded,
        # or committed since): numbering never goes back below it (see :meth:`forget`).
        self.durable_seq = 0
        # Per-message TTLs (``allow_msg_ttl``), and where max_age expiry goes on from
        # when messages that never expire sit at the front (see :meth:`expire`).
        self.ttls = MessageTTLs()
        self._age_from = 0

    # -- loading -------------------------------------------------------------------------
    def start_empty(self) -> None:
        """A new stream: nothing stored yet (``first_seq`` 0, or the configured one)."""
        st = self.state
        if self.config.first_seq > 0:
            st.first_seq = self.config.first_seq
            st.last_seq = st.first_seq - 1
        else:
            st.first_seq = st.last_seq = 0
        self.durable_seq = st.last_seq

    def load(self, index: Iterable[MessageMeta], last_seq: int) -> None:
        """Rebuild the index from storage; ``last_seq`` is the stored high-water mark."""
        for meta in index:
            self._add(meta)
        st = self.state
        st.last_seq = max(st.last_seq, last_seq)
        if st.msgs == 0:
            if st.last_seq == 0:
                self.start_empty()
            else:
                st.first_seq = st.last_seq + 1
        self.durable_seq = st.last_seq

    def remember_msg_id(self, msg_id: str, seq: int, ts: int) -> None:
        """Restore a dedup entry after restart (only ids still inside the window)."""
        self._dedup[msg_id] = (seq, ts)
        self._dedup_order.append((ts, msg_id))
        if seq == self.state.last_seq:
            self.last_msg_id = msg_id

    # -- reads ----------------------------------------------------------------------------
    def meta(self, seq: int) -> MessageMeta | None:
        return self._msgs.get(seq)

    def __len__(self) -> int:
        return self.state.msgs

    @property
    def first_seq(self) -> int:
        return self.state.first_seq

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    def seqs(self, start: int = 0) -> Iterator[int]:
        """Live sequences >= ``start`` in order."""
        msgs = self._msgs
        if start <= self.state.first_seq:
            for seq in self._order:
                if seq in msgs:
                    yield seq
            return
        # Sequences are dense apart from deletions: walk the range.
        last = self.state.last_seq
        seq = start
        while seq <= last:
            if seq in msgs:
                yield seq
            seq += 1

    def seqs_matching(self, start: int, filters: tuple[str, ...]) -> Iterator[int]:
        """Live sequences >= ``start`` whose subject matches any filter, in order."""
        if not filters:
            yield from self.seqs(start)
            return
        if len(filters) == 1 and is_literal(filters[0]):
            dq = self._by_subject.get(filters[0])
            if not dq:
                return
            items = list(dq) if start > dq[0] else dq
            idx = bisect.bisect_left(items, start) if start > dq[0] else 0
            for i in range(idx, len(items)):
                yield items[i]
            return
        subjects = self.matching_subjects(filters)
        if not subjects:
            return
        if len(subjects) * 4 < self.state.msgs:
            # Few matching subjects: merge their (sorted) sequence lists.
            merged = sorted(s for subj in subjects for s in self._by_subject[subj] if s >= start)
            yield from merged
            return
        msgs = self._msgs
        for seq in self.seqs(start):
            if msgs[seq].subject in subjects:
                yield seq

    def matching_subjects(self, filters: tuple[str, ...]) -> set[str]:
        out: set[str] = set()
        for f in filters:
            if is_literal(f):
                if f in self._by_subject:
                    out.add(f)
            else:
                out.update(s for s in self._by_subject if subject_matches(f, s))
        return out

    def count_matching(self, start: int, filters: tuple[str, ...]) -> int:
        """How many live messages with seq >= ``start`` match (``num_pending``)."""
        if start <= self.state.first_seq and not filters:
            return self.state.msgs
        if not filters:
            st = self.state
            if start > st.last_seq:
                return 0
            if st.msgs == st.last_seq - st.first_seq + 1:
                # No gaps (the common case): the count is arithmetic, not a walk.
                return st.last_seq - start + 1
            return sum(1 for _ in self.seqs(start))
        total = 0
        for subj in self.matching_subjects(filters):
            dq = self._by_subject[subj]
            if start <= dq[0]:
                total += len(dq)
            else:
                total += len(dq) - bisect.bisect_left(list(dq), start)
        return total

    def last_by_subject(self, filter_: str) -> int:
        """Highest sequence whose subject matches ``filter_`` (wildcards allowed), or 0."""
        if is_literal(filter_):
            dq = self._by_subject.get(filter_)
            return dq[-1] if dq else 0
        best = 0
        for subj, dq in self._by_subject.items():
            if dq[-1] > best and subject_matches(filter_, subj):
                best = dq[-1]
        return best

    def next_by_subject(self, start: int, filter_: str) -> int:
        for seq in self.seqs_matching(start, (filter_,)):
            return seq
        return 0

    def subjects_state(self, filter_: str) -> dict[str, int]:
        if filter_ == ">":
            return {subj: len(dq) for subj, dq in self._by_subject.items()}
        if is_literal(filter_):
            dq = self._by_subject.get(filter_)
            return {filter_: len(dq)} if dq else {}
        return {
            subj: len(dq) for subj, dq in self._by_subject.items() if subject_matches(filter_, subj)
        }

    @property
    def num_deleted(self) -> int:
        """Sequences between first and last that are gone (interior deletes)."""
        st = self.state
        return st.last_seq - st.first_seq + 1 - st.msgs if st.msgs else 0

    def deleted(self) -> list[int]:
        """The interior deleted sequences, in order (``deleted_details``)."""
        if not self.num_deleted:
            return []
        msgs = self._msgs
        return [s for s in range(self.state.first_seq, self.state.last_seq + 1) if s not in msgs]

    def info_state(self) -> dict[str, Any]:
        """``state`` of a stream info (timestamps as ns; the front door formats them).

        Field presence follows nats-server: ``num_subjects`` and ``num_deleted`` only
        when non-zero.
        """
        st = self.state
        first_ts = 0
        if st.msgs:
            first = self._msgs.get(st.first_seq)
            first_ts = first.ts if first else 0
        out: dict[str, Any] = {
            "messages": st.msgs,
            "bytes": st.bytes,
            "first_seq": st.first_seq,
            "first_ts": first_ts,
            "last_seq": st.last_seq,
            "last_ts": st.last_ts,
        }
        if self._by_subject:
            out["num_subjects"] = len(self._by_subject)
        deleted = self.num_deleted
        if deleted:
            out["num_deleted"] = deleted
        out["consumer_count"] = self.consumer_count
        return out

    def seq_from_time(self, ts: int) -> int:
        """The first live sequence stored at or after ``ts`` (ns), or 0 if none."""
        msgs = self._msgs
        for seq in self.seqs(0):
            if msgs[seq].ts >= ts:
                return seq
        return 0

    # -- publish checks --------------------------------------------------------------------
    def duplicate_of(self, msg_id: str, now: int) -> int:
        """The sequence of an earlier message with this id inside the window, or 0."""
        self.expire_dedup(now)
        hit = self._dedup.get(msg_id)
        return hit[0] if hit else 0

    def first_duplicate(self, ids: list[str], now: int) -> int:
        """The dedup check of an atomic batch's messages (``ids[i]`` the msg id of its
        message ``i``, "" for none): the index of the first whose id an earlier one of
        them or a message inside the window already has, -1 if none."""
        self.expire_dedup(now)
        dedup = self._dedup
        named = ids if "" not in ids else [msg_id for msg_id in ids if msg_id]
        if len(set(named)) == len(named) and dedup.keys().isdisjoint(named):
            return -1  # (the usual batch: asked in two calls, not a loop)
        seen: set[str] = set()
        for i, msg_id in enumerate(ids):
            if msg_id:
                if msg_id in seen or msg_id in dedup:
                    return i
                seen.add(msg_id)
        return -1

    def expire_dedup(self, now: int) -> None:
        cutoff = now - self.config.duplicate_window
        order = self._dedup_order
        dedup = self._dedup
        while order and order[0][0] < cutoff:
            ts, msg_id = order.popleft()
            hit = dedup.get(msg_id)
            if hit is not None and hit[1] == ts:
                del dedup[msg_id]

    def check_expectations(
        self,
        subject: str,
        expected_stream: bytes | None,
        expected_last_seq: bytes | None,
        expected_subj_seq: bytes | None,
        expected_subj_seq_subject: bytes | None,
        msg_ttl: bytes | None = None,
    ) -> int:
        """Optimistic-concurrency headers checked before dedup, in nats-server's order.

        A value that is not a number (ASCII digits, within int64) never matches
        (nats-server parses it as -1). Values are compared as bytes, so one that is not
        UTF-8 simply does not match. Returns the per-message TTL (``Nats-TTL``) in
        seconds, -1 for "never", 0 for none (a TTL of zero, ``00``, means none, as in
        nats-server); one is refused without ``allow_msg_ttl``.
        """
        if expected_stream and expected_stream != self.name.encode():
            raise errors.expected_stream_mismatch()
        ttl = 0
        if msg_ttl:
            parsed = _ttl_header(msg_ttl)
            if parsed is None:
                raise errors.msg_ttl_invalid()
            if parsed and not self.config.allow_msg_ttl:
                raise errors.msg_ttl_disabled()
            ttl = parsed
        if expected_subj_seq is not None:
            on = subject
            if expected_subj_seq_subject:
                # Subjects are read off the wire the same way.
                on = expected_subj_seq_subject.decode("utf-8", "surrogateescape")
            have = self.last_by_subject(on)
            if _int_header(expected_subj_seq) != have:
                raise errors.wrong_last_sequence(have)
        elif expected_subj_seq_subject:
            raise errors.expected_last_subject_sequence_missing()
        if expected_last_seq is not None and _int_header(expected_last_seq) != self.state.last_seq:
            raise errors.wrong_last_sequence(self.state.last_seq)
        return ttl

    def check_last_msg_id(self, expected_last_msg_id: bytes) -> None:
        """``Nats-Expected-Last-Msg-Id`` (checked after dedup, as nats-server does)."""
        if expected_last_msg_id != self.last_msg_id.encode():
            raise errors.wrong_last_msg_id(self.last_msg_id)

    def check_size(self, headers_len: int, payload_len: int) -> None:
        """``max_msg_size`` covers headers plus payload; headers are capped at 64 KiB."""
        limit = self.config.max_msg_size
        if limit >= 0 and headers_len + payload_len > limit:
            raise errors.message_too_large()
        if headers_len > 65535:
            raise errors.header_too_large()

    def msgs_on(self, subject: str) -> int:
        """How many messages the stream holds on ``subject`` (a literal subject)."""
        dq = self._by_subject.get(subject)
        return 0 if dq is None else len(dq)

    def peak_bytes(self, subjects: list[str], sizes: list[int], rollups: list[str]) -> int:
        """The most bytes the stream holds just before one of a run of messages
        (``subjects[i]``, ``sizes[i]``, ``rollups[i]`` its ``Nats-Rollup`` or "") is
        appended, were they appended one by one with the stream's limits evicting its
        oldest as they go: what nats-server checks each message of a batch against the
        server's bound with. Nothing changes; only the messages evicted are visited."""
        cfg = self.config
        evict = cfg.discard != "new"
        max_msgs = cfg.max_msgs if evict else 0
        max_bytes = cfg.max_bytes if evict else 0
        per_subject = cfg.max_msgs_per_subject
        stored = self._msgs
        by_subject = self._by_subject
        first = self.last_seq + 1  # the run's messages take the sequences from here
        gone: set[int] = set()
        counts: dict[str, int] = {}
        order: tuple[Iterator[int], deque[int]] = (iter(self._order), deque())
        queues: dict[str, tuple[Iterator[int], deque[int]]] = {}
        msgs, held = self.state.msgs, self.state.bytes
        peak = held

        def count_on(subject: str) -> int:
            count = counts.get(subject)
            return len(by_subject.get(subject, ())) if count is None else count

        def queue_of(subject: str) -> tuple[Iterator[int], deque[int]]:
            queue = queues.get(subject)
            if queue is None:
                queue = queues[subject] = (iter(by_subject.get(subject, ())), deque())
            return queue

        def oldest(queue: tuple[Iterator[int], deque[int]]) -> int:
            for seq in queue[0]:
                if seq in stored and seq not in gone:
                    return seq
            while queue[1]:
                seq = queue[1].popleft()
                if seq not in gone:
                    return seq
            return 0

        def drop(seq: int) -> None:
            nonlocal msgs, held
            gone.add(seq)
            msgs -= 1
            if seq >= first:
                subject, size = subjects[seq - first], sizes[seq - first]
            else:
                subject, size = stored[seq].subject, stored[seq].size
            held -= size
            counts[subject] = count_on(subject) - 1

        for i, (subject, size, rollup) in enumerate(zip(subjects, sizes, rollups, strict=True)):
            peak = max(peak, held)
            # A rollup purges what came before it (after it is stored: the same bytes
            # for the next message).
            if rollup:
                queue = order if rollup == "all" else queue_of(subject)
                while seq := oldest(queue):
                    drop(seq)
            seq = first + i
            msgs += 1
            held += size
            counts[subject] = count_on(subject) + 1
            order[1].append(seq)
            queue_of(subject)[1].append(seq)
            while (
                per_subject > 0
                and counts[subject] > per_subject
                and (old := oldest(queue_of(subject)))
            ):
                drop(old)
            while max_msgs > 0 and msgs > max_msgs and (old := oldest(order)):
                drop(old)
            while max_bytes > 0 and held > max_bytes and (old := oldest(order)):
                drop(old)
        return peak

    def check_limits_for_new(self, subject: str, size: int, rollup: bool = False) -> None:
        """With ``discard: new``: refuse a message that would exceed a limit.

        As in nats-server, a message whose subject is at ``max_msgs_per_subject``
        replaces that subject's oldest, so it does not count against ``max_msgs``
        (nor ``max_bytes`` when the replaced one is at least as large), unless
        ``discard_new_per_subject`` refuses it (rollups pass: they purge the subject).
        """
        cfg = self.config
        if cfg.discard != "new":
            return
        st = self.state
        replaces = 0
        if cfg.max_msgs_per_subject > 0:
            dq = self._by_subject.get(subject)
            if dq is not None and len(dq) + 1 > cfg.max_msgs_per_subject:
                if cfg.discard_new_per_subject and not rollup:
                    raise errors.store_failed("maximum messages per subject exceeded")
                replaces = dq[0]
        if cfg.max_msgs > 0 and st.msgs >= cfg.max_msgs and not replaces:
            raise errors.store_failed("maximum messages exceeded")
        if cfg.max_bytes > 0 and st.bytes + size > cfg.max_bytes:
            old = self._msgs[replaces].size if replaces else 0
            if not replaces or old < size:
                raise errors.store_failed("maximum bytes exceeded")

    # -- writes -----------------------------------------------------------------------------
    def append(self, meta: MessageMeta, msg_id: str) -> list[int]:
        """Add a message (seq = last_seq + 1); returns the sequences the limits evict."""
        self._add(meta)
        st = self.state
        st.last_ts = meta.ts
        if msg_id:
            self._dedup[msg_id] = (meta.seq, meta.ts)
            self._dedup_order.append((meta.ts, msg_id))
        self.last_msg_id = msg_id
        return self._enforce_limits(meta.subject)

    @property
    def evicts(self) -> bool:
        """Whether an append may evict older messages (a limit on count or bytes)."""
        cfg = self.config
        return cfg.max_msgs > 0 or cfg.max_bytes > 0 or cfg.max_msgs_per_subject > 0

    def append_run(
        self, subject: str, sizes: list[int], ts: int, overhead: int | None = None
    ) -> int:
        """:meth:`append` without a msg id for messages of ``sizes`` bytes to ``subject``,
        in one go; returns the first sequence. Nothing is evicted: only for a stream
        that does not :attr:`evicts`, or followed by :meth:`enforce_run_limits`.
        ``overhead``: the bytes of each size beyond subject, headers and payload (by
        default that of a message without headers)."""
        st = self.state
        first = st.last_seq + 1
        end = first + len(sizes)
        msgs = self._msgs
        plain = self.sizing.plain if overhead is None else overhead
        seq = first
        for size in sizes:
            msgs[seq] = MessageMeta(seq, subject, size, ts, 0, plain)
            seq += 1
        dq = self._by_subject.get(subject)
        if dq is None:
            dq = self._by_subject[subject] = deque()
        dq.extend(range(first, end))
        self._appended(first, end, sizes, ts)
        return first

    def append_mixed(
        self, subjects: list[str], sizes: list[int], ts: int, overheads: list[int] | None = None
    ) -> int:
        """:meth:`append_run` for messages each to its own subject (``subjects[i]`` has
        ``sizes[i]`` bytes, ``overheads[i]`` of them beyond subject, headers and payload;
        all without headers when not given); returns the first sequence."""
        st = self.state
        first = st.last_seq + 1
        msgs = self._msgs
        by_subject = self._by_subject
        if overheads is None:
            overheads = [self.sizing.plain] * len(sizes)
        seq = first
        for subject, size, extra in zip(subjects, sizes, overheads, strict=True):
            msgs[seq] = MessageMeta(seq, subject, size, ts, 0, extra)
            dq = by_subject.get(subject)
            if dq is None:
                dq = by_subject[subject] = deque()
            dq.append(seq)
            seq += 1
        self._appended(first, seq, sizes, ts)
        return first

    def remember_run_ids(self, first: int, ids: list[str], ts: int) -> None:
        """The msg ids of a run just appended from ``first`` on (``ids[k]`` for
        ``first + k``, "" for none), as :meth:`append` takes each one's."""
        dedup = self._dedup
        order = self._dedup_order
        if "" not in ids:
            # Every message has one (the usual batch): in two calls rather than a loop.
            seqs = zip(range(first, first + len(ids)), repeat(ts))
            dedup.update(zip(ids, seqs, strict=True))
            order.extend(zip(repeat(ts), ids))
        else:
            for seq, msg_id in enumerate(ids, first):
                if msg_id:
                    dedup[msg_id] = (seq, ts)
                    order.append((ts, msg_id))
        self.last_msg_id = ids[-1]

    def enforce_run_limits(self) -> list[int]:
        """After a run appended in one go (:meth:`append_run`, :meth:`append_mixed`):
        what appending its messages one at a time would have evicted, ascending. Only
        for a stream without ``max_msgs_per_subject``: ``max_msgs`` and ``max_bytes``
        each keep the newest messages that fit, so applying them once after the run
        keeps what applying them after each message would have kept."""
        return self._evict_past_totals([])

    def _evict_past_totals(self, evicted: list[int]) -> list[int]:
        """Remove the oldest messages while ``max_msgs`` or ``max_bytes`` is exceeded,
        adding their sequences to ``evicted``, which is returned."""
        cfg = self.config
        st = self.state
        if cfg.max_msgs > 0:
            while st.msgs > cfg.max_msgs:
                evicted.append(st.first_seq)
                self.remove(st.first_seq)
        if cfg.max_bytes > 0:
            while st.bytes > cfg.max_bytes and st.msgs:
                evicted.append(st.first_seq)
                self.remove(st.first_seq)
        return evicted

    def _appended(self, first: int, end: int, sizes: list[int], ts: int) -> None:
        """The stream's order and state after appending ``first..end-1``."""
        self._order.extend(range(first, end))
        st = self.state
        if st.msgs == 0:
            st.first_seq = first
        st.msgs += len(sizes)
        size = sum(sizes)
        st.bytes += size
        self.held.bytes += size
        st.last_seq = end - 1
        st.last_ts = ts
        self.last_msg_id = ""

    def _add(self, meta: MessageMeta) -> None:
        seq = meta.seq
        self._msgs[seq] = meta
        self._order.append(seq)
        dq = self._by_subject.get(meta.subject)
        if dq is None:
            dq = self._by_subject[meta.subject] = deque()
        dq.append(seq)
        st = self.state
        if st.msgs == 0:
            st.first_seq = seq
        st.msgs += 1
        st.bytes += meta.size
        self.held.bytes += meta.size
        if seq > st.last_seq:
            st.last_seq = seq
            st.last_ts = meta.ts

    def _enforce_limits(self, subject: str) -> list[int]:
        cfg = self.config
        evicted: list[int] = []
        if cfg.max_msgs_per_subject > 0:
            dq = self._by_subject[subject]
            while len(dq) > cfg.max_msgs_per_subject:
                evicted.append(dq[0])
                self.remove(dq[0])
        return self._evict_past_totals(evicted)

    def enforce_limits(self) -> list[int]:
        """Apply the limits everywhere (after a configuration update or a reload)."""
        evicted: list[int] = []
        for subject in list(self._by_subject):
            if subject in self._by_subject:
                evicted += self._enforce_limits(subject)
        return sorted(evicted)

    def expired(self, now: int) -> list[int]:
        """Sequences expired at ``now`` (see :meth:`expire`), removed from the index."""
        return [meta.seq for meta in self.expire(now)[0]]

    def expire(self, now: int) -> tuple[list[MessageMeta], set[int]]:
        """Remove what has expired at ``now``: messages whose per-message TTL is due,
        then those older than ``max_age`` (oldest first) except ``Nats-TTL: never``
        ones. Returns them in that order, and which of them were delete markers."""
        out: list[MessageMeta] = []
        ttls = self.ttls
        markers = ttls.markers
        was_marker: set[int] = set()
        if ttls.next_due() and ttls.next_due() <= now:
            msgs = self._msgs
            for seq in ttls.due(now):
                meta = msgs.get(seq)
                if meta is not None:
                    out.append(meta)
                    if seq in markers:
                        was_marker.add(seq)
                    self.remove(seq)
        if not self.config.max_age or not self.state.msgs:
            return out, was_marker
        cutoff = now - self.config.max_age
        while self.state.msgs:
            if ttls.forever:
                meta = self._first_aging()
                if meta is None:
                    break
            else:
                meta = self._msgs[self.state.first_seq]
            if meta.ts > cutoff:
                break
            out.append(meta)
            if markers and meta.seq in markers:
                was_marker.add(meta.seq)
            self.remove(meta.seq)
        return out, was_marker

    def _first_aging(self) -> MessageMeta | None:
        """The oldest live message max_age applies to (not ``Nats-TTL: never``).

        Walks on from where the last call stopped: what lies before is gone or never
        expires, so each sequence is passed over once, not at every expiry."""
        msgs = self._msgs
        forever = self.ttls.forever
        seq = max(self.state.first_seq, self._age_from)
        last = self.state.last_seq
        while seq <= last:
            meta = msgs.get(seq)
            if meta is not None and seq not in forever:
                self._age_from = seq
                return meta
            seq += 1
        self._age_from = seq
        return None

    def next_expiry(self) -> int:
        """When the next message expires (ns since epoch), or 0 if never."""
        due = self.ttls.next_due()
        if not self.config.max_age or not self.state.msgs:
            return due
        if self.ttls.forever:
            first = self._first_aging()
            if first is None:
                return due
        else:
            first = self._msgs[self.state.first_seq]
        aged = first.ts + self.config.max_age
        return min(due, aged) if due else aged

    def forget(self, seq: int, msg_id: str) -> None:
        """Undo :meth:`append` for a message whose commit failed (or that is taken back
        to be stored again).

        The sequences at the end that storage does not hold are given back, down to the
        last live message or :attr:`durable_seq`, so numbering stays what storage has
        (as after a restart), whatever order the failed commits are reported in.
        """
        self.remove(seq)
        self.ttls.forget(seq)
        if seq < self._age_from:
            self._age_from = seq
        if msg_id:
            hit = self._dedup.get(msg_id)
            if hit is not None and hit[0] == seq:
                del self._dedup[msg_id]
            if self.last_msg_id == msg_id:
                self.last_msg_id = ""
        st = self.state
        order = self._order
        msgs = self._msgs
        while order and order[-1] not in msgs:
            order.pop()  # taken back: a sequence given back is appended again
        last = max(order[-1] if order else 0, self.durable_seq)
        if last < st.last_seq:
            st.last_seq = last
            if not st.msgs:
                st.first_seq = last + 1 if last > 0 else 0

    def remove(self, seq: int) -> MessageMeta | None:
        # remove_many below does the same for a run of sequences: keep them in step.
        meta = self._msgs.pop(seq, None)
        if meta is None:
            return None
        st = self.state
        st.msgs -= 1
        st.bytes -= meta.size
        self.held.bytes -= meta.size
        dq = self._by_subject[meta.subject]
        if dq[0] == seq:
            dq.popleft()
        else:
            dq.remove(seq)
        if not dq:
            del self._by_subject[meta.subject]
        ttls = self.ttls
        if ttls.forever or ttls.markers:
            ttls.discard(seq)
        if seq == st.first_seq:
            order = self._order
            msgs = self._msgs
            while order and order[0] not in msgs:
                order.popleft()
            st.first_seq = order[0] if order else st.last_seq + 1
        return meta

    def remove_many(self, seqs: list[int]) -> list[int]:
        """:meth:`remove` of each of ``seqs`` (ascending) in one pass, for retention's
        batches of acknowledged messages: the sequences that were there."""
        msgs = self._msgs
        by_subject = self._by_subject
        ttls = self.ttls
        timed = ttls.forever or ttls.markers
        removed: list[int] = []
        size = 0
        for seq in seqs:
            meta = msgs.pop(seq, None)
            if meta is None:
                continue
            removed.append(seq)
            size += meta.size
            dq = by_subject[meta.subject]
            if dq[0] == seq:
                dq.popleft()
            else:
                dq.remove(seq)
            if not dq:
                del by_subject[meta.subject]
            if timed:
                ttls.discard(seq)
        if removed:
            st = self.state
            st.msgs -= len(removed)
            st.bytes -= size
            self.held.bytes -= size
            if st.first_seq not in msgs:
                order = self._order
                while order and order[0] not in msgs:
                    order.popleft()
                st.first_seq = order[0] if order else st.last_seq + 1
        return removed

    def purge(self, filter_: str = "", up_to_seq: int = 0, keep: int = 0) -> list[int]:
        """nats-server's purge: optional subject filter, below ``up_to_seq``, keep newest N.

        Returns the removed sequences in order.
        """
        if filter_ and filter_ != ">":
            candidates = list(self.seqs_matching(0, (filter_,)))
        else:
            candidates = list(self.seqs(0))
        if up_to_seq:
            candidates = [s for s in candidates if s < up_to_seq]
        elif keep:
            # nats-server keeps the newest `keep` of everything the filter matches.
            candidates = candidates[:-keep] if keep < len(candidates) else []
        for seq in candidates:
            self.remove(seq)
        st = self.state
        if not st.msgs:
            st.first_seq = st.last_seq + 1
            if up_to_seq > st.first_seq and not (filter_ and filter_ != ">"):
                # Compacting past the end moves the numbering forward, as nats-server does.
                st.first_seq = up_to_seq
                st.last_seq = up_to_seq - 1
                # The broker stores this numbering as a high-water mark of its own.
                self.durable_seq = max(self.durable_seq, st.last_seq)
        return candidates

    def rollup(self, subject: str, mode: str) -> list[int]:
        """Before storing a ``Nats-Rollup`` message: remove what it replaces."""
        if mode == "sub":
            return self.purge(subject)
        return self.purge()


_DURATION_PART = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)"
_DURATION = re.compile(f"(?:{_DURATION_PART})+")
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9}


def message_ttl(value: str) -> int | None:
    """A ``Nats-TTL`` value as nats-server reads it: seconds, -1 for "never", None if invalid.

    Go durations ("90s", "1h30m") must be at least a second; plain integers are seconds.
    """
    if value.lower() == "never":
        return -1
    text = value[1:] if value.startswith("+") else value
    if text == "0" or _DURATION.fullmatch(text):
        total = sum(
            float(number) * _UNIT_NS.get(unit, 3600 * 10**9)
            for number, unit in re.findall(_DURATION_PART, text)
        )
        # Go refuses a duration that overflows int64 nanoseconds, then reads the
        # value as digits, which it is not: invalid either way.
        return None if total < 10**9 or total > INT64_MAX else int(total // 10**9)
    return parse_uint(value.encode())


@lru_cache(maxsize=512)
def _ttl_header(raw: bytes) -> int | None:
    # Publishers repeat a handful of TTLs: parse each once, not once per message.
    return message_ttl(raw.decode(errors="replace"))


INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def parse_uint(raw: bytes) -> int | None:
    """``raw`` as a non-negative integer that fits a signed 64-bit one, or None.

    Strict, as nats-server reads numbers in headers: ASCII digits only (``bytes.isdigit``
    knows no others), no sign, space or underscore, which ``int()`` would accept.
    """
    if not raw or len(raw) > 19 or not raw.isdigit():
        return None
    value = int(raw)
    return value if value <= INT64_MAX else None


def parse_priority(raw: bytes) -> int | None:
    """A ``Tether-Priority`` value: a decimal integer, optionally negative, that the
    store can hold (signed 64-bit), else None."""
    digits = raw[1:] if raw[:1] == b"-" else raw
    if not digits or len(digits) > 19 or not digits.isdigit():
        return None
    value = int(raw)
    return value if INT64_MIN <= value <= INT64_MAX else None


def _int_header(raw: bytes) -> int:
    """An expected-sequence header: a number that is not one never matches (-1)."""
    value = parse_uint(raw)
    return -1 if value is None else value
