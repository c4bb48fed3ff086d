"""Priority groups (overflow, pinned client, prioritized), consumer reset and sampled
acks, with the fake clock."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.engine.consumers.config import ConsumerConfig, apply_defaults, validate
from tether.engine.consumers.consumer import Consumer
from tether.engine.errors import ApiError
from tether.engine.streams.config import StreamConfig
from tether.storage.base import MessageMeta

# Imported with --import-mode=importlib: the consumer tests' world is a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from test_consumer import NS, Sink, World, blocks, msgs


class PinSink(Sink):
    """Also records the extra header lines each message was handed over with."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[bytes] = []

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        super().deliver(consumer, to, meta, reply)
        self.headers.append(consumer.delivery_headers)


@pytest.fixture
def w() -> World:
    world = World()
    world.sink = PinSink()
    return world


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def status(block: bytes) -> str:
    return block.split(b"\r\n", 1)[0].decode()


def pinned(w: World, ttl_s: float = 10) -> Consumer:
    return w.consumer(
        priority_groups=["g"],
        priority_policy="pinned_client",
        priority_timeout=int(ttl_s * NS),
    )


def pin_of(w: World) -> str:
    sink = w.sink
    assert isinstance(sink, PinSink)
    header = sink.headers[-1].decode()
    assert header.startswith("Nats-Pin-Id: ")
    return header.removeprefix("Nats-Pin-Id: ").strip()


# -- configuration -----------------------------------------------------------------------------


def config(**fields: Any) -> ConsumerConfig:
    cfg = ConsumerConfig(durable_name="C", ack_policy="explicit", **fields)
    stream = StreamConfig(name="S", subjects=["s.>"])
    apply_defaults(cfg, stream)
    validate(cfg, stream)
    return cfg


@pytest.mark.parametrize(
    ("fields", "err_code"),
    [
        ({"priority_policy": "overflow"}, 10159),
        ({"priority_groups": ["a"]}, 10196),
        ({"priority_timeout": 5}, 10197),
        ({"priority_groups": [""], "priority_policy": "overflow"}, 10161),
        ({"priority_groups": ["a.b"], "priority_policy": "overflow"}, 10162),
        ({"priority_groups": ["x" * 17], "priority_policy": "overflow"}, 10162),
        (
            {"priority_groups": ["a"], "priority_policy": "overflow", "deliver_subject": "d"},
            10178,
        ),
        ({"direct": True}, 10090),
        ({"sourcing": True}, 10025),
        ({"rate_limit_bps": 1000}, 10086),
    ],
)
def test_invalid_priority_configs_are_refused(fields: dict[str, Any], err_code: int) -> None:
    with pytest.raises(ApiError) as exc:
        config(**fields)
    assert exc.value.err_code == err_code


def test_pinned_gets_the_default_timeout_and_reports_its_fields() -> None:
    cfg = config(priority_groups=["g", "h/1"], priority_policy="pinned_client")
    assert cfg.priority_timeout == 120 * NS
    out = cfg.to_dict()
    assert out["priority_groups"] == ["g", "h/1"]
    assert out["priority_policy"] == "pinned_client"
    assert "priority_policy" not in config().to_dict()


def test_pedantic_refuses_what_would_be_adjusted() -> None:
    stream = StreamConfig(name="S", subjects=["s.>"])
    with pytest.raises(ApiError) as exc:
        apply_defaults(ConsumerConfig(max_batch=-1), stream, pedantic=True)
    assert (exc.value.err_code, exc.value.description) == (
        10157,
        "pedantic mode: max_batch must not be negative",
    )
    assert apply_defaults(ConsumerConfig(max_batch=-1), stream).max_batch == 0


# -- pull request checks -------------------------------------------------------------------------


def test_priority_fields_on_a_plain_consumer(w: World) -> None:
    c = w.consumer()
    for fields, text in [
        ({"min_pending": 1}, "Not a Overflow Priority consumer"),
        ({"id": "x"}, "Not a Pinned Client Priority consumer"),
        ({"priority": 10}, "Priority must be between 0 and 9"),
    ]:
        c.pull("_INBOX.a", body(batch=1, no_wait=True, **fields))
        assert blocks(w.sink.take()) == [b"NATS/1.0 400 Bad Request - %s\r\n\r\n" % text.encode()]
    c.pull("_INBOX.a", body(batch=1, no_wait=True, group="any"))  # ignored
    assert [status(b) for b in blocks(w.sink.take())] == ["NATS/1.0 404 No Messages"]


