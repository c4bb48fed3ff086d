"""What the benchmark scripts share: options, run matrix, CPU accounting, report.

A benchmark measures some *loads* against the *servers* it compares (started by
:mod:`_peers`), prints one line per measurement, a table of medians and bests with
the ratio Tether / nats-server, and one final JSON line. This module holds the parts
that are the same in every script:

* :class:`Cli`: ``--quick``, ``--server``, ``--repeat``, ``--timeout``, ``--stall``,
  ``--wait-idle``, ``--client-loop``, ``--tether-wrapper``, ``--tether-python-args``
  and ``--self-test``, added after the script's own options;
* :func:`start_server` (a server by name, profiled as asked) and :func:`run_matrix`
  (every repeat, load and server, the servers' order alternating per repeat);
* :class:`Meter`: the server's and the whole machine's CPU over one measurement;
* :class:`Run`, :func:`show_run`, :func:`summarize`, :func:`print_table`,
  :func:`environment` and :func:`finish` (the JSON line) for the report;
* :func:`run_async`, :class:`BenchError`, and the raw protocol pieces:
  :func:`connect_frame`, :func:`raw_connect`, :class:`FrameReader`, :class:`RawConn`.

benchmarks/README.md shows a complete benchmark built from these.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import selectors
import shlex
import socket
import ssl
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from _peers import (
    HOST,
    PeerStartError,
    ServerProcess,
    machine_busy_seconds,
    nats_server_version,
    process_cpu_seconds,
    start_nats_server,
    start_tether,
    tether_version,
    wait_idle,
)

__all__ = [
    "HOST",
    "BenchError",
    "Cli",
    "FrameReader",
    "Meter",
    "PeerStartError",
    "RawConn",
    "Run",
    "ServerProcess",
    "alternating",
    "connect_frame",
    "describe",
    "emit",
    "environment",
    "finish",
    "loadavg",
    "nats_server_version",
    "print_table",
    "process_cpu_seconds",
    "rate_stats",
    "raw_connect",
    "run_async",
    "run_matrix",
    "settle",
    "show_run",
    "start_nats_server",
    "start_server",
    "start_tether",
    "subject_reply",
    "summarize",
    "tether_version",
]

T = TypeVar("T")
R = TypeVar("R")


class BenchError(RuntimeError):
    """A stall, a deadline, a closed connection, a server error or a short count."""


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded for the report."""
    return [round(x, 2) for x in os.getloadavg()]


