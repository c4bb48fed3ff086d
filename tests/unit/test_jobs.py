"""Jobs as the delivery state of a durable consumer: states, order, the pull spec's
state machine, timeouts, push retries."""

from __future__ import annotations

from typing import Any

import pytest

from tether.engine.clock import FakeClock
from tether.engine.consumers.config import apply_defaults, validate
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.cursor import StreamHead
from tether.engine.consumers.delivery_state import decode_state, encode_state
from tether.engine.jobs.view import (
    DEAD,
    DELIVERED,
    INFLIGHT,
    INVALID_TRANSITION,
    QUEUED,
    TIMEOUT_WITH_INVALID_STATE,
    JobError,
    JobSettings,
    JobView,
    engine_config,
)
from tether.engine.streams.config import StreamConfig
from tether.engine.streams.stream import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
BASE = 3  # seconds every in-flight job gets before its IncrementalTimeout


class _Sink:
    """An HTTP-owned consumer delivers nothing over NATS."""

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        raise AssertionError("no NATS delivery expected")

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        pass

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        pass

    def has_interest(self, subject: str) -> bool:
        return False

    def backlog(self, consumer: Consumer) -> int:
        return 0


class _Host:
    def consumer_changed(self, consumer: Consumer) -> None:
        consumer._changed = False

    def consumer_acked(self, consumer: Consumer, seqs: list[int]) -> None:
        pass

    def consumer_inactive(self, consumer: Consumer) -> None:
        pass


class Channel:
    """A channel's stream and one webhook-broker consumer's job view over it."""

    def __init__(self, max_retry: int, backoff: tuple[int, ...]) -> None:
        self.clock = FakeClock()
        self.stream = Stream(StreamConfig(name="WB_c", subjects=["wb.c"]), self.clock.now())
        self.stream.start_empty()
        self.head = StreamHead(0)
        self.settings = JobSettings(
            max_retry=max_retry, inflight_base_ns=BASE * NS, backoff_ns=[b * NS for b in backoff]
        )
        self.config = engine_config("k", self.settings)
        apply_defaults(self.config, self.stream.config)
        validate(self.config, self.stream.config)
        self.view = self.new_view()

    def new_view(self, saved: Any = None) -> JobView:
        consumer = Consumer(
            self.stream,
            self.head,
            "k",
            self.config,
            self.clock.now(),
            self.clock,
            _Sink(),
            _Host(),
            saved,
        )
        return JobView(consumer, self.settings, self.clock)

    def publish(self, priorities: list[int]) -> None:
        metas = []
        for priority in priorities:
            seq = self.stream.last_seq + 1
            meta = MessageMeta(seq, "wb.c", 10, self.clock.now(), priority)
            self.stream.append(meta, "")
            metas.append(meta)
        self.head.committed = self.stream.last_seq
        self.view.consumer.on_committed(metas)


# The channel of the view ``make`` returned last (each test makes one).
_channel: Channel


def make(max_retry: int = 5, backoff: tuple[int, ...] = (5, 30, 60)) -> tuple[JobView, FakeClock]:
    global _channel
    _channel = Channel(max_retry, backoff)
    return _channel.view, _channel.clock


def fill(view: JobView, clock: FakeClock, priorities: list[int]) -> None:
    assert view is _channel.view
    _channel.publish(priorities)


def status(view: JobView, seq: int) -> str:
    info = view.info(seq)
    assert info is not None
    return info.status


def test_peek_orders_by_priority_then_oldest_and_leaves_jobs_queued() -> None:
    view, clock = make()
    fill(view, clock, [1, 5, 1, 5, 0, 3])
    assert [j.seq for j in view.peek(10)] == [2, 4, 6, 1, 3, 5]
    assert [j.seq for j in view.peek(2)] == [2, 4]
    assert view.peek(0) == []
    assert all(status(view, s) == QUEUED for s in range(1, 7))


