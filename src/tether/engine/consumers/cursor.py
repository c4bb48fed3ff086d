"""Where a consumer stands in its stream: the next message it has not handed out yet.

Two orders exist. :class:`SequenceCursor` walks the stream in sequence order (what
JetStream does), optionally first through the last message of each subject
(``deliver_policy: last_per_subject``). :class:`PriorityCursor` (Tether's
``priority_order``) keeps one cursor per distinct ``Tether-Priority`` and serves the
highest priority first, oldest first among equals: no sort per pull, and with few
distinct priorities each message is stepped over a handful of times at most.

Both only hand out *committed* messages (``head.committed``) and keep ``num_pending``
(matching messages not handed out yet) up to date incrementally.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tether.engine.consumers.config import ConsumerConfig, parse_rfc3339
from tether.engine.consumers.delivery_state import SavedState
from tether.engine.streams import Stream
from tether.engine.subjects import is_subset, subject_matches
from tether.storage.base import MessageMeta

# After stepping over this many non-matching messages, switch to the stream's
# per-subject index instead of walking sequence by sequence.
_WALK_LIMIT = 256
_CACHE_LIMIT = 4096


class StreamHead:
    """The highest sequence of a stream whose group commit is durable."""

    __slots__ = ("committed",)

    def __init__(self, committed: int) -> None:
        self.committed = committed


class Matcher:
    """A consumer's subject filters; ``match_all`` when they cover the whole stream."""

    __slots__ = ("_cache", "filters", "match_all")

    def __init__(self, filters: tuple[str, ...], stream_subjects: Iterable[str]) -> None:
        self.filters = filters
        subjects = list(stream_subjects)
        self.match_all = not filters or (
            bool(subjects) and all(any(is_subset(s, f) for f in filters) for s in subjects)
        )
        self._cache: dict[str, bool] = {}

    def __call__(self, subject: str) -> bool:
        if self.match_all:
            return True
        hit = self._cache.get(subject)
        if hit is None:
            hit = any(subject_matches(f, subject) for f in self.filters)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[subject] = hit
        return hit


