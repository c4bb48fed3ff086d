"""Hostile values at every JetStream API subject and in publish headers: always an
answer, never an internal error, never a dropped connection.

One server for the whole module and one raw connection (blocking socket) that speaks
the protocol byte for byte, so bodies and headers can be anything: deep JSON, wrong
JSON types, numbers past int64, unicode digits (``"²".isdigit()`` is true and
``int("²")`` fails), bytes that are not UTF-8, control characters, oversize values.
After every example a plain STREAM.INFO must still work on the same connection.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.testing import RunningServer, run_server

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
INBOX = b"_INBOX.hostile"
_FRAME = re.compile(rb"(MSG|HMSG) (\S+) (\S+)(?: (\S+))? (\d+)(?: (\d+))?\r\n")


class ServerClosed(AssertionError):
    """The server closed the connection."""


@dataclass
class Reply:
    headers: bytes  # the header block of an HMSG (b"" for a MSG)
    data: bytes

    @property
    def status(self) -> str:
        """``"400 Bad Request - …"`` for a status message, else ""."""
        first = self.headers.split(b"\r\n", 1)[0]
        return first[len(b"NATS/1.0 ") :].decode("utf-8", "replace").strip()

    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.data)
        return doc


class Wire:
    """One NATS connection over a blocking socket; replies come to ``INBOX.<n>``."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.count = 0
        self._fill_until(lambda: b"\r\n" in self.buf, 5)
        del self.buf[: self.buf.index(b"\r\n") + 2]  # INFO
        self.sock.sendall(CONNECT)

    def close(self) -> None:
        self.sock.close()

    def _fill_until(self, done: Any, within: float) -> bool:
        deadline = time.monotonic() + within
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                return False
            except ConnectionError as exc:
                raise ServerClosed(f"connection reset: {exc}") from None
            if not chunk:
                raise ServerClosed(f"closed by the server after {bytes(self.buf[-300:])!r}")
            self.buf += chunk
        return True

    def _take_reply(self, sid: bytes) -> Reply | None:
        """The first frame for subscription ``sid`` in the buffer (others are dropped)."""
        while True:
            if self.buf.startswith((b"PING\r\n", b"PONG\r\n", b"+OK\r\n")):
                if self.buf.startswith(b"PING"):
                    self.sock.sendall(b"PONG\r\n")
                del self.buf[: 6 if not self.buf.startswith(b"+OK") else 5]
                continue
            if self.buf.startswith(b"-ERR"):
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return None
                raise AssertionError(f"server error line: {bytes(self.buf[:end])!r}")
            m = _FRAME.match(self.buf)
            if m is None:
                if b"\r\n" in self.buf and not self.buf.startswith((b"MSG", b"HMSG")):
                    raise AssertionError(f"unexpected bytes: {bytes(self.buf[:200])!r}")
                return None
            kind, frame_sid = m.group(1), m.group(3)
            if kind == b"HMSG":
                # HMSG subject sid [reply] hlen total
                nums = [g for g in m.groups()[3:] if g is not None]
                hlen, total = int(nums[-2]), int(nums[-1])
            else:
                nums = [g for g in m.groups()[3:] if g is not None]
                hlen, total = 0, int(nums[-1])
            start = m.end()
            if len(self.buf) < start + total + 2:
                return None
            headers = bytes(self.buf[start : start + hlen])
            data = bytes(self.buf[start + hlen : start + total])
            del self.buf[: start + total + 2]
            if frame_sid == sid:
                return Reply(headers, data)

    def request(
        self,
        subject: bytes,
        body: bytes,
        headers: bytes | None = None,
        wait: float = 5.0,
        then: Callable[[], None] | None = None,
    ) -> Reply | None:
        """Send a request; its reply, or None when none came within ``wait``.

        The reply inbox has a subscription of its own (a pull's messages come on their
        stored subjects), removed afterwards: a pull still waiting is then dropped.
        """
        self.count += 1
        sid = b"%d" % self.count
        inbox = b"%s.%s" % (INBOX, sid)
        sub = b"SUB %s %s\r\n" % (inbox, sid)
        if headers is None:
            self.sock.sendall(b"%sPUB %s %s %d\r\n%s\r\n" % (sub, subject, inbox, len(body), body))
        else:
            total = len(headers) + len(body)
            self.sock.sendall(
                b"%sHPUB %s %s %d %d\r\n%s%s\r\n"
                % (sub, subject, inbox, len(headers), total, headers, body)
            )
        found: list[Reply] = []

        def got() -> bool:
            reply = self._take_reply(sid)
            if reply is not None:
                found.append(reply)
            return bool(found)

        self._fill_until(got, wait)
        if not found and then is not None:
            then()
        self.sock.sendall(b"UNSUB %s\r\n" % sid)
        return found[0] if found else None


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    with run_server(store="memory") as srv:
        w = Wire(srv.host, srv.port)
        try:
            _seed(w)
            yield w
        finally:
            w.close()
        _server_still_fine(srv)


