"""TLS and compression for NSQ clients, as nsqd negotiates them in IDENTIFY: pynsq's
``tls_v1``/``tls_options``, ``snappy`` and ``deflate`` end to end, TLS with compression
inside it, client certificates, ``nsq_tls_required``, and the raw bytes around the
upgrade (the IDENTIFY response in plain text, then ``OK`` as the first frame in TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nsq
import pytest

from tether.testing import RunningServer, run_server

_topics = itertools.count()


@pytest.fixture(scope="module")
def certs(nsq_certs: dict[str, str]) -> dict[str, str]:
    return nsq_certs


def serve(certs: dict[str, str], tmp: Path, extra: str = "") -> Iterator[RunningServer]:
    conf = tmp / "tether.toml"
    conf.write_text(
        f'nsq_tls_cert = "{certs["cert"]}"\nnsq_tls_key = "{certs["key"]}"\n'
        f'tls_ca = "{certs["ca"]}"\n{extra}'
    )
    with run_server(store="memory", args=["--config", str(conf)]) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(certs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from serve(certs, tmp_path_factory.mktemp("nsq-tls"))


def address(server: RunningServer) -> str:
    return f"{server.host}:{server.nsq_port}"


def topic() -> str:
    return f"tls.t{next(_topics)}"


async def wait_until(condition: Callable[[], bool], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def tls_options(certs: dict[str, str], client: bool = False) -> dict[str, Any]:
    # pynsq's default ssl_version (PROTOCOL_TLSv1_2) is deprecated in Python: say what
    # pynsq users are told to.
    options: dict[str, Any] = {
        "ssl_version": ssl.PROTOCOL_TLS_CLIENT,
        "cert_reqs": ssl.CERT_REQUIRED,
        "ca_certs": certs["ca"],
    }
    if client:
        options["certfile"] = certs["client"]
    return options


async def round_trip(server: RunningServer, **conn_options: Any) -> tuple[bool, str]:
    """A pynsq Writer and Reader with the same connection options exchange messages:
    whether the reader's connection is TLS, and its compression (pynsq's encoder)."""
    name = topic()
    writer = nsq.Writer([address(server)], **conn_options)
    got: list[bytes] = []
    r = nsq.Reader(
        topic=name,
        channel="c",
        nsqd_tcp_addresses=[address(server)],
        lookupd_poll_interval=60,
        max_in_flight=10,
        message_handler=lambda m: got.append(m.body) or True,
        **conn_options,
    )
    try:
        await wait_until(lambda: bool(writer.conns) and bool(r.conns))
        # pynsq adds a connection before its IDENTIFY exchange is over.
        await wait_until(lambda: all(c.stream is not None for c in writer.conns.values()))
        bodies = [b"x" * 5000, b"small", *(b"m%d" % i for i in range(50))]
        answers: list[Any] = []
        for body in bodies:
            writer.pub(name, body, callback=lambda conn, data: answers.append(data))
        writer.mpub(name, [b"batch1", b"batch2"], callback=lambda c, d: answers.append(d))
        await wait_until(lambda: len(answers) == len(bodies) + 1)
        assert answers == [b"OK"] * (len(bodies) + 1)
        await wait_until(lambda: len(got) == len(bodies) + 2)
        assert sorted(got) == sorted([*bodies, b"batch1", b"batch2"])
        conn = next(iter(r.conns.values()))
        sock = conn.stream.socket
        sock = getattr(sock, "_socket", sock)  # under pynsq's compression wrapper
        return isinstance(sock, ssl.SSLSocket), type(conn.encoder).__name__
    finally:
        r.close()
        for conn in list(writer.conns.values()):
            conn.close()


async def test_pynsq_over_tls(server: RunningServer, certs: dict[str, str]) -> None:
    assert await round_trip(server, tls_v1=True, tls_options=tls_options(certs)) == (
        True,
        "DefaultEncoder",
    )


async def test_pynsq_snappy(server: RunningServer) -> None:
    assert await round_trip(server, snappy=True) == (False, "SnappyEncoder")


async def test_pynsq_deflate(server: RunningServer) -> None:
    assert await round_trip(server, deflate=True, deflate_level=9) == (False, "DeflateEncoder")


async def test_pynsq_snappy_inside_tls(server: RunningServer, certs: dict[str, str]) -> None:
    got = await round_trip(server, tls_v1=True, tls_options=tls_options(certs), snappy=True)
    assert got == (True, "SnappyEncoder")


async def test_pynsq_deflate_inside_tls(server: RunningServer, certs: dict[str, str]) -> None:
    got = await round_trip(server, tls_v1=True, tls_options=tls_options(certs), deflate=True)
    assert got == (True, "DeflateEncoder")


# -- the bytes around the upgrade ------------------------------------------------------------
def frame(data: bytes) -> tuple[int, bytes]:
    size, kind = struct.unpack(">ii", data[:8])
    assert size == len(data) - 4
    return kind, data[8:]


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readexactly(4), 5)
    (size,) = struct.unpack(">i", head)
    return frame(head + await asyncio.wait_for(reader.readexactly(size), 5))


async def shut(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await asyncio.wait_for(writer.wait_closed(), 5)


def identify(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(data)) + data


async def upgrade(
    server: RunningServer, certs: dict[str, str], *, client_cert: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Magic, IDENTIFY with tls_v1, the plaintext answer, then the handshake."""
    reader, writer = await asyncio.open_connection(server.host, server.nsq_port)
    writer.write(b"  V2" + identify({"feature_negotiation": True, "tls_v1": True}))
    kind, body = await read_frame(reader)
    assert kind == 0
    answer = json.loads(body)
    assert answer["tls_v1"] is True
    ctx = ssl.create_default_context(cafile=certs["ca"])
    if client_cert:
        ctx.load_cert_chain(certs["client"])
    await writer.start_tls(ctx, server_hostname="127.0.0.1")
    return reader, writer