def run_async(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """Run ``coro`` on a fresh event loop: ``"asyncio"`` or ``"uvloop"``."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


# -- command line -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Cli:
    """The options every benchmark shares; the script adds its own to ``parser`` first.

    ``unit`` names what one measurement is in the help texts ("measurement", "load").
    ``quick`` holds the values ``--quick`` sets (option dests to values). ``self_test``
    is ``(help, function, message)``: ``--self-test`` runs the function, prints the
    message and exits. Options that a script does not have are switched off with
    ``None``/``False``. ``parse`` returns the namespace with ``servers`` set to the
    chosen servers, in the given order.
    """

    doc: str = field(kw_only=False)  # the script's __doc__: its first paragraph
    servers: Sequence[str]
    quick: Mapping[str, object]
    quick_help: str
    self_test: tuple[str, Callable[[], None], str] | None = None
    unit: str = "measurement"
    timeout: float = 120.0
    stall: str = "--stall"
    stall_help: str = "max wait for any reply (s)"
    wait_idle: float | None = 30.0
    repeat: bool = True
    client_loop: bool = True
    profile: bool = True
    parser: argparse.ArgumentParser = field(init=False)

    def __post_init__(self) -> None:
        self.parser = argparse.ArgumentParser(description=self.doc.split("\n\n")[0])

    def parse(self, argv: list[str] | None = None) -> argparse.Namespace:
        p, unit = self.parser, self.unit
        p.add_argument("--quick", action="store_true", help=self.quick_help)
        p.add_argument("--server", choices=[*self.servers, "all"], default="all")
        if self.repeat:
            help_ = "runs of every load on every server; the order of the servers alternates"
            p.add_argument("--repeat", type=int, default=1, help=help_)
        p.add_argument(
            "--timeout", type=float, default=self.timeout, help=f"deadline per {unit} (s)"
        )
        p.add_argument(self.stall, type=float, default=20.0, help=self.stall_help)
        if self.wait_idle is not None:
            help_ = f"before each {unit} wait up to N s for other CPU load to stop (0: don't)"
            p.add_argument("--wait-idle", type=float, default=self.wait_idle, help=help_)
        if self.client_loop:
            help_ = "nats-py clients' event loop"
            p.add_argument(
                "--client-loop", choices=["asyncio", "uvloop"], default="asyncio", help=help_
            )
        if self.profile:
            help_ = "prefix for Tether's command, e.g. '.venv/bin/py-spy record -o /tmp/t.txt -f raw --'"
            p.add_argument("--tether-wrapper", default="", help=help_)
            help_ = "interpreter args for Tether, e.g. '-m cProfile -o /tmp/t.prof'"
            p.add_argument("--tether-python-args", default="", help=help_)
        if self.self_test:
            p.add_argument("--self-test", action="store_true", help=self.self_test[0])
        args = p.parse_args(argv)
        if self.self_test and args.self_test:
            _, test, passed = self.self_test
            test()
            print(passed)
            raise SystemExit(0)
        if args.quick:
            vars(args).update(self.quick)
        args.servers = tuple(self.servers) if args.server == "all" else (args.server,)
        return args


# -- servers and the run matrix -----------------------------------------------------------------


SYNC_ALWAYS = 'jetstream { sync_interval: "always" }\n'


@contextmanager
def start_server(
    name: str,
    args: argparse.Namespace | Mapping[str, Any],
    *,
    store: str = "memory",
    jetstream: bool = False,
) -> Iterator[ServerProcess]:
    """A fresh server by name: ``tether`` (with ``store``, under ``--tether-wrapper`` and
    ``--tether-python-args`` if the script has them), ``nats-server`` (``-js`` if
    ``jetstream``) or ``nats-server-sync`` (JetStream, fsync before every ack)."""
    opts = args if isinstance(args, Mapping) else vars(args)
    if name == "tether":
        with start_tether(
            store=store,
            wrapper=shlex.split(opts.get("tether_wrapper", "")),
            python_args=shlex.split(opts.get("tether_python_args", "")),
        ) as srv:
            yield srv
    elif name == "nats-server":
        with start_nats_server(jetstream=jetstream) as srv:
            yield srv
    elif name == "nats-server-sync":
        with start_nats_server(config=SYNC_ALWAYS) as srv:
            yield srv
    else:
        raise ValueError(f"unknown server {name!r}")


def alternating(servers: Sequence[str], rep: int) -> list[str]:
    """The servers in order on even repeats, reversed on odd ones: none always goes first."""
    return list(servers)[::-1] if rep % 2 else list(servers)


def run_matrix(
    args: argparse.Namespace,
    loads: Sequence[str],
    measure: Callable[[str, str, ServerProcess], R],
    failed: Callable[[str, str, str], R],
    show: Callable[[R, int], None],
    *,
    start: Callable[[str], AbstractContextManager[ServerProcess]] | None = None,
) -> list[R]:
    """Every repeat, load and server (``args.repeat``, ``args.servers``), each on a fresh
    server: ``measure(load, server name, server)``; ``failed(load, name, error)`` stands
    for a server that did not start; ``show(result, rep)`` prints each as it comes."""
    start = start or (lambda name: start_server(name, args))
    results: list[R] = []
    for rep in range(args.repeat):
        for load in loads:
            for name in alternating(args.servers, rep):
                try:
                    with start(name) as srv:
                        res = measure(load, name, srv)
                except PeerStartError as exc:
                    res = failed(load, name, str(exc))
                results.append(res)
                show(res, rep)
    return results


# -- measuring ------------------------------------------------------------------------------------


def settle(max_wait: float) -> float | None:
    """Before a measurement: wait up to ``max_wait`` s for an idle machine (0: don't).
    The seconds waited, or None if the machine stayed busy (the run is then NOISY)."""
    return wait_idle(max_wait) if max_wait > 0 else 0.0


class Meter:
    """CPU seconds of the server's process tree and of the whole machine, and wall
    seconds, from construction to ``stop()``."""

    def __init__(self, server: ServerProcess) -> None:
        self.srv = server
        self.server = self.machine = self.wall = 0.0
        self._cpu0 = server.cpu_seconds()
        self._busy0 = machine_busy_seconds()
        self._wall0 = time.monotonic()

    def stop(self) -> Meter:
        self.server = self.srv.cpu_seconds() - self._cpu0
        self.machine = machine_busy_seconds() - self._busy0
        self.wall = time.monotonic() - self._wall0
        return self

    def other(self, own: float) -> float:
        """CPU seconds the rest of the machine used meanwhile (other jobs, softirq work
        not charged to any process, this driver), given the clients' ``own``: noise."""
        return max(0.0, self.machine - self.server - own)


@dataclass
class Run:
    """One measurement as :func:`summarize` and :func:`show_run` expect it."""

    load: str
    server: str
    messages: int
    count: int = 0
    seconds: float = 0.0
    rate: float = 0.0  # count / seconds
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds / wall seconds
    server_us_per_msg: float = 0.0  # steadier than the rate on a shared machine
    idle_wait: float | None = 0.0  # seconds waited for an idle machine; None: gave up
    error: str = ""

    def record(self, count: int, meter: Meter, client_cpu: float) -> Run:
        """Fill in the numbers of a finished load from its ``meter``."""
        wall = meter.wall
        self.count, self.seconds, self.rate = count, wall, count / wall
        self.cpu = {
            "client": client_cpu / wall,
            "server": meter.server / wall,
            "other": meter.other(client_cpu) / wall,
        }
        self.server_us_per_msg = meter.server / max(1, count) * 1e6
        if count < self.messages:
            self.error = f"short: {count:,} of {self.messages:,}"
        return self


def show_run(r: Any, rep: int, details: str = "", suffix: str = "") -> None:
    """The report line of one measurement (a :class:`Run` or alike): rate, ``details``
    (default: count and seconds), server CPU per message, CPU use, ``suffix``."""
    head = f"  [{rep + 1}] {r.load:8} {r.server:12}"
    if r.error:
        print(f"{head} ERROR: {r.error}", flush=True)
        return
    cpu = " ".join(f"{k[:3]}={v:.0%}" for k, v in r.cpu.items())
    if r.idle_wait is None:
        cpu += " NOISY: machine busy before start"
    details = details or f"{r.count:,} in {r.seconds:.2f}s"
    print(
        f"{head} {r.rate:>12,.0f} msg/s  ({details}, "
        f"server {r.server_us_per_msg:.2f} us/msg, cpu {cpu}{suffix})",
        flush=True,
    )


# -- report ---------------------------------------------------------------------------------------


class Measured(Protocol):
    load: str
    server: str
    rate: float
    server_us_per_msg: float
    error: str


def rate_stats(rates: Sequence[float]) -> dict[str, Any]:
    """Median, best and every run's rate (None, None, [] without runs)."""
    return {
        "median": statistics.median(rates) if rates else None,
        "best": max(rates) if rates else None,
        "runs": [round(x) for x in rates],
    }


def summarize(
    results: Sequence[Measured],
    loads: Sequence[str],
    servers: Sequence[str],
    targets: Mapping[str, tuple[float, float]],
) -> dict[str, Any]:
    """Per load: each server's median and best rate and median server CPU per message,
    the ratios Tether / nats-server of the medians and of the bests, and the load's
    ``(target, stretch)`` ratio."""
    summary: dict[str, Any] = {}
    for load in loads:
        row: dict[str, Any] = {}
        for name in servers:
            ok = [r for r in results if r.load == load and r.server == name and not r.error]
            cost = [r.server_us_per_msg for r in ok]
            row[name] = {
                "server_us_per_msg": statistics.median(cost) if cost else None,
                **rate_stats([r.rate for r in ok]),
            }
        for stat in ("median", "best"):
            t = row.get("tether", {}).get(stat)
            ns = row.get("nats-server", {}).get(stat)
            row["ratio" if stat == "median" else "ratio_best"] = (t / ns) if t and ns else None
        row["target"], row["stretch"] = targets[load]
        summary[load] = row
    return summary


def print_table(summary: dict[str, Any], counts: Mapping[str, int]) -> None:
    """Medians over the repeats, then the best run of each (less disturbed by other
    load), with the ratio Tether / nats-server against the target."""

    def fmt(v: float | None) -> str:
        return f"{v:,.0f}" if v else "-"

    def fmt_ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}x"

    print()
    print(
        f"{'load':8} {'messages':>10} {'stat':>6} {'tether msg/s':>14} "
        f"{'nats-server msg/s':>18} {'ratio':>7}  target"
    )
    for load, row in summary.items():
        target, stretch = row["target"], row["stretch"]
        for stat, key in (("median", "ratio"), ("best", "ratio_best")):
            ratio = row[key]
            verdict = "-" if ratio is None else ("met" if ratio >= target else "MISSED")
            if ratio is not None and stretch > target and ratio >= stretch:
                verdict = "met (stretch)"
            print(
                f"{load:8} {counts[load]:>10,} {stat:>6} "
                f"{fmt(row.get('tether', {}).get(stat)):>14} "
                f"{fmt(row.get('nats-server', {}).get(stat)):>18} "
                f"{fmt_ratio(ratio):>7}  >={target}x {verdict}"
            )


def environment(*, memory: bool = False, uvloop: bool = False) -> dict[str, Any]:
    """The machine and the versions measured: cores, CPU model, optionally memory (GiB)
    and uvloop, Python, nats-py, Tether and nats-server."""
    cpu_model = ""
    mem_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / (1 << 20), 1)
                break
    except OSError:
        pass
    env: dict[str, Any] = {"nproc": os.cpu_count(), "cpu": cpu_model or platform.processor()}
    if memory:
        env["mem_gib"] = mem_gib
    env["python"] = platform.python_version()
    if uvloop:
        try:
            import uvloop as uvloop_module

            env["uvloop"] = getattr(uvloop_module, "__version__", None)
        except ImportError:
            env["uvloop"] = None
    try:
        env["nats_py"] = importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        env["nats_py"] = None
    env["tether"] = tether_version()
    env["nats_server"] = nats_server_version()
    return env


