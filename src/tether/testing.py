"""Helpers for tests: run a real Tether server and wait until it reports ready.

``run_server()`` starts ``tether serve`` as a subprocess on free ports (or given ones)
and returns once the server has printed ``Server is ready`` — never a sleep. It can
be stopped gracefully, killed with SIGKILL (crash tests) and restarted on the same
store directory::

    with run_server() as srv:
        nc = await nats.connect(srv.url)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_LISTEN = re.compile(rb"Listening for client connections on (\S+):(\d+)")
_HTTP = re.compile(rb"Starting http monitor on (\S+):(\d+)")
_READY = b"Server is ready"


class ServerStartError(RuntimeError):
    """The server exited or did not report ready in time; carries its stderr."""


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
        self.host = "127.0.0.1"
        self.port = 0
        self.http_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: list[bytes] = []
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

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
        if not ready.wait(self.startup_timeout) or not self.port:
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
            elif _READY in line:
                ready.set()
        ready.set()  # process ended: wake the waiter, which sees no port / dead process

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._join()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the crash a durability test needs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._join()

    def restart(self) -> RunningServer:
        self.stop()
        return self.start()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

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
) -> Iterator[RunningServer]:
    """Run ``tether serve`` for the duration of a ``with`` block.

    ``port=0`` picks free ports. ``store`` defaults to a fresh SQLite directory that is
    removed afterwards; pass ``"memory"`` or ``"sqlite:DIR"`` to choose.
    """
    store_url = None if store is None else (store if isinstance(store, str) else f"sqlite:{store}")
    server = RunningServer(port=port, http_port=http_port, store=store_url, args=args, env=env)
    try:
        yield server.start()
    finally:
        server.cleanup()
