"""Jobs: the delivery state of one message for one webhook-broker consumer.

A webhook-broker consumer *is* a durable consumer of its channel's stream (priority
order, owned by the HTTP side: it has no NATS delivery target). A job is what that
consumer knows about one message, read through :class:`JobView`:

* QUEUED: available (never handed out, queued for redelivery, or a push retry
  waiting out its backoff delay);
* INFLIGHT: handed out and waiting for its outcome until a deadline;
* DELIVERED: acked;
* DEAD: in the consumer's dead set (``max_deliver`` reached, or terminated).

Redelivery, ``max_deliver`` and the dead set are the consumer's own rules; the view
only adds what webhook-broker shows and the consumer has no field for: a job's sticky
``IncrementalTimeout``, when its status last changed, which push retries are waiting
out a delay, and dead jobs deleted for good. Those extras are persisted with the
consumer's registry record (see :mod:`tether.engine.jobs.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat

import msgspec

from tether.engine.clock import Clock
from tether.engine.consumers import Consumer as EngineConsumer
from tether.engine.consumers import ConsumerConfig
from tether.engine.consumers.cursor import PriorityCursor

QUEUED = "QUEUED"
INFLIGHT = "INFLIGHT"
DELIVERED = "DELIVERED"
DEAD = "DEAD"
STATES = (QUEUED, INFLIGHT, DELIVERED, DEAD)
# webhook-broker's numeric job statuses (what /job-status reports).
STATUS_CODES = {QUEUED: 1000, INFLIGHT: 1001, DELIVERED: 1002, DEAD: 1003}

INVALID_TRANSITION = "invalid transition request"
TIMEOUT_WITH_INVALID_STATE = "timeout provided with invalid state"
NOT_DEAD = "job is not dead"
NOT_IN_FLIGHT = "job is not in flight"

NS = 1_000_000_000
# Marks, in CONSUMER.INFO, the durable consumers the HTTP API owns.
OWNER_KEY = "tether.owner"
OWNER = "webhook-broker"


def owned_by_http(config: ConsumerConfig) -> bool:
    """Whether a durable consumer is the engine side of an HTTP (webhook-broker) consumer."""
    metadata = config.metadata
    return metadata is not None and metadata.get(OWNER_KEY) == OWNER


# Per consumer, how many DELIVERED jobs remember when they were delivered.
KEEP_DELIVERED_STAMPS = 4096

# The moves a job can make over HTTP, by current state (for error messages).
_ALLOWED = {
    "QUEUED": "QUEUED -> INFLIGHT",
    "INFLIGHT": "INFLIGHT -> DELIVERED, INFLIGHT -> DEAD",
    "DEAD": "DEAD -> INFLIGHT",
}


class JobError(Exception):
    """A refused request on a job (the HTTP layer answers 400 with the text)."""


@dataclass(slots=True)
class JobSettings:
    """The timing rules shared by every webhook-broker consumer of a server."""

    max_retry: int = 5
    # stopTimeout + rationalDelay: the part of an in-flight deadline every job gets;
    # it is the consumer's ack_wait.
    inflight_base_ns: int = 32_250_000_000
    # Push retry delays (webhook-broker's retry-backoff-delays-in-seconds), in ns.
    backoff_ns: list[int] = field(default_factory=lambda: [5 * NS, 30 * NS, 60 * NS])

    @property
    def max_deliver(self) -> int:
        """The first attempt plus ``max_retry`` retries."""
        return self.max_retry + 1

    def retry_delay(self, retry: int) -> int:
        """Delay before attempt number ``retry`` (1-based): 5, 30, 60, then linear."""
        delays = self.backoff_ns
        if not delays:
            return 0
        if retry <= len(delays):
            return delays[max(retry, 1) - 1]
        return (retry - len(delays) + 1) * delays[-1]


def engine_config(consumer_id: str, settings: JobSettings) -> ConsumerConfig:
    """The durable consumer behind an HTTP consumer.

    Jobs exist for the messages stored after the consumer was created (``new``), in
    priority order. A push retry's backoff delay is a nak with that delay (see
    :meth:`JobView.fail`), so ``backoff`` stays unset and an in-flight deadline is
    ``ack_wait`` plus the job's IncrementalTimeout. ``max_ack_pending`` is unlimited:
    webhook-broker has no such limit.
    """
    return ConsumerConfig(
        durable_name=consumer_id,
        deliver_policy="new",
        ack_policy="explicit",
        ack_wait=settings.inflight_base_ns,
        max_deliver=settings.max_deliver,
        max_ack_pending=-1,
        priority_order=True,
        metadata={OWNER_KEY: OWNER},
    )


@dataclass(slots=True, frozen=True)
class JobInfo:
    """One job as the HTTP views show it."""

    seq: int
    status: str
    retries: int
    timeout: int
    changed: int
    priority: int
    deadline: int = 0


class SavedJobs(msgspec.Struct, array_like=True):
    """Persisted extras: (seq, timeout, changed) triples, backing-off and dropped seqs."""

    extras: list[int]
    backing_off: list[int]
    dropped: list[int]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SavedJobs)


class JobView:
    """The jobs of one webhook-broker consumer, over its engine consumer."""

    def __init__(self, consumer: EngineConsumer, settings: JobSettings, clock: Clock) -> None:
        self.consumer = consumer
        self.settings = settings
        self.clock = clock
        self.timeouts: dict[int, int] = {}  # IncrementalTimeout (s), sticky per job
        self.changed: dict[int, int] = {}  # when the view last moved the job (ns)
        # Push retries waiting out their delay: unacked in the consumer (a nak with a
        # delay), but QUEUED for webhook-broker.
        self.backing_off: set[int] = set()
        self.dropped: set[int] = set()  # dead jobs deleted for good
        self.on_change: Callable[[], None] | None = None
        # Jobs :meth:`encode` found DELIVERED (acked: for good), for the consumer it
        # found them in, so that each save does not ask the consumer again.
        self._delivered: set[int] = set()
        self._delivered_of: EngineConsumer | None = None
        # Bumped when a change a restart must not lose is made to the extras (a sticky
        # timeout, a push retry's backoff, a dead job deleted for good), as opposed to
        # when a job last changed, which may be saved a little later.
        self.revision = 0

    @property
    def closed(self) -> bool:
        return self.consumer.deleted

    def _changed(self, seq: int) -> None:
        self.changed[seq] = self.clock.now()
        if self.on_change is not None:
            self.on_change()

    # -- reading ---------------------------------------------------------------------------
    def status(self, seq: int) -> str | None:
        """The job's status, or None if this consumer has no job for ``seq``."""
        c = self.consumer
        cursor = c.cursor
        meta = c.stream.meta(seq)
        if meta is None or seq in self.dropped or seq > c.head.committed:
            return None
        if isinstance(cursor, PriorityCursor) and seq < cursor.start:
            return None  # stored before the consumer existed
        c.reap()  # an exhausted redelivery is dead, not queued
        state = c.state
        if seq in state.dead:
            return DEAD
        if seq in state.pending:
            return QUEUED if seq in state.queued or seq in self.backing_off else INFLIGHT
        return QUEUED if c.is_available(seq) else DELIVERED

    def info(self, seq: int) -> JobInfo | None:
        status = self.status(seq)
        if status is None:
            return None
        return self._info(seq, status)

    def _info(self, seq: int, status: str) -> JobInfo:
        c = self.consumer
        meta = c.stream.meta(seq)
        deliveries = c.delivery_count(seq)
        # A retry is a delivery after the first: one in flight is being retried now, a
        # queued one is waiting for its next attempt.
        retries = deliveries if status == QUEUED else max(deliveries - 1, 0)
        return JobInfo(
            seq=seq,
            status=status,
            retries=retries,
            timeout=self.timeouts.get(seq, 0),
            changed=self.changed.get(seq, 0),
            priority=meta.priority if meta is not None else 0,
            deadline=c.deadline_of(seq) if status == INFLIGHT else 0,
        )

    def peek(self, limit: int) -> list[JobInfo]:
        """Up to ``limit`` queued jobs in claim order, leasing nothing."""
        return [self._info(m.seq, QUEUED) for m in self.consumer.peek_available(limit)]

    def dead(self) -> list[JobInfo]:
        """Dead jobs, newest first (the order of webhook-broker's DLQ list)."""
        letters = self.consumer.dead_messages()
        out = []
        for letter in sorted(letters, key=lambda d: -d.seq):
            info = self._info(letter.seq, DEAD)
            if not info.changed:
                info = JobInfo(info.seq, DEAD, info.retries, info.timeout, letter.ts, info.priority)
            out.append(info)
        return out

    def counts(self) -> dict[str, int]:
        """Jobs per status, DELIVERED excepted (see :meth:`delivered_count`)."""
        c = self.consumer
        c.reap()
        state = c.state
        waiting = len(state.queued) + sum(
            1 for s in self.backing_off if s in state.pending and s not in state.queued
        )
        return {
            QUEUED: c.num_pending + waiting,
            INFLIGHT: len(state.pending) - waiting,
            DEAD: len(state.dead),
        }

    def stamps(self) -> dict[str, list[int]]:
        """Status-change times of the jobs that are not delivered, per status."""
        c = self.consumer
        c.reap()  # first: it changes the state walked below
        state = c.state
        out: dict[str, list[int]] = {QUEUED: [], INFLIGHT: [], DEAD: []}
        for seq, (_, delivered_at) in state.pending.items():
            status = QUEUED if seq in state.queued or seq in self.backing_off else INFLIGHT
            out[status].append(self.changed.get(seq, 0) or delivered_at)
        for letter in state.dead.values():
            out[DEAD].append(self.changed.get(letter.seq, letter.ts))
        for meta in c.peek_available(c.num_pending):
            if meta.seq not in state.pending:
                out[QUEUED].append(meta.ts)
        return out

    def delivered_stamps(self) -> list[int]:
        """When the DELIVERED jobs that still remember it were delivered."""
        c = self.consumer
        state = c.state
        return [
            t
            for seq, t in self.changed.items()
            if seq not in state.pending and seq not in state.dead and not c.is_available(seq)
        ]

    def delivered_count(self) -> int:
        """How many jobs are DELIVERED (a walk of the stream: for status pages only)."""
        c = self.consumer
        c.reap()
        state = c.state
        cursor = c.cursor
        start = cursor.start if isinstance(cursor, PriorityCursor) else 1
        committed = c.head.committed
        count = 0
        for seq in c.stream.seqs(start):
            if seq > committed:
                break
            if seq in state.pending or seq in state.dead or seq in self.dropped:
                continue
            if not c.is_available(seq):
                count += 1
        return count

    # -- moves ---------------------------------------------------------------------------------
    def _deadline(self, seq: int) -> int:
        return self.clock.now() + self.settings.inflight_base_ns + self.timeouts.get(seq, 0) * NS

    def claim(self, limit: int, timeout: int | None = None) -> list[JobInfo]:
        """Atomically move up to ``limit`` queued jobs in flight, in priority order."""
        c = self.consumer
        out = []
        for meta in c.claim(limit):
            seq = meta.seq
            if seq in self.backing_off:
                self.backing_off.discard(seq)
                self.revision += 1
            if timeout:
                self.timeouts[seq] = timeout
                self.revision += 1
            if self.timeouts.get(seq):
                c.extend(seq, self._deadline(seq))
            self._changed(seq)
            out.append(self._info(seq, INFLIGHT))
        return out

    def transition(self, seq: int, next_state: str, timeout: int) -> bool:
        """The spec's ``POST …/job/{id}``: returns whether anything changed.

        Raises :class:`JobError` for the 400 answers, in webhook-broker's order.
        """
        current = self.status(seq)
        if current is None:
            raise KeyError(seq)
        if timeout and (next_state != INFLIGHT or current == INFLIGHT):
            raise JobError(TIMEOUT_WITH_INVALID_STATE)
        if current == next_state:
            return False
        c = self.consumer
        if next_state == INFLIGHT and current in (QUEUED, DEAD):
            if timeout:
                self.timeouts[seq] = timeout
                self.revision += 1
            deadline = self._deadline(seq)
            if current == DEAD:
                c.retry_dead(seq, deadline)
            elif seq in self.backing_off:
                self.backing_off.discard(seq)
                self.revision += 1
                c.extend(seq, deadline)
            else:
                c.take(seq, deadline)
        elif next_state == DELIVERED and current == INFLIGHT:
            c.ack(seq)
        elif next_state == DEAD and current == INFLIGHT:
            c.term(seq)
        else:
            # webhook-broker's words first (clients match on them), then which move.
            raise JobError(
                f"{INVALID_TRANSITION}: {current} -> {next_state or '(none)'} is not allowed"
                f" (allowed: {_ALLOWED.get(current, 'none')})"
            )
        self._changed(seq)
        return True

    def touch(self, seq: int, timeout: int | None = None) -> int:
        """Extend an in-flight deadline from now; returns the new deadline (ns)."""
        if self.status(seq) != INFLIGHT:
            raise JobError(NOT_IN_FLIGHT)
        if timeout is not None:
            self.timeouts[seq] = timeout
            self.revision += 1
        deadline = self._deadline(seq)
        self.consumer.extend(seq, deadline)
        self._changed(seq)
        return deadline

    def deliver(self, seq: int) -> bool:
        """A push delivery succeeded (INFLIGHT -> DELIVERED)."""
        if self.status(seq) != INFLIGHT:
            return False
        self.consumer.ack(seq)
        self._changed(seq)
        return True

    def fail(self, seq: int) -> bool:
        """A push attempt failed: a nak delayed by the backoff schedule, or DEAD once
        ``max_deliver`` attempts were made. Returns whether the job died."""
        if self.status(seq) != INFLIGHT:
            return False
        c = self.consumer
        attempts = c.delivery_count(seq)
        if attempts >= self.settings.max_deliver:
            c.term(seq, "max retries reached")
            self._changed(seq)
            return True
        delay = self.settings.retry_delay(attempts)
        if delay > 0:
            self.backing_off.add(seq)
            self.revision += 1
        c.nak(seq, delay)
        self._changed(seq)
        return False

    def requeue_dead(self, seq: int) -> bool:
        """DEAD -> QUEUED with the retry count reset (``requeue-dead-job``)."""
        if self.status(seq) != DEAD or not self.consumer.requeue_dead(seq):
            return False
        self._changed(seq)
        return True

    def requeue_all_dead(self) -> int:
        return sum(1 for letter in self.consumer.dead_messages() if self.requeue_dead(letter.seq))

    def delete_dead(self, seq: int) -> bool:
        """Remove a dead job for good (its message stays in the stream)."""
        if self.status(seq) != DEAD:
            return False
        self.consumer.ack(seq)  # a dead message acked leaves the dead set
        self.dropped.add(seq)
        self._forget(seq)
        return True

    def delete_all_dead(self) -> int:
        return sum(1 for letter in self.consumer.dead_messages() if self.delete_dead(letter.seq))

    def recover_in_flight(self) -> int:
        """After a restart, hand back what a push worker of the previous process had in
        flight: its outcome is unknown, so it is queued again at once."""
        c = self.consumer
        state = c.state
        flying = [s for s in state.pending if s not in state.queued and s not in self.backing_off]
        for seq in flying:
            c.nak(seq)
            self._changed(seq)
        return len(flying)

    def _forget(self, seq: int) -> None:
        self.revision += 1
        self.timeouts.pop(seq, None)
        self.changed.pop(seq, None)
        self.backing_off.discard(seq)
        if self.on_change is not None:
            self.on_change()

    # -- persistence ---------------------------------------------------------------------------
    def encode(self) -> bytes:
        """The extras, pruned of jobs that are delivered or whose message is gone."""
        c = self.consumer
        state = c.state
        meta = c.stream.meta
        known = self._delivered
        if self._delivered_of is not c:  # a new consumer (its stream was created again)
            known.clear()
            self._delivered_of = c
        delivered: list[int] = []
        pending, dead, timeouts = state.pending, state.dead, self.timeouts
        for seq in [s for s in self.changed if s not in pending and s not in dead]:
            if meta(seq) is None:
                self.timeouts.pop(seq, None)
                self.changed.pop(seq, None)
                known.discard(seq)
            elif seq in known:
                if timeouts:
                    timeouts.pop(seq, None)
                delivered.append(seq)
            elif not c.is_available(seq):
                self.timeouts.pop(seq, None)
                delivered.append(seq)
                known.add(seq)
        # When a DELIVERED job changed is kept for the most recent deliveries only (in
        # the order they were recorded): the extras are written with every save.
        for seq in delivered[: max(0, len(delivered) - KEEP_DELIVERED_STAMPS)]:
            self.changed.pop(seq, None)
            known.discard(seq)
        self.backing_off = {s for s in self.backing_off if s in state.pending}
        self.dropped = {s for s in self.dropped if meta(s) is not None}
        # (seq, timeout, changed) triples, flattened without a Python step per job.
        seqs = self.changed.keys()
        sticky = map(self.timeouts.get, seqs, repeat(0))
        stamps = zip(seqs, sticky, self.changed.values(), strict=True)
        extras = list(chain.from_iterable(stamps))
        return _encoder.encode(SavedJobs(extras, sorted(self.backing_off), sorted(self.dropped)))

    def load(self, raw: bytes) -> None:
        """Restore :meth:`encode` output (anything unreadable starts empty)."""
        try:
            saved = _decoder.decode(raw)
        except msgspec.DecodeError:
            return
        f = saved.extras
        for i in range(0, len(f) - 2, 3):
            seq, timeout, changed = f[i], f[i + 1], f[i + 2]
            self.changed[seq] = changed
            if timeout:
                self.timeouts[seq] = timeout
        self.backing_off = set(saved.backing_off)
        self.dropped = set(saved.dropped)
        # The consumer saves delivery times, not chosen deadlines: give in-flight jobs
        # with an IncrementalTimeout theirs back, counted from when they were handed out.
        c = self.consumer
        extra = self.settings.inflight_base_ns
        for seq, timeout in self.timeouts.items():
            entry = c.state.pending.get(seq)
            if entry is not None and self.status(seq) == INFLIGHT:
                c.extend(seq, entry[1] + extra + timeout * NS)
