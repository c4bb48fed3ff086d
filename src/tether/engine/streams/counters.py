"""Counters (ADR-49): streams whose messages are running totals.

On a stream with ``allow_msg_counter`` every publish carries ``Nats-Incr`` (a decimal
integer of any size, with an optional sign) and no body. The message stored is the
subject's previous total plus the increment, as ``{"val":"<total>"}``, and the PubAck
carries the new total. Python integers have arbitrary precision, like the big.Int
nats-server uses, so totals never overflow.

The total must be known when the publish is decided (synchronously, in arrival order),
without reading the store: :class:`CounterValues` keeps the value of each live message
of a counter stream, filled when the stream loads and at every append.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

from tether.engine.errors import ApiError

INCR = b"Nats-Incr"
# A copy made by a stream source, and what a counter stream remembers of its sources.
SOURCED = b"Nats-Stream-Source"
SOURCES = b"Nats-Counter-Sources"

# Headers nats-server refuses next to Nats-Incr (a counter's value is not conditional).
CONFLICTING = (
    b"Nats-Rollup",
    b"Nats-Expected-Stream",
    b"Nats-Expected-Last-Msg-Id",
    b"Nats-Expected-Last-Sequence",
    b"Nats-Expected-Last-Subject-Sequence",
    b"Nats-Expected-Last-Subject-Sequence-Subject",
)

_INCREMENT = re.compile(rb"[+-]?[0-9]+")


def disabled() -> ApiError:
    return ApiError(400, 10168, "message counters is disabled")


def missing() -> ApiError:
    return ApiError(400, 10169, "message counter increment is missing")


def has_payload() -> ApiError:
    return ApiError(400, 10170, "message counter has payload")


def invalid() -> ApiError:
    return ApiError(400, 10171, "message counter increment is invalid")


def broken() -> ApiError:
    return ApiError(400, 10172, "message counter is broken")


def parse_increment(raw: bytes) -> int | None:
    """A ``Nats-Incr`` value as Go's ``big.Int.SetString(v, 10)`` reads it, or None."""
    if not _INCREMENT.fullmatch(raw):
        return None
    return int(raw)


def body(value: int) -> bytes:
    return b'{"val":"%d"}' % value


class _Body(msgspec.Struct):
    val: str = ""


_decoder = msgspec.json.Decoder(_Body)


def read_value(payload: bytes) -> int | None:
    """The total a stored counter message holds, or None if it is not one."""
    try:
        doc = _decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    if not doc.val:
        return 0
    return parse_increment(doc.val.encode())


def check(counter_stream: bool, fields: dict[bytes, bytes], payload: bytes) -> int | None:
    """The increment of a publish, checked in nats-server's order; None when the
    message is not a counter update (a stream without counters, no ``Nats-Incr``)."""
    raw = fields.get(INCR)
    if not counter_stream:
        if not raw:
            return None
        if parse_increment(raw) is None:
            raise invalid()
        raise disabled()
    if not raw:
        raise missing()
    incr = parse_increment(raw)
    if incr is None:
        raise invalid()
    if payload:
        raise has_payload()
    for name in CONFLICTING:
        if name in fields:
            raise invalid()
    return incr


Sources = dict[str, dict[str, str]]


def sourced_increment(
    payload: bytes, stream_source: bytes, prev: Sources | None, subject: str
) -> tuple[int, Sources]:
    """A counter message copied from a source into a counter stream: the change since
    the last copy from the same source and subject (what ``Nats-Incr`` becomes), and
    the updated ``Nats-Counter-Sources`` (source -> original subject -> its total)."""
    value = read_value(payload)
    if value is None:
        raise broken()
    parts = stream_source.decode(errors="replace").split(" ")
    source = parts[0]
    original = parts[4] if len(parts) > 4 else subject
    known = dict(prev or {})
    per_subject = dict(known.get(source, {}))
    before = parse_increment(per_subject.get(original, "0").encode())
    if before is None:
        raise broken()
    per_subject[original] = str(value)
    known[source] = per_subject
    return value - before, known


def read_sources(raw: bytes) -> Sources | None:
    """A ``Nats-Counter-Sources`` value, or None if it is not valid JSON of that shape."""
    try:
        doc = msgspec.json.decode(raw, type=dict[str, dict[str, str]])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return doc


def encode_sources(sources: Sources) -> bytes:
    return msgspec.json.encode(sources)


def with_header(headers: bytes, name: bytes, value: bytes) -> bytes:
    """``headers`` with ``name`` set to ``value`` (replacing the first one, else added)."""
    lines = headers.split(b"\r\n")[:-2] if headers else [b"NATS/1.0"]
    for i, line in enumerate(lines[1:], 1):
        if line.partition(b":")[0].strip() == name:
            lines[i] = name + b": " + value
            break
    else:
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


class CounterValues:
    """The total held by each live message of one counter stream (seq -> value, None
    for a message that is not a valid counter body), and the sources' totals it
    carries (``Nats-Counter-Sources``) when it has them."""

    __slots__ = ("sources", "values")

    def __init__(self) -> None:
        self.values: dict[int, int | None] = {}
        self.sources: dict[int, Sources | None] = {}

    def set(self, seq: int, value: int | None) -> None:
        self.values[seq] = value

    def at(self, seq: int) -> int | None:
        """The total stored at ``seq`` (0 for no message: a counter starts at zero)."""
        if seq == 0:
            return 0
        return self.values.get(seq)

    def prune(self, live: int, alive: Callable[[int], bool]) -> None:
        """Forget messages no longer in the stream, once they outnumber the live ones
        (``alive(seq)`` tells whether one is)."""
        if len(self.values) > 2 * live + 64:
            self.values = {s: v for s, v in self.values.items() if alive(s)}
            self.sources = {s: v for s, v in self.sources.items() if alive(s)}
