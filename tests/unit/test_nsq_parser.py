"""The NSQ protocol parser and encoders: bytes in, commands out; nsqd's errors and texts."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.protocol.nsq import (
    Command,
    DPub,
    Failure,
    FinRun,
    FrameReader,
    Limits,
    MPub,
    Parser,
    PubRun,
    commands,
    frames,
    go_quote,
    is_valid_name,
)

MAGIC = b"  V2"


def parse(data: bytes, limits: Limits | None = None) -> list[object]:
    return list(Parser(limits).feed(MAGIC + data))


def size(n: int) -> bytes:
    return struct.pack(">i", n)


# -- commands ----------------------------------------------------------------------------------


def test_every_command_parses() -> None:
    data = (
        commands.identify({"feature_negotiation": True})
        + commands.sub("t", "c")
        + commands.rdy(5)
        + commands.fin(b"0" * 16)
        + commands.req(b"1" * 16, 500)
        + commands.touch(b"2" * 16)
        + commands.nop()
        + commands.cls()
        + commands.pub("t", b"x")
        + commands.mpub("t", [b"a", b"bc"])
        + commands.dpub("t", 250, b"later")
        + commands.auth(b"secret")
    )
    parser = Parser()
    out = parser.feed(MAGIC + data)
    assert out == [Command(b"IDENTIFY", [], b'{"feature_negotiation":true}')]
    out = parser.feed(parser.rest())  # the parser stops after IDENTIFY
    assert out == [
        Command(b"SUB", [b"t", b"c"]),
        Command(b"RDY", [b"5"]),
        FinRun([b"0" * 16]),
        Command(b"REQ", [b"1" * 16, b"500"]),
        Command(b"TOUCH", [b"2" * 16]),
        Command(b"NOP", []),
        Command(b"CLS", []),
        PubRun(b"t", [b"x"]),
        MPub(b"t", [b"a", b"bc"]),
        DPub(b"t", 250, b"later"),
        Command(b"AUTH", [], b"secret"),
    ]


def test_runs_of_pub_and_fin_come_as_one_command() -> None:
    data = b"".join(commands.pub("t", b"%d" % i) for i in range(5))
    data += commands.pub("u", b"other")
    data += b"".join(commands.fin(b"%016x" % i) for i in range(3))
    assert parse(data) == [
        PubRun(b"t", [b"0", b"1", b"2", b"3", b"4"]),
        PubRun(b"u", [b"other"]),
        FinRun([b"%016x" % i for i in range(3)]),
    ]


def test_a_carriage_return_before_the_newline_is_dropped() -> None:
    assert parse(b"RDY 3\r\nNOP\r\n") == [Command(b"RDY", [b"3"]), Command(b"NOP", [])]


def test_a_fin_with_a_bad_id_is_left_to_the_connection() -> None:
    assert parse(b"FIN abc\nFIN\n") == [Command(b"FIN", [b"abc"]), Command(b"FIN", [])]


def test_mpub_bytes_declared_but_unused_are_the_next_command() -> None:
    body = size(1) + size(1) + b"a" + b"NOP\n"
    assert parse(b"MPUB t\n" + size(len(body)) + body) == [
        MPub(b"t", [b"a"]),
        Command(b"NOP", []),
    ]


# -- errors: nsqd's codes and texts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code", "text"),
    [
        (b"FOO bar\n", b"E_INVALID", b"invalid command FOO"),
        (b"\n", b"E_INVALID", b"invalid command "),
        (b"pub t\n", b"E_INVALID", b"invalid command pub"),
        (b"PUB\n", b"E_INVALID", b"PUB insufficient number of parameters"),
        (b"PUB a/b\n", b"E_BAD_TOPIC", b'PUB topic name "a/b" is not valid'),
        (
            b"PUB " + b"x" * 65 + b"\n",
            b"E_BAD_TOPIC",
            b'PUB topic name "' + b"x" * 65 + b'" is not valid',
        ),
        (b"PUB t\n" + size(0), b"E_BAD_MESSAGE", b"PUB invalid message body size 0"),
        (b"PUB t\n" + size(-1), b"E_BAD_MESSAGE", b"PUB invalid message body size -1"),
        (b"PUB t\n" + size(11), b"E_BAD_MESSAGE", b"PUB message too big 11 > 10"),
        (b"MPUB\n", b"E_INVALID", b"MPUB insufficient number of parameters"),
        (b"MPUB a+b\n", b"E_BAD_TOPIC", b'E_BAD_TOPIC MPUB topic name "a+b" is not valid'),
        (b"MPUB t\n" + size(0), b"E_BAD_BODY", b"MPUB invalid body size 0"),
        (b"MPUB t\n" + size(101), b"E_BAD_BODY", b"MPUB body too big 101 > 100"),
        (b"MPUB t\n" + size(4) + size(0), b"E_BAD_BODY", b"MPUB invalid message count 0"),
        (b"MPUB t\n" + size(4) + size(20), b"E_BAD_BODY", b"MPUB invalid message count 20"),
        (
            b"MPUB t\n" + size(8) + size(1) + size(0),
            b"E_BAD_MESSAGE",
            b"MPUB invalid message(0) body size 0",
        ),
        (
            b"MPUB t\n" + size(8) + size(1) + size(11),
            b"E_BAD_MESSAGE",
            b"MPUB message too big 11 > 10",
        ),
        (
            b"MPUB t\n" + size(10) + size(1) + size(5) + b"ab",
            b"E_BAD_MESSAGE",
            b"MPUB failed to read message body",
        ),
        (
            b"MPUB t\n" + size(9) + size(2) + size(1) + b"a",
            b"E_BAD_MESSAGE",
            b"MPUB failed to read message(1) body size",
        ),
        (b"DPUB t\n", b"E_INVALID", b"DPUB insufficient number of parameters"),
        (b"DPUB t -5\n", b"E_INVALID", b"DPUB could not parse timeout -5"),
        (b"DPUB t 1001\n", b"E_INVALID", b"DPUB timeout 1001 out of range 0-1000"),
        (b"DPUB t 10\n" + size(0), b"E_BAD_MESSAGE", b"DPUB invalid message body size 0"),
        (b"IDENTIFY\n" + size(101), b"E_BAD_BODY", b"IDENTIFY body too big 101 > 100"),
        (b"IDENTIFY\n" + size(0), b"E_BAD_BODY", b"IDENTIFY invalid body size 0"),
        (b"AUTH x\n", b"E_INVALID", b"AUTH invalid number of parameters"),
        (b"AUTH\n" + size(-3), b"E_BAD_BODY", b"AUTH invalid body size -3"),
    ],
)
def test_errors_before_the_body(data: bytes, code: bytes, text: bytes) -> None:
    limits = Limits(max_msg_size=10, max_body_size=100, max_req_timeout_ms=1000)
    out = Parser(limits).feed(MAGIC + data)
    assert out == [Failure(code, text)]


def test_a_bad_magic_is_refused_on_its_first_wrong_byte() -> None:
    assert Parser().feed(b"  V1") == [Failure(b"E_BAD_PROTOCOL", b"")]
    assert Parser().feed(b"G") == [Failure(b"E_BAD_PROTOCOL", b"")]
    assert Parser().feed(b"  ") == []


def test_a_line_too_long_closes_without_a_frame() -> None:
    assert Parser().feed(MAGIC + b"N" * 20_000) == [Failure(b"", b"")]


def test_nothing_is_parsed_after_a_failure() -> None:
    parser = Parser()
    assert parser.feed(MAGIC + b"BAD\nNOP\n") == [Failure(b"E_INVALID", b"invalid command BAD")]
    assert parser.feed(b"NOP\n") == []


def test_a_body_is_not_buffered_before_its_size_is_checked() -> None:
    parser = Parser(Limits(max_msg_size=10))
    assert parser.feed(MAGIC + b"PUB t\n" + size(5) + b"ab") == []
    assert parser.pending == 12
    assert parser.feed(b"cde") == [PubRun(b"t", [b"abcde"])]


def test_go_quote() -> None:
    assert go_quote(b'a"b\\c') == b'"a\\"b\\\\c"'
    assert go_quote(b"\x00\n\xff") == b'"\\x00\\n\\xff"'
    assert go_quote("é".encode()) == '"é"'.encode()


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        (b"a", True),
        (b"a.b-c_d", True),
        (b"x" * 64, True),
        (b"x" * 65, False),
        (b"", False),
        (b"t#ephemeral", True),
        (b"#ephemeral", False),
        (b"t#other", False),
        (b"t ephemeral", False),
        (b"t\n", False),
    ],
)
def test_names(name: bytes, valid: bool) -> None:
    assert is_valid_name(name) is valid


# -- frames ---------------------------------------------------------------------------------------------


def test_frames_byte_for_byte() -> None:
    assert frames.OK == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert frames.HEARTBEAT == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert frames.CLOSE_WAIT == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"
    assert frames.error(b"E_INVALID x") == b"\x00\x00\x00\x0f\x00\x00\x00\x01E_INVALID x"
    msg = frames.message(1, 2, b"00000000000000ff", b"body")
    assert msg == (
        b"\x00\x00\x00\x22\x00\x00\x00\x02"
        + b"\x00\x00\x00\x00\x00\x00\x00\x01"
        + b"\x00\x02"
        + b"00000000000000ff"
        + b"body"
    )
    reader = FrameReader()
    got = reader.feed(msg[:5]) + reader.feed(msg[5:] + frames.OK)
    assert got[0].message() == frames.Message(1, 2, b"00000000000000ff", b"body")
    assert got[1] == frames.Frame(0, b"OK")


def test_client_encoders_byte_for_byte() -> None:
    assert commands.pub("t", b"ab") == b"PUB t\n\x00\x00\x00\x02ab"
    assert commands.mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"
    )
    assert commands.dpub("t", 5, b"x") == b"DPUB t 5\n\x00\x00\x00\x01x"
    assert commands.rdy(7) == b"RDY 7\n"
    assert commands.req(b"a" * 16, 0) == b"REQ " + b"a" * 16 + b" 0\n"


# -- properties ----------------------------------------------------------------------------------------


@settings(max_examples=400)
@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=10))
def test_any_bytes_give_commands_or_one_failure(data: bytes, cuts: list[int]) -> None:
    parser = Parser(Limits(max_msg_size=64, max_body_size=256, max_req_timeout_ms=1000))
    out: list[object] = []
    pos = 0
    for cut in [*cuts, len(data) + 4]:
        chunk = (MAGIC + data)[pos : pos + cut]
        pos += cut
        out += parser.feed(chunk)
        if out and isinstance(out[-1], Command) and out[-1].verb == b"IDENTIFY":
            out += parser.feed(parser.rest())
    failures = [c for c in out if isinstance(c, Failure)]
    assert len(failures) <= 1
    if failures:
        assert out[-1] is failures[0]


_names = st.text("abcXYZ019._-", min_size=1, max_size=12)
_bodies = st.binary(min_size=1, max_size=40)
_ids = st.binary(min_size=16, max_size=16).map(lambda b: b.hex()[:16].encode())
_commands = st.one_of(
    st.builds(commands.pub, _names, _bodies),
    st.builds(commands.mpub, _names, st.lists(_bodies, min_size=1, max_size=5)),
    st.builds(commands.dpub, _names, st.integers(0, 1000), _bodies),
    st.builds(commands.sub, _names, _names),
    st.builds(commands.rdy, st.integers(0, 3000)),
    st.builds(commands.fin, _ids),
    st.builds(commands.req, _ids, st.integers(0, 99999)),
    st.builds(commands.touch, _ids),
    st.just(commands.nop()),
    st.just(commands.cls()),
)


def _flatten(out: list[object]) -> list[object]:
    """Runs split into single commands, to compare parses cut at different places."""
    flat: list[object] = []
    for cmd in out:
        if isinstance(cmd, PubRun):
            flat += [PubRun(cmd.topic, [b]) for b in cmd.bodies]
        elif isinstance(cmd, FinRun):
            flat += [FinRun([i]) for i in cmd.ids]
        else:
            flat.append(cmd)
    return flat


@settings(max_examples=200)
@given(st.lists(_commands, max_size=12), st.lists(st.integers(1, 60), max_size=20))
def test_valid_commands_parse_the_same_however_they_are_cut(
    encoded: list[bytes], cuts: list[int]
) -> None:
    data = MAGIC + b"".join(encoded)
    whole = Parser().feed(data)
    assert not any(isinstance(c, Failure) for c in whole)
    parser = Parser()
    pieces: list[object] = []
    pos = 0
    for cut in [*cuts, len(data)]:
        pieces += parser.feed(data[pos : pos + cut])
        pos += cut
    assert _flatten(pieces) == _flatten(list(whole))
    assert len(_flatten(list(whole))) == len(encoded)