def describe(env: Mapping[str, Any]) -> str:
    """``environment()`` as the first line of a report says it."""
    parts = [f"{env['nproc']} CPU ({env['cpu']})"]
    if "mem_gib" in env:
        parts.append(f"{env['mem_gib']} GiB")
    parts.append(f"Python {env['python']}")
    if "uvloop" in env:
        parts.append(f"uvloop {env['uvloop']}")
    parts += [
        f"nats-py {env['nats_py']}",
        f"tether {env['tether']}",
        f"nats-server {env['nats_server']}",
    ]
    return ", ".join(parts)


def emit(benchmark: str, argv: list[str] | None, **fields: Any) -> None:
    """The final single-line JSON document: benchmark, time, argv, then ``fields``."""
    out = {
        "benchmark": benchmark,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else argv,
        **fields,
    }
    print(json.dumps(out, separators=(",", ":"), default=str))


def finish(benchmark: str, argv: list[str] | None, results: Sequence[Any], **fields: Any) -> int:
    """:func:`emit` ``fields`` and then ``runs``, every result (a dataclass or a dict);
    returns the exit code: 1 if any measurement failed."""
    runs = [asdict(r) if is_dataclass(r) and not isinstance(r, type) else r for r in results]
    emit(benchmark, argv, **fields, runs=runs)
    return 1 if any(run.get("error") for run in runs) else 0


