"""Request bodies at the NATS front door: decoded as Go decodes them, refused cleanly."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.consumers import pull_queue as pq
from tether.engine.errors import ApiError
from tether.protocol.nats.errors import ProtocolError
from tether.server.nats import requests
from tether.server.nats.connection import parse_connect
from tether.server.nats.jetstream import parse_rfc3339
from tether.server.nats.requests import (
    BodyError,
    ConsumersRequest,
    DirectGetRequest,
    PauseRequest,
    PurgeRequest,
    StreamInfoRequest,
)

DEEP = b"[" * 5000 + b"]" * 5000


def test_text_that_is_not_utf8_becomes_replacement_characters() -> None:
    assert requests.go_text(b'{"a":"b"}') == b'{"a":"b"}'
    assert requests.go_text('{"a":"é"}'.encode()) == '{"a":"é"}'.encode()
    assert requests.go_text(b'{"\xff":"\xfe"}') == '{"\ufffd":"\ufffd"}'.encode()


def test_depth() -> None:
    assert not requests.too_deep(b'{"a":[{"b":[1]}]}')
    assert requests.too_deep(DEEP)
    assert requests.too_deep(b'{"a":' * 65 + b"1" + b"}" * 65)
    assert not requests.too_deep(b'{"a":' * 64 + b"1" + b"}" * 64)
    # Brackets inside strings do not nest anything.
    assert not requests.too_deep(b'{"a":"' + b"[" * 5000 + b'"}')
    assert not requests.too_deep(b'{"a":"\\"' + b"[" * 5000 + b'"}')


@pytest.mark.parametrize(
    "body",
    [DEEP, b'{"offset":' + DEEP + b"}", b"{", b"[]", b'"x"', b"12", b'{"zz":1}', b'{"offset":"1"}'],
)
def test_bad_bodies_are_invalid_json(body: bytes) -> None:
    with pytest.raises(ApiError) as exc:
        requests.decode_required(body, StreamInfoRequest)
    assert (exc.value.code, exc.value.err_code) == (400, 10025)
    assert exc.value.description.startswith("invalid JSON: ")


def test_null_keeps_the_defaults() -> None:
    assert requests.decode_required(b"null", StreamInfoRequest) == StreamInfoRequest()
    req = requests.decode_required(b'{"offset":null,"subjects_filter":"a.>"}', StreamInfoRequest)
    assert req == StreamInfoRequest(subjects_filter="a.>")


def test_numbers_must_fit_go_types() -> None:
    assert requests.decode_required(b'{"offset":-1}', ConsumersRequest).offset == -1
    top = requests.decode_required(b'{"offset":9223372036854775807}', ConsumersRequest)
    assert top.offset == 2**63 - 1
    for body in (b'{"offset":9223372036854775808}', b'{"offset":1e400}', b'{"offset":1.5}'):
        with pytest.raises(ApiError):
            requests.decode_required(body, ConsumersRequest)
    with pytest.raises(ApiError):
        requests.decode_required(b'{"seq":-1}', PurgeRequest)  # a uint64


def test_bodies_that_are_not_objects_are_ignored_where_nats_server_ignores_them() -> None:
    assert requests.decode_request(b"12", ConsumersRequest) == ConsumersRequest()
    assert requests.decode_request(b"", PauseRequest) == PauseRequest()
    with pytest.raises(ApiError):
        requests.decode_request(b"[1]", ConsumersRequest)


def test_lenient_bodies_pass_unknown_fields() -> None:
    req = requests.decode_as(b'{"seq":3,"group":"\xff","x":[1]}', DirectGetRequest)
    assert req.seq == 3
    with pytest.raises(BodyError):
        requests.decode_as(DEEP, DirectGetRequest)


def test_empty_requests() -> None:
    for body in (b"", b"  ", b"{}", b" { } "):
        requests.require_empty(body)
    for body in (b"null", b"[]", b"1", b'{"a":1}', b"{", DEEP):
        with pytest.raises(ApiError) as exc:
            requests.require_empty(body)
        assert exc.value.err_code == 10038


def test_checked_body() -> None:
    assert requests.checked_body(b" null ") == b"{}"
    assert requests.checked_body(b'{"name":"\xff"}') == '{"name":"\ufffd"}'.encode()
    with pytest.raises(ApiError) as exc:
        requests.checked_body(DEEP)
    assert exc.value.description == "invalid JSON: exceeded max depth"


def test_replies_with_surrogates_are_written_as_go_writes_them() -> None:
    text = b"s.\xff".decode("utf-8", "surrogateescape")
    assert not requests.is_utf8(text) and requests.is_utf8("é") and requests.is_utf8("a")
    out = requests.encode_json({"error": {"description": text}, text: [text, 1]})
    assert msgspec.json.decode(out) == {
        "error": {"description": "s.\ufffd"},
        "s.\ufffd": ["s.\ufffd", 1],
    }


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_any_bytes_decode_or_fail_cleanly(body: bytes) -> None:
    try:
        requests.decode_required(body, StreamInfoRequest)
    except ApiError as exc:
        assert exc.err_code == 10025


# -- pull requests (the engine's parser, reached by MSG.NEXT and +NXT) -------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"batch":9223372036854775808}',
        b'{"expires":99999999999999999999}',
        b'{"max_bytes":-9223372036854775809}',
        b'{"idle_heartbeat":1e400}',
        b'{"batch":1,"x":' + DEEP + b"}",
        b'{"batch":"\xff"}',
    ],
)
def test_pull_bodies_beyond_go_types_are_bad_requests(body: bytes) -> None:
    with pytest.raises(pq.PullRequestError):
        pq.parse_next_request(body)


def test_pull_bodies_with_nulls_and_bare_numbers() -> None:
    req = pq.parse_next_request(b'{"batch":null,"no_wait":true,"expires":null}')
    assert (req.batch, req.no_wait, req.expires) == (0, True, 0)
    top = pq.parse_next_request(b'{"batch":9223372036854775807,"expires":-1}')
    assert (top.batch, top.expires) == (2**63 - 1, -1)
    # strconv.Atoi: a sign and ASCII digits within int64; anything else is batch 1.
    assert pq.parse_next_request(b"-3").batch == -3
    assert pq.parse_next_request(b"+7").batch == 7
    for body in ("²", "٣", "7_0", "9" * 5000, "9223372036854775808", "1e3", "[5]"):
        assert pq.parse_next_request(body.encode()).batch == 1, body


# -- CONNECT -------------------------------------------------------------------------------------


def test_connect_options_as_go_decodes_them() -> None:
    assert parse_connect(b'{"name":"\xff","verbose":false}').name == "\ufffd"
    assert parse_connect(b" null ").verbose is None
    for bad in (b"{bad", b"[]", b"12", b'{"protocol":99999999999999999999}', b"[" * 3000):
        with pytest.raises(ProtocolError) as exc:
            parse_connect(bad)
        assert exc.value.silent  # closed without an -ERR, as nats-server does


def test_config_bodies_with_numbers_past_int64() -> None:
    for body in (
        b'{"config":{"ack_wait":99999999999999999999}}',
        b'{"backoff":[1,-9223372036854775809]}',
        b'{"max_msgs":9223372036854775808}',
    ):
        with pytest.raises(ApiError) as exc:
            requests.checked_body(body)
        assert exc.value.err_code == 10025
    fits = b'{"max_msgs":9223372036854775807,"max_age":-9223372036854775808}'
    assert requests.checked_body(fits) == fits
    assert requests.checked_body(b"{bad") == b"{bad"  # the engine's decoder reports it


def test_times_are_read_strictly() -> None:
    assert parse_rfc3339("2024-01-02T03:04:05.5+01:00") == 1704161045500000000
    assert parse_rfc3339("0000-01-01T00:00:00Z") == 0
    for text in ("2024-01-01T00:00:00.٣Z", "٢٠٢٤-01-01T00:00:00Z", "2024-W01-1", "2024-01-01"):
        with pytest.raises(ValueError):
            parse_rfc3339(text)
