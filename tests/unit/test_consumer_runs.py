"""Pull delivery in runs: exactly what delivering one message at a time does.

``PullDelivery._deliver_run`` is the fast lane for new messages to plain requests; the
general path (``_candidate`` / ``_take_request`` / ``_commit`` per message) is the
reference. Every scenario runs twice, once with the fast lane switched off, and
everything observable must be identical: messages with their ack subjects and targets,
status blocks, advisories, consumer views and the saved state.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.delivery_state import encode_state
from tether.engine.consumers.pull import PullDelivery
from tether.storage.base import MessageMeta

# Imported with --import-mode=importlib: the consumer tests' world is a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from test_consumer import INBOX, NS, Sink, World, msgs

Scenario = Callable[[World], Consumer]


def _transcript(w: World, c: Consumer) -> list[Any]:
    return [
        w.sink.take(),
        list(w.sink.advisories),
        c.delivered,
        c.ack_floor,
        c.num_pending,
        c.num_ack_pending,
        c.count_waiting(),
        encode_state(c.save()),
    ]


class _RunSink(Sink):
    """Takes whole runs, as the NATS front door does (every subscription is steady)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def steady(self, subject: str) -> bool:
        return self.has_interest(subject)

    def deliver_run(
        self, consumer: Consumer, tos: list[str], metas: list[MessageMeta], replies: list[str]
    ) -> None:
        self.runs += 1
        for to, meta, reply in zip(tos, metas, replies, strict=True):
            self.deliver(consumer, to, meta, reply)


# slow: one message at a time; each: the fast lane, delivering message by message;
# runs: the fast lane handing whole runs to a sink that takes them.
MODES = ("slow", "each", "runs")