async def fill_stream(url: str, messages: int, size: int, **config: Any) -> float:
    """Create the stream BENCH (``bench.>``, plus ``config``) and publish ``messages`` of
    ``size`` bytes over 16 subjects with the SDK's ``publish_async``; returns msg/s."""
    from tether.client import ServiceUnavailable, connect

    nc = await connect(url)
    js = nc.jetstream(timeout=30, max_pending_acks=4000)
    for attempt in range(50):  # a freshly started server may not answer the API yet
        try:
            await js.add_stream(name="BENCH", subjects=["bench.>"], **config)
            break
        except ServiceUnavailable:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)
    payload = b"x" * size
    start = time.perf_counter()
    for i in range(messages):
        await js.publish_async(f"bench.{i % 16}", payload)
    await js.publish_async_completed(timeout=300)
    rate = messages / (time.perf_counter() - start)
    await nc.close()
    return rate


# -- raw protocol ---------------------------------------------------------------------------------


def connect_frame(name: str, *, headers: bool = True) -> bytes:
    """A CONNECT line without verbose/pedantic; ``headers`` also asks for no_responders."""
    opts: dict[str, object] = {"verbose": False, "pedantic": False, "headers": headers}
    if headers:
        opts["no_responders"] = True
    opts.update(echo=True, protocol=1, lang="raw", version="0", name=name)
    return b"CONNECT " + json.dumps(opts, separators=(",", ":")).encode() + b"\r\n"