def test_claim_pops_in_the_same_order_and_never_twice() -> None:
    view, clock = make()
    fill(view, clock, [1, 5, 1, 5, 0, 3])
    first = [j.seq for j in view.claim(3)]
    second = [j.seq for j in view.claim(10)]
    assert first == [2, 4, 6]
    assert second == [1, 3, 5]
    assert view.claim(5) == []
    assert view.counts() == {QUEUED: 0, INFLIGHT: 6, DEAD: 0}


def test_specific_transition_removes_a_job_from_the_ready_order() -> None:
    view, clock = make()
    fill(view, clock, [0, 0, 0])
    view.transition(2, INFLIGHT, 0)
    assert [j.seq for j in view.peek(5)] == [1, 3]
    assert [j.seq for j in view.claim(5)] == [1, 3]
    assert view.counts()[QUEUED] == 0


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


def put_in(view: JobView, seq: int, state: str) -> None:
    path = {
        QUEUED: [],
        INFLIGHT: [INFLIGHT],
        DEAD: [INFLIGHT, DEAD],
        DELIVERED: [INFLIGHT, DELIVERED],
    }[state]
    for step in path:
        view.transition(seq, step, 0)
    assert status(view, seq) == state


@pytest.mark.parametrize(("current", "nxt", "changes"), VALID)
def test_valid_transitions(current: str, nxt: str, changes: bool) -> None:
    view, clock = make()
    fill(view, clock, [0])
    put_in(view, 1, current)
    assert view.transition(1, nxt, 0) is changes
    assert status(view, 1) == nxt


@pytest.mark.parametrize(("current", "nxt"), INVALID)
def test_invalid_transitions_change_nothing(current: str, nxt: str) -> None:
    view, clock = make()
    fill(view, clock, [0])
    put_in(view, 1, current)
    with pytest.raises(JobError, match=INVALID_TRANSITION):
        view.transition(1, nxt, 0)
    assert status(view, 1) == current


def test_dead_to_inflight_counts_a_retry() -> None:
    view, clock = make()
    fill(view, clock, [0])
    put_in(view, 1, DEAD)
    view.transition(1, INFLIGHT, 0)
    info = view.info(1)
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
    view, clock = make()
    fill(view, clock, [0])
    put_in(view, 1, current)
    with pytest.raises(JobError, match=TIMEOUT_WITH_INVALID_STATE):
        view.transition(1, nxt, 10)
    assert status(view, 1) == current


def test_incremental_timeout_is_stored_and_sticky() -> None:
    view, clock = make()
    fill(view, clock, [0])
    view.transition(1, INFLIGHT, 10)
    assert view.info(1).timeout == 10  # type: ignore[union-attr]
    view.transition(1, DEAD, 0)
    assert view.info(1).timeout == 10  # type: ignore[union-attr]
    view.transition(1, INFLIGHT, 0)  # no new value: the old one stays
    assert view.info(1).timeout == 10  # type: ignore[union-attr]
    view.transition(1, DEAD, 0)
    view.transition(1, INFLIGHT, 4)
    assert view.info(1).timeout == 4  # type: ignore[union-attr]


def test_inflight_timeout_requeues_with_a_retry_then_dies_past_max() -> None:
    view, clock = make(max_retry=2)
    fill(view, clock, [0])
    view.transition(1, INFLIGHT, 2)
    clock.advance(BASE + 2 - 0.1)
    assert status(view, 1) == INFLIGHT
    clock.advance(0.2)
    info = view.info(1)
    assert info is not None and (info.status, info.retries, info.timeout) == (QUEUED, 1, 2)
    for expected in (2,):
        view.claim(1)
        clock.advance(BASE + 2 + 0.1)
        assert view.info(1).retries == expected  # type: ignore[union-attr]
    view.claim(1)
    clock.advance(BASE + 2 + 0.1)
    assert status(view, 1) == DEAD


def test_resolved_jobs_do_not_time_out() -> None:
    view, clock = make()
    fill(view, clock, [0, 0])
    view.claim(2)
    view.transition(1, DELIVERED, 0)
    view.transition(2, DEAD, 0)
    clock.advance(BASE * 10)
    assert (status(view, 1), status(view, 2)) == (DELIVERED, DEAD)


