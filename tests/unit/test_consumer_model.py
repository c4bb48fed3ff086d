"""A consumer against a reference model: publishes, pulls, acks, naks, terms, timeouts, restarts.

The model keeps one state per message (available, in flight with a deadline, queued
for redelivery, acked, dead) and predicts exactly which messages a no-wait pull
returns and with which delivery count. Invariants: nothing is lost (every published
message is in exactly one state and the consumer's counters agree), nothing acked is
delivered again, and delivery counts are right, across restarts too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tether.engine.clock import FakeClock
from tether.engine.consumers.config import ConsumerConfig, apply_defaults, validate
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.cursor import StreamHead
from tether.engine.consumers.delivery_state import decode_state, encode_state
from tether.engine.streams.config import StreamConfig
from tether.engine.streams.stream import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
ACK_WAIT = NS


class _Sink:
    def __init__(self) -> None:
        self.delivered: list[tuple[int, int]] = []
        self.gone: set[str] = set()

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        self.delivered.append((meta.seq, int(reply.split(".")[4])))

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        pass

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        pass

    def has_interest(self, subject: str) -> bool:
        return subject not in self.gone

    def backlog(self, consumer: Consumer) -> int:
        return 0


class _Host:
    def consumer_changed(self, consumer: Consumer) -> None:
        consumer._changed = False

    def consumer_acked(self, consumer: Consumer, seqs: list[int]) -> None:
        pass

    def consumer_inactive(self, consumer: Consumer) -> None:
        pass


@dataclass
class Msg:
    state: str = "avail"  # avail | flight | queued | acked | dead
    deliveries: int = 0
    deadline: int = 0
    why: str = ""  # for dead: max | term


class ConsumerModel(RuleBasedStateMachine):
    @initialize(
        max_deliver=st.sampled_from([-1, 3]),
        max_ack_pending=st.sampled_from([3, 1000]),
    )
    def setup(self, max_deliver: int, max_ack_pending: int) -> None:
        self.clock = FakeClock()
        self.stream = Stream(StreamConfig(name="S", subjects=["s"]), self.clock.now())
        self.stream.start_empty()
        self.head = StreamHead(0)
        self.sink = _Sink()
        self.host = _Host()
        config = ConsumerConfig(
            durable_name="C",
            ack_policy="explicit",
            ack_wait=ACK_WAIT,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
        )
        apply_defaults(config, self.stream.config)
        validate(config, self.stream.config)
        self.max_deliver = max_deliver
        self.max_ack_pending = max_ack_pending
        self.consumer = Consumer(
            self.stream, self.head, "C", config, self.clock.now(), self.clock, self.sink, self.host
        )
        self.msgs: dict[int, Msg] = {}
        self.pulls = 0

    # -- the model's own clock -------------------------------------------------------------------
    def _expire(self) -> None:
        now = self.clock.now()
        for m in self.msgs.values():
            if m.state == "flight" and m.deadline <= now:
                m.state = "queued"  # dies when its turn comes if it had max_deliver

    def _expected_pull(self, batch: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for seq in sorted(s for s, m in self.msgs.items() if m.state == "queued"):
            if len(out) >= batch:
                break
            m = self.msgs[seq]
            if self.max_deliver > 0 and m.deliveries >= self.max_deliver:
                m.state, m.why = "dead", "max"  # reaped when it comes up
                continue
            out.append((seq, m.deliveries + 1))
        unacked = sum(1 for m in self.msgs.values() if m.state in ("flight", "queued"))
        for seq in sorted(s for s, m in self.msgs.items() if m.state == "avail"):
            if len(out) >= batch or unacked >= self.max_ack_pending:
                break
            out.append((seq, 1))
            unacked += 1
        return out

    # -- rules -----------------------------------------------------------------------------------------
    @rule(n=st.integers(1, 4))
    def publish(self, n: int) -> None:
        metas = []
        for _ in range(n):
            seq = self.stream.last_seq + 1
            meta = MessageMeta(seq, "s", 30, self.clock.now())
            self.stream.append(meta, "")
            metas.append(meta)
            self.msgs[seq] = Msg()
        self.head.committed = self.stream.last_seq
        self.consumer.on_committed(metas)

    @rule(batch=st.integers(1, 6))
    def pull(self, batch: int) -> None:
        self.pulls += 1
        inbox = f"_INBOX.{self.pulls}"
        expected = self._expected_pull(batch)
        self.sink.delivered = []
        self.consumer.pull(inbox, b'{"batch": %d, "no_wait": true}' % batch)
        # A request left waiting (stalled by max_ack_pending) is abandoned by its client.
        self.sink.gone.add(inbox)
        self.consumer.drop_requests_for(lambda s: s == inbox)
        assert self.sink.delivered == expected
        now = self.clock.now()
        for seq, deliveries in expected:
            m = self.msgs[seq]
            assert m.state not in ("acked", "dead"), "an acked or dead message came back"
            m.state, m.deliveries, m.deadline = "flight", deliveries, now + ACK_WAIT

    def _pick(self, data: st.DataObject, states: tuple[str, ...]) -> int | None:
        seqs = sorted(s for s, m in self.msgs.items() if m.state in states)
        return data.draw(st.sampled_from(seqs)) if seqs else None

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        seq = self._pick(data, ("flight", "queued", "acked", "dead"))
        if seq is None:
            return
        self.consumer.ack(seq)
        self.msgs[seq].state = "acked"

    @rule(data=st.data())
    def nak(self, data: st.DataObject) -> None:
        seq = self._pick(data, ("flight",))
        if seq is None:
            return
        self.consumer.nak(seq)
        self.msgs[seq].state = "queued"

    @rule(data=st.data())
    def term(self, data: st.DataObject) -> None:
        seq = self._pick(data, ("flight", "queued"))
        if seq is None:
            return
        self.consumer.term(seq)
        self.msgs[seq].state, self.msgs[seq].why = "dead", "term"

    @rule(seconds=st.sampled_from([0.3, 0.7, 1.0, 1.5]))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._expire()

    @rule()
    def restart(self) -> None:
        saved = decode_state(encode_state(self.consumer.save()))
        self.consumer.close(notify=False)
        self.consumer = Consumer(
            self.stream,
            self.head,
            "C",
            self.consumer.config,
            self.consumer.created_ns,
            self.clock,
            self.sink,
            self.host,
            saved,
        )

    @precondition(
        lambda self: any(m.state == "dead" and m.why == "max" for m in self.msgs.values())
    )
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        seqs = sorted(s for s, m in self.msgs.items() if m.state == "dead" and m.why == "max")
        seq = data.draw(st.sampled_from(seqs))
        assert self.consumer.requeue_dead(seq)
        self.msgs[seq] = Msg(state="queued", deliveries=0)

    # -- invariants -------------------------------------------------------------------------------------
    @invariant()
    def counters_match(self) -> None:
        count = {k: 0 for k in ("avail", "flight", "queued", "acked", "dead")}
        for m in self.msgs.values():
            count[m.state] += 1
        c = self.consumer
        assert c.num_pending == count["avail"]
        assert c.num_ack_pending == count["flight"] + count["queued"]
        assert len(c.state.dead) == count["dead"]
        # Nothing lost: every message is in exactly one place.
        assert sum(count.values()) == len(self.msgs) == self.stream.last_seq

    @invariant()
    def floor_is_lowest_unacked(self) -> None:
        holding = [s for s, m in self.msgs.items() if m.state in ("flight", "queued")]
        c = self.consumer
        if holding:
            assert c.ack_floor[1] == min(holding) - 1
        else:
            assert c.ack_floor[1] == c.delivered[1]

    @invariant()
    def redelivered_count(self) -> None:
        expected = sum(
            1
            for m in self.msgs.values()
            if m.deliveries > 1
            and (m.state in ("flight", "queued") or (m.state == "dead" and m.why == "max"))
        )
        assert self.consumer.num_redelivered == expected


TestConsumerModel = ConsumerModel.TestCase
TestConsumerModel.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
