"""The NATS protocol parser and encoders: every op, any split, any garbage."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.protocol.nats import (
    Headers,
    Parser,
    ProtocolError,
    encode_connect,
    encode_err,
    encode_headers,
    encode_hmsg,
    encode_hpub,
    encode_info,
    encode_msg,
    encode_pub,
    encode_sub,
    encode_unsub,
    header_value,
    parse_headers,
)
from tether.protocol.nats.errors import (
    MAX_CONTROL_LINE,
    MAX_PAYLOAD,
    UNKNOWN_OPERATION,
)

Call = tuple[Any, ...]


class Recorder:
    """A handler that records every call in order."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def on_connect(self, options: bytes) -> None:
        self.calls.append(("connect", options))

    def on_pub(self, subject: str, reply: str, payload: bytes) -> None:
        self.calls.append(("pub", subject, reply, payload))

    def on_hpub(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        self.calls.append(("hpub", subject, reply, headers, payload))

    def on_sub(self, subject: str, queue: str, sid: str) -> None:
        self.calls.append(("sub", subject, queue, sid))

    def on_unsub(self, sid: str, max_msgs: int) -> None:
        self.calls.append(("unsub", sid, max_msgs))

    def on_ping(self) -> None:
        self.calls.append(("ping",))

    def on_pong(self) -> None:
        self.calls.append(("pong",))

    def on_info(self, info: bytes) -> None:
        self.calls.append(("info", info))

    def on_msg(self, subject: str, sid: str, reply: str, payload: bytes) -> None:
        self.calls.append(("msg", subject, sid, reply, payload))

    def on_hmsg(self, subject: str, sid: str, reply: str, headers: bytes, payload: bytes) -> None:
        self.calls.append(("hmsg", subject, sid, reply, headers, payload))

    def on_ok(self) -> None:
        self.calls.append(("ok",))

    def on_err(self, message: str) -> None:
        self.calls.append(("err", message))


def parse(
    chunks: list[bytes] | bytes, recorder: Recorder | None = None, **kwargs: Any
) -> tuple[list[Call], ProtocolError | None]:
    """Feed the chunks; the calls made, and the error that stopped parsing (if any)."""
    if isinstance(chunks, bytes):
        chunks = [chunks]
    rec = Recorder() if recorder is None else recorder
    parser = Parser(rec, **kwargs)
    for chunk in chunks:
        try:
            parser.feed(chunk)
        except ProtocolError as exc:
            return rec.calls, exc
    return rec.calls, None


def ok(data: bytes | list[bytes], **kwargs: Any) -> list[Call]:
    calls, error = parse(data, **kwargs)
    assert error is None, f"{error.message!r}" if error else ""
    return calls


def fails(data: bytes | list[bytes], **kwargs: Any) -> ProtocolError:
    _, error = parse(data, **kwargs)
    assert error is not None, "expected a protocol error"
    return error


# -- every op ------------------------------------------------------------------------------

CLIENT_OPS: list[tuple[bytes, Call]] = [
    (b'CONNECT {"verbose":false}\r\n', ("connect", b'{"verbose":false}')),
    (b"PUB foo 5\r\nhello\r\n", ("pub", "foo", "", b"hello")),
    (b"PUB foo.bar reply.to 0\r\n\r\n", ("pub", "foo.bar", "reply.to", b"")),
    (b"PUB foo 4\r\n\r\n\r\n\r\n", ("pub", "foo", "", b"\r\n\r\n")),
    (
        b"HPUB foo 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",
        ("hpub", "foo", "", b"NATS/1.0\r\n\r\n", b"hello"),
    ),
    (
        b"HPUB foo r 16 16\r\nNATS/1.0 503\r\n\r\n\r\n",
        ("hpub", "foo", "r", b"NATS/1.0 503\r\n\r\n", b""),
    ),
    (b"SUB foo 1\r\n", ("sub", "foo", "", "1")),
    (b"SUB foo.* workers 22\r\n", ("sub", "foo.*", "workers", "22")),
    (b"SUB _INBOX.x.*  1\r\n", ("sub", "_INBOX.x.*", "", "1")),  # nats-py's double space
    (b"UNSUB 1\r\n", ("unsub", "1", 0)),
    (b"UNSUB 3 \r\n", ("unsub", "3", 0)),  # nats-py's trailing space
    (b"UNSUB 1 10\r\n", ("unsub", "1", 10)),
    (b"UNSUB 1 x\r\n", ("unsub", "1", 0)),  # a malformed maximum: remove now
    (b"UNSUB 1 1234567890\r\n", ("unsub", "1", 0)),  # more digits than nats-server reads
    (b"PING\r\n", ("ping",)),
    (b"PONG\r\n", ("pong",)),
    (b"+OK\r\n", ("ok",)),
]

SERVER_OPS: list[tuple[bytes, Call]] = [
    (b'INFO {"server_id":"X"} \r\n', ("info", b'{"server_id":"X"}')),
    (b"MSG foo 1 5\r\nhello\r\n", ("msg", "foo", "1", "", b"hello")),
    (b"MSG foo 1 _INBOX.a 2\r\nhi\r\n", ("msg", "foo", "1", "_INBOX.a", b"hi")),
    (
        b"HMSG foo 9 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
        ("hmsg", "foo", "9", "", b"NATS/1.0\r\n\r\n", b"hi"),
    ),
    (
        b"HMSG _INBOX.abc.1 10 43 43\r\nNATS/1.0 503\r\nNats-Subject: nobody.here\r\n\r\n\r\n",
        (
            "hmsg",
            "_INBOX.abc.1",
            "10",
            "",
            b"NATS/1.0 503\r\nNats-Subject: nobody.here\r\n\r\n",
            b"",
        ),
    ),
    (
        b"HMSG foo 9 r.x 12 12\r\nNATS/1.0\r\n\r\n\r\n",
        ("hmsg", "foo", "9", "r.x", b"NATS/1.0\r\n\r\n", b""),
    ),
    (b"-ERR 'Unknown Protocol Operation'\r\n", ("err", "Unknown Protocol Operation")),
    (b"-ERR unquoted\r\n", ("err", "unquoted")),
    (b"PING\r\n", ("ping",)),
    (b"PONG\r\n", ("pong",)),
    (b"+OK\r\n", ("ok",)),
]


@pytest.mark.parametrize(("data", "call"), CLIENT_OPS + SERVER_OPS)
def test_each_op(data: bytes, call: Call) -> None:
    assert ok(data) == [call]


@pytest.mark.parametrize(("data", "call"), CLIENT_OPS)
def test_each_client_op_server_side(data: bytes, call: Call) -> None:
    assert ok(data, server_side=True) == [call]


@pytest.mark.parametrize(
    "data",
    [b"MSG foo 1 2\r\nhi\r\n", b"HMSG foo 1 12 12\r\nNATS/1.0\r\n\r\n\r\n", b"MSG foo"],
)
def test_server_side_rejects_server_ops_at_their_line(data: bytes) -> None:
    # As soon as the op line is known, without waiting for a payload.
    error = fails(data, server_side=True)
    assert error.message == UNKNOWN_OPERATION and not error.silent


@pytest.mark.parametrize(("data", "call"), CLIENT_OPS + SERVER_OPS)
def test_lowercase_ops(data: bytes, call: Call) -> None:
    keyword, _, rest = data.partition(b" ")
    if not rest:
        keyword, rest = data[:-2], b""
        assert ok(keyword.lower() + b"\r\n") == [call]
    else:
        assert ok(keyword.lower() + b" " + rest) == [call]


def test_mixed_case_and_tabs() -> None:
    assert ok(b"Pub\tfoo\t\t2\r\nhi\r\nsUb foo 1\r\nPiNg\r\n") == [
        ("pub", "foo", "", b"hi"),
        ("sub", "foo", "", "1"),
        ("ping",),
    ]


def test_lf_only_line_endings() -> None:
    assert ok(b"SUB foo 1\nPUB foo 2\nhi\r\nPING\n") == [
        ("sub", "foo", "", "1"),
        ("pub", "foo", "", b"hi"),
        ("ping",),
    ]


def test_nats_server_leniencies() -> None:
    # The rest of a PING/PONG/+OK line is ignored; CONNECT and INFO need no space.
    assert ok(b"PINGXYZ\r\nPONG junk\r\n+OKAY\r\nCONNECT{}\r\nINFO{}\r\n") == [
        ("ping",),
        ("pong",),
        ("ok",),
        ("connect", b"{}"),
        ("info", b"{}"),
    ]


def test_connect_and_info_arguments_are_stripped() -> None:
    assert ok(b"CONNECT   {}  \r\nINFO\t{}\r\nCONNECT\r\n") == [
        ("connect", b"{}"),
        ("info", b"{}"),
        ("connect", b""),
    ]


def test_subjects_keep_any_bytes() -> None:
    calls = ok(b"PUB caf\xc3\xa9.\xff 1\r\nx\r\n")
    subject = calls[0][1]
    assert subject == "café.\udcff"
    assert subject.encode("utf-8", "surrogateescape") == b"caf\xc3\xa9.\xff"


# -- splits and batches ------------------------------------------------------------------------

STREAM = b"".join(data for data, _ in CLIENT_OPS + SERVER_OPS)
STREAM_CALLS = [call for _, call in CLIENT_OPS + SERVER_OPS]


def test_many_frames_in_one_read() -> None:
    assert ok(STREAM) == STREAM_CALLS
    assert ok(STREAM * 50) == STREAM_CALLS * 50


def test_split_at_every_offset() -> None:
    for cut in range(len(STREAM) + 1):
        assert ok([STREAM[:cut], STREAM[cut:]]) == STREAM_CALLS, cut


def test_split_at_every_pair_of_offsets() -> None:
    data = b"PUB a.b r 5\r\nhello\r\nHPUB h 12 14\r\nNATS/1.0\r\n\r\nhi\r\nSUB x q 1\r\n"
    expected = ok(data)
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert ok([data[:i], data[i:j], data[j:]]) == expected, (i, j)


def test_byte_by_byte() -> None:
    assert ok([STREAM[i : i + 1] for i in range(len(STREAM))]) == STREAM_CALLS


def test_empty_feeds_are_harmless() -> None:
    assert ok([b"", b"PI", b"", b"NG\r\n", b""]) == [("ping",)]


def test_payload_may_arrive_much_later() -> None:
    rec = Recorder()
    parser = Parser(rec)
    parser.feed(b"PUB big 100000\r\n")
    for _ in range(100):
        parser.feed(b"x" * 1000)
    assert rec.calls == []
    assert parser.pending == 100000
    parser.feed(b"\r\n")
    assert rec.calls == [("pub", "big", "", b"x" * 100000)]
    assert parser.pending == 0


# -- errors ----------------------------------------------------------------------------------------

# (input, error message or None for a silent close)
ERRORS: list[tuple[bytes, str | None]] = [
    (b"FOO bar\r\n", UNKNOWN_OPERATION),
    (b"FOO", UNKNOWN_OPERATION),  # detected before the newline arrives
    (b"PUX", UNKNOWN_OPERATION),
    (b"\r\n", UNKNOWN_OPERATION),
    (b" PING\r\n", UNKNOWN_OPERATION),
    (b"\tSUB foo 1\r\n", UNKNOWN_OPERATION),
    (b"PUBfoo 1\r\n", UNKNOWN_OPERATION),
    (b"PUB\r\n", UNKNOWN_OPERATION),
    (b"UNSUB\r\n", UNKNOWN_OPERATION),
    (b"-ERR\r\n", UNKNOWN_OPERATION),
    (b"PUB foo 2\r\nhello\r\n", UNKNOWN_OPERATION),  # payload longer than declared
    (b"PUB foo 5\r\nhi\r\nPING\r\n", UNKNOWN_OPERATION),  # shorter, then more ops
    (b"PUB foo 2\r\nhi\n", UNKNOWN_OPERATION),
    (b"PUB foo 2\r\nhiXY", UNKNOWN_OPERATION),
    (b"PUB foo 1048577\r\n", MAX_PAYLOAD),
    (b"HPUB foo 0 1048577\r\n", MAX_PAYLOAD),
    (b"PUB foo 1234567890\r\n", None),  # longer than nats-server's sizes
    (b"PUB foo -1\r\n", None),
    (b"PUB foo +1\r\n", None),
    (b"PUB foo 1_0\r\n", None),
    (b"PUB foo abc\r\n", None),
    (b"PUB foo\r\n", None),
    (b"PUB \r\n", None),
    (b"PUB a b c 1\r\n", None),
    (b"pub a b c 1\r\n", None),
    (b"HPUB foo 12\r\n", None),
    (b"HPUB foo 12 10\r\n", None),  # header longer than the total
    (b"HPUB foo x 10\r\n", None),
    (b"SUB foo\r\n", None),
    (b"SUB a b c d\r\n", None),
    (b"UNSUB \r\n", None),
    (b"UNSUB 1 2 3\r\n", None),
    (b"SUB " + b"a" * 4095 + b" 1\r\n", MAX_CONTROL_LINE),
    (b"SUB " + b"a" * 5000, MAX_CONTROL_LINE),  # detected before the newline arrives
    (b"CONNECT " + b"x" * 5000, MAX_CONTROL_LINE),
    (b"X" * 5000, UNKNOWN_OPERATION),
    (b"X" * 5000 + b"\r\n", UNKNOWN_OPERATION),
]


@pytest.mark.parametrize(("data", "message"), ERRORS)
def test_errors(data: bytes, message: str | None) -> None:
    error = fails(data)
    if message is None:
        assert error.silent
    else:
        assert not error.silent
        assert error.message == message
    assert error.fatal


@pytest.mark.parametrize(("data", "message"), ERRORS)
def test_errors_byte_by_byte(data: bytes, message: str | None) -> None:
    whole = fails(data)
    split = fails([data[i : i + 1] for i in range(len(data))])
    assert (split.message, split.silent) == (whole.message, whole.silent)


def test_frames_before_an_error_are_delivered() -> None:
    calls, error = parse(b"PING\r\nSUB foo 1\r\nBAD\r\nPING\r\n")
    assert calls == [("ping",), ("sub", "foo", "", "1")]
    assert error is not None and error.message == UNKNOWN_OPERATION


def test_parser_is_dead_after_an_error() -> None:
    rec = Recorder()
    parser = Parser(rec)
    with pytest.raises(ProtocolError):
        parser.feed(b"BAD\r\n")
    with pytest.raises(ProtocolError):
        parser.feed(b"PING\r\n")
    assert rec.calls == []


def test_control_line_limit_counts_arguments_only() -> None:
    # nats-server measures what follows the keyword: 4096 bytes pass, 4097 do not.
    assert ok(b"SUB " + b"a" * 4094 + b" 1\r\n") == [("sub", "a" * 4094, "", "1")]
    assert ok(b"SUB\t\t" + b"a" * 4094 + b" 1\r\n") == [("sub", "a" * 4094, "", "1")]
    assert fails(b"SUB " + b"a" * 4095 + b" 1\r\n").message == MAX_CONTROL_LINE
    assert ok(b"PUB abc 1\r\nx\r\n", max_control_line=5) == [("pub", "abc", "", b"x")]
    assert fails(b"PUB abcd 1\r\nx\r\n", max_control_line=5).message == MAX_CONTROL_LINE


def test_long_ping_line_is_not_held() -> None:
    # nats-server ignores the rest of a PING line however long; so do we, without
    # buffering it.
    rec = Recorder()
    parser = Parser(rec)
    parser.feed(b"PING")
    for _ in range(20):
        parser.feed(b"x" * 1000)
        assert parser.pending < 5000
    parser.feed(b"\r\nPONG\r\n")
    assert rec.calls == [("ping",), ("pong",)]


def test_max_payload_is_configurable() -> None:
    assert ok(b"PUB a 3\r\nabc\r\n", max_payload=3) == [("pub", "a", "", b"abc")]
    assert fails(b"PUB a 4\r\n", max_payload=3).message == MAX_PAYLOAD
    assert fails(b"HPUB a 2 4\r\n", max_payload=3).message == MAX_PAYLOAD
    assert fails(b"MSG a 1 4\r\n", max_payload=3).message == MAX_PAYLOAD


# -- property tests --------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Fragments that make random input reach deep states of the parser.
_FRAGMENTS = [
    b"PUB ",
    b"HPUB ",
    b"SUB ",
    b"UNSUB ",
    b"MSG ",
    b"HMSG ",
    b"PING",
    b"PONG",
    b"CONNECT ",
    b"INFO ",
    b"+OK",
    b"-ERR ",
    b"foo",
    b"foo.bar",
    b" ",
    b"\t",
    b"\r\n",
    b"\n",
    b"\r",
    b"0",
    b"1",
    b"2",
    b"12",
    b"-1",
    b"NATS/1.0\r\n\r\n",
    b"{}",
]
garbage = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(_FRAGMENTS) | st.binary(max_size=4), max_size=40).map(b"".join),
)


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@FUZZ
@given(data=garbage, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_bytes_give_calls_or_protocol_error(data: bytes, cuts: list[int]) -> None:
    for server_side in (False, True):
        rec = Recorder()
        parser = Parser(rec, server_side=server_side, max_control_line=64, max_payload=64)
        try:
            for chunk in _chunked(data, cuts):
                parser.feed(chunk)
        except ProtocolError as exc:
            # Raised on purpose, not the parser's last-resort conversion of an internal
            # IndexError or ValueError. Anything else propagates and fails the test.
            assert exc.__cause__ is None, repr(exc.__cause__)


@FUZZ
@given(data=garbage, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_chunking_never_changes_the_outcome(data: bytes, cuts: list[int]) -> None:
    kwargs: dict[str, Any] = {"max_control_line": 64, "max_payload": 64}
    whole_calls, whole_error = parse(data, **kwargs)
    calls, error = parse(_chunked(data, cuts), **kwargs)
    assert calls == whole_calls
    if whole_error is None:
        assert error is None
    else:
        assert error is not None
        assert (error.message, error.silent) == (whole_error.message, whole_error.silent)


token = st.text(
    alphabet=st.characters(
        blacklist_categories=["Cs", "Zs", "Zl", "Zp", "Cc"], blacklist_characters=". \t\r\n"
    ),
    min_size=1,
    max_size=8,
)
subject = st.lists(token, min_size=1, max_size=5).map(".".join)
sid = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
reply = st.just("") | subject
payload = st.binary(max_size=200)
header_key = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_0123456789",
    min_size=1,
    max_size=12,
)
header_val = st.text(
    alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]), max_size=20
).map(str.strip)
header_items = st.lists(st.tuples(header_key, header_val), max_size=5)
cuts = st.lists(st.integers(min_value=0, max_value=2000), max_size=6)