def raw_connect(
    port: int, connect: bytes, stall: float, tls: ssl.SSLContext | None = None
) -> tuple[socket.socket, bytes]:
    """A blocking TCP_NODELAY socket to ``127.0.0.1:port`` (``stall`` s timeout) that has
    read INFO and sent ``connect``; returns it and the bytes read after INFO. With
    ``tls``, the socket upgrades after INFO (as INFO's ``tls_required`` asks) and
    ``connect`` goes inside TLS."""
    sock = socket.create_connection((HOST, port), timeout=stall)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = time.monotonic() + stall  # each recv is bounded by the timeout too
        buf = b""
        while b"\r\n" not in buf:
            if time.monotonic() > deadline:
                raise BenchError(f"no INFO within {stall:.0f}s")
            chunk = sock.recv(65536)
            if not chunk:
                raise BenchError("server closed the connection before INFO")
            buf += chunk
        if not buf.startswith(b"INFO "):
            raise BenchError(f"expected INFO, got {buf[:80]!r}")
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="localhost")
        sock.sendall(connect)
    except BaseException:
        sock.close()
        raise
    return sock, buf[buf.index(b"\r\n") + 2 :]


# on_msg(buf, line, eol, hdr_len, payload_start, payload_len)
OnMsg = Callable[[bytearray, int, int, int, int, int], None]