def _server_still_fine(srv: RunningServer) -> None:
    assert srv.proc is not None and srv.proc.poll() is None
    assert "Traceback" not in srv.stderr, srv.stderr[-3000:]


def _ok(reply: Reply | None) -> dict[str, Any]:
    assert reply is not None, "no reply"
    doc = reply.json()
    assert "error" not in doc, doc
    return doc


def _seed(w: Wire) -> None:
    stream = {"name": "S", "subjects": ["s.>"], "allow_direct": True, "allow_rollup_hdrs": True}
    _ok(w.request(b"$JS.API.STREAM.CREATE.S", json.dumps(stream).encode()))
    _ok(w.request(b"$JS.API.STREAM.CREATE.U", b'{"name":"U","subjects":["u.>"]}'))
    pull = {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}}
    _ok(w.request(b"$JS.API.CONSUMER.DURABLE.CREATE.S.C", json.dumps(pull).encode()))
    for i in range(5):
        _ok(w.request(b"s.m%d" % i, b"message %d" % i))


def _still_serving(w: Wire) -> None:
    doc = _ok(w.request(b"$JS.API.STREAM.INFO.S", b""))
    assert doc["config"]["name"] == "S"


# -- hostile values ------------------------------------------------------------------------

HOSTILE_SCALARS: list[Any] = [
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    -1,
    0,
    1,
    "²",
    "٣",
    "1²",
    "9" * 5000,
    "\x00\x01\x7f",
    "a\r\nb",
    "",
    None,
    True,
    [],
    {},
    "2024-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "0001-01-01T00:00:00Z",
    "s.>",
    "S",
    "C",
    "x" * 70_000,
]
DEEP_ARRAY = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000
RAW_BODIES: list[bytes] = [
    b"",
    b"{}",
    b"null",
    b"[]",
    b"123",
    b'"x"',
    b"{",
    b'{"seq":1e400}',
    b'{"batch":1.5}',
    b'{"\xff":"\xfe"}',
    b'{"name":"\xff\xfe","subjects":["s.\xff"]}',
    b'{"stream_name":"S","config":{"durable_name":"\xff"}}',
    b'{"pause_until":12}',
    b'{"batch":9223372036854775808}',
    b'{"expires":99999999999999999999}',
    "²".encode(),
    b"-3",
    b"9" * 5000,
    DEEP_ARRAY,
    DEEP_OBJECT,
    b'{"config":' + DEEP_ARRAY + b"}",
    b"\x00\x01\x02\xff",
    b'{"x":"' + b"y" * 200_000 + b'"}',
]
FIELDS = [
    "name",
    "subjects",
    "stream_name",
    "config",
    "durable_name",
    "ack_policy",
    "filter_subject",
    "deliver_subject",
    "max_deliver",
    "ack_wait",
    "backoff",
    "offset",
    "subject",
    "subjects_filter",
    "deleted_details",
    "seq",
    "keep",
    "filter",
    "last_by_subj",
    "next_by_subj",
    "start_time",
    "batch",
    "max_bytes",
    "multi_last",
    "up_to_seq",
    "up_to_time",
    "no_hdr",
    "expires",
    "no_wait",
    "idle_heartbeat",
    "pause_until",
    "action",
    "metadata",
    "block_bytes",
    "sample_freq",
    "opt_start_time",
    "opt_start_seq",
    "deliver_policy",
    "max_msgs",
    "max_age",
    "first_seq",
]

