"""Per-message TTLs (``Nats-TTL``) and subject delete markers, as nats-server keeps them.

A stream with ``allow_msg_ttl`` holds a :class:`MessageTTLs`: a timer wheel of slots
(one per :data:`SLOT_NS` of deadline) in a heap of slot keys. Adding a TTL is a dict
lookup and a list append (a heap push only for a slot not seen yet), and expiring is
popping the slots that are due: never a scan of the stream. A slot is due once its
whole span has passed, so a message expires at most one slot late, never early.

Entries are not removed when their message goes earlier (deleted, purged, evicted): a
due sequence that is no longer live is skipped. A slot holds bare sequences (about 36
bytes per live TTL); a sequence given back by a failed commit and used again is in
:attr:`MessageTTLs.forgotten` until its old entry comes due, so the new message is never
expired early by the old one's deadline.
Messages with ``Nats-TTL: never`` are kept apart (:attr:`MessageTTLs.forever`): they
are exempt from ``max_age`` too. Nothing here is persisted: the TTLs are read back
from the stored headers when a stream loads (see :func:`ttl_of_headers`).
"""

from __future__ import annotations

import heapq

from tether.engine.clock import go_duration

NS = 1_000_000_000
# The wheel's resolution: how late a message may expire, at most.
SLOT_NS = 100_000_000

MSG_TTL = b"Nats-TTL"
MARKER_REASON = b"Nats-Marker-Reason"


class MessageTTLs:
    """The live per-message deadlines of one stream."""

    __slots__ = ("_heap", "_prune_at", "_slots", "_unsettled", "forever", "forgotten", "markers")

    def __init__(self) -> None:
        # slot key (deadline // SLOT_NS, rounded up) -> sequences due in it
        self._slots: dict[int, list[int]] = {}
        self._heap: list[int] = []
        # Sequences with ``Nats-TTL: never`` (not removed by max_age).
        self.forever: set[int] = set()
        # Sequences holding a subject delete marker (their expiry leaves no marker).
        self.markers: set[int] = set()
        # Sequences given back (a failed commit) while an entry of theirs is in a slot.
        self.forgotten: set[int] = set()
        # Sequences added whose commit may not have landed yet (only these can be given
        # back): pruned as commits land.
        self._unsettled: set[int] = set()
        self._prune_at = 1024

    def __len__(self) -> int:
        return sum(len(slot) for slot in self._slots.values())

    def add(self, seq: int, deadline: int, durable_seq: int | None = None) -> None:
        """``seq`` expires at ``deadline`` (ns since the epoch). ``durable_seq``: the
        stream's highest committed sequence, for a message not committed yet."""
        if durable_seq is not None:
            unsettled = self._unsettled
            if len(unsettled) >= self._prune_at:
                # Amortized: the set is rebuilt only once it has doubled since the last
                # time (many publishes may await their commit at once).
                self._unsettled = unsettled = {s for s in unsettled if s > durable_seq}
                self._prune_at = max(1024, 2 * len(unsettled))
            unsettled.add(seq)
        key = -(-deadline // SLOT_NS)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = []
            heapq.heappush(self._heap, key)
        slot.append(seq)

    def add_many(self, seqs: range, deadline: int, durable_seq: int | None = None) -> None:
        """:meth:`add` for each of ``seqs``, all due at ``deadline`` (a run of messages
        stored at once with one TTL): one slot lookup for them all."""
        if durable_seq is not None:
            unsettled = self._unsettled
            if len(unsettled) >= self._prune_at:
                self._unsettled = unsettled = {s for s in unsettled if s > durable_seq}
                self._prune_at = max(1024, 2 * len(unsettled))
            unsettled.update(seqs)
        key = -(-deadline // SLOT_NS)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = []
            heapq.heappush(self._heap, key)
        slot.extend(seqs)

    def forget(self, seq: int) -> None:
        """``seq`` is given back: its entry, if any, must not expire what comes next."""
        self.discard(seq)
        if seq in self._unsettled:
            self._unsettled.discard(seq)
            self.forgotten.add(seq)

    def discard(self, seq: int) -> None:
        """``seq`` is gone: forget its kind (its deadline is skipped when due)."""
        self.forever.discard(seq)
        self.markers.discard(seq)

    def next_due(self) -> int:
        """When the next slot is due (ns), or 0 if none."""
        return self._heap[0] * SLOT_NS if self._heap else 0

    def due(self, now: int) -> list[int]:
        """Pop every sequence whose slot has passed at ``now``, in slot order (whether
        each is still live is for the caller to check)."""
        out: list[int] = []
        heap = self._heap
        limit = now // SLOT_NS
        while heap and heap[0] <= limit:
            out += self._slots.pop(heapq.heappop(heap))
        forgotten = self.forgotten
        if forgotten:
            kept = []
            for seq in out:
                if seq in forgotten:
                    forgotten.discard(seq)  # the entry of the message given back
                else:
                    kept.append(seq)
            out = kept
        return out

    def clear(self) -> None:
        self._slots.clear()
        self._heap.clear()
        self.forever.clear()
        self.markers.clear()
        self.forgotten.clear()
        self._unsettled.clear()


def header_value(block: bytes, name: bytes) -> bytes | None:
    """The first value of header ``name`` in a ``NATS/1.0`` block, or None."""
    for line in block.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def with_ttl(block: bytes, seconds: int) -> bytes:
    """The header block with its ``Nats-TTL`` value replaced by ``seconds`` (what
    nats-server stores when it raises a TTL to the delete-marker TTL)."""
    lines = block.split(b"\r\n")
    for i, line in enumerate(lines):
        if i and line.partition(b":")[0].strip() == MSG_TTL:
            lines[i] = b"Nats-TTL: %d" % seconds
            break
    return b"\r\n".join(lines)


def marker_headers(marker_ttl_ns: int, reason: str = "MaxAge") -> bytes:
    """The header block of a subject delete marker: its reason, its own TTL (whole
    seconds, as a Go duration, as nats-server writes it) and a subject rollup."""
    ttl = go_duration(marker_ttl_ns // NS * NS)
    return b"NATS/1.0\r\nNats-Marker-Reason: %s\r\nNats-TTL: %s\r\nNats-Rollup: sub\r\n\r\n" % (
        reason.encode(),
        ttl.encode(),
    )