def test_touch_extends_the_deadline() -> None:
    view, clock = make()
    fill(view, clock, [0])
    view.claim(1)
    clock.advance(BASE - 1)
    view.touch(1, 5)
    clock.advance(BASE + 4)
    assert status(view, 1) == INFLIGHT
    clock.advance(1.1)
    assert status(view, 1) == QUEUED
    with pytest.raises(JobError):
        view.touch(1)


def test_push_failures_back_off_then_die() -> None:
    view, clock = make(max_retry=5, backoff=(5, 30, 60))
    fill(view, clock, [0])
    delays = []
    attempts = 0
    while True:
        jobs = view.claim(1)
        if not jobs:
            if status(view, 1) == DEAD:
                break
            before = clock.now()
            while not view.claim(1):
                clock.advance(1)
            delays.append(round((clock.now() - before) / NS))
        attempts += 1
        if view.fail(1):
            break
    assert attempts == 6
    assert delays == [5, 30, 60, 120, 180]
    assert status(view, 1) == DEAD


def test_requeue_and_delete_dead() -> None:
    view, clock = make()
    fill(view, clock, [0, 0, 0])
    for seq in (1, 2, 3):
        put_in(view, seq, DEAD)
    assert view.requeue_dead(1)
    assert not view.requeue_dead(1)
    info = view.info(1)
    assert info is not None and (info.status, info.retries) == (QUEUED, 0)
    assert view.delete_dead(2)
    assert view.info(2) is None
    assert view.requeue_all_dead() == 1
    assert [j.seq for j in view.peek(5)] == [1, 3]


def test_state_round_trips_through_encoding() -> None:
    view, clock = make()
    fill(view, clock, [0, 2, 0, 1, 0, 0])
    view.transition(1, INFLIGHT, 7)
    view.transition(2, INFLIGHT, 0)
    view.transition(2, DELIVERED, 0)
    put_in(view, 3, DEAD)
    put_in(view, 6, DEAD)
    view.delete_dead(6)
    saved = decode_state(encode_state(view.consumer.save()))
    extras = view.encode()
    view.consumer.close(notify=False)
    copy = _channel.new_view(saved)
    copy.load(extras)
    for seq in range(1, 7):
        before, after = view.info(seq), copy.info(seq)
        assert (before is None) == (after is None)
        if before is not None and after is not None:
            assert (after.status, after.retries, after.timeout, after.changed) == (
                before.status,
                before.retries,
                before.timeout,
                before.changed,
            )
    assert [j.seq for j in copy.peek(5)] == [4, 5]
    assert copy.counts() == {QUEUED: 2, INFLIGHT: 1, DEAD: 1}
    clock.advance(BASE + 6)
    assert status(copy, 1) == INFLIGHT  # its IncrementalTimeout survived the reload
    clock.advance(1.1)
    assert status(copy, 1) == QUEUED


def test_jobs_exist_for_messages_stored_after_the_consumer_and_leave_with_them() -> None:
    fresh = Channel(5, (5,))
    fresh.publish([0, 0])
    fresh.view = fresh.new_view()  # created after two messages were stored
    fresh.publish([0, 0])
    view = fresh.view
    assert view.info(1) is None and view.info(2) is None
    assert status(view, 3) == QUEUED
    fresh.stream.remove(3)
    view.consumer.on_removed([3], False)
    assert view.info(3) is None
    assert view.counts()[QUEUED] == 1


def test_status_summaries_see_exhausted_jobs_as_dead() -> None:
    view, clock = make(max_retry=0)
    fill(view, clock, [0, 0, 0])
    view.claim(2)
    view.transition(1, DELIVERED, 0)
    clock.advance(BASE + 0.1)  # job 2 timed out with its one attempt used: dead
    stamps = view.stamps()
    assert (len(stamps[QUEUED]), len(stamps[INFLIGHT]), len(stamps[DEAD])) == (1, 0, 1)
    assert view.delivered_count() == 1
    assert view.counts() == {QUEUED: 1, INFLIGHT: 0, DEAD: 1}
