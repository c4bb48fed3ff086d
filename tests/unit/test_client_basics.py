"""Small pieces of the SDK: public API, models, errors, metadata, backoff, NUIDs."""

from __future__ import annotations

import random

import pytest

import tether.client as client
from tether.client import (
    ApiError,
    Backoff,
    ConsumerConfig,
    ConsumerInfo,
    ConsumerNotFound,
    NotJetStreamMessage,
    StreamConfig,
    StreamInfo,
    StreamNotFound,
    Timeout,
    WrongLastSequence,
)
from tether.client._pull_requests import expires_ns, long_request, no_wait_request
from tether.client.message import JsMsg, parse_ack_subject, status_of
from tether.client.nuid import Nuid


def test_public_api_is_curated() -> None:
    assert sorted(client.__all__) == client.__all__
    for name in client.__all__:
        assert getattr(client, name) is not None
        assert getattr(client, name).__doc__, name
    assert "Worker" in client.__all__ and "CatchUpSubscription" in client.__all__


def test_stream_config_durations_in_seconds() -> None:
    config = StreamConfig(name="ORDERS", subjects=["orders.>"], max_age=3600, duplicate_window=0.5)
    assert config.to_wire() == {
        "name": "ORDERS",
        "subjects": ["orders.>"],
        "max_age": 3_600_000_000_000,
        "duplicate_window": 500_000_000,
    }
    info = StreamInfo.from_wire(
        {
            "config": {
                "name": "ORDERS",
                "max_age": 1_000_000_000,
                "retention": "limits",
                "unknown": 1,
            },
            "state": {
                "messages": 3,
                "bytes": 10,
                "first_seq": 1,
                "last_seq": 3,
                "consumer_count": 0,
            },
            "created": "2024-01-01T00:00:00Z",
        }
    )
    assert info.config.max_age == 1.0 and info.state.last_seq == 3


def test_consumer_config_backoff_list() -> None:
    config = ConsumerConfig(durable_name="c", ack_wait=30, backoff=[1, 2.5], max_deliver=5)
    wire = config.to_wire()
    assert wire["ack_wait"] == 30_000_000_000 and wire["backoff"] == [1_000_000_000, 2_500_000_000]
    info = ConsumerInfo.from_wire({"stream_name": "S", "name": "c", "config": wire})
    assert info.config.backoff == [1.0, 2.5] and info.config.ack_wait == 30.0


def test_api_errors_map_to_types() -> None:
    err = ApiError.from_response(
        {"code": 404, "err_code": 10059, "description": "stream not found"}
    )
    assert isinstance(err, StreamNotFound) and err.code == 404 and err.err_code == 10059
    assert isinstance(ApiError.from_response({"code": 404, "err_code": 10014}), ConsumerNotFound)
    assert isinstance(ApiError.from_response({"code": 400, "err_code": 10071}), WrongLastSequence)
    assert type(ApiError.from_response({"code": 418})) is ApiError
    assert issubclass(Timeout, TimeoutError)


def test_ack_subject_metadata_v1_and_v2() -> None:
    v1 = parse_ack_subject("$JS.ACK.ORDERS.C1.2.10.12.1795319468562162575.4")
    assert (v1.stream, v1.consumer, v1.num_delivered, v1.stream_seq, v1.consumer_seq) == (
        "ORDERS", "C1", 2, 10, 12,
    )  # fmt: skip
    assert (v1.timestamp_ns, v1.num_pending, v1.domain) == (1795319468562162575, 4, "")
    v2 = parse_ack_subject("$JS.ACK.hub.ACCHASH.ORDERS.C1.1.5.6.1795319468562162575.0.tok")
    assert (v2.domain, v2.stream, v2.stream_seq) == ("hub", "ORDERS", 5)
    for bad in ("foo.bar", "$JS.ACK.a.b.c", "$JS.ACK.S.C.x.1.1.1.0"):
        with pytest.raises(NotJetStreamMessage):
            parse_ack_subject(bad)
    with pytest.raises(NotJetStreamMessage):
        _ = JsMsg(None, "s", "", b"").metadata


def test_status_of() -> None:
    assert status_of(b"NATS/1.0 404 No Messages\r\n\r\n") == 404
    assert status_of(b"NATS/1.0\r\nA: b\r\n\r\n") == 0
    assert status_of(None) == 0 and status_of(b"NATS/1.0 4x4\r\n\r\n") == 0


def test_pull_request_bodies() -> None:
    assert no_wait_request(5) == b'{"batch":5,"no_wait":true}'
    assert expires_ns(5.0) == 4_900_000_000
    assert expires_ns(0.1) == 50_000_000  # never more than half the timeout is kept back
    assert long_request(5, 4_900_000_000) == b'{"batch":5,"expires":4900000000}'
    assert long_request(1, 10, 0.5) == b'{"batch":1,"expires":10,"idle_heartbeat":500000000}'


def test_backoff_is_exponential_capped_and_jittered() -> None:
    b = Backoff(0.1, 1.0, 2.0, 0.0)
    assert [b.base(n) for n in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert b.base(10_000) == 1.0
    jittered = Backoff(1.0, 10.0, 2.0, 0.5)
    delays = {jittered.delay(2, random.Random(i)) for i in range(50)}
    assert len(delays) > 10 and all(1.0 <= d <= 3.0 for d in delays)
    with pytest.raises(ValueError):
        Backoff(jitter=2)


def test_nuids_are_unique() -> None:
    gen = Nuid()
    tokens = {gen.next() for _ in range(10_000)}
    assert len(tokens) == 10_000 and all(len(t) == 22 for t in tokens)
