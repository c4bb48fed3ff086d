"""Jobs: the delivery state of each message of a channel for one webhook-broker consumer.

A job is QUEUED (available), INFLIGHT (handed out, with a deadline), DELIVERED (done)
or DEAD (given up on, kept until requeued or deleted). A :class:`JobLedger` keeps the
jobs of one consumer and applies the pull-consumer state machine of webhook-broker's
spec, the push retry schedule and Tether's atomic claim.

Every job that is not delivered is held in memory; delivered ones are remembered as
ranges of sequences (ack-floor style), so a ledger's size follows its backlog and not
its history. Ready jobs sit in one heap ordered by priority (highest first) then
sequence (oldest first); peeking at the head never removes anything, and claiming
pops from the same heap, so listing and claiming agree on the order.

Time comes from the engine's :class:`Clock`; nothing here does I/O. The owner learns
about changes through two callbacks: ``on_change`` (persist the state) and ``on_ready``
(wake a claimant or a delivery worker).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from tether.engine.clock import Clock, Timer
from tether.engine.jobs_intervals import IntervalSet

QUEUED = "QUEUED"
INFLIGHT = "INFLIGHT"
DELIVERED = "DELIVERED"
DEAD = "DEAD"
STATES = (QUEUED, INFLIGHT, DELIVERED, DEAD)
# webhook-broker's numeric job statuses (what /job-status reports).
STATUS_CODES = {QUEUED: 1000, INFLIGHT: 1001, DELIVERED: 1002, DEAD: 1003}
_STATE_OF_CODE = {0: QUEUED, 1: INFLIGHT, 3: DEAD}
_CODE_OF_STATE = {QUEUED: 0, INFLIGHT: 1, DEAD: 3}

INVALID_TRANSITION = "invalid transition request"
TIMEOUT_WITH_INVALID_STATE = "timeout provided with invalid state"
NOT_DEAD = "job is not dead"
NOT_IN_FLIGHT = "job is not in flight"

NS = 1_000_000_000
_SEQ_BITS = 44
_SEQ_MASK = (1 << _SEQ_BITS) - 1
MAX_PRIORITY = (1 << 19) - 1  # priorities are clamped into [0, MAX_PRIORITY]


class JobError(Exception):
    """A refused request on a job (the HTTP layer answers 400 with the text)."""


@dataclass(slots=True)
class LedgerSettings:
    """The timing rules shared by every ledger of a server."""

    max_retry: int = 5
    # stopTimeout + rationalDelay: the part of an in-flight deadline every job gets.
    inflight_base_ns: int = 32_250_000_000
    # Push retry delays (webhook-broker's retry-backoff-delays-in-seconds), in ns.
    backoff_ns: list[int] = field(default_factory=lambda: [5 * NS, 30 * NS, 60 * NS])

    def retry_delay(self, retry: int) -> int:
        """Delay before attempt number ``retry`` (1-based): 5, 30, 60, then linear."""
        delays = self.backoff_ns
        if not delays:
            return 0
        if retry <= len(delays):
            return delays[max(retry, 1) - 1]
        return (retry - len(delays) + 1) * delays[-1]


class Job:
    """One job that is not delivered. ``deadline`` is the in-flight deadline, or for a
    queued job the earliest time it may be handed out (0 = now)."""

    __slots__ = (
        "changed",
        "deadline",
        "in_heap",
        "priority",
        "retries",
        "seq",
        "status",
        "timeout",
    )

    def __init__(self, seq: int, priority: int, changed: int) -> None:
        self.seq = seq
        self.priority = priority
        self.status = QUEUED
        self.retries = 0
        self.timeout = 0  # IncrementalTimeout, seconds; sticky across transitions
        self.changed = changed
        self.deadline = 0
        self.in_heap = False


@dataclass(slots=True, frozen=True)
class JobInfo:
    """A job as the views show it (delivered jobs have no in-memory :class:`Job`)."""

    seq: int
    status: str
    retries: int
    timeout: int
    changed: int
    priority: int


class SavedLedger(msgspec.Struct, array_like=True):
    """Persisted form: the dispatch window, delivered/deleted ranges and every job whose
    state is not "queued, never tried" (those are rebuilt from the stream)."""

    start: int
    cursor: int
    done: list[int]
    dropped: list[int]
    jobs: list[int]  # seq, state code, retries, timeout, changed, deadline, ...


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SavedLedger)


def _key(priority: int, seq: int) -> int:
    return ((MAX_PRIORITY - priority) << _SEQ_BITS) | seq


def clamp_priority(priority: int) -> int:
    return min(max(priority, 0), MAX_PRIORITY)


class JobLedger:
    """The jobs of one consumer: states, ready queue, deadlines and retries."""

    def __init__(self, settings: LedgerSettings, clock: Clock, start_seq: int) -> None:
        self.settings = settings
        self.clock = clock
        self.start = start_seq
        self.cursor = start_seq - 1  # highest sequence a job was created for
        self.jobs: dict[int, Job] = {}
        self.done = IntervalSet()
        self.dropped = IntervalSet()
        self.counts = {QUEUED: 0, INFLIGHT: 0, DEAD: 0}
        self.on_change: Callable[[], None] | None = None
        self.on_ready: Callable[[], None] | None = None
        self._ready: list[int] = []
        self._ready_count = 0
        self._timed: list[tuple[int, int]] = []  # (deadline or not_before, seq)
        self._timer: Timer | None = None
        self._timer_at = 0
        self.closed = False

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _wake(self) -> None:
        if self.on_ready is not None:
            self.on_ready()

    # -- creating and forgetting jobs ---------------------------------------------------------
    def dispatch(self, seq: int, priority: int, ts: int) -> bool:
        """Create the job of a newly stored message (once; older sequences are ignored)."""
        if seq <= self.cursor or seq < self.start:
            return False
        self.cursor = seq
        job = Job(seq, clamp_priority(priority), ts)
        self.jobs[seq] = job
        self.counts[QUEUED] += 1
        self._push_ready(job)
        return True

    def dispatch_many(self, items: Iterable[tuple[int, int, int]]) -> int:
        created = sum(1 for seq, prio, ts in items if self.dispatch(seq, prio, ts))
        if created:
            self._changed()
            self._wake()
        return created

    def forget(self, seq: int) -> None:
        """The message left the stream: its job goes with it."""
        job = self.jobs.pop(seq, None)
        if job is not None:
            self._leave(job)
            self._changed()

    # -- views --------------------------------------------------------------------------------
    def info(self, seq: int) -> JobInfo | None:
        """The job of ``seq`` (None if this consumer has none). Delivered jobs report the
        message time as their change time once their own time is no longer kept."""
        job = self.jobs.get(seq)
        if job is not None:
            return JobInfo(seq, job.status, job.retries, job.timeout, job.changed, job.priority)
        if self.start <= seq <= self.cursor and seq in self.done and seq not in self.dropped:
            return JobInfo(seq, DELIVERED, 0, 0, 0, 0)
        return None

    def peek(self, limit: int) -> list[Job]:
        """Up to ``limit`` ready queued jobs, highest priority first then oldest, untouched.

        A best-first walk of the heap's tree: O(limit log limit), whatever the backlog.
        """
        heap = self._ready
        out: list[Job] = []
        if limit <= 0 or not heap:
            return out
        jobs = self.jobs
        frontier = [(heap[0], 0)]
        size = len(heap)
        while frontier and len(out) < limit:
            key, i = heapq.heappop(frontier)
            job = jobs.get(key & _SEQ_MASK)
            if job is not None and job.status == QUEUED and job.deadline == 0:
                out.append(job)
            left = 2 * i + 1
            if left < size:
                heapq.heappush(frontier, (heap[left], left))
                if left + 1 < size:
                    heapq.heappush(frontier, (heap[left + 1], left + 1))
        return out

    def dead(self) -> list[Job]:
        """Dead jobs, newest first (the order of webhook-broker's DLQ list)."""
        return sorted((j for j in self.jobs.values() if j.status == DEAD), key=lambda j: -j.seq)

    def ready_count(self) -> int:
        return self._ready_count

    # -- state changes ------------------------------------------------------------------------
    def claim(self, limit: int, timeout: int | None = None) -> list[Job]:
        """Atomically move up to ``limit`` ready jobs to INFLIGHT, in priority order."""
        out: list[Job] = []
        heap = self._ready
        jobs = self.jobs
        while heap and len(out) < limit:
            seq = heapq.heappop(heap) & _SEQ_MASK
            job = jobs.get(seq)
            if job is None:
                continue
            job.in_heap = False
            if job.status != QUEUED or job.deadline:
                continue
            if timeout:
                job.timeout = timeout
            self._set(job, INFLIGHT)
            self._start_flight(job)
            out.append(job)
        if out:
            self._changed()
        return out

    def transition(self, seq: int, next_state: str, timeout: int) -> bool:
        """The spec's ``POST …/job/{id}``: returns whether anything changed.

        Raises :class:`JobError` for the 400 answers, in webhook-broker's order.
        """
        info = self.info(seq)
        if info is None:
            raise KeyError(seq)
        current = info.status
        if timeout and (next_state != INFLIGHT or current == INFLIGHT):
            raise JobError(TIMEOUT_WITH_INVALID_STATE)
        if current == next_state:
            return False
        job = self.jobs.get(seq)
        if job is None:  # delivered: nothing leaves DELIVERED
            raise JobError(INVALID_TRANSITION)
        if next_state == INFLIGHT and current in (QUEUED, DEAD):
            if current == DEAD:
                job.retries += 1
            if timeout:
                job.timeout = timeout
            self._set(job, INFLIGHT)
            self._start_flight(job)
        elif next_state == DELIVERED and current == INFLIGHT:
            self._deliver(job)
        elif next_state == DEAD and current == INFLIGHT:
            self._set(job, DEAD)
        else:
            raise JobError(INVALID_TRANSITION)
        self._changed()
        return True

    def touch(self, seq: int, timeout: int | None = None) -> int:
        """Extend an in-flight deadline from now; returns the new deadline (ns)."""
        job = self.jobs.get(seq)
        if job is None or job.status != INFLIGHT:
            raise JobError(NOT_IN_FLIGHT)
        if timeout is not None:
            job.timeout = timeout
        self._start_flight(job)
        self._changed()
        return job.deadline

    def deliver(self, seq: int) -> bool:
        """A push delivery succeeded (INFLIGHT → DELIVERED)."""
        job = self.jobs.get(seq)
        if job is None or job.status != INFLIGHT:
            return False
        self._deliver(job)
        self._changed()
        return True

    def fail(self, seq: int) -> bool:
        """A push attempt failed: retry after the backoff delay, or DEAD past max retry.
        Returns whether the job died."""
        job = self.jobs.get(seq)
        if job is None or job.status != INFLIGHT:
            return False
        if job.retries >= self.settings.max_retry:
            self._set(job, DEAD)
            self._changed()
            return True
        job.retries += 1
        self._set(job, QUEUED)
        delay = self.settings.retry_delay(job.retries)
        if delay > 0:
            job.deadline = self.clock.now() + delay
            self._arm(job.deadline, job.seq)
        else:
            self._push_ready(job)
            self._wake()
        self._changed()
        return False

    def requeue_dead(self, seq: int) -> bool:
        """DEAD → QUEUED with the retry count reset (``requeue-dead-job``)."""
        job = self.jobs.get(seq)
        if job is None or job.status != DEAD:
            return False
        self._requeue(job)
        self._changed()
        self._wake()
        return True

    def requeue_all_dead(self) -> int:
        dead = [j for j in self.jobs.values() if j.status == DEAD]
        for job in dead:
            self._requeue(job)
        if dead:
            self._changed()
            self._wake()
        return len(dead)

    def delete_dead(self, seq: int) -> bool:
        """Remove a dead job for good (its message stays in the stream)."""
        job = self.jobs.get(seq)
        if job is None or job.status != DEAD:
            return False
        del self.jobs[seq]
        self._leave(job)
        self.dropped.add(seq)
        self._changed()
        return True

    def delete_all_dead(self) -> int:
        dead = [j.seq for j in self.jobs.values() if j.status == DEAD]
        for seq in dead:
            job = self.jobs.pop(seq)
            self._leave(job)
            self.dropped.add(seq)
        if dead:
            self._changed()
        return len(dead)

    def recover_in_flight(self) -> int:
        """After a restart, hand back what a push worker of the previous process had in
        flight: its outcome is unknown, so it is queued again without counting a retry."""
        flying = [j for j in self.jobs.values() if j.status == INFLIGHT]
        for job in flying:
            self._set(job, QUEUED)
            self._push_ready(job)
        if flying:
            self._changed()
            self._wake()
        return len(flying)

    # -- internals ----------------------------------------------------------------------------
    def _set(self, job: Job, status: str) -> None:
        counts = self.counts
        counts[job.status] -= 1
        counts[status] += 1
        if job.status == QUEUED and job.deadline == 0:
            # Leaves the ready set; a heap entry left behind is skipped as stale.
            self._ready_count -= 1
        job.status = status
        job.deadline = 0
        job.changed = self.clock.now()

    def _leave(self, job: Job) -> None:
        self.counts[job.status] -= 1
        if job.status == QUEUED and job.deadline == 0:
            self._ready_count -= 1
        job.status = DELIVERED  # stale heap and timer entries no longer match

    def _deliver(self, job: Job) -> None:
        del self.jobs[job.seq]
        self._leave(job)
        self.done.add(job.seq)

    def _requeue(self, job: Job) -> None:
        job.retries = 0
        self._set(job, QUEUED)
        self._push_ready(job)

    def _push_ready(self, job: Job) -> None:
        if not job.in_heap:
            heapq.heappush(self._ready, _key(job.priority, job.seq))
            job.in_heap = True
        self._ready_count += 1
        if len(self._ready) > 2 * self._ready_count + 1024:
            self._compact()

    def _compact(self) -> None:
        keep = [k for k in self._ready if self._is_ready(k & _SEQ_MASK)]
        for key in self._ready:
            job = self.jobs.get(key & _SEQ_MASK)
            if job is not None and not self._is_ready(job.seq):
                job.in_heap = False
        heapq.heapify(keep)
        self._ready = keep

    def _is_ready(self, seq: int) -> bool:
        job = self.jobs.get(seq)
        return job is not None and job.status == QUEUED and job.deadline == 0

    def _start_flight(self, job: Job) -> None:
        job.deadline = self.clock.now() + self.settings.inflight_base_ns + job.timeout * NS
        self._arm(job.deadline, job.seq)

    def _arm(self, at: int, seq: int) -> None:
        heapq.heappush(self._timed, (at, seq))
        self._schedule()

    def _schedule(self) -> None:
        """Keep one clock timer, due at the earliest pending deadline."""
        if not self._timed or self.closed:
            return
        at = self._timed[0][0]
        if self._timer is not None:
            if at >= self._timer_at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(max(0.0, (at - self.clock.now()) / NS), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.clock.now()
        timed = self._timed
        changed = woke = False
        while timed and timed[0][0] <= now:
            at, seq = heapq.heappop(timed)
            job = self.jobs.get(seq)
            if job is None or job.deadline != at:
                continue  # resolved, or given a new deadline since
            changed = True
            if job.status == INFLIGHT:
                woke |= self._expire(job)
            elif job.status == QUEUED:  # a push retry whose delay is over
                job.deadline = 0
                self._push_ready(job)
                woke = True
        self._schedule()
        if changed:
            self._changed()
        if woke:
            self._wake()

    def _expire(self, job: Job) -> bool:
        """An in-flight deadline passed: QUEUED with one more retry, or DEAD past max."""
        job.retries += 1
        if job.retries > self.settings.max_retry:
            self._set(job, DEAD)
            return False
        self._set(job, QUEUED)
        self._push_ready(job)
        return True

    # -- persistence --------------------------------------------------------------------------
    def encode(self) -> bytes:
        flat: list[int] = []
        add = flat.extend
        for job in self.jobs.values():
            if job.status == QUEUED and not job.retries and not job.timeout and not job.deadline:
                continue  # rebuilt from the stream on load
            add(
                (
                    job.seq,
                    _CODE_OF_STATE[job.status],
                    job.retries,
                    job.timeout,
                    job.changed,
                    job.deadline,
                )
            )
        saved = SavedLedger(self.start, self.cursor, self.done.flat(), self.dropped.flat(), flat)
        return _encoder.encode(saved)

    def load(self, raw: bytes, messages: Callable[[int], Iterable[tuple[int, int, int]]]) -> None:
        """Restore from :meth:`encode` output; ``messages(start)`` gives the stream's
        live ``(seq, priority, ts)`` from ``start`` on, in order."""
        saved = _decoder.decode(raw)
        self.start = saved.start
        self.cursor = saved.cursor
        self.done = IntervalSet.from_flat(saved.done)
        self.dropped = IntervalSet.from_flat(saved.dropped)
        special: dict[int, tuple[int, ...]] = {}
        f = saved.jobs
        for i in range(0, len(f) - 5, 6):
            special[f[i]] = tuple(f[i + 1 : i + 6])
        now = self.clock.now()
        for seq, priority, ts in messages(self.start):
            if seq > self.cursor:
                break
            if seq < self.start or seq in self.done or seq in self.dropped:
                continue
            job = Job(seq, clamp_priority(priority), ts)
            self.jobs[seq] = job
            state = special.get(seq)
            if state is None:
                self.counts[QUEUED] += 1
                self._push_ready(job)
                continue
            code, job.retries, job.timeout, job.changed, deadline = state
            job.status = _STATE_OF_CODE.get(code, QUEUED)
            self.counts[job.status] += 1
            if job.status == QUEUED and deadline <= now:
                self._push_ready(job)
            elif job.status != DEAD:
                job.deadline = deadline
                self._arm(deadline, seq)