def test_group_is_required_and_must_exist(w: World) -> None:
    c = w.consumer(priority_groups=["a"], priority_policy="overflow")
    c.pull("_INBOX.a", body(batch=1, no_wait=True))
    c.pull("_INBOX.a", body(batch=1, no_wait=True, group="b"))
    assert [status(b) for b in blocks(w.sink.take())] == [
        "NATS/1.0 400 Bad Request - Priority Group missing",
        "NATS/1.0 400 Bad Request - Invalid Priority Group",
    ]


# -- overflow -----------------------------------------------------------------------------------------


def test_overflow_serves_only_past_its_limits(w: World) -> None:
    c = w.consumer(priority_groups=["a"], priority_policy="overflow")
    w.publish(n=3)
    c.pull("_INBOX.big", body(batch=5, expires=NS, group="a", min_pending=4))
    assert w.sink.take() == []
    c.pull("_INBOX.ok", body(batch=1, expires=NS, group="a", min_pending=3))
    assert msgs(w.sink.take()) == [1]
    # One unacked: min_ack_pending 2 waits; 1 is served, which makes two unacked,
    # so the first is served too.
    c.pull("_INBOX.ack2", body(batch=1, expires=NS, group="a", min_ack_pending=2))
    assert w.sink.take() == []
    c.pull("_INBOX.ack1", body(batch=1, expires=NS, group="a", min_ack_pending=1))
    events = w.sink.take()
    assert [(e[1], e[2]) for e in events] == [("_INBOX.ack1", 2), ("_INBOX.ack2", 3)]
    # Four pending: the big request's limit is reached for one message (then three
    # are pending, fewer than its limit).
    w.publish(n=4)
    assert [(e[1], e[2]) for e in w.sink.take()] == [("_INBOX.big", 4)]
    w.clock.advance(2)
    assert [(e[1], status(e[2])) for e in w.sink.take()] == [
        ("_INBOX.big", "NATS/1.0 408 Request Timeout")
    ]


# -- pinned client ---------------------------------------------------------------------------------


def test_first_request_gets_the_pin_and_every_message_carries_it(w: World) -> None:
    c = pinned(w)
    w.publish(n=4)
    c.pull("_INBOX.a", body(batch=2, expires=NS, group="g"))
    assert msgs(w.sink.take()) == [1, 2]
    pin = pin_of(w)
    assert len(pin) == 22
    assert c.priority is not None and c.priority.state() == ("g", pin, w.clock.now())
    (advisory,) = w.sink.advisories
    assert advisory[0] == "$JS.EVENT.ADVISORY.CONSUMER.PINNED.S.C"
    assert advisory[1]["pinned_id"] == pin and advisory[1]["group"] == "g"
    # A standby waits; a wrong id is refused at once; the pin holder is served.
    c.pull("_INBOX.standby", body(batch=1, expires=5 * NS, group="g"))
    assert w.sink.take() == []
    c.pull("_INBOX.x", body(batch=1, expires=NS, group="g", id="nope"))
    assert blocks(w.sink.take()) == [b"NATS/1.0 423 Nats-Pin-Id mismatch\r\n\r\n"]
    c.pull("_INBOX.a", body(batch=1, expires=NS, group="g", id=pin))
    assert [(e[1], e[2]) for e in w.sink.take()] == [("_INBOX.a", 3)]


def test_unpin_hands_the_pin_to_a_standby_and_stale_ids_get_423(w: World) -> None:
    c = pinned(w)
    w.publish(n=2)
    c.pull("_INBOX.a", body(batch=1, expires=NS, group="g"))
    old = pin_of(w)
    w.sink.take()
    c.unpin("g")
    # A request with the old pin meets the next message: 423, and it is gone.
    c.pull("_INBOX.stale", body(batch=1, expires=5 * NS, group="g", id=old))
    assert [(e[1], status(e[2])) for e in w.sink.take()] == [
        ("_INBOX.stale", "NATS/1.0 423 Nats-Wrong-Pin-Id")
    ]
    c.pull("_INBOX.b", body(batch=1, expires=NS, group="g"))
    assert [(e[1], e[2]) for e in w.sink.take()] == [("_INBOX.b", 2)]
    assert pin_of(w) != old
    kinds = [a[0].split(".")[4] for a in w.sink.advisories]
    assert kinds == ["PINNED", "UNPINNED", "PINNED"]
    assert w.sink.advisories[1][1]["reason"] == "admin"