@ROUND_TRIP
@given(
    frames=st.lists(
        st.one_of(
            st.tuples(st.just("pub"), subject, reply, payload),
            st.tuples(st.just("hpub"), subject, reply, header_items, payload),
            st.tuples(st.just("sub"), subject, st.just("") | token, sid),
            st.tuples(st.just("unsub"), sid, st.integers(min_value=0, max_value=10**9 - 1)),
            st.tuples(st.just("connect"), st.dictionaries(header_key, st.booleans() | sid)),
        ),
        max_size=10,
    ),
    cuts=cuts,
)
def test_client_frames_round_trip(frames: list[tuple[Any, ...]], cuts: list[int]) -> None:
    data = b""
    expected: list[Call] = []
    for frame in frames:
        kind = frame[0]
        if kind == "pub":
            _, subj, rep, body = frame
            data += encode_pub(subj, body, rep)
            expected.append(("pub", subj, rep, body))
        elif kind == "hpub":
            _, subj, rep, items, body = frame
            block = encode_headers(items)
            data += encode_hpub(subj, block, body, rep)
            expected.append(("hpub", subj, rep, block, body))
        elif kind == "sub":
            _, subj, queue, s = frame
            data += encode_sub(subj, s, queue)
            expected.append(("sub", subj, queue, s))
        elif kind == "unsub":
            _, s, n = frame
            data += encode_unsub(s, n)
            expected.append(("unsub", s, n))
        else:
            _, options = frame
            data += encode_connect(options)
            expected.append(("connect", json.dumps(options, separators=(",", ":")).encode()))
    for server_side in (False, True):
        calls = ok(_chunked(data, cuts), server_side=server_side)
        # CONNECT's JSON text may differ in spacing: compare it decoded.
        assert [_decoded(c) for c in calls] == [_decoded(c) for c in expected]


