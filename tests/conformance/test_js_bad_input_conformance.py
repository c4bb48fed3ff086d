"""Bad input at the JetStream front door: what Tether answers is what nats-server answers.

Publishes with header values that are not UTF-8 or not numbers, bodies nested deep or
of the wrong JSON type, numbers past int64 in pull requests, bodies on requests that
take none. Each request goes over a raw connection to both servers; the answers are
reduced to what clients branch on (``code``/``err_code`` of an error, the status line
of a status message, a PubAck's stream and sequence) and compared. The connection must
still be open afterwards: none of this is a protocol error.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tether.testing import RawClient, run_server

pytestmark = pytest.mark.peer

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
_FRAME = re.compile(rb"(?:MSG \S+ (\S+)(?: \S+)? (\d+)|HMSG \S+ (\S+)(?: \S+)? (\d+) (\d+))\r\n")
DEEP_ARRAY = b"[" * 3000 + b"]" * 3000
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000


@dataclass
class Peer:
    client: RawClient
    count: int = 0

    async def request(self, subject: bytes, body: bytes = b"", headers: bytes | None = None) -> str:
        """Send a request and reduce its answer to what a client branches on."""
        self.count += 1
        sid = b"%d" % self.count
        inbox = b"_INBOX.bad.%s" % sid
        head = b"SUB %s %s\r\n" % (inbox, sid)
        if headers is None:
            op = b"PUB %s %s %d\r\n%s\r\n" % (subject, inbox, len(body), body)
        else:
            total = len(headers) + len(body)
            op = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject,
                inbox,
                len(headers),
                total,
                headers,
                body,
            )
        await self.client.send(head + op)
        found: list[str] = []

        def answered() -> bool:
            data = bytes(self.client.data)
            for m in _FRAME.finditer(data):
                if sid not in (m.group(1), m.group(3)):
                    continue
                start = m.end()
                if m.group(3) is not None:
                    hlen, total = int(m.group(4)), int(m.group(5))
                    if len(data) < start + total:
                        return False
                    first = data[start : start + hlen].split(b"\r\n", 1)[0]
                    found.append(_status(first.decode("utf-8", "replace")))
                else:
                    size = int(m.group(2))
                    if len(data) < start + size:
                        return False
                    found.append(_summary(data[start : start + size]))
                return True
            return False

        try:
            await self.client.wait_for(answered, 5)
        except TimeoutError:
            return "<no answer>"
        finally:
            await self.client.send(b"UNSUB %s\r\n" % sid)
        return found[0] if found else "<closed>"


def _status(line: str) -> str:
    # "NATS/1.0 400 Bad Request - json: …": the decoder's own words differ (Go's, msgspec's).
    return line.removeprefix("NATS/1.0 ").split(" - ", 1)[0]


def _summary(body: bytes) -> str:
    doc: dict[str, Any] = json.loads(body)
    error = doc.get("error")
    if isinstance(error, dict):
        return f"error {error['code']}/{error['err_code']}"
    if "type" not in doc:  # a PubAck
        return f"ack {doc.get('stream')} {doc.get('seq')}"
    kind = str(doc["type"]).rsplit(".", 1)[-1]
    lists = {k: v for k, v in doc.items() if k in ("consumers", "streams")}
    return f"{kind} {json.dumps(lists)}" if lists else kind


async def _open(host: str, port: int) -> Peer:
    client = await RawClient.connect(host, port)
    await client.send(CONNECT)
    peer = Peer(client)
    setup = [
        (b"STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "allow_rollup_hdrs": True}),
        (b"STREAM.CREATE.E", {"name": "E", "subjects": ["e.>"]}),
        (b"STREAM.CREATE.D", {"name": "D", "subjects": ["d.>"], "allow_direct": True}),
        (
            b"CONSUMER.DURABLE.CREATE.S.C",
            {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}},
        ),
    ]
    for subject, body in setup:
        answer = await peer.request(b"$JS.API." + subject, json.dumps(body).encode())
        assert not answer.startswith("error"), (subject, answer)
    assert (await peer.request(b"s.first", b"one")).startswith("ack S")
    assert (await peer.request(b"d.x", b"x")).startswith("ack D")
    return peer


@dataclass
class Peers:
    tether: Peer
    nats: Peer

    async def same(self, subject: bytes, body: bytes = b"", headers: bytes | None = None) -> str:
        """Ask both; the answers must be equal and both connections still open."""
        ours = await self.tether.request(subject, body, headers)
        theirs = await self.nats.request(subject, body, headers)
        assert ours == theirs, f"tether: {ours!r}, nats-server: {theirs!r}"
        for peer in (self.tether, self.nats):
            assert await peer.client.sync(), "the connection was closed"
        return ours


@pytest.fixture(scope="module")
def tether_address() -> Iterator[tuple[str, int]]:
    with run_server(store="memory") as srv:
        yield srv.host, srv.port
        assert "Traceback" not in srv.stderr, srv.stderr[-3000:]


@pytest.fixture
async def peers(nats_peer_url: str, tether_address: tuple[str, int]) -> AsyncIterator[Peers]:
    host, port = nats_peer_url.removeprefix("nats://").rsplit(":", 1)
    both = Peers(await _open(*tether_address), await _open(host, int(port)))
    try:
        yield both
    finally:
        await both.tether.client.close()
        await both.nats.client.close()


def _headers(*lines: bytes) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


# -- publishes with headers that are not what they should be ------------------------------------

HEADER_CASES = [
    ("expected stream not UTF-8", [b"Nats-Expected-Stream: \xff"], "error 400/10060"),
    ("expected last msg id not UTF-8", [b"Nats-Expected-Last-Msg-Id: \xff"], "error 400/10070"),
    ("rollup not UTF-8", [b"Nats-Rollup: \xff"], "error 500/10111"),
    ("TTL in unicode digits", ["Nats-TTL: ²".encode()], "error 400/10165"),
    ("TTL of 5000 digits", [b"Nats-TTL: " + b"9" * 5000], "error 400/10165"),
    (
        "expected subject not UTF-8",
        [
            b"Nats-Expected-Last-Subject-Sequence: 0",
            b"Nats-Expected-Last-Subject-Sequence-Subject: s.\xff",
        ],
        "ack S",
    ),
    ("expected last sequence in unicode digits", ["Nats-Expected-Last-Sequence: ²".encode()], None),
    ("expected last sequence past int64", [b"Nats-Expected-Last-Sequence: " + b"9" * 30], None),
]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [pytest.param(lines, expected, id=name) for name, lines, expected in HEADER_CASES],
)
async def test_publish_with_bad_header_values(
    peers: Peers, lines: list[bytes], expected: str | None
) -> None:
    answer = await peers.same(b"s.a", b"body", _headers(*lines))
    assert answer.startswith(expected or "error 400/10071"), answer


# -- request bodies ----------------------------------------------------------------------------

# Every request that decodes a JSON body, with the body nested 3000 deep.
DECODING = [
    b"STREAM.CREATE.X",
    b"STREAM.UPDATE.E",
    b"STREAM.INFO.S",
    b"STREAM.PURGE.E",
    b"STREAM.LIST",
    b"STREAM.NAMES",
    b"STREAM.MSG.GET.S",
    b"STREAM.MSG.DELETE.E",
    b"CONSUMER.CREATE.S.X",
    b"CONSUMER.DURABLE.CREATE.S.X",
    b"CONSUMER.CREATE.S",
    b"CONSUMER.NAMES.S",
    b"CONSUMER.LIST.S",
    b"CONSUMER.PAUSE.S.C",
]


@pytest.mark.parametrize("deep", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
@pytest.mark.parametrize("subject", DECODING, ids=[s.decode() for s in DECODING])
async def test_deep_json_is_invalid_json(peers: Peers, subject: bytes, deep: bytes) -> None:
    assert await peers.same(b"$JS.API." + subject, deep) == "error 400/10025"


def _stream(**config: Any) -> bytes:
    return json.dumps({"name": "Q", "subjects": ["q.>"], **config}).encode()


def _consumer(**config: Any) -> bytes:
    body = {"stream_name": "S", "config": {"ack_policy": "explicit", **config}}
    return json.dumps(body, ensure_ascii=False).encode()


BODY_CASES = [
    ("pause until a number", b"CONSUMER.PAUSE.S.C", b'{"pause_until":12}', "error 400/10025"),
    ("pause null", b"CONSUMER.PAUSE.S.C", b"null", "consumer_pause_response"),
    ("purge with a key not UTF-8", b"STREAM.PURGE.E", b'{"\xff":1}', "error 400/10025"),
    ("names with offset past int64", b"STREAM.NAMES", b'{"offset":1e400}', "error 400/10025"),
    ("msg get with a number", b"STREAM.MSG.GET.S", b"123", "error 400/10025"),
    ("msg delete with a string", b"STREAM.MSG.DELETE.E", b'"x"', "error 400/10025"),
    ("stream delete with a body", b"STREAM.DELETE.X", b'{"x":1}', "error 400/10038"),
    ("consumer info with a body", b"CONSUMER.INFO.S.C", b"[1]", "error 400/10038"),
    ("consumer delete with a body", b"CONSUMER.DELETE.S.X", b"null", "error 400/10038"),
    ("direct get with null", b"DIRECT.GET.D", b"null", "408 Empty Request"),
    ("direct get with a key not UTF-8", b"DIRECT.GET.D", b'{"\xff":1}', "408 Empty Request"),
    ("direct get past uint64", b"DIRECT.GET.D", b'{"seq":1e400}', "408 Malformed Request"),
    ("stream config past int64", b"STREAM.CREATE.Q", _stream(max_msgs=10**20), "error 400/10025"),
    (
        "consumer ack_wait past int64",
        b"CONSUMER.CREATE.S.K1",
        _consumer(ack_wait=10**20),
        "error 400/10025",
    ),
    (
        "consumer start past int64",
        b"CONSUMER.CREATE.S.K2",
        _consumer(deliver_policy="by_start_sequence", opt_start_seq=10**20),
        "error 400/10025",
    ),
    ("sample frequency ²", b"CONSUMER.CREATE.S.K3", _consumer(sample_freq="²"), "error 400/10095"),
    (
        "start time with a digit that is not ASCII",
        b"CONSUMER.CREATE.S.K4",
        _consumer(deliver_policy="by_start_time", opt_start_time="2024-01-01T00:00:00.٣Z"),
        "error 400/10025",
    ),
]


@pytest.mark.parametrize(
    ("subject", "body", "expected"),
    [pytest.param(s, b, e, id=name) for name, s, b, e in BODY_CASES],
)
async def test_bad_bodies(peers: Peers, subject: bytes, body: bytes, expected: str) -> None:
    assert (await peers.same(b"$JS.API." + subject, body)).startswith(expected)


NEXT_CASES = [
    ("expires past int64", b'{"batch":1,"expires":9223372036854775808}'),
    ("batch past int64", b'{"batch":9223372036854775808,"no_wait":true}'),
    ("max_bytes past int64", b'{"batch":1,"max_bytes":99999999999999999999,"no_wait":true}'),
    ("expires a float", b'{"batch":1,"expires":1.5}'),
    ("batch a string", b'{"batch":"1"}'),
    ("truncated", b'{"batch":'),
]


@pytest.mark.parametrize("body", [pytest.param(b, id=name) for name, b in NEXT_CASES])
async def test_pull_requests_beyond_int64_are_bad_requests(peers: Peers, body: bytes) -> None:
    assert await peers.same(b"$JS.API.CONSUMER.MSG.NEXT.S.C", body) == "400 Bad Request"


async def test_consumer_lists_of_a_stream_without_consumers_are_empty(peers: Peers) -> None:
    names = await peers.same(b"$JS.API.CONSUMER.NAMES.E")
    assert names == 'consumer_names_response {"consumers": []}'
    listed = await peers.same(b"$JS.API.CONSUMER.LIST.E")
    assert listed == 'consumer_list_response {"consumers": []}'
    # nats-server writes an empty stream name list as null, an empty stream list as [].
    none = b'{"subject":"nothing.here"}'
    assert (
        await peers.same(b"$JS.API.STREAM.NAMES", none) == 'stream_names_response {"streams": null}'
    )
    assert await peers.same(b"$JS.API.STREAM.LIST", none) == 'stream_list_response {"streams": []}'