class SequenceCursor:
    """Stream order, with an optional last-per-subject prelude."""

    __slots__ = ("_dirty", "_np", "_scan", "head", "lps", "lps_end", "match", "next_seq", "stream")

    def __init__(
        self,
        stream: Stream,
        head: StreamHead,
        match: Matcher,
        next_seq: int,
        lps: Iterable[int] = (),
        lps_end: int = 0,
    ) -> None:
        self.stream = stream
        self.head = head
        self.match = match
        self.lps: deque[int] = deque(lps)
        self.lps_end = lps_end
        self.next_seq = next_seq if not self.lps else self.lps[0]
        if not self.lps and lps_end:
            self.next_seq = max(next_seq, lps_end + 1)
        # Where the last search stopped: sequences between ``next_seq`` and here hold
        # nothing for this consumer. ``next_seq`` itself only moves when a message is
        # handed out, because that is what ``delivered.stream_seq`` reports.
        self._scan = self.next_seq
        self._np = 0
        self._dirty = True

    @property
    def delivered_seq(self) -> int:
        """The stream sequence reported as ``delivered.stream_seq``."""
        return self.next_seq - 1

    @property
    def num_pending(self) -> int:
        if self._dirty:
            self._np = self._recount()
            self._dirty = False
        return self._np

    def _recount(self) -> int:
        stream = self.stream
        filters = () if self.match.match_all else self.match.filters
        committed = self.head.committed
        if self.lps:
            total = sum(1 for s in self.lps if stream.meta(s) is not None)
            start = self.lps_end + 1
        else:
            total = 0
            start = self.next_seq
        if start > committed:
            return total
        total += stream.count_matching(start, filters)
        if stream.last_seq > committed:
            total -= sum(1 for _ in stream.seqs_matching(committed + 1, filters))
        return total

    def peek(self) -> MessageMeta | None:
        """The next message to hand out (skipping what no longer exists), or None."""
        stream = self.stream
        lps = self.lps
        while lps:
            meta = stream.meta(lps[0])
            if meta is not None:
                return meta
            lps.popleft()
            if not lps:
                self.next_seq = max(self.next_seq, self.lps_end + 1)
        seq = max(self.next_seq, self._scan)
        last = self.head.committed
        match = self.match
        if match.match_all:
            while seq <= last:
                meta = stream.meta(seq)
                if meta is not None:
                    self._scan = seq
                    return meta
                seq += 1
        else:
            walked = 0
            while seq <= last:
                meta = stream.meta(seq)
                if meta is not None and match(meta.subject):
                    self._scan = seq
                    return meta
                seq += 1
                walked += 1
                if walked > _WALK_LIMIT:
                    found = self._indexed_next(seq, last)
                    if found is not None:
                        self._scan = found.seq
                        return found
                    seq = last + 1
                    break
        self._scan = seq
        return None

    def peek_run(self, limit: int) -> list[MessageMeta]:
        """Up to ``limit`` next messages in order, as repeated :meth:`peek` / :meth:`take`
        would find them, without handing them out: :meth:`take_run` does that for as
        many of them as were delivered. Empty when nothing is left."""
        if self.lps:
            meta = self.peek()
            return [] if meta is None else [meta]
        stream_meta = self.stream.meta
        seq = max(self.next_seq, self._scan)
        last = self.head.committed
        run: list[MessageMeta]
        if self.match.match_all:
            end = min(last, seq + limit - 1)
            run = [m for m in map(stream_meta, range(seq, end + 1)) if m is not None]
        else:
            match = self.match
            run = []
            walked = 0
            while seq <= last and len(run) < limit:
                meta = stream_meta(seq)
                seq += 1
                if meta is not None and match(meta.subject):
                    run.append(meta)
                else:
                    walked += 1
                    if walked > _WALK_LIMIT:
                        break  # sparse: peek() below, or the next run, uses the index
        if run:
            self._scan = run[0].seq
            return run
        # Nothing close by (a gap, or a sparse filter): peek's own search.
        meta = self.peek()
        return [] if meta is None else [meta]

    def take_run(self, last: MessageMeta, count: int) -> None:
        """The first ``count`` messages of :meth:`peek_run`, ending with ``last``, were
        handed out (like ``count`` :meth:`take` calls)."""
        if self.lps:
            self.take(last)
            return
        self.next_seq = last.seq + 1
        if not self._dirty:
            self._np = max(self._np - count, 0)

    def _indexed_next(self, start: int, last: int) -> MessageMeta | None:
        try:
            for seq in self.stream.seqs_matching(start, self.match.filters):
                if seq > last:
                    return None
                return self.stream.meta(seq)
        except RuntimeError:  # the index changed under the iterator; walk next time
            return None
        return None

    def passed(self, meta: MessageMeta) -> bool:
        """Whether ``meta`` was handed out (or skipped for good)."""
        return meta.seq < self.next_seq and meta.seq not in self.lps

    def set_match(self, match: Matcher) -> None:
        """The filters changed (consumer update): recount what is pending."""
        self.match = match
        self._scan = self.next_seq
        self._dirty = True

    def take(self, meta: MessageMeta) -> None:
        """``meta`` (from :meth:`peek`) was handed out."""
        lps = self.lps
        if lps and lps[0] == meta.seq:
            lps.popleft()
            self.next_seq = meta.seq + 1
            if not lps:
                self.next_seq = max(self.next_seq, self.lps_end + 1)
        else:
            self.next_seq = meta.seq + 1
        if not self._dirty and self._np > 0:
            self._np -= 1

    def on_committed(self, metas: list[MessageMeta]) -> None:
        if self._dirty:
            return
        match = self.match
        floor = max(self.next_seq, self.lps_end + 1)
        for meta in metas:
            if meta.seq >= floor and match(meta.subject):
                self._np += 1

    def on_removed(self, seqs: list[int]) -> None:
        """Messages left the stream for reasons unknown to the consumer (limits, purge)."""
        if self._dirty:
            return
        committed = self.head.committed
        if self.match.match_all and not self.lps:
            start = self.next_seq
            self._np -= sum(1 for s in seqs if start <= s <= committed)
            self._np = max(self._np, 0)
            return
        low = self.next_seq if not self.lps else self.lps[0]
        if any(low <= s <= committed for s in seqs):
            self._dirty = True

    def save(self) -> tuple[int, list[int], int]:
        return self.next_seq, list(self.lps), self.lps_end