def _decoded(call: Call) -> Call:
    if call[0] in ("connect", "info"):
        return (call[0], json.loads(call[1]))
    return call


@ROUND_TRIP
@given(
    frames=st.lists(
        st.one_of(
            st.tuples(st.just("msg"), subject, sid, reply, payload),
            st.tuples(st.just("hmsg"), subject, sid, reply, header_items, payload),
            st.tuples(st.just("info"), st.dictionaries(header_key, st.integers() | sid)),
            st.tuples(st.just("err"), header_val.filter(lambda v: "'" not in v and v)),
        ),
        max_size=10,
    ),
    cuts=cuts,
)
def test_server_frames_round_trip(frames: list[tuple[Any, ...]], cuts: list[int]) -> None:
    data = b""
    expected: list[Call] = []
    for frame in frames:
        kind = frame[0]
        if kind == "msg":
            _, subj, s, rep, body = frame
            data += encode_msg(_b(subj), _b(s), body, _b(rep))
            expected.append(("msg", subj, s, rep, body))
        elif kind == "hmsg":
            _, subj, s, rep, items, body = frame
            block = encode_headers(items)
            data += encode_hmsg(_b(subj), _b(s), block, body, _b(rep))
            expected.append(("hmsg", subj, s, rep, block, body))
        elif kind == "info":
            _, info = frame
            data += encode_info(info)
            expected.append(("info", info))
        else:
            _, message = frame
            data += encode_err(message)
            expected.append(("err", message))
    calls = ok(_chunked(data, cuts))
    assert [_decoded(c) if c[0] == "info" else c for c in calls] == [
        c if c[0] != "info" else ("info", c[1]) for c in expected
    ]


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


