"""``tether serve`` as a user (or a tool written for nats-server) runs it."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

LISTEN = re.compile(r"Listening for client connections on (\S+):(\d+)")
HTTP = re.compile(r"Starting http monitor on (\S+):(\d+)")


class Serve:
    """``python -m tether serve ARGS`` with its stderr collected line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        if not any(a.startswith("--nsq-port") for a in args):
            args = [*args, "--nsq-port", "-1"]  # never nsqd's 4150, which may be taken
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "serve", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
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

    def wait_ready(self, within: float = 20.0) -> Serve:
        assert self._ready.wait(within), "no 'Server is ready' in time"
        assert self.proc.poll() is None, f"exited early:\n{self.stderr}"
        return self

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    @property
    def address(self) -> tuple[str, int]:
        m = LISTEN.search(self.stderr)
        assert m, self.stderr
        return m.group(1), int(m.group(2))

    @property
    def http_address(self) -> tuple[str, int]:
        m = HTTP.search(self.stderr)
        assert m, self.stderr
        return m.group(1), int(m.group(2))

    def info(self) -> dict[str, object]:
        """The INFO line a client gets."""
        with socket.create_connection(self.address, timeout=5) as sock:
            data = b""
            while not data.endswith(b"\r\n"):
                chunk = sock.recv(4096)
                assert chunk
                data += chunk
        assert data.startswith(b"INFO ")
        info: dict[str, object] = json.loads(data[5:])
        return info

    def varz(self) -> dict[str, object]:
        host, port = self.http_address
        body: dict[str, object] = httpx.get(f"http://{host}:{port}/varz", timeout=5).json()
        return body

    def finish(self, sig: int = signal.SIGTERM, within: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(within)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return code


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[type[Serve]]:
    started: list[Serve] = []

    class Tracked(Serve):
        def __init__(self, args: list[str], cwd: Path = tmp_path) -> None:
            super().__init__(args, cwd)
            started.append(self)

    yield Tracked
    for s in started:
        s.finish(signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BASE = ["--store", "memory", "--http-port", "-1", "--nsq-port", "-1"]


def test_ready_lines_on_stderr(serve: type[Serve]) -> None:
    s = serve(["--port", "-1", *BASE]).wait_ready()
    listen = next(i for i, line in enumerate(s.lines) if LISTEN.search(line))
    ready = next(i for i, line in enumerate(s.lines) if "Server is ready" in line)
    assert listen < ready
    host, port = s.address
    assert host == "127.0.0.1" and port > 0
    assert s.info()["port"] == port
    assert s.finish() == 0


def test_port_minus_one_picks_a_free_port(serve: type[Serve]) -> None:
    a = serve(["--port", "-1", *BASE]).wait_ready()
    b = serve(["--port", "-1", *BASE]).wait_ready()
    assert a.address[1] != b.address[1]
    assert a.http_address[1] != b.http_address[1]
    assert a.finish() == 0 and b.finish() == 0


def test_explicit_port(serve: type[Serve]) -> None:
    port = free_port()
    s = serve(["--port", str(port), *BASE]).wait_ready()
    assert s.address == ("127.0.0.1", port)
    assert s.finish() == 0


@pytest.mark.parametrize(
    "flags",
    [
        ["-p", "-1", "-a", "127.0.0.1", "-m", "-1"],
        ["--port=-1", "--addr", "127.0.0.1", "--http_port", "-1"],
        ["-p", "-1", "--net", "127.0.0.1", "-m=-1"],
    ],
    ids=["short", "long", "mixed"],
)
def test_nats_server_address_flags(serve: type[Serve], flags: list[str]) -> None:
    s = serve([*flags, "--store", "memory"]).wait_ready()
    assert s.address[0] == "127.0.0.1"
    assert s.varz()["port"] == s.address[1]
    assert s.finish() == 0


@pytest.mark.parametrize(
    "flags",
    [
        lambda d: ["-js", "-sd", d],
        lambda d: ["-js", f"-sd={d}"],
        lambda d: ["--jetstream", "--store_dir", d],
        lambda d: ["--js", "--store_dir=" + d],
    ],
    ids=["-sd DIR", "-sd=DIR", "--store_dir DIR", "--store_dir=DIR"],
)
def test_nats_server_store_flags(serve: type[Serve], tmp_path: Path, flags: object) -> None:
    store = tmp_path / "store"
    args = flags(str(store))  # type: ignore[operator]
    s = serve(["-p", "-1", "-m", "-1", *args]).wait_ready()
    # The data lands where nats-server's flags said.
    assert store.is_dir() and any(store.iterdir())
    assert s.finish() == 0


def test_trace_flags_are_accepted(serve: type[Serve]) -> None:
    s = serve(["-p", "-1", "-DV", *BASE]).wait_ready()
    assert s.finish() == 0


def test_config_file(serve: type[Serve], tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(
        'host = "127.0.0.1"\nport = -1\nhttp_port = -1\nstore = "memory"\n'
        'server_name = "from-file"\nmax_payload = 2048\n'
    )
    s = serve(["--config", str(config)]).wait_ready()
    info = s.info()
    assert info["server_name"] == "from-file"
    assert info["max_payload"] == 2048
    assert s.finish() == 0


def test_config_file_server_table_and_flag_precedence(serve: type[Serve], tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(
        '[server]\nport = -1\nhttp-port = -1\nstore = "memory"\n'
        'server_name = "from-file"\nmax_payload = 2048\nmax_connections = 7\n'
    )
    s = serve(["-c", str(config), "--max-payload", "4096", "-n", "from-flag"]).wait_ready()
    info = s.info()
    assert info["max_payload"] == 4096  # the flag wins
    assert info["server_name"] == "from-flag"
    assert s.varz()["max_connections"] == 7  # the file still counts where no flag is given
    assert s.finish() == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("port = [1\n", "tether.toml"),  # not TOML
        ("no_such_setting = 1\n", "no_such_setting"),
        ('port = "x"\n', "port"),
        ('sync = "sometimes"\n', "sync"),
        ("[server]\nmax_payload = true\n", "max_payload"),
        ('server = "x"\n', "[server] must be a table"),
    ],
    ids=["syntax", "unknown key", "wrong type", "bad choice", "bool for int", "server not a table"],
)
def test_bad_config(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--config", str(config), *BASE],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("tether: "), proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "nope.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_flag_value(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--port", "abc"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "port" in proc.stderr and "Traceback" not in proc.stderr


def test_port_in_use(serve: type[Serve], tmp_path: Path) -> None:
    first = serve(["-p", "-1", *BASE]).wait_ready()
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "-p", str(first.address[1]), *BASE],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr and "Traceback" not in proc.stderr
    assert first.finish() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_exit_cleanly(serve: type[Serve], sig: int) -> None:
    s = serve(["-p", "-1", *BASE]).wait_ready()
    # With a client connected, too.
    with socket.create_connection(s.address, timeout=5) as sock:
        sock.sendall(b"CONNECT {}\r\nSUB x 1\r\n")
        assert s.finish(sig) == 0
        # The client sees the connection end.
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"INFO ")
    assert "Traceback" not in s.stderr
    assert "Server exiting" in s.stderr


def test_version_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tether", "version"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*\n", proc.stdout)
