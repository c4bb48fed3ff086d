"""The message block wire format and the bulk read request (no server)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.protocol.block import MessageBlock, decode_block, encode_block
from tether.server.nats.stream_read import (
    LIMIT_MAX_BYTES,
    BadReadRequest,
    ReadRequest,
    parse_request,
)

rows = st.lists(
    st.tuples(
        st.integers(1, 2**62),
        st.text(min_size=1, max_size=12),  # non-ASCII subjects take the slow path
        st.binary(max_size=40),
        st.binary(max_size=200),
        st.integers(0, 2**62),
    ),
    max_size=40,
)


@given(rows, st.booleans())
def test_round_trip(messages: list[tuple[int, str, bytes, bytes, int]], headers: bool) -> None:
    seqs = [m[0] for m in messages]
    subjects = [m[1] for m in messages]
    hdrs = [m[2] for m in messages]
    data = [m[3] for m in messages]
    stamps = [m[4] for m in messages]
    payload = encode_block(seqs, stamps, subjects, hdrs if headers else None, data)
    block = decode_block(payload)
    assert block.count == len(messages)
    expected = [(s, subj, h if headers else b"", d, t) for s, subj, h, d, t in messages]
    assert list(block.rows()) == expected


def test_columns_are_arrow_layout() -> None:
    payload = encode_block([7, 9], [100, 200], ["a.b", "c"], None, [b"xy", b""])
    block = decode_block(payload)
    assert block.seqs == (7).to_bytes(8, "little") + (9).to_bytes(8, "little")
    assert block.subject_offsets == b"".join(n.to_bytes(4, "little") for n in (0, 3, 4))
    assert block.subjects == b"a.bc"
    assert block.data == b"xy" and block.header_offsets == b"" and block.headers == b""
    assert block.header_list() == [b"", b""]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b'{"count": 1}',
        # count says 2, columns hold 1
        encode_block([1], [1], ["a"], None, [b"x"]).replace(b"\x01", b"\x02", 1),
    ],
)
def test_malformed_blocks_are_value_errors(payload: bytes) -> None:
    with pytest.raises(ValueError, match="not a message block"):
        decode_block(payload)


def test_offsets_must_span_their_values() -> None:
    good = decode_block(encode_block([1], [1], ["a"], None, [b"xyz"]))
    bad = msgspec.structs.replace(good, data=b"xy")
    with pytest.raises(ValueError, match="offsets"):
        decode_block(msgspec.msgpack.encode(bad))
    assert isinstance(good, MessageBlock)


def test_request_defaults_and_fields() -> None:
    assert parse_request(b"") == ReadRequest()
    assert parse_request(b"  ") == ReadRequest()
    req = parse_request(b'{"seq": 5, "up_to_seq": 9, "subjects": ["a.*"], "no_hdr": true}')
    assert (req.seq, req.up_to_seq, req.subjects, req.no_hdr) == (5, 9, ["a.*"], True)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"{", "truncated"),
        (b"[]", "Expected `object`"),
        (b'{"seq": -1}', "seq must not be negative"),
        (b'{"batch": -3}', "batch must not be negative"),
        (b'{"seq": "1"}', "Expected `int`"),
        (b'{"nope": 1}', "unknown field"),
        (b'{"subjects": ["a..b"]}', "invalid subject filter"),
        (b'{"max_bytes": %d}' % (LIMIT_MAX_BYTES + 1), "max_bytes must be at most"),
        (b'{"block_bytes": %d}' % (LIMIT_MAX_BYTES + 1), "block_bytes must be at most"),
    ],
)
def test_bad_requests_say_why(payload: bytes, why: str) -> None:
    with pytest.raises(BadReadRequest, match=why):
        parse_request(payload)