# -- headers ---------------------------------------------------------------------------------------


@ROUND_TRIP
@given(
    items=header_items,
    status=st.just(0) | st.integers(min_value=100, max_value=599),
    description=st.just("") | header_val,
)
def test_headers_round_trip(items: list[tuple[str, str]], status: int, description: str) -> None:
    block = encode_headers(items, status, description if status else "")
    assert block.startswith(b"NATS/1.0") and block.endswith(b"\r\n\r\n")
    parsed = parse_headers(block)
    assert parsed.status == status
    assert parsed.description == (description if status else "")
    assert list(parsed.items) == items
    for key, value in items:
        first = next(v for k, v in items if k.lower() == key.lower())
        assert parsed.get(key.upper()) == first
        assert value is not None


def test_header_encoding_exact() -> None:
    assert encode_headers([("A", "1"), ("A", "2")]) == b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n"
    assert encode_headers([], 503) == b"NATS/1.0 503\r\n\r\n"
    assert (
        encode_headers([("Nats-Last-Consumer", "2")], 100, "Idle Heartbeat")
        == b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 2\r\n\r\n"
    )


def test_parse_status_headers() -> None:
    h = parse_headers(b"NATS/1.0 404 No Messages\r\n\r\n")
    assert (h.status, h.description, h.items) == (404, "No Messages", ())
    h = parse_headers(b"NATS/1.0 503\r\nNats-Subject: x\r\n\r\n")
    assert (h.status, h.description, h.to_dict()) == (503, "", {"Nats-Subject": "x"})
    h = parse_headers(b"NATS/1.0\r\nKey:  spaced value \r\nbroken line\r\n\r\n")
    assert h == Headers(0, "", (("Key", "spaced value"),))
    with pytest.raises(ProtocolError):
        parse_headers(b"HTTP/1.1 200 OK\r\n\r\n")