def test_the_pin_times_out_unless_its_holder_pulls(w: World) -> None:
    c = pinned(w, ttl_s=2)
    w.publish(n=3)
    c.pull("_INBOX.a", body(batch=1, expires=10 * NS, group="g"))
    pin = pin_of(w)
    c.pull("_INBOX.standby", body(batch=1, expires=10 * NS, group="g"))
    w.clock.advance(1.5)
    c.pull("_INBOX.a", body(batch=1, expires=10 * NS, group="g", id=pin))  # restarts the timer
    assert msgs(w.sink.take()) == [1, 2]
    w.clock.advance(1.5)
    assert w.sink.take() == []  # 3 s after the pin, 1.5 s after the last pull
    w.clock.advance(1)
    # Timed out: the standby takes a new pin and the next message.
    assert [(e[1], e[2]) for e in w.sink.take()] == [("_INBOX.standby", 3)]
    assert pin_of(w) != pin
    unpinned = [a for a in w.sink.advisories if ".UNPINNED." in a[0]]
    assert [a[1]["reason"] for a in unpinned] == ["timeout"]


def test_changing_the_policy_drops_the_pin(w: World) -> None:
    c = pinned(w)
    w.publish(n=1)
    c.pull("_INBOX.a", body(batch=1, expires=NS, group="g"))
    assert c.priority is not None and c.priority.pin_id
    cfg = ConsumerConfig(**{**c.config.to_dict(), "priority_policy": "overflow"})
    cfg.priority_timeout = 0
    c.update_config(cfg)
    assert c.priority is not None and c.priority.pin_id == ""


# -- prioritized ------------------------------------------------------------------------------------


def test_prioritized_serves_the_lowest_priority_first_fifo_within(w: World) -> None:
    c = w.consumer(priority_groups=["g"], priority_policy="prioritized")
    for inbox, priority in (("p5", 5), ("p1a", 1), ("p3", 3), ("p1b", 1)):
        c.pull(inbox, body(batch=2, expires=NS, group="g", priority=priority))
    c.pull("plain", b"2")  # not JSON: no priority, served last
    w.publish(n=8)
    order = [e[1] for e in w.sink.take() if e[0] == "msg"]
    assert order == ["p1a", "p1b", "p1a", "p1b", "p3", "p3", "p5", "p5"]


# -- reset ------------------------------------------------------------------------------------------------


def test_reset_to_the_ack_floor_forgets_deliveries(w: World) -> None:
    c = w.consumer(ack_wait=5 * NS)
    w.publish(n=5)
    c.pull("_INBOX.a", b"3")
    w.sink.take()
    c.ack(1)
    assert c.reset(0) == 2
    assert c.delivered == (0, 1) and c.ack_floor == (0, 1)
    assert c.num_ack_pending == 0 and c.num_pending == 4
    c.pull("_INBOX.a", b"4")
    events = w.sink.take()
    assert msgs(events) == [2, 3, 4, 5]
    assert events[0][3].split(".")[4:7] == ["1", "2", "1"]  # delivered 1, seq 2, cseq 1
    w.clock.advance(10)  # the old deliveries' timers do not redeliver anything extra
    assert msgs(w.sink.take()) == []


def test_reset_limits_follow_the_deliver_policy(w: World) -> None:
    w.publish(n=5)
    assert w.consumer("A").reset(4) == 4
    with pytest.raises(ValueError, match="not allowed"):
        w.consumer("N", deliver_policy="new").reset(2)
    assert w.consumer("N2", deliver_policy="new").reset(0) == 6
    q = w.consumer("Q", deliver_policy="by_start_sequence", opt_start_seq=3)
    with pytest.raises(ValueError, match="below start seq"):
        q.reset(2)
    assert q.reset(3) == 3


# -- sampled acks ------------------------------------------------------------------------------------


def test_sampled_acks_are_reported(w: World) -> None:
    c = w.consumer(sample_freq="100%")
    w.publish(n=2)
    c.pull("_INBOX.a", b"2")
    w.clock.advance(0.25)
    c.ack(1)
    ((subject, event),) = w.sink.advisories
    assert subject == "$JS.EVENT.METRIC.CONSUMER.ACK.S.C"
    assert event["type"] == "io.nats.jetstream.metric.v1.consumer_ack"
    assert (event["consumer_seq"], event["stream_seq"], event["deliveries"]) == (1, 1, 1)
    assert event["ack_time"] == NS // 4
    assert w.consumer("Z", sample_freq="0").sample_freq == 0


# -- one-shot requests held back -----------------------------------------------------------------


