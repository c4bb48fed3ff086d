"""Per-message control of a consumer (what the job view of the HTTP API builds on)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests are imported with --import-mode=importlib, so a sibling module is not importable
# by name until its directory is on sys.path: reuse the consumer tests' world.
sys.path.insert(0, str(Path(__file__).parent))
from test_consumer import INBOX, NS, World, msgs


@pytest.fixture
def w() -> World:
    return World()


def seqs(metas: list[object]) -> list[int]:
    return [m.seq for m in metas]  # type: ignore[attr-defined]


def test_peek_available_is_priority_order_and_leases_nothing(w: World) -> None:
    c = w.consumer(priority_order=True)
    for p in (1, 5, 1, 5, 0, 3):
        w.publish("s.a", 1, priority=p)
    assert seqs(c.peek_available(10)) == [2, 4, 6, 1, 3, 5]
    assert seqs(c.peek_available(2)) == [2, 4]
    assert c.peek_available(0) == []
    assert c.num_pending == 6 and c.num_ack_pending == 0


def test_claim_follows_peek_and_uses_the_given_deadline(w: World) -> None:
    c = w.consumer(priority_order=True, ack_wait=30 * NS)
    for p in (1, 5, 1, 5, 0, 3):
        w.publish("s.a", 1, priority=p)
    deadline = w.clock.now() + 5 * NS
    assert seqs(c.claim(3, deadline)) == [2, 4, 6]
    assert c.deadline_of(2) == deadline
    assert seqs(c.peek_available(10)) == [1, 3, 5]
    assert c.num_ack_pending == 3 and c.num_pending == 3
    w.clock.advance(5)
    # Timed out: available again, ahead of the lower priorities.
    assert seqs(c.peek_available(10)) == [2, 4, 6, 1, 3, 5]
    assert seqs(c.claim(10)) == [2, 4, 6, 1, 3, 5]
    assert c.delivery_count(2) == 2 and c.delivery_count(1) == 1
    assert c.claim(1) == []


def test_take_moves_one_message_out_of_order_and_the_cursor_steps_over_it(w: World) -> None:
    c = w.consumer(priority_order=True)
    w.publish("s.a", 4)
    assert c.take(3)
    assert not c.take(3)
    assert c.num_pending == 3 and c.num_ack_pending == 1
    assert seqs(c.peek_available(9)) == [1, 2, 4]
    c.ack(3)
    c = w.reload(c)
    assert c.num_pending == 3
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [1, 2, 4]


def test_take_a_queued_redelivery_counts_a_delivery(w: World) -> None:
    c = w.consumer(priority_order=True)
    w.publish("s.a", 2)
    assert seqs(c.claim(2)) == [1, 2]
    c.nak(2)
    assert c.is_available(2) and not c.is_available(1)
    assert c.take(2, w.clock.now() + 7 * NS)
    assert c.delivery_count(2) == 2
    assert c.deadline_of(2) == w.clock.now() + 7 * NS
    assert c.peek_available(5) == []


def test_retry_dead_goes_straight_in_flight_with_one_more_delivery(w: World) -> None:
    c = w.consumer(priority_order=True, max_deliver=2, ack_wait=NS)
    w.publish("s.a", 1)
    c.claim(1)
    w.clock.advance(1)
    c.claim(1)
    w.clock.advance(1)
    assert c.peek_available(1) == []
    assert [d.seq for d in c.dead_messages()] == [1]
    assert c.retry_dead(1, w.clock.now() + 10 * NS)
    assert c.dead_messages() == []
    assert c.delivery_count(1) == 3 and c.num_ack_pending == 1
    assert not c.retry_dead(1)
    w.clock.advance(10)
    assert [d.seq for d in c.dead_messages()] == [1]


def test_extend_sets_a_new_deadline_for_in_flight_only(w: World) -> None:
    c = w.consumer(priority_order=True, ack_wait=2 * NS)
    w.publish("s.a", 2)
    c.claim(1)
    w.clock.advance(1)
    assert c.extend(1, w.clock.now() + 10 * NS)
    assert not c.extend(2, w.clock.now() + 10 * NS)
    w.clock.advance(5)
    assert c.deadline_of(1) == w.clock.now() + 5 * NS
    assert seqs(c.peek_available(5)) == [2]


def test_take_out_of_order_needs_priority_order(w: World) -> None:
    c = w.consumer()
    w.publish("s.a", 3)
    assert seqs(c.peek_available(5)) == [1]
    with pytest.raises(ValueError):
        c.take(2)
    assert seqs(c.claim(2)) == [1, 2]