def test_header_value_lookup() -> None:
    block = b"NATS/1.0\r\nNats-Msg-Id: abc\r\nnats-expected-stream: S\r\n\r\n"
    assert header_value(block, b"Nats-Msg-Id") == b"abc"
    assert header_value(block, b"Nats-Expected-Stream") == b"S"
    assert header_value(block, b"Missing") is None
    assert header_value(b"", b"Nats-Msg-Id") is None


# -- encoders --------------------------------------------------------------------------------------


def test_encoders_exact() -> None:
    assert encode_pub("a.b", b"hi") == b"PUB a.b 2\r\nhi\r\n"
    assert encode_pub("a.b", b"", "r") == b"PUB a.b r 0\r\n\r\n"
    assert encode_hpub("a", b"NATS/1.0\r\n\r\n", b"x", "r") == (
        b"HPUB a r 12 13\r\nNATS/1.0\r\n\r\nx\r\n"
    )
    assert encode_sub("a.*", "1") == b"SUB a.* 1\r\n"
    assert encode_sub("a.*", "1", "q") == b"SUB a.* q 1\r\n"
    assert encode_unsub("1") == b"UNSUB 1\r\n"
    assert encode_unsub("1", 5) == b"UNSUB 1 5\r\n"
    assert encode_msg(b"a", b"1", b"hi") == b"MSG a 1 2\r\nhi\r\n"
    assert encode_msg(b"a", b"1", b"hi", b"r") == b"MSG a 1 r 2\r\nhi\r\n"
    assert encode_hmsg(b"a", b"1", b"NATS/1.0\r\n\r\n", b"") == (
        b"HMSG a 1 12 12\r\nNATS/1.0\r\n\r\n\r\n"
    )
    assert encode_info({"a": 1}) == b'INFO {"a":1} \r\n'  # nats-server's space before CRLF
    assert encode_connect({"verbose": False}) == b'CONNECT {"verbose":false}\r\n'
    assert encode_err("Slow Consumer") == b"-ERR 'Slow Consumer'\r\n"


