"""The job ledger: states, order, the pull spec's state machine, timeouts, push retries."""

from __future__ import annotations

import pytest

from tether.engine.clock import FakeClock
from tether.engine.jobs import (
    DEAD,
    DELIVERED,
    INFLIGHT,
    INVALID_TRANSITION,
    QUEUED,
    TIMEOUT_WITH_INVALID_STATE,
    JobError,
    JobLedger,
    LedgerSettings,
)

NS = 1_000_000_000
BASE = 3  # seconds every in-flight job gets before its IncrementalTimeout


def make(max_retry: int = 5, backoff: tuple[int, ...] = (5, 30, 60)) -> tuple[JobLedger, FakeClock]:
    clock = FakeClock()
    settings = LedgerSettings(
        max_retry=max_retry, inflight_base_ns=BASE * NS, backoff_ns=[b * NS for b in backoff]
    )
    return JobLedger(settings, clock, 1), clock


def fill(ledger: JobLedger, clock: FakeClock, priorities: list[int]) -> None:
    ledger.dispatch_many((i + 1, p, clock.now()) for i, p in enumerate(priorities))


def status(ledger: JobLedger, seq: int) -> str:
    info = ledger.info(seq)
    assert info is not None
    return info.status


def test_peek_orders_by_priority_then_oldest_and_leaves_jobs_queued() -> None:
    ledger, clock = make()
    fill(ledger, clock, [1, 5, 1, 5, 0, 3])
    assert [j.seq for j in ledger.peek(10)] == [2, 4, 6, 1, 3, 5]
    assert [j.seq for j in ledger.peek(2)] == [2, 4]
    assert ledger.peek(0) == []
    assert all(status(ledger, s) == QUEUED for s in range(1, 7))


def test_claim_pops_in_the_same_order_and_never_twice() -> None:
    ledger, clock = make()
    fill(ledger, clock, [1, 5, 1, 5, 0, 3])
    first = [j.seq for j in ledger.claim(3)]
    second = [j.seq for j in ledger.claim(10)]
    assert first == [2, 4, 6]
    assert second == [1, 3, 5]
    assert ledger.claim(5) == []
    assert ledger.counts == {QUEUED: 0, INFLIGHT: 6, DEAD: 0}


def test_specific_transition_removes_a_job_from_the_ready_order() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0, 0, 0])
    ledger.transition(2, INFLIGHT, 0)
    assert [j.seq for j in ledger.peek(5)] == [1, 3]
    assert [j.seq for j in ledger.claim(5)] == [1, 3]
    assert ledger.ready_count() == 0


VALID = [
    (QUEUED, QUEUED, False),
    (QUEUED, INFLIGHT, True),
    (INFLIGHT, INFLIGHT, False),
    (INFLIGHT, DEAD, True),
    (DEAD, DEAD, False),
    (DEAD, INFLIGHT, True),
    (INFLIGHT, DELIVERED, True),
    (DELIVERED, DELIVERED, False),
]
INVALID = [
    (QUEUED, DELIVERED),
    (QUEUED, DEAD),
    (INFLIGHT, QUEUED),
    (DEAD, QUEUED),
    (DEAD, DELIVERED),
    (DELIVERED, QUEUED),
    (DELIVERED, INFLIGHT),
    (DELIVERED, DEAD),
    (QUEUED, "BOGUS"),
]


def put_in(ledger: JobLedger, seq: int, state: str) -> None:
    path = {
        QUEUED: [],
        INFLIGHT: [INFLIGHT],
        DEAD: [INFLIGHT, DEAD],
        DELIVERED: [INFLIGHT, DELIVERED],
    }[state]
    for step in path:
        ledger.transition(seq, step, 0)
    assert status(ledger, seq) == state


@pytest.mark.parametrize(("current", "nxt", "changes"), VALID)
def test_valid_transitions(current: str, nxt: str, changes: bool) -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    put_in(ledger, 1, current)
    assert ledger.transition(1, nxt, 0) is changes
    assert status(ledger, 1) == nxt


@pytest.mark.parametrize(("current", "nxt"), INVALID)
def test_invalid_transitions_change_nothing(current: str, nxt: str) -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    put_in(ledger, 1, current)
    with pytest.raises(JobError, match=INVALID_TRANSITION):
        ledger.transition(1, nxt, 0)
    assert status(ledger, 1) == current


def test_dead_to_inflight_counts_a_retry() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    put_in(ledger, 1, DEAD)
    ledger.transition(1, INFLIGHT, 0)
    info = ledger.info(1)
    assert info is not None and info.retries == 1


@pytest.mark.parametrize(
    ("current", "nxt"),
    [
        (QUEUED, DELIVERED),
        (QUEUED, DEAD),
        (INFLIGHT, INFLIGHT),
        (INFLIGHT, DELIVERED),
        (QUEUED, QUEUED),
    ],
)
def test_timeout_only_when_entering_inflight(current: str, nxt: str) -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    put_in(ledger, 1, current)
    with pytest.raises(JobError, match=TIMEOUT_WITH_INVALID_STATE):
        ledger.transition(1, nxt, 10)
    assert status(ledger, 1) == current