class PriorityCursor:
    """Highest ``Tether-Priority`` first, oldest first among equals."""

    __slots__ = (
        "_dirty",
        "_np",
        "_order",
        "ahead",
        "cursors",
        "head",
        "match",
        "max_taken",
        "start",
        "stream",
    )

    def __init__(
        self,
        stream: Stream,
        head: StreamHead,
        match: Matcher,
        start: int,
        cursors: dict[int, int] | None = None,
        max_taken: int = 0,
        ahead: Iterable[int] = (),
    ) -> None:
        self.stream = stream
        self.head = head
        self.match = match
        self.cursors: dict[int, int] = dict(cursors or {})
        # Messages handed out out of order (:meth:`take_ahead`) that their priority's
        # cursor has not reached yet: the walk steps over them instead of re-serving them.
        self.ahead: set[int] = set(ahead)
        self.start = start
        self.max_taken = max_taken or start - 1
        self._np = 0
        self._dirty = True
        # Discover the priorities present in what is still to be handed out.
        low = min(self.cursors.values()) if self.cursors else start
        for seq in stream.seqs(max(low, 1)):
            if seq > head.committed:
                break
            meta = stream.meta(seq)
            if meta is not None and meta.priority not in self.cursors:
                self.cursors[meta.priority] = max(seq, start)
        self._order = sorted(self.cursors, reverse=True)

    @property
    def delivered_seq(self) -> int:
        return self.max_taken

    @property
    def num_pending(self) -> int:
        if self._dirty:
            self._np = self._recount()
            self._dirty = False
        return self._np

    def _recount(self) -> int:
        if not self.cursors:
            return 0
        stream = self.stream
        cursors = self.cursors
        match = self.match
        total = 0
        committed = self.head.committed
        for seq in stream.seqs(min(cursors.values())):
            if seq > committed:
                break
            meta = stream.meta(seq)
            if (
                meta is not None
                and seq >= cursors.get(meta.priority, 0)
                and match(meta.subject)
                and seq not in self.ahead
            ):
                total += 1
        return total

    def peek(self) -> MessageMeta | None:
        stream = self.stream
        cursors = self.cursors
        match = self.match
        last = self.head.committed
        ahead = self.ahead
        for priority in self._order:
            seq = cursors[priority]
            while seq <= last:
                meta = stream.meta(seq)
                if meta is not None and meta.priority == priority and match(meta.subject):
                    if not ahead or seq not in ahead:
                        cursors[priority] = seq
                        return meta
                    ahead.discard(seq)  # the cursor moves past it: no longer "ahead"
                seq += 1
            cursors[priority] = seq
        return None

    def peek_many(self, limit: int) -> list[MessageMeta]:
        """Up to ``limit`` messages :meth:`peek` would return in turn, moving nothing.

        Higher priorities come first, so filling the list priority by priority yields
        the overall first ``limit`` in order.
        """
        stream = self.stream
        match = self.match
        ahead = self.ahead
        last = self.head.committed
        out: list[MessageMeta] = []
        for priority in self._order:
            seq = self.cursors[priority]
            while seq <= last and len(out) < limit:
                meta = stream.meta(seq)
                if (
                    meta is not None
                    and meta.priority == priority
                    and match(meta.subject)
                    and seq not in ahead
                ):
                    out.append(meta)
                seq += 1
            if len(out) >= limit:
                break
        return out

    def passed(self, meta: MessageMeta) -> bool:
        return meta.seq < self.cursors.get(meta.priority, self.start) or meta.seq in self.ahead

    def available(self, meta: MessageMeta) -> bool:
        """Whether ``meta`` is committed, matches, and was not handed out yet."""
        return (
            meta.seq <= self.head.committed and not self.passed(meta) and self.match(meta.subject)
        )

    def take_ahead(self, meta: MessageMeta) -> None:
        """``meta`` (available, not necessarily next) was handed out out of order."""
        if meta.priority not in self.cursors:
            self.cursors[meta.priority] = meta.seq
            self._order = sorted(self.cursors, reverse=True)
        self.ahead.add(meta.seq)
        self.max_taken = max(self.max_taken, meta.seq)
        if not self._dirty and self._np > 0:
            self._np -= 1

    def set_match(self, match: Matcher) -> None:
        self.match = match
        self._dirty = True

    def take(self, meta: MessageMeta) -> None:
        self.ahead.discard(meta.seq)
        self.cursors[meta.priority] = meta.seq + 1
        self.max_taken = max(self.max_taken, meta.seq)
        if not self._dirty and self._np > 0:
            self._np -= 1

    def on_committed(self, metas: list[MessageMeta]) -> None:
        cursors = self.cursors
        match = self.match
        grew = False
        for meta in metas:
            if meta.priority not in cursors:
                cursors[meta.priority] = meta.seq
                grew = True
            if not self._dirty and meta.seq >= cursors[meta.priority] and match(meta.subject):
                self._np += 1
        if grew:
            self._order = sorted(cursors, reverse=True)

    def on_removed(self, seqs: list[int]) -> None:
        if self._dirty or not self.cursors:
            return
        low = min(self.cursors.values())
        committed = self.head.committed
        if any(low <= s <= committed for s in seqs):
            self._dirty = True

    def save(self) -> list[int]:
        flat: list[int] = []
        for priority, seq in self.cursors.items():
            flat.append(priority)
            flat.append(seq)
        return flat


