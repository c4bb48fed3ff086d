"""What one HTTP client may cost: header size and count, slow and idle clients, and
connections at once (server/http/limits.py), with small limits set in a config file."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tether.testing import RunningServer, run_server

LIMITS = """
http_max_header_bytes = 4096
http_max_headers = 20
http_header_timeout = 0.5
http_body_timeout = 0.5
http_idle_timeout = 1
http_max_connections = 8
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tmp_path_factory.mktemp("limits") / "tether.toml"
    config.write_text(LIMITS)
    with run_server(store="memory", args=["--config", str(config)]) as srv:
        yield srv


def _connect(srv: RunningServer) -> socket.socket:
    host, port = srv.http_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _status(sock: socket.socket) -> int:
    answer = b""
    while b"\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return int(answer.split(b" ", 2)[1]) if answer else 0


def _closed(sock: socket.socket) -> bool:
    try:
        while chunk := sock.recv(65536):
            del chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


def test_a_huge_header_is_refused_and_the_connection_closed(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        try:
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n"
            )
        except (ConnectionResetError, BrokenPipeError):
            pass  # cut off mid-send: the 431 may be lost with the reset
        else:
            assert _status(sock) == 431
        assert _closed(sock)


def test_body_bytes_in_the_head_s_read_do_not_count_as_head(limited: RunningServer) -> None:
    """A small head followed at once by a large body, in one write: the body's bytes
    are not the head's (they used to be counted, and the request got 431)."""
    body = b"x" * 60_000
    head = b"POST /pub?topic=big_head HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _connect(limited) as sock:
        sock.sendall(head + body)
        assert _status(sock) == 200


def test_a_header_sent_forever_is_cut_off(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nx-big: ")
        sent = 0
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(10_000):
                sock.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 16 * 1024 * 1024  # bounded by the limit, not by the client


def test_too_many_headers(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        lines = b"".join(b"x-h%d: 1\r\n" % i for i in range(50))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
        assert _status(sock) == 431


def test_a_slow_head_times_out(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # never finished
        assert _status(sock) == 408
        assert time.monotonic() - start < 4


def test_a_client_that_says_nothing_is_closed(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        start = time.monotonic()
        assert _closed(sock)
        assert time.monotonic() - start < 4


def test_a_slow_body_times_out(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        sock.sendall(
            b"PUT /producer/slow HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\nto"
        )
        assert _status(sock) == 408


def test_healthy_requests_go_on_and_connections_are_capped(limited: RunningServer) -> None:
    hogs = [_connect(limited) for _ in range(8)]
    try:
        for sock in hogs:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # heads left open
        r = httpx.get(f"{limited.http_url}/healthz", timeout=5)
        assert r.status_code == 503  # past http_max_connections
    finally:
        for sock in hogs:
            sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        r = httpx.get(f"{limited.http_url}/healthz", timeout=5)
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200


def test_defaults_allow_ordinary_requests(tmp_path: Path) -> None:
    with run_server(store="memory") as srv:
        headers = {f"x-h{i}": "v" * 100 for i in range(50)}
        assert httpx.get(f"{srv.http_url}/healthz", headers=headers).status_code == 200