def test_incremental_timeout_is_stored_and_sticky() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    ledger.transition(1, INFLIGHT, 10)
    assert ledger.info(1).timeout == 10  # type: ignore[union-attr]
    ledger.transition(1, DEAD, 0)
    assert ledger.info(1).timeout == 10  # type: ignore[union-attr]
    ledger.transition(1, INFLIGHT, 0)  # no new value: the old one stays
    assert ledger.info(1).timeout == 10  # type: ignore[union-attr]
    ledger.transition(1, DEAD, 0)
    ledger.transition(1, INFLIGHT, 4)
    assert ledger.info(1).timeout == 4  # type: ignore[union-attr]


def test_inflight_timeout_requeues_with_a_retry_then_dies_past_max() -> None:
    ledger, clock = make(max_retry=2)
    fill(ledger, clock, [0])
    ledger.transition(1, INFLIGHT, 2)
    clock.advance(BASE + 2 - 0.1)
    assert status(ledger, 1) == INFLIGHT
    clock.advance(0.2)
    info = ledger.info(1)
    assert info is not None and (info.status, info.retries, info.timeout) == (QUEUED, 1, 2)
    for expected in (2,):
        ledger.claim(1)
        clock.advance(BASE + 2 + 0.1)
        assert ledger.info(1).retries == expected  # type: ignore[union-attr]
    ledger.claim(1)
    clock.advance(BASE + 2 + 0.1)
    assert status(ledger, 1) == DEAD


def test_resolved_jobs_do_not_time_out() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0, 0])
    ledger.claim(2)
    ledger.transition(1, DELIVERED, 0)
    ledger.transition(2, DEAD, 0)
    clock.advance(BASE * 10)
    assert (status(ledger, 1), status(ledger, 2)) == (DELIVERED, DEAD)


def test_touch_extends_the_deadline() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0])
    ledger.claim(1)
    clock.advance(BASE - 1)
    ledger.touch(1, 5)
    clock.advance(BASE + 4)
    assert status(ledger, 1) == INFLIGHT
    clock.advance(1.1)
    assert status(ledger, 1) == QUEUED
    with pytest.raises(JobError):
        ledger.touch(1)


def test_push_failures_back_off_then_die() -> None:
    ledger, clock = make(max_retry=5, backoff=(5, 30, 60))
    fill(ledger, clock, [0])
    delays = []
    attempts = 0
    while True:
        jobs = ledger.claim(1)
        if not jobs:
            if status(ledger, 1) == DEAD:
                break
            before = clock.now()
            while not ledger.claim(1):
                clock.advance(1)
            delays.append(round((clock.now() - before) / NS))
        attempts += 1
        if ledger.fail(1):
            break
    assert attempts == 6
    assert delays == [5, 30, 60, 120, 180]
    assert status(ledger, 1) == DEAD


def test_requeue_and_delete_dead() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0, 0, 0])
    for seq in (1, 2, 3):
        put_in(ledger, seq, DEAD)
    assert ledger.requeue_dead(1)
    assert not ledger.requeue_dead(1)
    info = ledger.info(1)
    assert info is not None and (info.status, info.retries) == (QUEUED, 0)
    assert ledger.delete_dead(2)
    assert ledger.info(2) is None
    assert ledger.requeue_all_dead() == 1
    assert [j.seq for j in ledger.peek(5)] == [1, 3]


def test_state_round_trips_through_encoding() -> None:
    ledger, clock = make()
    fill(ledger, clock, [0, 2, 0, 1, 0, 0])
    ledger.transition(1, INFLIGHT, 7)
    ledger.transition(2, INFLIGHT, 0)
    ledger.transition(2, DELIVERED, 0)
    put_in(ledger, 3, DEAD)
    put_in(ledger, 6, DEAD)
    ledger.delete_dead(6)
    raw = ledger.encode()
    copy = JobLedger(ledger.settings, clock, 1)
    prios = [0, 2, 0, 1, 0, 0]
    copy.load(raw, lambda start: ((s, prios[s - 1], clock.now()) for s in range(start, 7)))
    for seq in range(1, 7):
        assert copy.info(seq) == ledger.info(seq)
    assert [j.seq for j in copy.peek(5)] == [4, 5]
    assert copy.counts == ledger.counts
    clock.advance(BASE + 8)
    assert status(copy, 1) == QUEUED  # its deadline survived the reload


def test_dispatch_ignores_older_sequences_and_forget_drops_jobs() -> None:
    ledger, _clock = make()
    ledger.start = 5
    ledger.cursor = 4
    ledger.dispatch_many([(3, 0, 0), (5, 0, 0), (6, 0, 0), (5, 0, 0)])
    assert sorted(ledger.jobs) == [5, 6]
    ledger.forget(5)
    assert ledger.info(5) is None
    assert ledger.counts[QUEUED] == 1