# The request kinds Tether serves, with the name tokens they take ({s} stream, {c} consumer).
SERVED = [
    "$JS.API.INFO",
    "$JS.API.STREAM.CREATE.{n}",
    "$JS.API.STREAM.UPDATE.U",
    "$JS.API.STREAM.INFO.{s}",
    "$JS.API.STREAM.DELETE.{n}",
    "$JS.API.STREAM.PURGE.U",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.MSG.GET.{s}",
    "$JS.API.STREAM.MSG.DELETE.U",
    "$JS.API.DIRECT.GET.S",
    "$JS.API.DIRECT.GET.S.s.{n}",
    "$JS.API.CONSUMER.CREATE.{s}",
    "$JS.API.CONSUMER.CREATE.S.{n}",
    "$JS.API.CONSUMER.CREATE.S.{n}.s.{n}",
    "$JS.API.CONSUMER.DURABLE.CREATE.S.{n}",
    "$JS.API.CONSUMER.INFO.S.{c}",
    "$JS.API.CONSUMER.DELETE.S.{n}",
    "$JS.API.CONSUMER.LIST.{s}",
    "$JS.API.CONSUMER.NAMES.{s}",
    "$JS.API.CONSUMER.PAUSE.S.{c}",
    "$JS.API.CONSUMER.MSG.NEXT.S.{c}",
    "$TETHER.API.STREAM.READ.{s}",
]
# Asked of nats-server, not served here: no reply, but the connection must stay.
UNSERVED = [
    "$JS.API.CONSUMER.UNPIN.S.C",
    "$JS.API.CONSUMER.RESET.S.C",
    "$JS.API.STREAM.SNAPSHOT.S",
    "$JS.API.STREAM.LEADER.STEPDOWN.S",
]
HOSTILE_TOKENS = [b"\xff", b"\xfe\xfd", "²".encode(), "é".encode(), b"a" * 300, b"X1"]


@st.composite
def json_body(draw: st.DrawFn) -> bytes:
    value = st.recursive(
        st.sampled_from(HOSTILE_SCALARS) | st.integers() | st.text(max_size=12),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=3)
        ),
        max_leaves=8,
    )
    doc = draw(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), value, max_size=4))
    body = json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and b'"' in body:
        # A byte that is not UTF-8 inside the first string.
        at = body.index(b'"') + 1
        body = body[:at] + b"\xff" + body[at:]
    return body


def _fill(template: str, token: bytes) -> bytes:
    out = template.encode()
    for key, default in ((b"{s}", b"S"), (b"{c}", b"C"), (b"{n}", b"N1")):
        out = out.replace(key, token or default)
    return out


def _is_internal_error(reply: Reply) -> bool:
    if reply.headers:
        code = reply.status.split(" ", 1)[0]
        return code.startswith("5") and code != "503"  # 503: no responders
    try:
        doc = reply.json()
    except ValueError:
        return False  # not JSON: a message (DIRECT.GET) or a block (STREAM.READ)
    error = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(error, dict) and error.get("err_code") == 10051


@given(
    template=st.sampled_from(SERVED + UNSERVED),
    token=st.sampled_from([b"", *HOSTILE_TOKENS]),
    # Indices, not the values: hypothesis would print the 200 kB bodies in every report.
    raw=st.integers(0, len(RAW_BODIES) - 1),
    body=st.none() | json_body() | st.binary(max_size=40),
)
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_api_request_gets_an_answer(
    wire: Wire, template: str, token: bytes, raw: int, body: bytes | None
) -> None:
    subject = _fill(template, token)
    payload = RAW_BODIES[raw] if body is None else body
    served = template in SERVED
    waits = "MSG.NEXT" in template
    waiting: list[int] = []

    def count_waiting() -> None:
        # Asked while the pull's inbox is still subscribed.
        waiting.append(_ok(wire.request(b"$JS.API.CONSUMER.INFO.S.C", b""))["num_waiting"])

    wait = 0.3 if waits or not served else 5.0
    reply = wire.request(subject, payload, wait=wait, then=count_waiting if waits else None)
    if reply is None:
        if waits:
            # A valid pull without no_wait is queued until it expires, as on nats-server.
            assert waiting[0] >= 1, (subject, payload[:200])
        else:
            assert not served, ("no answer", subject, payload[:200])
    else:
        assert not _is_internal_error(reply), (subject, payload[:200], reply)
    _still_serving(wire)


def _no_line_breaks(value: bytes) -> bytes:
    return value.replace(b"\r", b"").replace(b"\n", b"")


