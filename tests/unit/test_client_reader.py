"""The client reader's MSG/HMSG fast path must behave exactly like the shared parser."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.protocol.nats import Parser, ProtocolError
from tether.protocol.nats.client_reader import ClientReader


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, *args))


def run(
    kind: type[Parser] | type[ClientReader], data: bytes, cuts: list[int]
) -> tuple[list[Any], str]:
    rec = Recorder()
    reader = kind(rec, max_payload=1024)  # type: ignore[arg-type]
    error = ""
    pieces = []
    last = 0
    for cut in sorted(set(c % (len(data) + 1) for c in cuts)):
        pieces.append(data[last:cut])
        last = cut
    pieces.append(data[last:])
    try:
        for piece in pieces:
            reader.feed(piece)
    except ProtocolError as exc:
        error = exc.message
    return rec.calls, error


FRAMES = [
    b"MSG a.b 1 5\r\nhello\r\n",
    b"MSG a.b 12 _INBOX.x.1 0\r\n\r\n",
    b"HMSG a 2 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"HMSG a 2 r.1 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n",
    b"PING\r\n",
    b"PONG\r\n",
    b"+OK\r\n",
    b"-ERR 'Stale Connection'\r\n",
    b'INFO {"max_payload":1024} \r\n',
    b"MSG  a   1   2\r\nab\r\n",  # odd spacing
    b"msg a 1 2\r\nab\r\n",  # lower case: the shared parser's call
]
BAD = [
    b"MSG a 1 x\r\n",
    b"MSG a 1 5000\r\n",
    b"GARBAGE\r\n",
    b"MSG a 1 2\r\nabXY",
    b"HMSG a 1 9 3\r\n",
]


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.sampled_from(FRAMES), min_size=1, max_size=12),
    bad=st.one_of(st.none(), st.sampled_from(BAD)),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_same_calls_and_errors_as_the_shared_parser(
    frames: list[bytes], bad: bytes | None, cuts: list[int]
) -> None:
    data = b"".join(frames) + (bad or b"")
    assert run(ClientReader, data, cuts) == run(Parser, data, cuts)


def test_large_payload_arriving_in_small_pieces() -> None:
    rec = Recorder()
    reader = ClientReader(rec, max_payload=1 << 20)  # type: ignore[arg-type]
    payload = bytes(range(256)) * 1000
    data = b"MSG big 1 %d\r\n%s\r\nPING\r\n" % (len(payload), payload)
    for i in range(0, len(data), 1000):
        reader.feed(data[i : i + 1000])
    assert rec.calls == [("on_msg", "big", "1", "", payload), ("on_ping",)]


def test_endless_line_is_refused() -> None:
    reader = ClientReader(Recorder(), max_payload=1024)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        for _ in range(10):
            reader.feed(b"MSG " + b"a" * 1000)