def test_a_stalled_one_shot_ends_at_its_first_heartbeat(w: World) -> None:
    c = w.consumer(max_ack_pending=2)
    w.publish(n=5)
    c.pull(
        "_INBOX.a",
        body(batch=5, no_wait=True, expires=2 * NS, idle_heartbeat=NS // 2),
    )
    assert msgs(w.sink.take()) == [1, 2]
    w.clock.advance(0.5)
    assert [status(b) for b in blocks(w.sink.take())] == ["NATS/1.0 404 No Messages"]
    assert c.count_waiting() == 0


def test_a_stalled_one_shot_waits_for_its_expiry_without_other_wake_ups(w: World) -> None:
    c = w.consumer(max_ack_pending=2)
    w.publish(n=5)
    c.pull("_INBOX.a", body(batch=5, no_wait=True, expires=2 * NS))
    assert msgs(w.sink.take()) == [1, 2]
    w.clock.advance(1.9)
    assert w.sink.take() == []
    w.clock.advance(0.2)
    assert [status(b) for b in blocks(w.sink.take())] == ["NATS/1.0 408 Request Timeout"]


def test_another_requests_expiry_ends_a_stalled_one_shot(w: World) -> None:
    c = w.consumer(max_ack_pending=2)
    w.publish(n=5)
    c.pull("_INBOX.a", body(batch=5, no_wait=True, expires=2 * NS))
    c.pull("_INBOX.b", body(batch=1, expires=NS // 4))
    w.sink.take()
    w.clock.advance(0.3)
    assert [(e[1], status(e[2])) for e in w.sink.take()] == [
        ("_INBOX.b", "NATS/1.0 408 Request Timeout"),
        ("_INBOX.a", "NATS/1.0 404 No Messages"),
    ]


def test_a_paused_consumer_ends_one_shots_without_expires(w: World) -> None:
    c = w.consumer(pause_until="2099-01-01T00:00:00Z")
    w.publish(n=1)
    c.pull("_INBOX.a", body(batch=1, no_wait=True))
    assert [status(b) for b in blocks(w.sink.take())] == ["NATS/1.0 404 No Messages"]
    c.pull("_INBOX.b", body(batch=1, no_wait=True, expires=NS))
    assert w.sink.take() == []


# -- replay_policy original ------------------------------------------------------------------------


def test_replay_original_spaces_stored_messages_as_they_were_stored(w: World) -> None:
    w.publish()
    w.clock.advance(1)
    w.publish()
    w.clock.advance(2)
    w.publish()
    w.clock.advance(10)
    c = w.consumer(replay_policy="original")
    c.pull("_INBOX.a", b"5")
    assert msgs(w.sink.take()) == [1]
    w.clock.advance(0.9)
    assert msgs(w.sink.take()) == []
    w.clock.advance(0.1)
    assert msgs(w.sink.take()) == [2]
    w.clock.advance(2)
    assert msgs(w.sink.take()) == [3]
    # Caught up: what comes later goes out at once.
    w.publish()
    assert msgs(w.sink.take()) == [4]
    assert not c.replaying


def test_replay_original_on_a_push_consumer(w: World) -> None:
    w.publish()
    w.clock.advance(0.5)
    w.publish()
    c = w.consumer(deliver_subject="out", replay_policy="original")
    c.set_push_interest(True)
    assert msgs(w.sink.take()) == [1]
    w.clock.advance(0.5)
    assert msgs(w.sink.take()) == [2]


# -- rate_limit_bps ----------------------------------------------------------------------------------


def test_rate_limit_paces_a_push_consumer() -> None:
    w = World()
    w.stream.config.max_msg_size = 100  # the bucket holds 100 bytes
    w.publish(n=6)
    c = w.consumer(deliver_subject="out", rate_limit_bps=8 * 1000)  # 1000 bytes/s
    c.set_push_interest(True)
    first = w.sink.take()
    size = len(first[0][3]) + len("s.a") + 4  # what nats-server counts per message
    assert len(first) == 100 // size
    w.clock.advance(size / 1000)
    assert len(w.sink.take()) == 1
    w.clock.advance(1)
    assert len(first) + 1 + len(w.sink.take()) == 6


# -- ack_policy flow_control ---------------------------------------------------------------------------


def test_flow_control_answers_acknowledge(w: World) -> None:
    w.publish(n=3)
    c = w.consumer(ack_policy="flow_control", deliver_subject="out", max_ack_pending=2)
    assert c.config.flow_control and c.config.idle_heartbeat == NS and c.config.ack_wait == 0
    c.set_push_interest(True)
    events = w.sink.take()
    assert msgs(events) == [1, 2]
    (fc,) = [e for e in events if e[0] == "ctl"]
    assert fc[2] == b"NATS/1.0 100 FlowControl Request\r\n\r\n"
    w.clock.advance(60)  # no ack wait: nothing is redelivered
    assert msgs(w.sink.take()) == []
    c.flow_control_reply(fc[3], b"NATS/1.0\r\nNats-Last-Consumer: 2\r\nNats-Last-Stream: 2\r\n\r\n")
    assert c.ack_floor == (2, 2)
    assert msgs(w.sink.take()) == [3]