# PUB lines that differ only in their reply, and near misses of that shape: the parser
# predicts such lines in one read, which must give what it gives a byte at a time (where
# no next line is ever at hand, so nothing is predicted).
_REPLIES = [b"r.1", b"r.2", b"_INBOX.x.3"]
_ODD_REPLIES = [b"a\x0cb", b"a b", b"", b"r\t", b" r", b"a" * 70]


@st.composite
def _reply_run_frames(draw: st.DrawFn) -> bytes:
    """A frame like ``PUB foo <reply> 1`` + ``a``; one part in a few is a near miss."""
    parts = {"subj": b"foo", "sep": b" ", "rep": draw(st.sampled_from(_REPLIES))}
    parts.update({"size": b"1", "data": b"a", "end": b"\r\n"})
    odd = draw(st.sampled_from(["", "", "", "subj", "sep", "rep", "size", "data", "end"]))
    if odd:
        parts[odd] = draw(
            st.sampled_from(
                {
                    "subj": [b"foo.bar", b"fo"],
                    "sep": [b"  ", b"\t"],
                    "rep": _ODD_REPLIES,
                    "size": [b"2", b"01", b"x"],
                    "data": [b"ab", b""],
                    "end": [b"\n", b"xx"],
                }[odd]
            )
        )
    return b"PUB %s%s%s %s\r\n%s%s" % tuple(
        parts[k] for k in ("subj", "sep", "rep", "size", "data", "end")
    )