def make_cursor(
    stream: Stream, head: StreamHead, cfg: ConsumerConfig, saved: SavedState | None
) -> SequenceCursor | PriorityCursor:
    """The cursor of a consumer: restored from ``saved``, or placed by its deliver policy."""
    match = Matcher(cfg.filters, stream.config.subjects)
    if cfg.priority_order:
        if saved is not None:
            p = saved.priority_cursors
            cursors = {p[i]: p[i + 1] for i in range(0, len(p) - 1, 2)}
            return PriorityCursor(
                stream, head, match, saved.start, cursors, saved.max_taken, saved.ahead
            )
        start, _, _ = start_position(stream, head, cfg, match)
        return PriorityCursor(stream, head, match, start)
    if saved is not None:
        return SequenceCursor(stream, head, match, saved.cursor, saved.lps, saved.lps_end)
    start, lps, lps_end = start_position(stream, head, cfg, match)
    return SequenceCursor(stream, head, match, start, lps, lps_end)


def start_position(
    stream: Stream, head: StreamHead, cfg: ConsumerConfig, match: Matcher
) -> tuple[int, list[int], int]:
    """Where a new consumer starts: (first seq, last-per-subject seqs, end of those)."""
    committed = head.committed
    policy = cfg.deliver_policy
    if policy == "new":
        return stream.last_seq + 1, [], 0
    if policy == "by_start_sequence":
        return max(cfg.opt_start_seq, 1), [], 0
    if policy == "by_start_time":
        start_ns = parse_rfc3339(cfg.opt_start_time or "")
        for seq in stream.seqs(stream.first_seq):
            meta = stream.meta(seq)
            if seq > committed or (meta is not None and meta.ts >= start_ns):
                return seq, [], 0
        return committed + 1, [], 0
    if policy == "last":
        if match.match_all:
            # The newest committed message: step back over deleted sequences.
            last = committed
            while last >= stream.first_seq and stream.meta(last) is None:
                last -= 1
            if last < stream.first_seq:
                last = 0
        else:
            last = max((stream.last_by_subject(f) for f in cfg.filters), default=0)
            last = last if last <= committed else 0
        return (last or committed + 1), [], 0
    if policy == "last_per_subject":
        filters = cfg.filters if not match.match_all else (">",)
        lasts = (stream.last_by_subject(subj) for subj in stream.matching_subjects(filters))
        seqs = sorted(s for s in lasts if 0 < s <= committed)
        return (seqs[0] if seqs else committed + 1), seqs, committed
    return max(stream.first_seq, 1), [], 0
