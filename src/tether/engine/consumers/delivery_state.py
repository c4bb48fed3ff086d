"""What a consumer remembers about each message it handed out.

A delivered message is *outstanding* (waiting for its ack until a deadline), *queued*
(nak'd or timed out: waiting to be redelivered), or *dead* (max deliveries reached or
terminated: kept aside until requeued). Acked messages are forgotten; everything at or
below the ack floor is acked.

The hot path (deliver, ack) is one dict insert and one dict pop. Deadlines follow from
the delivery time because the dict is kept in delivery order (a redelivery or a
progress update moves the entry to the end): the ack-wait timer walks the dict from
the front and stops at the first message not yet due. Only deadlines that break that
order (a nak with a delay, backoff) go to a small heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import msgspec

# Why a message is dead.
MAX_DELIVERIES = "max_deliveries"
TERMINATED = "terminated"


class DeadLetter(msgspec.Struct, array_like=True):
    """A message the consumer gave up on; kept until requeued or removed from the stream."""

    seq: int
    consumer_seq: int
    deliveries: int
    reason: str
    ts: int  # when it died (ns)
    detail: str = ""


class SavedState(msgspec.Struct, array_like=True):
    """The persisted form (msgpack): cursors plus flat integer lists, compact and fast."""

    cursor: int
    dseq: int
    pending: list[int]  # sseq, cseq, delivered_at, ... in delivery order
    redelivered: list[int]  # sseq, deliveries, ...
    dead: list[DeadLetter]
    priority_cursors: list[int]  # priority, cursor, ...
    last_delivered_ns: int = 0
    last_ack_ns: int = 0
    lps: list[int] = msgspec.field(default_factory=list)
    lps_end: int = 0
    start: int = 0  # priority order: where the consumer started
    max_taken: int = 0  # priority order: highest stream seq handed out
    ahead: list[int] = msgspec.field(default_factory=list)  # priority order: taken early


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SavedState)


def encode_state(state: SavedState) -> bytes:
    return _encoder.encode(state)


def decode_state(raw: bytes) -> SavedState:
    return _decoder.decode(raw)


class DeliveryState:
    """Outstanding, queued and dead messages of one consumer."""

    __slots__ = (
        "_custom",
        "_rdq",
        "_timed",
        "dead",
        "pending",
        "queued",
        "rdc",
    )

    def __init__(self) -> None:
        # sseq -> (consumer seq of the last delivery, delivered_at ns); in delivery order.
        self.pending: dict[int, tuple[int, int]] = {}
        # Pending messages waiting to be redelivered, and their heap of sort keys.
        self.queued: set[int] = set()
        self._rdq: list[int] = []
        # sseq -> deliveries so far, only for messages delivered more than once
        # (0 for a requeued dead message: its count starts over).
        self.rdc: dict[int, int] = {}
        # Deadlines that do not follow from the delivery time: sseq -> deadline, + heap.
        self._custom: dict[int, int] = {}
        self._timed: list[tuple[int, int]] = []
        self.dead: dict[int, DeadLetter] = {}

    # -- deliveries ------------------------------------------------------------------------
    def deliveries(self, seq: int) -> int:
        """How many times ``seq`` was delivered (1 unless redelivered)."""
        return self.rdc.get(seq, 1) if self.rdc else 1

    def count_redelivery(self, seq: int) -> int:
        """A pending message is delivered again: returns its new delivery count."""
        dc = self.rdc.get(seq, 1) + 1 if self.rdc else 2
        if dc > 1:
            self.rdc[seq] = dc
        else:
            self.rdc.pop(seq, None)
        return dc

    def track(self, seq: int, cseq: int, now: int) -> None:
        """Record a delivery (first or re-delivery) that now awaits its ack.

        A redelivery keeps the consumer sequence of the first delivery, as nats-server
        does (its ack floor reports it).
        """
        pending = self.pending
        entry = pending.pop(seq, None)  # re-inserted at the end: deadline order
        pending[seq] = (cseq if entry is None else entry[0], now)

    def set_deadline(self, seq: int, deadline: int) -> None:
        """Give ``seq`` a deadline that does not follow from its delivery time."""
        self._custom[seq] = deadline
        heapq.heappush(self._timed, (deadline, seq))

    def deadline(self, seq: int, wait: int) -> int:
        """When outstanding ``seq`` times out, given the wait its delivery count implies
        (0 if it is not outstanding)."""
        entry = self.pending.get(seq)
        if entry is None or seq in self.queued:
            return 0
        return self._custom.get(seq) or entry[1] + wait

    def unqueue(self, seq: int) -> bool:
        """Take ``seq`` out of the redelivery queue (its heap entry is skipped as stale)."""
        if seq not in self.queued:
            return False
        self.queued.discard(seq)
        return True

    def touch(self, seq: int, now: int) -> bool:
        """Progress (``+WPI``): restart the ack timer of an outstanding message."""
        entry = self.pending.get(seq)
        if entry is None or seq in self.queued:
            return False
        self._custom.pop(seq, None)
        self.track(seq, entry[0], now)
        return True

    # -- resolution ----------------------------------------------------------------------------
    def ack(self, seq: int) -> bool:
        """Forget an acked message; False if it was not outstanding or queued."""
        if self.pending.pop(seq, None) is None:
            return False
        if self.queued:
            self.queued.discard(seq)
        if self._custom:
            self._custom.pop(seq, None)
        if self.rdc:
            self.rdc.pop(seq, None)
        return True

    def ack_up_to(self, seq: int) -> list[int]:
        """``ack_policy: all``: ack everything outstanding at or below ``seq``."""
        done = [s for s in self.pending if s <= seq]
        for s in done:
            self.ack(s)
        for s in [s for s in self.dead if s <= seq]:
            self.dead.pop(s)
            self.rdc.pop(s, None)
        return done

    def kill(self, seq: int, reason: str, now: int, detail: str = "") -> DeadLetter | None:
        """Move a pending message to the dead set."""
        entry = self.pending.get(seq)
        if entry is None:
            return None
        deliveries = self.deliveries(seq)
        self.pending.pop(seq)
        self.queued.discard(seq)
        self._custom.pop(seq, None)
        if reason != MAX_DELIVERIES:
            self.rdc.pop(seq, None)
        letter = DeadLetter(seq, entry[0], deliveries, reason, now, detail)
        self.dead[seq] = letter
        return letter

    def revive(self, seq: int, now: int) -> DeadLetter | None:
        """Take ``seq`` out of the dead set back into pending; its delivery count starts over.

        The caller queues it for redelivery.
        """
        letter = self.dead.pop(seq, None)
        if letter is not None:
            self.rdc[seq] = 0
            self.pending[seq] = (letter.consumer_seq, now)
        return letter

    def forget(self, seq: int) -> None:
        """The message left the stream: drop every trace of it."""
        if self.pending.pop(seq, None) is not None:
            self.queued.discard(seq)
            self._custom.pop(seq, None)
        self.dead.pop(seq, None)
        self.rdc.pop(seq, None)

    # -- redelivery queue --------------------------------------------------------------------------
    def queue(self, seq: int, key: int) -> None:
        """Mark a pending message due for redelivery; ``key`` orders the queue."""
        if seq in self.queued:
            return
        self._custom.pop(seq, None)
        self.queued.add(seq)
        heapq.heappush(self._rdq, key)

    def peek_queued(self, key_mod: int) -> int:
        """The next message due for redelivery (0 if none); ``key_mod`` decodes sort keys."""
        rdq = self._rdq
        queued = self.queued
        while rdq:
            key = rdq[0]
            seq = key % key_mod if key_mod else key
            if seq in queued:
                return seq
            heapq.heappop(rdq)
        return 0

    def pop_queued(self, seq: int) -> None:
        """Remove the message :meth:`peek_queued` returned: it is being redelivered."""
        heapq.heappop(self._rdq)
        self.queued.discard(seq)

    # -- timeouts ---------------------------------------------------------------------------------
    def expired(self, now: int, ack_wait: int) -> list[int]:
        """Outstanding messages whose deadline passed, oldest delivery first."""
        out: list[int] = []
        queued = self.queued
        custom = self._custom
        if ack_wait > 0:
            cutoff = now - ack_wait
            for seq, (_, at) in self.pending.items():
                if seq in queued or seq in custom:
                    continue
                if at > cutoff:
                    break
                out.append(seq)
        timed = self._timed
        while timed and timed[0][0] <= now:
            deadline, seq = heapq.heappop(timed)
            if custom.get(seq) == deadline and seq in self.pending and seq not in queued:
                out.append(seq)
        return out

    def next_deadline(self, ack_wait: int) -> int:
        """The earliest deadline of an outstanding message (0 if none)."""
        best = 0
        if ack_wait > 0:
            queued = self.queued
            custom = self._custom
            for seq, (_, at) in self.pending.items():
                if seq in queued or seq in custom:
                    continue
                best = at + ack_wait
                break
        timed = self._timed
        custom = self._custom
        while timed:
            deadline, seq = timed[0]
            if custom.get(seq) == deadline and seq in self.pending and seq not in self.queued:
                if not best or deadline < best:
                    best = deadline
                break
            heapq.heappop(timed)
        return best

    # -- views -----------------------------------------------------------------------------------
    def floor_seq(self) -> tuple[int, int] | None:
        """(consumer seq, stream seq) of the lowest outstanding delivery, or None.

        Dead messages do not hold the floor: nats-server moves its ack floor past a
        message once it reached max deliveries, and clients compare these numbers.
        """
        if not self.pending:
            return None
        best = min(self.pending)
        return self.pending[best][0], best

    def num_redelivered(self) -> int:
        return sum(1 for count in self.rdc.values() if count > 1)

    def iter_pending(self) -> Iterator[tuple[int, int, int]]:
        for seq, (cseq, at) in self.pending.items():
            yield seq, cseq, at

    # -- persistence --------------------------------------------------------------------------------
    def dump_into(self, state: SavedState) -> None:
        flat: list[int] = []
        append = flat.append
        queued = self.queued
        for seq, (cseq, at) in self.pending.items():
            append(seq)
            append(cseq)
            # Queued for redelivery: saved as delivered long ago, so due after a restart.
            append(0 if queued and seq in queued else at)
        state.pending = flat
        red: list[int] = []
        for seq, count in self.rdc.items():
            red.append(seq)
            red.append(count)
        state.redelivered = red
        state.dead = list(self.dead.values())

    def load_from(self, state: SavedState) -> None:
        p = state.pending
        pending = self.pending
        for i in range(0, len(p) - 2, 3):
            pending[p[i]] = (p[i + 1], p[i + 2])
        r = state.redelivered
        for i in range(0, len(r) - 1, 2):
            self.rdc[r[i]] = r[i + 1]
        for letter in state.dead:
            self.dead[letter.seq] = letter
