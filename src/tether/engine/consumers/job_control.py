"""Per-message control of a consumer, for front doors that show delivery state as jobs.

A webhook-broker job is the delivery state of one message for one consumer, and its
HTTP API acts on single messages: list what is queued without leasing it, claim a
batch with a caller-chosen deadline, move one given message in flight, retry a dead
one, extend a deadline. These methods do exactly that on the consumer's own state, so
there is one set of rules (ack wait, backoff, ``max_deliver``, dead set) whichever
door a client comes through. Out-of-order moves need ``priority_order`` (the cursor
that can step over messages taken early).
"""

from __future__ import annotations

from tether.engine.clock import Clock
from tether.engine.consumers.cursor import PriorityCursor, SequenceCursor
from tether.engine.consumers.delivery_state import DeliveryState
from tether.engine.streams import Stream
from tether.storage.base import MessageMeta


class JobControl:
    """The per-message side of :class:`~tether.engine.consumers.consumer.Consumer` (a mixin)."""

    # Provided by Consumer.
    stream: Stream
    clock: Clock
    state: DeliveryState
    cursor: SequenceCursor | PriorityCursor
    dseq: int
    last_delivered_ns: int
    deleted: bool

    def _candidate(self) -> tuple[MessageMeta, bool] | None:
        raise NotImplementedError

    def _commit(self, meta: MessageMeta, redelivery: bool, now: int) -> None:
        raise NotImplementedError

    def _changed_state(self) -> None:
        raise NotImplementedError

    def reap(self) -> None:
        raise NotImplementedError

    def _wait_for(self, deliveries: int) -> int:
        raise NotImplementedError

    def _arm_ack_timer(self, deadline: int) -> None:
        raise NotImplementedError

    # -- views -------------------------------------------------------------------------------
    def peek_available(self, limit: int) -> list[MessageMeta]:
        """Up to ``limit`` messages the next deliveries would hand out, in that order,
        leasing nothing: queued redeliveries and messages not handed out yet."""
        if limit <= 0:
            return []
        self.reap()  # exhausted redeliveries are dead, not available
        meta_of = self.stream.meta
        queued = [m for m in map(meta_of, self.state.queued) if m is not None]
        cursor = self.cursor
        if isinstance(cursor, PriorityCursor):
            merged = queued + cursor.peek_many(limit)
            merged.sort(key=lambda m: (-m.priority, m.seq))
            return merged[:limit]
        # Stream order: redeliveries go first, then new messages (as _candidate does).
        queued.sort(key=lambda m: m.seq)
        fresh: list[MessageMeta] = []
        nxt = cursor.peek()
        if nxt is not None:
            fresh.append(nxt)
        return (queued + fresh)[:limit]

    def delivery_count(self, seq: int) -> int:
        """How many times ``seq`` was delivered (0 if it is neither unacked nor dead)."""
        letter = self.state.dead.get(seq)
        if letter is not None:
            return letter.deliveries
        if seq in self.state.pending:
            return self.state.deliveries(seq)
        return 0

    def deadline_of(self, seq: int) -> int:
        """When the in-flight delivery of ``seq`` times out (0 if it is not in flight)."""
        return self.state.deadline(seq, self._wait_for(self.state.deliveries(seq)))

    def is_available(self, seq: int) -> bool:
        """Whether ``seq`` waits to be handed out (queued again, or never handed out)."""
        meta = self.stream.meta(seq)
        if meta is None:
            return False
        state = self.state
        if seq in state.queued:
            return True
        if seq in state.pending or seq in state.dead:
            return False
        cursor = self.cursor
        if isinstance(cursor, PriorityCursor):
            return cursor.available(meta)
        return seq <= cursor.head.committed and not cursor.passed(meta)

    # -- moves -------------------------------------------------------------------------------
    def claim(self, limit: int, deadline_ns: int = 0) -> list[MessageMeta]:
        """Hand out up to ``limit`` messages in delivery order, to no delivery target;
        each times out at ``deadline_ns`` if given, else after its ack wait / backoff."""
        out: list[MessageMeta] = []
        if self.deleted:
            return out
        now = self.clock.now()
        while len(out) < limit:
            candidate = self._candidate()
            if candidate is None:
                break
            meta, redelivery = candidate
            self._commit(meta, redelivery, now)
            if deadline_ns:
                self._give_deadline(meta.seq, deadline_ns)
            out.append(meta)
        return out

    def take(self, seq: int, deadline_ns: int = 0) -> bool:
        """Move one available message in flight, whatever its place in the order."""
        self.reap()  # an exhausted redelivery is dead, not available
        meta = self.stream.meta(seq)
        if meta is None or self.deleted or not self.is_available(seq):
            return False
        state = self.state
        now = self.clock.now()
        if state.unqueue(seq):
            dc = state.count_redelivery(seq)
            state.track(seq, self.dseq + 1, now)
        else:
            cursor = self.cursor
            if not isinstance(cursor, PriorityCursor):
                raise ValueError("taking a message out of order needs priority_order")
            cursor.take_ahead(meta)
            dc = 1
            state.track(seq, self.dseq + 1, now)
        self.dseq += 1
        self.last_delivered_ns = now
        self._give_deadline(seq, deadline_ns or now + self._wait_for(dc))
        self._changed_state()
        return True

    def retry_dead(self, seq: int, deadline_ns: int = 0) -> bool:
        """Put a dead message straight back in flight, as one more delivery."""
        state = self.state
        letter = state.dead.get(seq)
        if letter is None or self.stream.meta(seq) is None or self.deleted:
            return False
        del state.dead[seq]
        dc = letter.deliveries + 1
        state.rdc[seq] = dc
        now = self.clock.now()
        state.track(seq, letter.consumer_seq, now)
        self.dseq += 1
        self.last_delivered_ns = now
        self._give_deadline(seq, deadline_ns or now + self._wait_for(dc))
        self._changed_state()
        return True

    def extend(self, seq: int, deadline_ns: int) -> bool:
        """Give an in-flight message a new deadline (progress with a chosen length)."""
        state = self.state
        if not state.touch(seq, self.clock.now()):
            return False
        self._give_deadline(seq, deadline_ns)
        self._changed_state()
        return True

    def _give_deadline(self, seq: int, deadline_ns: int) -> None:
        # A custom deadline goes to the state's heap; the ack timer fires at the earliest.
        self.state.set_deadline(seq, deadline_ns)
        self._arm_ack_timer(deadline_ns)