@FUZZ
@given(st.lists(_reply_run_frames(), max_size=12), st.sampled_from([b"", b"PING\r\n", b"PUB foo"]))
def test_pubs_with_replies_in_one_read_parse_as_byte_by_byte(
    frames: list[bytes], trailer: bytes
) -> None:
    data = b"".join(frames) + trailer
    # Handed over one by one, or as runs.
    _parses_as_byte_by_byte(data, [Recorder(), RunRecorder()], max_control_line=64)


def _parses_as_byte_by_byte(data: bytes, recorders: list[Recorder], **options: Any) -> None:
    """``data`` in one read gives each recorder what it gives a byte at a time."""
    kwargs: dict[str, Any] = {"server_side": True, **options}
    calls, error = parse([data[i : i + 1] for i in range(len(data))], **kwargs)
    for recorder in recorders:
        whole_calls, whole_error = parse(data, recorder=recorder, **kwargs)
        assert whole_calls == calls
        assert (whole_error is None) == (error is None)
        if whole_error is not None and error is not None:
            assert (whole_error.message, whole_error.silent) == (error.message, error.silent)


class RunRecorder(Recorder):
    """Takes runs of PUBs (``on_pub_run``), recorded as the PUBs they stand for."""

    def on_pub_run(self, subject: str, replies: list[str], payloads: list[bytes]) -> None:
        assert len(replies) == len(payloads) > 0
        for reply, payload in zip(replies, payloads, strict=True):
            self.calls.append(("pub", subject, reply, payload))