def _run(scenario: Scenario, mode: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    with monkeypatch.context() as m:
        if mode == "slow":
            m.setattr(PullDelivery, "_deliver_run", lambda self, now: False)
        w = World(subjects=("s.>", "t.>"))
        if mode == "runs":
            w.sink = _RunSink()
        c = scenario(w)
        return _transcript(w, c)


def _same(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    reference = _run(scenario, "slow", monkeypatch)
    for mode in MODES[1:]:
        assert _run(scenario, mode, monkeypatch) == reference, mode
    return reference


def test_round_robin_between_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        c = w.consumer()
        w.publish(n=7)
        c.pull("_INBOX.a", b'{"batch": 3, "expires": 5000000000}')
        c.pull("_INBOX.b", b'{"batch": 5, "expires": 5000000000}')
        w.publish(n=4)
        return c

    events = _same(scenario, monkeypatch)[0]
    assert msgs(events) == list(range(1, 9))
    targets = [e[1] for e in events if e[0] == "msg"]
    assert targets == ["_INBOX.a", "_INBOX.a", "_INBOX.a"] + ["_INBOX.b"] * 5


def test_a_run_is_one_call() -> None:
    w = World()
    w.sink = sink = _RunSink()
    c = w.consumer()
    w.publish(n=8)
    c.pull("_INBOX.a", b'{"batch": 4, "expires": 5000000000}')
    c.pull("_INBOX.b", b'{"batch": 4, "expires": 5000000000}')
    assert sink.runs == 2  # each request arrives with its messages waiting
    c.pull("_INBOX.c", b'{"batch": 3, "expires": 5000000000}')
    c.pull("_INBOX.d", b'{"batch": 3, "expires": 5000000000}')
    sink.take()
    w.publish(n=4)  # both wait: one run, taking turns
    assert sink.runs == 3
    assert [e[1][-1] for e in sink.take()] == ["c", "d", "c", "d"]


def test_interleaving_when_both_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        c = w.consumer()
        c.pull("_INBOX.a", b'{"batch": 2, "expires": 5000000000}')
        c.pull("_INBOX.b", b'{"batch": 4, "expires": 5000000000}')
        w.publish(n=10)
        return c

    events = _same(scenario, monkeypatch)[0]
    targets = [e[1][-1] for e in events if e[0] == "msg"]
    assert targets == ["a", "b", "a", "b", "b", "b"]


def test_max_ack_pending_stalls_and_acks_release(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        c = w.consumer(max_ack_pending=3)
        w.publish(n=10)
        c.pull(INBOX, b'{"batch": 8, "expires": 5000000000, "no_wait": true}')
        c.ack(2)
        c.ack(1)
        w.clock.advance(31)  # ack wait: redeliveries go first, new messages stay stalled
        c.ack(3)
        return c

    _same(scenario, monkeypatch)


def test_gaps_and_sparse_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        c = w.consumer(filter_subject="t.>")
        w.publish("s.a", n=300)
        w.publish("t.a", n=2)
        w.publish("s.a", n=5)
        w.publish("t.b", n=3)
        w.remove([301, 305, 306])
        c.pull(INBOX, b'{"batch": 4, "expires": 5000000000}')
        w.publish("t.a", n=2)
        return c

    events = _same(scenario, monkeypatch)[0]
    assert msgs(events) == [302, 308, 309, 310]


def test_last_per_subject_prelude(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        w.publish("s.a", n=3)
        w.publish("s.b", n=2)
        c = w.consumer(deliver_policy="last_per_subject", filter_subject="s.>")
        w.publish("s.c", n=2)
        c.pull(INBOX, b'{"batch": 10, "expires": 5000000000}')
        return c

    _same(scenario, monkeypatch)


def test_expired_and_uninterested_requests_in_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        c = w.consumer()
        c.pull("_INBOX.a", b'{"batch": 5, "expires": 1000000000}')
        c.pull("_INBOX.b", b'{"batch": 5, "expires": 9000000000}')
        c.pull("_INBOX.c", b'{"batch": 5, "expires": 9000000000, "max_bytes": 200}')
        w.sink.no_interest.add("_INBOX.b")
        w.clock._now += 2 * NS  # past a's expiry, without firing its timer
        w.publish(n=6)
        return c

    _same(scenario, monkeypatch)


class _EndingSink(Sink):
    """A subscription that ends after ``limit`` messages, as one with an UNSUB maximum."""

    def __init__(self, to: str, limit: int) -> None:
        super().__init__()
        self.to = to
        self.limit = limit

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        super().deliver(consumer, to, meta, reply)
        if to == self.to:
            self.limit -= 1
            if self.limit == 0:
                self.no_interest.add(to)
                consumer.drop_requests_for(lambda s: s == to)


def test_request_dropped_by_its_own_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        w.sink = _EndingSink("_INBOX.a", 2)
        c = w.consumer()
        c.pull("_INBOX.a", b'{"batch": 5, "expires": 5000000000}')
        c.pull("_INBOX.b", b'{"batch": 5, "expires": 5000000000}')
        c.pull("_INBOX.c", b'{"batch": 5, "expires": 5000000000}')
        w.publish(n=12)
        return c

    events = _same(scenario, monkeypatch)[0]
    assert [e[1][-1] for e in events if e[0] == "msg"].count("a") == 2


@pytest.mark.parametrize("seed", range(40))
def test_random_scenarios(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def scenario(w: World) -> Consumer:
        rnd = random.Random(seed)
        options: dict[str, Any] = {}
        if rnd.random() < 0.3:
            options["max_ack_pending"] = rnd.randint(1, 8)
        if rnd.random() < 0.3:
            options["filter_subject"] = "t.>"
        if rnd.random() < 0.2:
            options["max_deliver"] = rnd.randint(1, 3)
        c = w.consumer(**options)
        for _ in range(40):
            op = rnd.random()
            if op < 0.25:
                w.publish(rnd.choice(["s.a", "t.a"]), n=rnd.randint(1, 6))
            elif op < 0.45:
                body: dict[str, Any] = {"batch": rnd.randint(1, 6)}
                if rnd.random() < 0.7:
                    body["expires"] = rnd.randint(1, 5) * NS
                if rnd.random() < 0.2:
                    body["no_wait"] = True
                if rnd.random() < 0.1:
                    body["max_bytes"] = rnd.randint(20, 200)
                inbox = f"_INBOX.{rnd.choice('abc')}"
                c.pull(inbox, repr(body).replace("'", '"').replace("True", "true").encode())
            elif op < 0.7 and c.state.pending:
                seq = rnd.choice(sorted(c.state.pending))
                if rnd.random() < 0.8:
                    c.ack(seq)
                else:
                    c.nak(seq)
            elif op < 0.8:
                w.clock.advance(rnd.choice([0.5, 2, 31]))
            elif op < 0.9:
                inbox = f"_INBOX.{rnd.choice('abc')}"
                if inbox in w.sink.no_interest:
                    w.sink.no_interest.discard(inbox)
                else:
                    w.sink.no_interest.add(inbox)
            elif w.stream.last_seq:
                w.remove([rnd.randint(1, w.stream.last_seq)])
        return c

    _same(scenario, monkeypatch)
