"""Consumer rules with a fake clock: pulls, statuses, acks, redelivery, dead letters."""

from __future__ import annotations

from typing import Any

import pytest

from tether.engine.clock import FakeClock
from tether.engine.consumers import pull_queue as pq
from tether.engine.consumers.config import ConsumerConfig, apply_defaults, format_rfc3339, validate
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.cursor import StreamHead
from tether.engine.consumers.delivery_state import decode_state, encode_state
from tether.engine.streams.config import StreamConfig
from tether.engine.streams.stream import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
INBOX = "_INBOX.a"


class Sink:
    """Records what a consumer sends."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.advisories: list[tuple[str, dict[str, Any]]] = []
        self.no_interest: set[str] = set()

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        self.events.append(("msg", to, meta.seq, reply))

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        self.events.append(("ctl", to, block, reply))

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        self.advisories.append((subject, body))

    def has_interest(self, subject: str) -> bool:
        return subject not in self.no_interest

    def backlog(self, consumer: Consumer) -> int:
        return 0

    def take(self) -> list[tuple[Any, ...]]:
        events, self.events = self.events, []
        return events


class Host:
    def __init__(self) -> None:
        self.changed = 0
        self.acked: list[int] = []
        self.inactive: list[Consumer] = []

    def consumer_changed(self, consumer: Consumer) -> None:
        self.changed += 1
        consumer._changed = False

    def consumer_acked(self, consumer: Consumer, seqs: list[int]) -> None:
        self.acked.extend(seqs)

    def consumer_inactive(self, consumer: Consumer) -> None:
        self.inactive.append(consumer)


class World:
    """A stream, its committed head, a fake clock and recording sink/host."""

    def __init__(self, subjects: tuple[str, ...] = ("s.>",)) -> None:
        self.clock = FakeClock()
        self.stream = Stream(StreamConfig(name="S", subjects=list(subjects)), self.clock.now())
        self.stream.start_empty()
        self.head = StreamHead(0)
        self.sink = Sink()
        self.host = Host()
        self.consumers: list[Consumer] = []

    def publish(self, subject: str = "s.a", n: int = 1, priority: int = 0) -> list[int]:
        metas = []
        for _ in range(n):
            seq = self.stream.last_seq + 1
            meta = MessageMeta(seq, subject, 20 + len(subject), self.clock.now(), priority)
            self.stream.append(meta, "")
            metas.append(meta)
        self.head.committed = self.stream.last_seq
        for consumer in self.consumers:
            consumer.on_committed(metas)
        return [m.seq for m in metas]

    def remove(self, seqs: list[int]) -> None:
        for seq in seqs:
            self.stream.remove(seq)
        for consumer in self.consumers:
            consumer.on_removed(seqs, False)

    def consumer(self, name: str = "C", **fields: Any) -> Consumer:
        fields.setdefault("ack_policy", "explicit")
        config = ConsumerConfig(durable_name=name, name=name, **fields)
        apply_defaults(config, self.stream.config)
        validate(config, self.stream.config)
        consumer = Consumer(
            self.stream, self.head, name, config, self.clock.now(), self.clock, self.sink, self.host
        )
        self.consumers.append(consumer)
        return consumer

    def reload(self, consumer: Consumer) -> Consumer:
        """What a restart does: encode, decode, rebuild."""
        saved = decode_state(encode_state(consumer.save()))
        consumer.close(notify=False)
        self.consumers.remove(consumer)
        fresh = Consumer(
            self.stream,
            self.head,
            consumer.name,
            consumer.config,
            consumer.created_ns,
            self.clock,
            self.sink,
            self.host,
            saved,
        )
        self.consumers.append(fresh)
        return fresh


def msgs(events: list[tuple[Any, ...]]) -> list[int]:
    return [e[2] for e in events if e[0] == "msg"]


def blocks(events: list[tuple[Any, ...]]) -> list[bytes]:
    return [e[2] for e in events if e[0] == "ctl"]


def ack_tokens(reply: str) -> list[str]:
    return reply.split(".")


@pytest.fixture
def w() -> World:
    return World()


# -- pull requests and statuses ----------------------------------------------------------------


def test_empty_body_is_batch_one_with_ack_subject(w: World) -> None:
    c = w.consumer()
    w.publish(n=3)
    c.pull(INBOX, b"")
    (event,) = w.sink.take()
    assert event[:3] == ("msg", INBOX, 1)
    tokens = ack_tokens(event[3])
    meta = w.stream.meta(1)
    assert meta is not None
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
    assert tokens == ["$JS", "ACK", "S", "C", "1", "1", "1", str(meta.ts), "2"]
    assert c.num_pending == 2 and c.num_ack_pending == 1


def test_bare_integer_body_is_the_batch(w: World) -> None:
    c = w.consumer()
    w.publish(n=5)
    c.pull(INBOX, b"3")
    assert msgs(w.sink.take()) == [1, 2, 3]


def test_no_wait_with_nothing_is_404(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 2, "no_wait": true}')
    assert blocks(w.sink.take()) == [pq.NO_MESSAGES]
    assert c.count_waiting() == 0


def test_no_wait_partial_batch_ends_with_404(w: World) -> None:
    c = w.consumer()
    w.publish(n=2)
    c.pull(INBOX, b'{"batch": 5, "no_wait": true, "expires": 5000000000}')
    events = w.sink.take()
    assert msgs(events) == [1, 2]
    assert blocks(events) == [pq.NO_MESSAGES]
    assert c.count_waiting() == 0


def test_no_wait_with_expires_and_nothing_waits_then_408(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 2, "no_wait": true, "expires": 300000000}')
    assert w.sink.take() == []
    assert c.count_waiting() == 1
    w.clock.advance(0.3)
    assert blocks(w.sink.take()) == [pq.request_timeout(2, 0)]


def test_lingering_request_gets_later_messages(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 2, "expires": 1000000000}')
    assert c.count_waiting() == 1
    w.publish()
    assert msgs(w.sink.take()) == [1]
    w.publish()
    assert msgs(w.sink.take()) == [2]
    assert c.count_waiting() == 0
    w.clock.advance(2)
    assert w.sink.take() == []  # completed requests never time out


def test_expiry_after_partial_delivery_reports_what_is_left(w: World) -> None:
    c = w.consumer()
    w.publish()
    c.pull(INBOX, b'{"batch": 3, "expires": 500000000, "max_bytes": 1000}')
    events = w.sink.take()
    assert msgs(events) == [1]
    w.clock.advance(0.5)
    size = 20 + 3 - 16 + len(events[0][3])
    assert blocks(w.sink.take()) == [pq.request_timeout(2, 1000 - size)]


def test_negative_expires_times_out_at_once(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 1, "expires": -5}')
    assert blocks(w.sink.take()) == [pq.request_timeout(1, 0)]


def test_idle_heartbeats_while_waiting(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 2, "expires": 1000000000, "idle_heartbeat": 200000000}')
    w.clock.advance(0.45)
    assert blocks(w.sink.take()) == [pq.idle_heartbeat(0, 0)] * 2
    w.publish()
    w.sink.take()
    w.clock.advance(0.25)  # a delivery restarts the heartbeat interval
    assert blocks(w.sink.take()) == [pq.idle_heartbeat(1, 1)]
    w.clock.advance(0.5)
    assert blocks(w.sink.take())[-1] == pq.request_timeout(1, 0)


def test_heartbeat_larger_than_half_expires_is_bad_request(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 2, "expires": 300000000, "idle_heartbeat": 200000000}')
    assert blocks(w.sink.take()) == [
        b"NATS/1.0 400 Bad Request - heartbeat value too large\r\n\r\n"
    ]


def test_bad_json_is_bad_request(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b"{bad")
    (block,) = blocks(w.sink.take())
    assert block.startswith(b"NATS/1.0 400 Bad Request - ")


def test_max_waiting(w: World) -> None:
    c = w.consumer(max_waiting=2)
    c.pull("_INBOX.1", b'{"batch": 1, "expires": 5000000000}')
    c.pull("_INBOX.2", b'{"batch": 1, "expires": 5000000000}')
    c.pull("_INBOX.3", b'{"batch": 1, "expires": 5000000000}')
    assert w.sink.take() == [("ctl", "_INBOX.3", pq.EXCEEDED_MAX_WAITING, "")]
    # With an idle heartbeat the client waits for heartbeats instead: no 409.
    c.pull("_INBOX.4", b'{"batch": 1, "expires": 5000000000, "idle_heartbeat": 1000000000}')
    assert w.sink.take() == []
    assert c.count_waiting() == 2


def test_requests_pending(w: World) -> None:
    c = w.consumer()
    c.pull("_INBOX.1", b'{"batch": 10, "expires": 5000000000}')
    c.pause(w.clock.now() + 10 * NS)  # keep the two messages from being taken
    w.publish(n=2)
    c.pull("_INBOX.2", b'{"batch": 1, "no_wait": true}')
    assert blocks(w.sink.take()) == [pq.REQUESTS_PENDING]


def test_message_larger_than_max_bytes(w: World) -> None:
    c = w.consumer()
    w.publish()
    c.pull(INBOX, b'{"batch": 5, "max_bytes": 10}')
    assert blocks(w.sink.take()) == [pq.size_exceeds_max_bytes(5, 10)]
    assert c.num_pending == 1  # still there for the next request


def test_batch_completed_with_bytes_left(w: World) -> None:
    c = w.consumer()
    w.publish(n=2)
    c.pull(INBOX, b'{"batch": 1, "max_bytes": 1000, "no_wait": true}')
    events = w.sink.take()
    assert msgs(events) == [1]
    size = 20 + 3 - 16 + len(events[0][3])
    assert blocks(events) == [pq.batch_completed(0, 1000 - size)]


def test_request_limits(w: World) -> None:
    c = w.consumer(max_batch=2, max_expires=NS, max_bytes=100)
    c.pull(INBOX, b'{"batch": 3}')
    c.pull(INBOX, b'{"batch": 1, "expires": 2000000000}')
    c.pull(INBOX, b'{"batch": 1, "max_bytes": 200}')
    assert blocks(w.sink.take()) == [
        b"NATS/1.0 409 Exceeded MaxRequestBatch of 2\r\n\r\n",
        b"NATS/1.0 409 Exceeded MaxRequestExpires of 1s\r\n\r\n",
        b"NATS/1.0 409 Exceeded MaxRequestMaxBytes of 100\r\n\r\n",
    ]


def test_requests_without_interest_are_dropped(w: World) -> None:
    c = w.consumer()
    c.pull("_INBOX.gone", b'{"batch": 1, "expires": 5000000000}')
    c.pull("_INBOX.here", b'{"batch": 1, "expires": 5000000000}')
    w.sink.no_interest.add("_INBOX.gone")
    c.drop_requests_for(lambda s: s == "_INBOX.gone")
    assert c.count_waiting() == 1
    w.publish()
    assert w.sink.take()[0][:3] == ("msg", "_INBOX.here", 1)


def test_interest_checked_at_delivery(w: World) -> None:
    c = w.consumer()
    c.pull("_INBOX.gone", b'{"batch": 1, "expires": 5000000000}')
    w.sink.no_interest.add("_INBOX.gone")
    w.publish()
    assert w.sink.take() == []
    assert c.count_waiting() == 0 and c.num_pending == 1


def test_waiting_requests_share_round_robin(w: World) -> None:
    c = w.consumer()
    c.pull("_INBOX.1", b'{"batch": 3, "expires": 5000000000}')
    c.pull("_INBOX.2", b'{"batch": 3, "expires": 5000000000}')
    w.publish(n=4)
    assert [e[1] for e in w.sink.take()] == ["_INBOX.1", "_INBOX.2", "_INBOX.1", "_INBOX.2"]


def test_push_consumer_refuses_pulls(w: World) -> None:
    c = w.consumer(deliver_subject="d")
    c.pull(INBOX, b"")
    assert blocks(w.sink.take()) == [pq.PUSH_BASED]


def test_deleted_consumer_tells_waiting_requests(w: World) -> None:
    c = w.consumer()
    c.pull(INBOX, b'{"batch": 1, "expires": 5000000000}')
    c.close()
    assert blocks(w.sink.take()) == [pq.CONSUMER_DELETED]


# -- acks and redelivery -----------------------------------------------------------------------------


def test_explicit_ack_moves_the_floor(w: World) -> None:
    c = w.consumer()
    w.publish(n=3)
    c.pull(INBOX, b"3")
    w.sink.take()
    c.ack(2)
    assert c.ack_floor == (0, 0) and c.num_ack_pending == 2
    c.ack(1)
    assert c.ack_floor == (2, 2)
    c.ack(3)
    assert c.ack_floor == (3, 3) and c.delivered == (3, 3)
    assert c.num_ack_pending == 0


def test_ack_wait_redelivers_in_stream_order(w: World) -> None:
    c = w.consumer(ack_wait=NS)
    w.publish(n=3)
    c.pull(INBOX, b"3")
    w.sink.take()
    c.ack(2)
    w.clock.advance(1.01)
    c.pull(INBOX, b'{"batch": 5, "no_wait": true}')
    events = w.sink.take()
    assert msgs(events) == [1, 3]
    assert [ack_tokens(e[3])[4] for e in events if e[0] == "msg"] == ["2", "2"]
    assert [ack_tokens(e[3])[6] for e in events if e[0] == "msg"] == ["4", "5"]
    assert c.num_redelivered == 2
    assert c.delivered == (5, 3)


def test_redeliveries_go_before_new_messages(w: World) -> None:
    c = w.consumer(ack_wait=NS)
    w.publish(n=2)
    c.pull(INBOX, b"1")
    w.clock.advance(1.01)
    w.sink.take()
    c.pull(INBOX, b"2")
    assert msgs(w.sink.take()) == [1, 2]


def test_nak_redelivers_now(w: World) -> None:
    c = w.consumer()
    w.publish(n=2)
    c.pull(INBOX, b"2")
    w.sink.take()
    c.nak(2)
    c.pull(INBOX, b"1")
    assert msgs(w.sink.take()) == [2]
    assert [s for s, _ in w.sink.advisories] == ["$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.S.C"]


def test_nak_with_delay(w: World) -> None:
    c = w.consumer()
    w.publish()
    c.pull(INBOX, b"1")
    w.sink.take()
    c.nak(1, 300_000_000)
    c.pull(INBOX, b'{"batch": 1, "expires": 5000000000}')
    w.clock.advance(0.29)
    assert w.sink.take() == []
    w.clock.advance(0.02)
    assert msgs(w.sink.take()) == [1]


def test_progress_resets_the_ack_timer(w: World) -> None:
    c = w.consumer(ack_wait=NS)
    w.publish()
    c.pull(INBOX, b"1")
    w.sink.take()
    w.clock.advance(0.8)
    c.progress(1)
    w.clock.advance(0.8)
    c.pull(INBOX, b'{"batch": 1, "no_wait": true}')
    assert blocks(w.sink.take()) == [pq.NO_MESSAGES]
    w.clock.advance(0.3)
    c.pull(INBOX, b'{"batch": 1, "no_wait": true}')
    assert msgs(w.sink.take()) == [1]


def test_term_keeps_a_dead_letter(w: World) -> None:
    c = w.consumer(ack_wait=NS)
    w.publish(n=2)
    c.pull(INBOX, b"2")
    w.sink.take()
    c.term(1, "bad payload")
    w.clock.advance(2)
    c.pull(INBOX, b'{"batch": 5, "no_wait": true}')
    assert msgs(w.sink.take()) == [2]
    (dead,) = c.dead_messages()
    assert (dead.seq, dead.reason, dead.detail) == (1, "terminated", "bad payload")
    (subject, body) = w.sink.advisories[-1]
    assert subject == "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.S.C"
    assert body["reason"] == "bad payload"


def test_max_deliver_kills_and_requeue_dead_revives(w: World) -> None:
    c = w.consumer(ack_wait=NS, max_deliver=2)
    w.publish()
    c.pull(INBOX, b"1")
    w.clock.advance(1.01)
    c.pull(INBOX, b"1")
    assert msgs(w.sink.take()) == [1, 1]
    w.clock.advance(1.01)
    assert c.num_ack_pending == 1  # as on nats-server: dead once its turn comes
    (dead,) = c.dead_messages()
    assert c.num_ack_pending == 0
    assert (dead.seq, dead.deliveries, dead.reason) == (1, 2, "max_deliveries")
    subject, body = w.sink.advisories[-1]
    assert subject == "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.C"
    assert body["type"] == "io.nats.jetstream.advisory.v1.max_deliver"
    assert (body["stream_seq"], body["deliveries"]) == (1, 2)
    assert c.ack_floor == (2, 1)  # as on nats-server, a dead message does not hold the floor
    c.pull(INBOX, b'{"batch": 1, "no_wait": true}')
    assert blocks(w.sink.take()) == [pq.NO_MESSAGES]
    assert c.requeue_dead(1)
    assert c.dead_messages() == []
    c.pull(INBOX, b"1")
    (event,) = w.sink.take()
    assert ack_tokens(event[3])[4] == "1"  # the delivery count starts over


def test_backoff_spaces_redeliveries(w: World) -> None:
    c = w.consumer(backoff=[NS, 3 * NS], max_deliver=5)
    assert c.config.ack_wait == NS
    w.publish()
    c.pull(INBOX, b"1")
    c.pull(INBOX, b'{"batch": 3, "expires": 60000000000}')
    w.sink.take()
    w.clock.advance(1.01)
    assert msgs(w.sink.take()) == [1]
    w.clock.advance(2.9)
    assert w.sink.take() == []
    w.clock.advance(0.2)
    assert msgs(w.sink.take()) == [1]
    w.clock.advance(3.1)  # the last backoff repeats
    assert msgs(w.sink.take()) == [1]


def test_max_ack_pending_stalls_new_messages_only(w: World) -> None:
    c = w.consumer(max_ack_pending=2, ack_wait=NS)
    w.publish(n=4)
    c.pull(INBOX, b'{"batch": 4, "no_wait": true}')
    assert msgs(w.sink.take()) == [1, 2]  # stalled, not the end: no 404
    assert c.count_waiting() == 1
    c.ack(1)
    assert msgs(w.sink.take()) == [3]
    w.clock.advance(1.01)  # 2 and 3 time out: redeliveries are not limited
    c.pull("_INBOX.b", b'{"batch": 4, "expires": 5000000000}')
    assert msgs(w.sink.take()) == [2, 3]


def test_ack_all(w: World) -> None:
    c = w.consumer(ack_policy="all")
    w.publish(n=4)
    c.pull(INBOX, b"4")
    c.ack(3)
    assert c.ack_floor == (3, 3) and c.num_ack_pending == 1
    c.nak(2)  # below the floor: ignored
    assert c.num_ack_pending == 1


def test_ack_none(w: World) -> None:
    c = w.consumer(ack_policy="none")
    w.publish(n=3)
    c.pull(INBOX, b"2")
    assert c.num_ack_pending == 0
    assert c.ack_floor == (2, 2) and c.num_pending == 1


def test_acks_feed_retention_when_asked(w: World) -> None:
    c = w.consumer()
    c.notify_acks = True
    w.publish(n=2)
    c.pull(INBOX, b"2")
    c.ack(1)
    c.term(2)
    assert w.host.acked == [1, 2]


# -- where a consumer starts and what it sees ---------------------------------------------------------


def test_deliver_policies() -> None:
    w = World()
    w.publish("s.a", 2)
    w.publish("s.b", 2)
    w.publish("s.a", 1)
    start = w.stream.meta(3)
    assert start is not None

    def first(**cfg: Any) -> tuple[list[int], int]:
        c = w.consumer(f"c{len(w.consumers)}", **cfg)
        pending = c.num_pending
        c.pull(INBOX, b'{"batch": 10, "no_wait": true}')
        return msgs(w.sink.take()), pending

    assert first() == ([1, 2, 3, 4, 5], 5)
    assert first(deliver_policy="last") == ([5], 1)
    assert first(deliver_policy="new") == ([], 0)
    assert first(deliver_policy="by_start_sequence", opt_start_seq=4) == ([4, 5], 2)
    w.clock.advance(1)
    w.publish("s.c", 1)
    since = format_rfc3339(w.clock.now())
    assert first(deliver_policy="by_start_time", opt_start_time=since) == ([6], 1)
    assert first(deliver_policy="last_per_subject", filter_subject="s.>") == ([4, 5, 6], 3)
    assert first(deliver_policy="last", filter_subject="s.b") == ([4], 1)


def test_last_per_subject_then_new_messages() -> None:
    w = World()
    w.publish("s.a", 3)
    w.publish("s.b", 1)
    c = w.consumer(deliver_policy="last_per_subject", filter_subject="s.>")
    assert c.delivered == (0, 2)
    assert c.num_pending == 2
    w.publish("s.a", 1)
    assert c.num_pending == 3
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [3, 4, 5]


def test_filters() -> None:
    w = World()
    c = w.consumer(filter_subjects=["s.a", "s.c.*"])
    w.publish("s.a", 1)
    w.publish("s.b", 300)  # long runs of non-matching messages
    w.publish("s.c.x", 1)
    assert c.num_pending == 2
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [1, 302]
    assert c.num_pending == 0


def test_num_pending_follows_removals(w: World) -> None:
    c = w.consumer()
    w.publish(n=5)
    c.pull(INBOX, b"2")
    w.sink.take()
    w.remove([1, 3])
    assert c.num_pending == 2
    assert c.num_ack_pending == 1  # a removed message cannot be acked or redelivered
    f = w.consumer("F", filter_subject="s.a")
    w.remove([4])
    assert f.num_pending == 2
    f.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [2, 5]


def test_priority_order(w: World) -> None:
    c = w.consumer(priority_order=True)
    w.publish("s.a", 2, priority=1)
    w.publish("s.a", 2, priority=5)
    w.publish("s.a", 1, priority=3)
    w.publish("s.a", 1, priority=5)
    assert c.num_pending == 6
    c.pull(INBOX, b'{"batch": 3, "no_wait": true}')
    assert msgs(w.sink.take()) == [3, 4, 6]
    c.nak(4)
    w.publish("s.a", 1, priority=9)
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    # Highest priority first, oldest first among equals, redeliveries included.
    assert msgs(w.sink.take()) == [7, 4, 5, 1, 2]
    plain = w.consumer("plain")
    plain.pull(INBOX, b'{"batch": 3, "no_wait": true}')
    assert msgs(w.sink.take()) == [1, 2, 3]


def test_priority_cursor_survives_restart(w: World) -> None:
    c = w.consumer(priority_order=True)
    w.publish("s.a", 3, priority=1)
    w.publish("s.a", 2, priority=2)
    c.pull(INBOX, b"3")
    assert msgs(w.sink.take()) == [4, 5, 1]
    for seq in (4, 5, 1):
        c.ack(seq)
    c = w.reload(c)
    assert c.num_pending == 2
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [2, 3]


# -- persistence, pause, inactivity ----------------------------------------------------------------------


def test_state_survives_a_restart(w: World) -> None:
    c = w.consumer(ack_wait=5 * NS, max_deliver=3)
    w.publish(n=5)
    c.pull(INBOX, b"4")
    w.sink.take()
    c.ack(1)
    c.ack(3)
    c.nak(2)
    c = w.reload(c)
    assert c.delivered == (4, 4)
    assert c.ack_floor == (1, 1)
    assert c.num_ack_pending == 2 and c.num_pending == 1
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    # The nak'd 2 comes back at once; 4 is in flight until its ack wait passes; nothing
    # acked comes back.
    assert msgs(w.sink.take()) == [2, 5]
    w.clock.advance(5.1)
    c.pull(INBOX, b'{"batch": 9, "no_wait": true}')
    assert msgs(w.sink.take()) == [2, 4, 5]


def test_inactive_threshold() -> None:
    w = World()
    c = w.consumer(inactive_threshold=NS)
    w.clock.advance(0.5)
    c.pull(INBOX, b'{"batch": 1, "expires": 800000000}')
    w.clock.advance(1.0)
    assert w.host.inactive == []
    w.clock.advance(1.5)
    assert w.host.inactive == [c]


def test_pause(w: World) -> None:
    c = w.consumer()
    c.pause(w.clock.now() + NS)
    assert c.paused
    w.publish()
    c.pull(INBOX, b'{"batch": 1, "expires": 5000000000}')
    assert w.sink.take() == []
    w.clock.advance(1.01)
    assert msgs(w.sink.take()) == [1]
    assert not c.paused


def test_a_pause_timer_firing_early_waits_for_the_rest(w: World) -> None:
    # The loop's monotonic timer can fire before the wall clock reaches the pause's end.
    c = w.consumer()
    c.pause(w.clock.now() + NS)
    w.publish()
    c.pull(INBOX, b'{"batch": 1, "expires": 5000000000}')
    timer = c._pause_timer
    assert timer is not None
    timer.cancel()  # it fires now, a second early
    c._on_unpause()
    assert c.paused and w.sink.take() == []
    w.clock.advance(1.01)
    assert msgs(w.sink.take()) == [1]
    assert not c.paused


def test_resuming_with_the_epoch_keeps_it_in_the_config(w: World) -> None:
    # nats.js resumes with pause_until = the epoch; nats-server keeps that time in the config.
    c = w.consumer()
    c.pause(w.clock.now() + 10 * NS)
    c.pause(0)
    assert not c.paused and c.config.pause_until == "1970-01-01T00:00:00Z"
    c.pause(None)
    assert not c.paused and c.config.pause_until is None


# -- push ------------------------------------------------------------------------------------------------


def test_push_delivers_while_bound(w: World) -> None:
    c = w.consumer(deliver_subject="d", ack_policy="explicit")
    w.publish(n=2)
    assert w.sink.take() == []  # no subscriber yet
    c.set_push_interest(True)
    assert [(e[1], e[2]) for e in w.sink.take()] == [("d", 1), ("d", 2)]
    c.set_push_interest(False)
    w.publish()
    assert w.sink.take() == []
    c.set_push_interest(True)
    assert msgs(w.sink.take()) == [3]


def test_push_idle_heartbeats(w: World) -> None:
    c = w.consumer(deliver_subject="d", ack_policy="none", idle_heartbeat=NS)
    c.set_push_interest(True)
    w.clock.advance(1.01)
    assert blocks(w.sink.take()) == [pq.idle_heartbeat(0, 0)]
    w.publish()
    w.sink.take()
    w.clock.advance(0.9)  # a delivery restarts the interval
    assert w.sink.take() == []
    w.clock.advance(0.2)
    assert blocks(w.sink.take()) == [pq.idle_heartbeat(1, 1)]


def test_push_flow_control(w: World) -> None:
    c = w.consumer(deliver_subject="d", ack_policy="none", flow_control=True, idle_heartbeat=NS)
    c.set_push_interest(True)
    big = 600_000
    for _ in range(5):
        seq = w.stream.last_seq + 1
        meta = MessageMeta(seq, "s.a", big, w.clock.now())
        w.stream.append(meta, "")
        w.head.committed = seq
        c.on_committed([meta])
    events = w.sink.take()
    # A request once past half the 2 MiB window, then a stall once past all of it.
    assert [e[0] for e in events] == ["msg", "msg", "ctl", "msg", "msg"]
    fc = events[2][3]
    assert events[2][2] == pq.FLOW_CONTROL and fc.startswith("$JS.FC.S.C.")
    w.clock.advance(1.01)
    assert blocks(w.sink.take()) == [pq.idle_heartbeat(4, 4, fc)]
    c.flow_control_reply("$JS.FC.S.C.nope")  # not the outstanding one
    assert w.sink.take() == []
    c.flow_control_reply(fc)
    assert msgs(w.sink.take()) == [5]


def test_push_ephemeral_goes_when_unbound() -> None:
    w = World()
    c = w.consumer("E", deliver_subject="d", inactive_threshold=NS)
    c.set_push_interest(True)
    w.clock.advance(2)
    assert w.host.inactive == []
    c.set_push_interest(False)
    w.clock.advance(0.5)
    c.set_push_interest(True)
    c.set_push_interest(False)
    w.clock.advance(0.9)
    assert w.host.inactive == []
    w.clock.advance(0.2)
    assert w.host.inactive == [c]


def test_push_redelivers_after_ack_wait(w: World) -> None:
    c = w.consumer(deliver_subject="d", ack_policy="explicit", ack_wait=NS)
    c.set_push_interest(True)
    w.publish()
    w.sink.take()
    w.clock.advance(1.01)
    (event,) = w.sink.take()
    assert event[2] == 1 and ack_tokens(event[3])[4] == "2"
