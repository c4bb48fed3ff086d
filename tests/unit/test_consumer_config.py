"""Consumer configuration, pull request bodies and ack payloads: pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from tether.engine.clock import go_duration
from tether.engine.consumers import pull_queue as pq
from tether.engine.consumers.config import (
    ConsumerConfig,
    apply_defaults,
    check_update,
    decode_request,
    format_rfc3339,
    parse_rfc3339,
    validate,
)
from tether.engine.errors import ApiError
from tether.engine.streams.config import StreamConfig
from tether.server.nats.consumers import _nak_delay, parse_go_duration

NS = 1_000_000_000
STREAM = StreamConfig(name="S", subjects=["s.>"])


def made(**fields: Any) -> ConsumerConfig:
    config = ConsumerConfig(**fields)
    apply_defaults(config, STREAM)
    validate(config, STREAM)
    return config


def test_defaults_like_nats_server() -> None:
    pull = made(durable_name="D", ack_policy="explicit")
    assert pull.to_dict() == {
        "durable_name": "D",
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": 30 * NS,
        "max_deliver": -1,
        "replay_policy": "instant",
        "max_waiting": 512,
        "max_ack_pending": 1000,
        "num_replicas": 0,
    }
    # No ack policy in the request is Go's zero value: none, and no ack wait.
    ephemeral = made(name="E")
    assert ephemeral.ack_policy == "none" and ephemeral.ack_wait == 0
    assert ephemeral.max_ack_pending == 0 and ephemeral.inactive_threshold == 5 * NS
    push = made(deliver_subject="d", ack_policy="explicit", idle_heartbeat=NS)
    assert push.max_waiting == 0 and "max_waiting" not in push.to_dict()
    backoff = made(name="B", backoff=[2 * NS, 4 * NS], max_deliver=3)
    assert backoff.ack_wait == 2 * NS


@pytest.mark.parametrize(
    ("fields", "err_code"),
    [
        ({"flow_control": True}, 10089),
        ({"idle_heartbeat": NS}, 10088),
        ({"deliver_subject": "x", "flow_control": True}, 10108),
        ({"deliver_subject": "x", "idle_heartbeat": 1000}, 10083),
        ({"deliver_subject": "x", "max_waiting": 5}, 10080),
        ({"deliver_subject": "x.*"}, 10079),
        ({"deliver_subject": "s.x"}, 10081),
        ({"max_deliver": 2, "backoff": [1, 2, 3]}, 10116),
        ({"filter_subject": "s.a", "filter_subjects": ["s.b"]}, 10136),
        ({"filter_subjects": ["s.>", "s.b"]}, 10138),
        ({"filter_subjects": [""]}, 10139),
        ({"deliver_policy": "by_start_sequence"}, 10094),
        ({"deliver_policy": "by_start_time"}, 10094),
        ({"deliver_policy": "last", "opt_start_seq": 2}, 10094),
        ({"deliver_policy": "last_per_subject"}, 10094),
        ({"durable_name": "a", "name": "b"}, 10132),
        ({"name": "a.b"}, 10052),
    ],
)
def test_invalid_configs(fields: dict[str, Any], err_code: int) -> None:
    with pytest.raises(ApiError) as exc:
        made(**fields)
    assert exc.value.err_code == err_code


def test_updates() -> None:
    old = made(durable_name="D", ack_policy="explicit")
    new = made(durable_name="D", ack_policy="explicit", max_ack_pending=5, filter_subject="s.a")
    check_update(old, new, deliver_bound=False)
    for field, value, message in [
        ("ack_policy", "all", "ack policy can not be updated"),
        ("deliver_policy", "new", "deliver policy can not be updated"),
        ("max_waiting", 10, "max waiting can not be updated"),
        ("deliver_subject", "x", "can not update pull consumer to push based"),
    ]:
        changed = made(durable_name="D", ack_policy="explicit")
        setattr(changed, field, value)
        with pytest.raises(ApiError) as exc:
            check_update(old, changed, deliver_bound=False)
        assert (exc.value.code, exc.value.err_code, exc.value.description) == (
            500,
            10012,
            message,
        )
    push = made(durable_name="P", deliver_subject="a", ack_policy="explicit")
    moved = made(durable_name="P", deliver_subject="b", ack_policy="explicit")
    check_update(push, moved, deliver_bound=False)
    with pytest.raises(ApiError) as exc:
        check_update(push, moved, deliver_bound=True)
    assert exc.value.err_code == 10013


def test_request_decoding() -> None:
    req = decode_request(b'{"stream_name": "S", "config": {"durable_name": "D"}, "x": 1}')
    assert req.stream_name == "S" and req.config.durable_name == "D"
    with pytest.raises(ApiError) as exc:
        decode_request(b'{"config": {"ack_wait": "soon"}}')
    assert exc.value.err_code == 10025


def test_times() -> None:
    ns = parse_rfc3339("2024-01-02T03:04:05.123456789Z")
    assert format_rfc3339(ns) == "2024-01-02T03:04:05.123456789Z"
    assert parse_rfc3339("2024-01-02T05:04:05+02:00") == parse_rfc3339("2024-01-02T03:04:05Z")
    assert format_rfc3339(0) == "0001-01-01T00:00:00Z"
    assert parse_rfc3339("0001-01-01T00:00:00Z") == 0
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")


def test_pull_request_bodies() -> None:
    assert pq.parse_next_request(b"").batch == 1
    assert pq.parse_next_request(b" 7 ").batch == 7
    assert pq.parse_next_request(b"garbage").batch == 1
    req = pq.parse_next_request(b'{"batch": 5, "expires": 100, "no_wait": true, "max_bytes": 9}')
    assert (req.batch, req.expires, req.no_wait, req.max_bytes) == (5, 100, True, 9)
    with pytest.raises(pq.PullRequestError, match="heartbeat value too large"):
        pq.parse_next_request(b'{"expires": 100, "idle_heartbeat": 60}')
    with pytest.raises(pq.PullRequestError):
        pq.parse_next_request(b'{"batch": "x"}')


def test_go_durations() -> None:
    assert go_duration(NS) == "1s"
    assert go_duration(1_500_000_000) == "1.5s"
    assert go_duration(250_000_000) == "250ms"
    assert go_duration(90 * NS) == "1m30s"
    assert parse_go_duration("1m30s") == 90 * NS
    assert parse_go_duration("250ms") == 250_000_000
    assert parse_go_duration("1.5s") == 1_500_000_000
    with pytest.raises(ValueError):
        parse_go_duration("soon")


def test_nak_delays() -> None:
    assert _nak_delay(b"") == 0
    assert _nak_delay(b'{"delay": 5000}') == 5000
    assert _nak_delay(b"2s") == 2 * NS
    assert _nak_delay(b"{bad") == 0  # a bad delay is a plain nak, as on nats-server
    assert _nak_delay(b'{"delay": -3}') == 0


def test_status_blocks() -> None:
    assert pq.request_timeout(3, 10) == (
        b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n"
        b"Nats-Pending-Bytes: 10\r\n\r\n"
    )
    assert pq.idle_heartbeat(2, 4, "$JS.FC.S.C.abcd") == (
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 2\r\nNats-Last-Stream: 4\r\n"
        b"Nats-Consumer-Stalled: $JS.FC.S.C.abcd\r\n\r\n"
    )
