"""RDY rules of the NSQ client guide, on the pure controller with a fake clock."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.client import Backoff
from tether.client.ready import Phase, ReadyController, SourceState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(
    max_in_flight: int, n: int, **kw: object
) -> tuple[ReadyController, list[SourceState], Clock]:
    clock = Clock()
    rc = ReadyController(max_in_flight, clock=clock, rng=random.Random(7), **kw)  # type: ignore[arg-type]
    return rc, [rc.add_source(f"s{i}") for i in range(n)], clock


def test_new_sources_start_at_one() -> None:
    _, sources, _ = controller(100, 3)
    assert [s.rdy for s in sources] == [1, 1, 1]


def test_a_source_gets_its_share_after_a_message() -> None:
    rc, (a, b, c), _ = controller(100, 3)
    rc.on_message(a)
    rc.on_finished(a)
    assert a.rdy == 33  # max_in_flight // n
    rc.rebalance()
    assert [s.rdy for s in (a, b, c)] == [33, 33, 33]
    assert rc.total_rdy <= 100


def test_never_above_max_in_flight_when_sources_outnumber_it() -> None:
    rc, sources, _ = controller(2, 5)
    assert rc.total_rdy == 2
    assert sum(1 for s in sources if s.rdy) == 2


def test_idle_rdy_moves_to_other_sources() -> None:
    rc, sources, clock = controller(2, 5, low_rdy_idle_timeout=10.0)
    holders = {s.name for s in sources if s.rdy}
    clock.now += 11  # every holder has been idle past the timeout
    rc.rebalance()
    assert rc.total_rdy == 2
    assert {s.name for s in sources if s.rdy}.isdisjoint(holders)


def test_a_busy_source_keeps_its_rdy() -> None:
    rc, sources, clock = controller(2, 5, low_rdy_idle_timeout=10.0)
    busy = next(s for s in sources if s.rdy)
    rc.on_message(busy)
    clock.now += 11
    rc.rebalance()
    assert busy.rdy == 1


def test_pull_and_cancel_decisions() -> None:
    src = SourceState("s", rdy=10)
    assert src.wants_pull() and src.credit == 10
    src.owed = 5
    assert not src.wants_pull()  # still more than 25 % owed
    src.owed = 2
    assert src.wants_pull() and src.credit == 8
    src.rdy = 1
    assert src.over_cap()  # RDY shrank below what we asked for: cancel


def test_is_starved() -> None:
    rc, (a, b), _ = controller(20, 2)
    rc.on_finished(a)
    rc.on_finished(b)  # both at their share of 10
    for _ in range(8):
        rc.on_message(a)
    assert not rc.is_starved()
    rc.on_message(a)  # 9 >= 0.85 * 10
    assert rc.is_starved()


def test_backoff_cycle() -> None:
    backoff = Backoff(1.0, 8.0, 2.0, 0.0)
    rc, (a, b), clock = controller(10, 2, backoff=backoff)
    rc.on_result(False, rc.epoch)
    assert rc.phase is Phase.BACKOFF and rc.level == 1
    assert rc.total_rdy == 0
    assert rc.window_ends == clock.now + 1.0
    rc.on_result(False, rc.epoch)  # results during the window are ignored
    assert rc.level == 1
    clock.now += 1.0
    assert rc.window_over()
    tester = rc.end_window()
    assert rc.phase is Phase.TESTING and tester is not None
    assert tester.rdy == 1 and rc.total_rdy == 1
    rc.on_result(False, rc.epoch)  # the test message failed: a longer window
    assert rc.phase is Phase.BACKOFF and rc.level == 2
    assert rc.window_ends == clock.now + 2.0
    clock.now += 2.0
    rc.end_window()
    stale_epoch = rc.epoch - 1
    rc.on_result(True, stale_epoch)  # a message from before this window does not count
    assert rc.phase is Phase.TESTING
    rc.on_result(True, rc.epoch)  # success: shrink
    assert rc.phase is Phase.BACKOFF and rc.level == 1
    assert rc.window_ends == clock.now + 1.0
    clock.now += 1.0
    rc.end_window()
    rc.on_result(True, rc.epoch)
    assert rc.phase is Phase.NORMAL and rc.level == 0
    assert [a.rdy, b.rdy] == [5, 5]


def test_no_backoff_configured() -> None:
    rc, _, _ = controller(10, 1, backoff=None)
    rc.on_result(False, rc.epoch)
    assert rc.phase is Phase.NORMAL


def test_testing_moves_to_another_source_when_the_tester_is_idle() -> None:
    rc, (a, b), clock = controller(
        10, 2, backoff=Backoff(1.0, 8.0, 2.0, 0.0), low_rdy_idle_timeout=5
    )
    rc.on_result(False, rc.epoch)
    clock.now += 1
    first = rc.end_window()
    clock.now += 6
    rc.rebalance()
    second = next(s for s in (a, b) if s.rdy)
    assert second is not first and rc.total_rdy == 1


@settings(max_examples=200, deadline=None)
@given(
    max_in_flight=st.integers(1, 20),
    n=st.integers(1, 8),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["msg", "done", "fail", "ok", "tick", "window", "time"]),
            st.integers(0, 7),
        ),
        max_size=60,
    ),
)
def test_total_rdy_never_exceeds_max_in_flight(
    max_in_flight: int, n: int, steps: list[tuple[str, int]]
) -> None:
    rc, sources, clock = controller(
        max_in_flight, n, backoff=Backoff(1.0, 4.0, 2.0, 0.0), low_rdy_idle_timeout=3.0
    )
    for action, i in steps:
        src = sources[i % n]
        if action == "msg" and src.in_flight < src.rdy:
            rc.on_message(src)
        elif action == "done" and src.in_flight:
            rc.on_finished(src)
        elif action in ("fail", "ok"):
            rc.on_result(action == "ok", rc.epoch)
        elif action == "tick":
            rc.rebalance()
        elif action == "window" and rc.window_over():
            rc.end_window()
        elif action == "time":
            clock.now += i
        assert rc.total_rdy <= max_in_flight
        assert all(s.rdy >= 0 for s in sources)
        if rc.phase is Phase.BACKOFF:
            assert rc.total_rdy == 0
        if rc.phase is Phase.TESTING:
            assert rc.total_rdy <= 1