class FrameReader:
    """Parses what a server sends, fed in pieces that may split frames anywhere.

    ``on_msg(buf, line, eol, hdr_len, start, size)`` is called for every MSG
    (``hdr_len`` -1) and HMSG frame: its control line is ``buf[line:eol]``, its headers
    ``buf[eol + 2 : eol + 2 + hdr_len]``, its payload ``buf[start : start + size]``,
    valid during the call only. PINGs and PONGs are counted in ``pings`` (the caller
    answers them) and ``pongs``; ``-ERR`` or an unknown frame raises BenchError.
    """

    def __init__(self, on_msg: OnMsg) -> None:
        self.buf = bytearray()
        self.on_msg = on_msg
        self.pings = 0
        self.pongs = 0

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        del buf[: self.scan(buf, len(buf))]

    def scan(self, buf: bytearray, end: int) -> int:
        """Consume whole frames of ``buf[:end]``; returns where the first incomplete one
        starts."""
        pos, frame = 0, self.frame
        while pos < end and (step := frame(buf, pos, end)):
            pos += step
        return pos

    def frame(self, buf: bytearray, pos: int, end: int) -> int:
        """Handle one frame at ``pos``; its length, or 0 if it is not complete yet."""
        eol = buf.find(b"\r\n", pos, end)
        if eol < 0:
            if end - pos > 4096:
                raise BenchError(f"control line too long: {bytes(buf[pos : pos + 80])!r}")
            return 0
        if buf.startswith(b"MSG ", pos):
            size = int(buf[buf.rfind(b" ", pos, eol) + 1 : eol])
            stop = eol + 4 + size
            if stop > end:
                return 0
            self.on_msg(buf, pos, eol, -1, eol + 2, size)
            return stop - pos
        if buf.startswith(b"HMSG ", pos):
            sp2 = buf.rfind(b" ", pos, eol)
            sp1 = buf.rfind(b" ", pos, sp2)
            hlen, total = int(buf[sp1 + 1 : sp2]), int(buf[sp2 + 1 : eol])
            stop = eol + 4 + total
            if stop > end:
                return 0
            self.on_msg(buf, pos, eol, hlen, eol + 2 + hlen, total - hlen)
            return stop - pos
        line = bytes(buf[pos:eol])
        op = line.split(b" ", 1)[0].upper()
        if op == b"PING":
            self.pings += 1
        elif op == b"PONG":
            self.pongs += 1
        elif op == b"-ERR":
            raise BenchError(f"server error: {line.decode(errors='replace')}")
        elif op not in (b"+OK", b"INFO"):
            raise BenchError(f"unexpected frame: {line[:80]!r}")
        return eol + 2 - pos


def subject_reply(buf: bytearray, line: int, eol: int, hdr_len: int) -> tuple[bytes, bytes | None]:
    """The subject and the reply subject (None without one) of the frame ``on_msg`` got."""
    parts = bytes(buf[line:eol]).split(b" ")
    reply = parts[3] if len(parts) == (5 if hdr_len < 0 else 6) else None
    return parts[1], reply


class RawConn:
    """A non-blocking raw connection: writes buffered, read frames go to a FrameReader
    (``reader``), server PINGs answered. ``pump()`` moves the bytes."""

    def __init__(self, port: int, on_msg: OnMsg, stall: float, connect: bytes) -> None:
        self.stall = stall
        self.out = bytearray()
        self.reader = FrameReader(on_msg)
        self.sock, rest = raw_connect(port, connect, stall)
        self.sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.mask = selectors.EVENT_READ
        self.last_data = time.monotonic()
        try:
            self.feed(rest)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sel.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.out += data

    def feed(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        if reader.pings:
            self.out += b"PONG\r\n" * reader.pings
            reader.pings = 0

    def pump(self, timeout: float = 0.2) -> None:
        """Write what the socket takes, read and parse what arrived (waits <= timeout);
        BenchError if nothing arrived for ``stall`` seconds."""
        if self.out:
            self._write()
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
        if want != self.mask:
            self.sel.modify(self.sock, want)
            self.mask = want
        for _key, events in self.sel.select(timeout):
            if events & selectors.EVENT_READ:
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    chunk = None
                if chunk is not None:
                    if not chunk:
                        raise BenchError("server closed the connection")
                    self.last_data = time.monotonic()
                    self.feed(chunk)
            if events & selectors.EVENT_WRITE and self.out:
                self._write()
        if time.monotonic() - self.last_data > self.stall:
            raise BenchError(f"nothing received for {self.stall:.0f}s")

    def _write(self) -> None:
        try:
            n = self.sock.send(self.out)
        except BlockingIOError:
            return
        del self.out[:n]

    def ping(self, deadline: float) -> None:
        """PING and wait for the PONG: the server has read everything sent before."""
        want = self.reader.pongs + 1
        self.send(b"PING\r\n")
        while self.reader.pongs < want:
            if time.monotonic() > deadline:
                raise BenchError("no PONG before the deadline")
            self.pump()
