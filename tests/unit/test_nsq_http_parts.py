"""Parts of the NSQ HTTP front door and of the worker's discovery, without a server:
query strings read as Go reads them, binary ``/mpub`` bodies, the answer shapes, and
``/lookup`` answers as the discovery reads them (bare, enveloped, chunked, 404)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.client.discovery import Discovery, Producer, lookup
from tether.server.nsq.http_api import split_binary
from tether.server.nsq.http_common import HttpError, Query, wants_envelope

MAX_MSG, MAX_BODY = 1024, 8192


def encode(bodies: list[bytes]) -> bytes:
    out = struct.pack(">i", len(bodies))
    for body in bodies:
        out += struct.pack(">i", len(body)) + body
    return out


@given(st.lists(st.binary(min_size=1, max_size=MAX_MSG), min_size=1, max_size=5))
def test_binary_mpub_round_trip(bodies: list[bytes]) -> None:
    assert split_binary(encode(bodies), MAX_MSG, MAX_BODY * 10) == bodies


@given(st.binary(max_size=64))
def test_any_binary_body_is_messages_or_a_413(raw: bytes) -> None:
    try:
        bodies = split_binary(raw, MAX_MSG, MAX_BODY)
    except HttpError as exc:
        assert exc.status == 413 and exc.code in ("BAD_BODY", "BAD_MESSAGE")
    else:
        assert bodies and all(0 < len(b) <= MAX_MSG for b in bodies)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "BAD_BODY"),
        (b"\0\0\0", "BAD_BODY"),
        (struct.pack(">i", 0), "BAD_BODY"),
        (struct.pack(">i", -1), "BAD_BODY"),
        (struct.pack(">i", 10_000), "BAD_BODY"),  # more than the body size allows
        (struct.pack(">i", 1), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 0), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 5) + b"abc", "BAD_MESSAGE"),
        (struct.pack(">ii", 1, MAX_MSG + 1) + b"x" * (MAX_MSG + 1), "BAD_MESSAGE"),
    ],
)
def test_binary_mpub_errors(raw: bytes, code: str) -> None:
    with pytest.raises(HttpError) as caught:
        split_binary(raw, MAX_MSG, MAX_BODY)
    assert (caught.value.status, caught.value.code) == (413, code)


def test_query_strings_as_go_reads_them() -> None:
    q = Query(b"topic=a.b&topic=second&channel=c%23ephemeral&flag&x=a+b")
    assert q.get("topic") == "a.b"
    assert q.get("channel") == "c#ephemeral"
    assert q.get("flag") == "" and "flag" in q
    assert q.get("x") == "a b"
    assert q.get("missing") is None
    for bad in (b"topic=%zz", b"topic=a;b", b"a=%4"):
        with pytest.raises(HttpError) as caught:
            Query(bad)
        assert (caught.value.status, caught.value.code) == (400, "INVALID_REQUEST")


@pytest.mark.parametrize(
    ("accept", "envelope"),
    [
        (None, False),
        (b"application/vnd.nsq; version=1.0", False),
        (b"application/vnd.nsq;version=1.0", False),
        (b"application/vnd.nsq; version=0.3", True),
        (b"application/json", False),
    ],
)
def test_which_shape(accept: bytes | None, envelope: bool) -> None:
    headers = [] if accept is None else [(b"accept", accept)]
    assert wants_envelope({"headers": headers}) is envelope


# -- the discovery's side ------------------------------------------------------------------------


async def _serve(answer: Callable[[bytes], bytes]) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(answer(head))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


def _http(status: str, body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        half = len(body) // 2
        payload = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            half,
            body[:half],
            len(body) - half,
            body[half:],
        )
        return b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (status.encode(), payload)
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status.encode(), len(body), body)


BARE = b'{"channels":[],"producers":[{"broadcast_address":"h1","tcp_port":4150,"http_port":4151,"nats_port":4222,"hostname":"h","version":"1.3.0"}]}'
OLD = b'{"status_code":200,"status_txt":"OK","data":{"producers":[{"broadcast_address":"h2","tcp_port":4150,"http_port":4151}]}}'


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, str]]:
    answers = {
        "bare": lambda head: _http("200 OK", BARE),
        "old": lambda head: _http("200 OK", OLD, chunked=True),
        "missing": lambda head: _http("404 Not Found", b'{"message":"TOPIC_NOT_FOUND"}'),
        "broken": lambda head: _http("500 Internal Server Error", b"{}"),
    }
    running = {}
    addresses = {}
    for name, answer in answers.items():
        running[name], addresses[name] = await _serve(answer)
    yield addresses
    for server in running.values():
        server.close()
        await server.wait_closed()


async def test_lookup_reads_both_shapes(servers: dict[str, str]) -> None:
    assert await lookup(servers["bare"], "t") == [Producer("h1", 4150, 4151, 4222, "h", "1.3.0")]
    assert await lookup(f"http://{servers['old']}/lookup", "t") == [Producer("h2", 4150, 4151, 0)]
    assert await lookup(servers["missing"], "t") == []
    with pytest.raises(OSError):
        await lookup(servers["broken"], "t")


async def test_discovery_unites_and_connects_once(servers: dict[str, str]) -> None:
    connected: list[str] = []

    async def connect(producer: Producer) -> object | None:
        connected.append(producer.key)
        return None if producer.nats_port == 0 else object()  # declined: retried later

    addresses = [servers["bare"], servers["bare"], servers["old"], servers["broken"]]
    discovery = Discovery(addresses, "t", connect)  # type: ignore[arg-type]
    added = await discovery.poll()
    assert [p.key for p, _ in added] == ["h1:4150"]
    assert sorted(connected) == ["h1:4150", "h2:4150"]
    assert list(discovery.failed) == [servers["broken"]]
    await discovery.poll()
    assert sorted(connected) == ["h1:4150", "h2:4150", "h2:4150"]  # h1 is known now