HEADER_KEYS = [
    b"Nats-Msg-Id",
    b"Nats-Expected-Stream",
    b"Nats-Expected-Last-Msg-Id",
    b"Nats-Expected-Last-Sequence",
    b"Nats-Expected-Last-Subject-Sequence",
    b"Nats-Expected-Last-Subject-Sequence-Subject",
    b"Nats-Rollup",
    b"Nats-TTL",
    b"Tether-Priority",
    b"Nats-Required-Api-Level",
    b"X-Other",
]
HEADER_VALUES = [
    b"\xff\xfe",
    b"a\xffb",
    "²".encode(),
    "٣".encode(),
    b"9" * 5000,
    b"18446744073709551616",
    b"9223372036854775808",
    b"-1",
    b"+1",
    b" 1",
    b"1_0",
    b"0",
    b"00",
    b"sub",
    b"all",
    b"ALL",
    b"never",
    b"1h",
    b"1.5s",
    b"\x01\x02\x7f",
    b"S",
    b"s.m1",
    b"",
    b"x" * 60_000,
]


@given(
    token=st.sampled_from([b"m1", b"new", *HOSTILE_TOKENS]),
    fields=st.lists(
        st.tuples(
            st.sampled_from(HEADER_KEYS),
            st.sampled_from(HEADER_VALUES) | st.binary(max_size=20).map(_no_line_breaks),
        ),
        min_size=1,
        max_size=4,
    ),
    payload=st.binary(max_size=64),
)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_publish_with_hostile_headers_gets_an_answer(
    wire: Wire, token: bytes, fields: list[tuple[bytes, bytes]], payload: bytes
) -> None:
    block = b"NATS/1.0\r\n" + b"".join(b"%s: %s\r\n" % kv for kv in fields) + b"\r\n"
    reply = wire.request(b"s." + token, payload, headers=block)
    assert reply is not None, ("no PubAck", token, fields)
    assert not reply.headers, reply  # a PubAck, never a status
    doc = reply.json()
    if "error" in doc:
        assert doc["error"]["err_code"] != 10051, doc
        assert doc["seq"] == 0
    else:
        assert doc["stream"] == "S" and doc["seq"] > 0
    _still_serving(wire)


# -- the cases that were reported, one by one ------------------------------------------------------


async def test_consumers_info_of_a_stream_without_consumers(memory_server: RunningServer) -> None:
    nc = await nats.connect(memory_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="EMPTY", subjects=["empty.>"])
        assert await js.consumers_info("EMPTY") == []  # null made nats-py raise
        await js.add_consumer("EMPTY", durable_name="ONE")
        assert [c.name for c in await js.consumers_info("EMPTY")] == ["ONE"]
    finally:
        await nc.close()


def test_a_subject_that_is_not_utf8_is_refused_by_a_stream(wire: Wire) -> None:
    # nats-server stores any bytes; Tether keeps subjects as text (store, JSON, HTTP).
    for _ in range(3):  # the second time it is no longer a first sight: still refused
        doc = wire.request(b"s.\xff\xfe", b"x")
        assert doc is not None
        error = doc.json()["error"]
        assert (error["code"], error["err_code"]) == (400, 10003)
        assert error["description"] == "subject is not valid UTF-8"
    # Without a reply subject it is dropped, and nothing else suffers.
    wire.sock.sendall(b"PUB s.\xff 1\r\nx\r\n")
    _still_serving(wire)
    assert _ok(wire.request(b"s.\xc3\xa9", b"x"))["seq"] > 0  # "s.é" is UTF-8


def test_pulls_beyond_int64_get_an_answer(wire: Wire) -> None:
    for body in (
        b'{"batch":1,"expires":99999999999999999999}',
        b'{"batch":9223372036854775808}',
        b'{"batch":1,"x":' + DEEP_OBJECT + b"}",
    ):
        reply = wire.request(b"$JS.API.CONSUMER.MSG.NEXT.S.C", body)
        assert reply is not None and reply.status.startswith("400 Bad Request - "), body[:60]


def test_pause_until_a_number(wire: Wire) -> None:
    reply = wire.request(b"$JS.API.CONSUMER.PAUSE.S.C", b'{"pause_until":12}')
    assert reply is not None
    assert reply.json()["error"]["err_code"] == 10025