async def test_ok_is_the_first_frame_inside_tls(
    server: RunningServer, certs: dict[str, str]
) -> None:
    reader, writer = await upgrade(server, certs)
    try:
        assert await read_frame(reader) == (0, b"OK")
        writer.write(b"PUB raw.tls\n" + struct.pack(">i", 3) + b"abc" + b"NOP\n")
        assert await read_frame(reader) == (0, b"OK")
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        await shut(writer)


async def test_without_a_certificate_tls_is_answered_false() -> None:
    with run_server(store="memory") as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        try:
            writer.write(b"  V2" + identify({"feature_negotiation": True, "tls_v1": True}))
            kind, body = await read_frame(reader)
            assert kind == 0
            assert json.loads(body)["tls_v1"] is False
            writer.write(b"NOP\nPUB plain\n" + struct.pack(">i", 1) + b"x")
            assert await read_frame(reader) == (0, b"OK")  # still plain text
        finally:
            await shut(writer)


async def test_a_failed_handshake_closes_only_that_client(server: RunningServer) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.nsq_port)
    writer.write(b"  V2" + identify({"feature_negotiation": True, "tls_v1": True}))
    await read_frame(reader)
    writer.write(b"this is not a TLS ClientHello at all\n" * 4)
    # The server closes the connection: nothing, or a TLS alert record, never a frame.
    rest = await asyncio.wait_for(reader.read(), 5)
    assert rest == b"" or rest[:1] == b"\x15"
    await shut(writer)
    # Others are served.
    assert await round_trip(server, snappy=True) == (False, "SnappyEncoder")


# -- nsq_tls_required and client certificates ---------------------------------------------
@pytest.fixture(scope="module")
def strict_server(
    certs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    extra = 'nsq_tls_required = true\nnsq_tls_client_auth_policy = "require-verify"\n'
    yield from serve(certs, tmp_path_factory.mktemp("nsq-strict"), extra)


async def test_tls_required_refuses_plain_commands(strict_server: RunningServer) -> None:
    reader, writer = await asyncio.open_connection(strict_server.host, strict_server.nsq_port)
    try:
        writer.write(b"  V2PUB t\n" + struct.pack(">i", 1) + b"x")
        kind, body = await read_frame(reader)
        assert (kind, body) == (1, b"E_INVALID cannot PUB in current state (TLS required)")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # fatal: closed
    finally:
        await shut(writer)


async def test_tls_required_with_a_client_certificate(
    strict_server: RunningServer, certs: dict[str, str]
) -> None:
    reader, writer = await upgrade(strict_server, certs, client_cert=True)
    try:
        assert await read_frame(reader) == (0, b"OK")
        writer.write(b"PUB strict\n" + struct.pack(">i", 2) + b"ok")
        assert await read_frame(reader) == (0, b"OK")
    finally:
        await shut(writer)
    got = await round_trip(strict_server, tls_v1=True, tls_options=tls_options(certs, client=True))
    assert got == (True, "DefaultEncoder")


async def test_require_verify_refuses_a_client_without_a_certificate(
    strict_server: RunningServer, certs: dict[str, str]
) -> None:
    reader, writer = await upgrade(strict_server, certs)  # TLS 1.3: checked after
    try:
        data = b""
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            data = await asyncio.wait_for(reader.readexactly(10), 5)
        assert data == b""
    finally:
        await shut(writer)