# Ack PUBs (each to its own ``$JS.ACK.…`` subject), and near misses of that shape: the
# parser hands those it finds in one read to ``on_pub_batch``, which must give what it
# gives a byte at a time.
_ACK_SUBJECTS = [b"$JS.ACK.S.C.1.%d.%d.1.0" % (i, i) for i in (1, 2, 30)]


@st.composite
def _ack_frames(draw: st.DrawFn) -> bytes:
    """A frame like ``PUB $JS.ACK.S.C.1.2.2.1.0 [reply] 4`` + ``+ACK``; one in a few is
    a near miss."""
    parts = {"subj": draw(st.sampled_from(_ACK_SUBJECTS)), "sep": b" "}
    parts["rep"] = draw(st.sampled_from([b"", b"r.1 "]))
    data = draw(st.sampled_from([b"", b"+ACK", b"-NAK"]))
    parts.update({"size": b"%d" % len(data), "data": data, "end": b"\r\n"})
    odd = draw(st.sampled_from(["", "", "", "subj", "sep", "rep", "size", "data", "end"]))
    if odd:
        parts[odd] = draw(
            st.sampled_from(
                {
                    "subj": [b"$JS.ACKS", b"$JS.ACK.", b"$JS.ACK..x", b"$JS.ACK." + b"a" * 70],
                    "sep": [b"  ", b"\t"],
                    "rep": [b"a b ", b"r\t", b"a" * 70 + b" "],
                    "size": [b"9", b"01", b"x", b"9999999999", b"+1"],
                    "data": [b"ab", b"+ACK+ACK"],
                    "end": [b"\n", b"xx"],
                }[odd]
            )
        )
    return b"PUB %s%s%s%s\r\n%s%s" % tuple(
        parts[k] for k in ("subj", "sep", "rep", "size", "data", "end")
    )


class BatchRecorder(RunRecorder):
    """Also takes batches of acks (``on_pub_batch``), recorded as the PUBs they stand for."""

    def on_pub_batch(self, subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
        assert len(subjects) == len(replies) == len(payloads) > 0
        for subject, reply, payload in zip(subjects, replies, payloads, strict=True):
            self.calls.append(("pub", subject, reply, payload))


@FUZZ
@given(
    st.lists(st.one_of(_ack_frames(), _reply_run_frames()), max_size=12),
    st.sampled_from([b"", b"PING\r\n", b"PUB $JS.ACK.S"]),
)
def test_acks_in_one_read_parse_as_byte_by_byte(frames: list[bytes], trailer: bytes) -> None:
    data = b"".join(frames) + trailer
    _parses_as_byte_by_byte(data, [Recorder(), BatchRecorder()], max_control_line=64, max_payload=8)


class CountingBatchRecorder(BatchRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def on_pub_batch(self, subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
        self.batches.append(len(subjects))
        super().on_pub_batch(subjects, replies, payloads)


def test_a_batch_of_acks_is_one_call() -> None:
    acks = b"".join(b"PUB $JS.ACK.S.C.1.%d.%d.1.0 0\r\n\r\n" % (i, i) for i in range(1, 6))
    recorder = CountingBatchRecorder()
    calls, error = parse(acks + b"PING\r\n" + acks[:20], recorder=recorder, server_side=True)
    assert error is None and recorder.batches == [5]
    assert calls[0] == ("pub", "$JS.ACK.S.C.1.1.1.1.0", "", b"") and calls[5] == ("ping",)
    assert len(calls) == 6  # the partial ack after the PING waits for its bytes
