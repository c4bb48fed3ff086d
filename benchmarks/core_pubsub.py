"""Core pub/sub throughput: the same load against Tether and nats-server, in one run.

Two loads, each run against a fresh Tether (``tether serve --store memory``) and a fresh
nats-server, with publisher and subscriber in separate processes:

* ``raw``: a publisher writing pre-built batches of ``PUB`` frames to a raw socket (one
  ``sendall`` per batch, a PING/PONG sync every ``--sync-every`` messages), and a
  subscriber counting ``MSG`` frames on a raw socket. This measures the server.
* ``nats-py``: ``await nc.publish()`` in a loop (``flush()`` at the end) and a callback
  subscriber, on separate connections. This is what a Python application sees.

Rate = messages received by the subscriber / (first publish -> last receive). Each
side's CPU use is sampled so the report can say which side bounds the result. Every
wait has a deadline: a stalled side ends the run with an error instead of hanging.

    .venv/bin/python benchmarks/core_pubsub.py            # 1M raw, 100k nats-py
    .venv/bin/python benchmarks/core_pubsub.py --quick    # 100k raw, 20k nats-py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import random
import shlex
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peers import (  # after the sys.path tweak above
    PeerStartError,
    ServerProcess,
    machine_busy_seconds,
    nats_server_version,
    start_nats_server,
    start_tether,
    tether_version,
    wait_idle,
)

SUBJECT = b"bench.core"
SID = b"1"
SERVERS = ("tether", "nats-server")
LOADS = ("raw", "nats-py")
TARGETS = {"raw": (0.3, 0.5), "nats-py": (0.9, 0.9)}  # (target, stretch) Tether/nats-server
CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":false,"echo":true,'
    b'"protocol":1,"lang":"raw","version":"0","name":"core_pubsub"}\r\n'
)


class BenchError(RuntimeError):
    """A side stalled, the server closed a connection, or a count came up short."""


# -- MSG counting (raw subscriber) -----------------------------------------------------------


class MsgCounter:
    """Counts MSG/HMSG frames in a byte stream fed in arbitrary pieces.

    ``frames`` is the cycle of frames the publisher's messages turn into (one per
    subject, all the same length). The fast path compares whole runs of the expected
    cycle against a pre-built template (one memcmp for up to ``run`` frames); anything
    else (another size, a PING, a frame split across reads) goes through a general
    one-frame parser, so the count is exact for any framing and any split.
    """

    def __init__(self, frames: list[bytes], run: int = 4096) -> None:
        self.frame_len = len(frames[0])
        if any(len(f) != self.frame_len for f in frames):
            raise ValueError("cycle frames must have one length")
        self.cycle = len(frames)
        reps = max(1, run // self.cycle)
        self.run = reps * self.cycle
        joined = b"".join(frames)
        cut = [p * self.frame_len for p in range(self.cycle)]
        # templates[p]: the stream as it continues from the p-th frame of the cycle.
        self.templates = [(joined[c:] + joined[:c]) * reps for c in cut]
        self.heads = {f[: f.index(b"\r\n")]: i for i, f in enumerate(frames)}
        self.phase = 0
        self.buf = bytearray()
        self.count = 0
        self.pings = 0  # server PINGs seen; the caller answers each with PONG
        self.pongs = 0

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = self._scan(buf)
        del buf[:pos]

    def _scan(self, buf: bytearray) -> int:
        pos, end = 0, len(buf)
        flen, run, cycle = self.frame_len, self.run, self.cycle
        with memoryview(buf) as mv:
            while pos < end:
                template = self.templates[self.phase]
                k = min((end - pos) // flen, run)
                while k and not template.startswith(mv[pos : pos + k * flen]):
                    k >>= 1  # something else within the run: narrow down to it
                if k:
                    self.count += k
                    self.phase = (self.phase + k) % cycle
                    pos += k * flen
                    continue
                step = self._one(buf, pos, end)
                if step == 0:
                    break  # incomplete frame: wait for more bytes
                pos += step
        return pos

    def _one(self, buf: bytearray, pos: int, end: int) -> int:
        """Parse one frame of any kind at ``pos``; its length, or 0 if incomplete."""
        eol = buf.find(b"\r\n", pos, end)
        if eol < 0:
            if end - pos > 4096:
                raise BenchError(f"control line too long: {bytes(buf[pos : pos + 80])!r}")
            return 0
        line = bytes(buf[pos:eol])
        op = line.split(b" ", 1)[0].upper()
        if op in (b"MSG", b"HMSG"):
            size = int(line.rsplit(b" ", 1)[1])
            total = eol + 2 + size + 2 - pos
            if pos + total > end:
                return 0
            self.count += 1
            index = self.heads.get(line)
            if index is not None:  # resynchronise with the cycle
                self.phase = (index + 1) % self.cycle
            return total
        if op == b"PING":
            self.pings += 1
        elif op == b"PONG":
            self.pongs += 1
        elif op == b"-ERR":
            raise BenchError(f"server error: {line.decode(errors='replace')}")
        elif op not in (b"+OK", b"INFO"):
            raise BenchError(f"unexpected frame: {line[:80]!r}")
        return eol + 2 - pos


def subjects(count: int) -> list[bytes]:
    """The subjects a load publishes to in turn, all of one length."""
    if count <= 1:
        return [SUBJECT]
    return [b"%s.%03d" % (SUBJECT, i) for i in range(count)]


def sub_filter(count: int) -> bytes:
    return SUBJECT if count <= 1 else SUBJECT + b".*"


def msg_frames(count: int, sid: bytes, payload: bytes) -> list[bytes]:
    return [
        b"MSG %s %s %d\r\n%s\r\n" % (subject, sid, len(payload), payload)
        for subject in subjects(count)
    ]


def self_test(seed: int = 1) -> None:
    """Check MsgCounter on streams with odd frames, split at random points."""
    for count in (1, 3):
        rng = random.Random(seed)
        payload = b"x" * 128
        cycle = msg_frames(count, SID, payload)
        counter = MsgCounter(cycle, run=64)
        parts, expected, pings = [], 0, 0
        for i in range(20_000):
            r = rng.random()
            if r < 0.01:
                parts.append(b"PING\r\n")
                pings += 1
            elif r < 0.02:
                parts.append(b"+OK\r\n")
            elif r < 0.03:
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
                parts.append(b"MSG other 2 reply.x %d\r\n%s\r\n" % (len(body), body))
                expected += 1
            else:
                parts.append(cycle[i % count])
                expected += 1
        stream = b"".join(parts)
        pos = 0
        while pos < len(stream):
            step = rng.choice((1, 2, 3, 7, 151, 152, 153, 1000, 65536))
            counter.feed(stream[pos : pos + step])
            pos += step
        assert counter.count == expected, (count, counter.count, expected)
        assert counter.pings == pings, (count, counter.pings, pings)
        assert not counter.buf, bytes(counter.buf[:40])


# -- raw socket clients ----------------------------------------------------------------------


class RawClient:
    """A blocking NATS connection speaking the text protocol directly."""

    def __init__(self, host: str, port: int, stall_timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=stall_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stall_timeout = stall_timeout
        self.buf = bytearray()
        line = self.read_line()
        if not line.startswith(b"INFO "):
            raise BenchError(f"expected INFO, got {line[:80]!r}")
        self.sock.sendall(CONNECT)

    def recv(self) -> bytes:
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            raise BenchError(f"no data from the server for {self.stall_timeout:.0f}s") from None
        if not data:
            raise BenchError("server closed the connection")
        return data

    def read_line(self) -> bytes:
        while (eol := self.buf.find(b"\r\n")) < 0:
            self.buf += self.recv()
        line = bytes(self.buf[:eol])
        del self.buf[: eol + 2]
        return line

    def wait_pongs(self, n: int) -> None:
        """Read until ``n`` PONGs arrived, answering PINGs; errors on -ERR."""
        while n > 0:
            line = self.read_line()
            if line == b"PONG":
                n -= 1
            elif line == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise BenchError(f"server error: {line.decode(errors='replace')}")

    def sync(self) -> None:
        self.sock.sendall(b"PING\r\n")
        self.wait_pongs(1)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Side:
    """What a client process reports back."""

    ok: bool = True
    error: str = ""
    count: int = 0
    t_first: float = 0.0  # publisher: first publish; subscriber: first receive
    t_last: float = 0.0  # publisher: final flush/PONG; subscriber: last receive
    cpu: float = 0.0  # process CPU seconds between go and t_last


def _report(conn: Connection, side: Side) -> None:
    conn.send(asdict(side))
    conn.close()


def raw_subscriber(
    port: int, n: int, size: int, received: Synchronized, conn: Connection, opts: dict[str, Any]
) -> None:
    side = Side()
    try:
        client = RawClient("127.0.0.1", port, opts["stall_timeout"])
        client.sock.sendall(b"SUB %s %s\r\n" % (sub_filter(opts["subjects"]), SID))
        client.sync()  # the SUB is registered once the PONG is back
        counter = MsgCounter(msg_frames(opts["subjects"], SID, b"x" * size))
        if client.buf:
            counter.feed(bytes(client.buf))
        conn.send("ready")
        deadline = time.monotonic() + opts["timeout"]
        cpu0 = time.process_time()
        recv, feed = client.recv, counter.feed
        first = True
        while counter.count < n:
            data = recv()
            if first:
                side.t_first = time.monotonic()
                first = False
            feed(data)
            received.value = counter.count
            if counter.pings:
                client.sock.sendall(b"PONG\r\n" * counter.pings)
                counter.pings = 0
            if time.monotonic() > deadline:
                raise BenchError(f"deadline: received {counter.count:,} of {n:,}")
        side.t_last = time.monotonic()
        side.cpu = time.process_time() - cpu0
        side.count = counter.count
        client.close()
    except (BenchError, OSError) as exc:
        side.ok, side.error = False, f"subscriber: {exc}"
    _report(conn, side)


def raw_publisher(
    port: int, n: int, size: int, received: Synchronized, conn: Connection, opts: dict[str, Any]
) -> None:
    side = Side()
    try:
        client = RawClient("127.0.0.1", port, opts["stall_timeout"])
        client.sync()
        payload = b"x" * size
        cycle = [
            b"PUB %s %d\r\n%s\r\n" % (subj, size, payload) for subj in subjects(opts["subjects"])
        ]
        flen = len(cycle[0])
        # Whole cycles per batch, so every batch starts with the first subject.
        batch_n = max(1, opts["batch"] // len(cycle)) * len(cycle)
        batch = b"".join(cycle) * (batch_n // len(cycle))
        sync_every, window = opts["sync_every"], opts["window"]
        conn.send("ready")
        if not conn.poll(opts["timeout"]) or conn.recv() != "go":
            raise BenchError("no go signal")
        deadline = time.monotonic() + opts["timeout"]
        sendall = client.sock.sendall
        cpu0 = time.process_time()
        side.t_first = time.monotonic()
        sent = since_sync = pings_out = 0
        while sent < n:
            k = min(batch_n, n - sent)
            # End-to-end window: never more than ``window`` messages ahead of the
            # subscriber, so neither server builds a backlog big enough to drop it.
            while sent - received.value > window:
                if time.monotonic() > deadline:
                    raise BenchError(f"deadline: subscriber stuck at {received.value:,}")
                time.sleep(0.0002)
            sendall(batch if k == batch_n else batch[: k * flen])
            sent += k
            since_sync += k
            if since_sync >= sync_every:
                sendall(b"PING\r\n")
                since_sync = 0
                pings_out += 1
                if pings_out > 1:  # keep one PING in flight, wait for the one before
                    client.wait_pongs(pings_out - 1)
                    pings_out = 1
                if time.monotonic() > deadline:
                    raise BenchError(f"deadline: published {sent:,} of {n:,}")
        client.sock.sendall(b"PING\r\n")
        client.wait_pongs(pings_out + 1)  # the server has read every PUB
        side.t_last = time.monotonic()
        side.cpu = time.process_time() - cpu0
        side.count = sent
        client.close()
    except (BenchError, OSError) as exc:
        side.ok, side.error = False, f"publisher: {exc}"
    _report(conn, side)


# -- nats-py clients ------------------------------------------------------------------------


def _run_async(coro_fn: Callable[[], Any], loop_kind: str) -> None:
    if loop_kind == "uvloop":
        import uvloop

        uvloop.run(coro_fn())
    else:
        asyncio.run(coro_fn())


def natspy_subscriber(
    port: int, n: int, size: int, received: Synchronized, conn: Connection, opts: dict[str, Any]
) -> None:
    side = Side()

    async def main() -> None:
        import nats

        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(repr(exc))

        nc = await nats.connect(
            f"nats://127.0.0.1:{port}", allow_reconnect=False, error_cb=on_error
        )
        done = asyncio.Event()
        count = 0

        async def on_msg(msg: Any) -> None:
            nonlocal count
            count += 1
            if count == 1:
                side.t_first = time.monotonic()
            if count & 1023 == 0:
                received.value = count
            if count >= n:
                side.t_last = time.monotonic()
                done.set()

        await nc.subscribe(
            sub_filter(opts["subjects"]).decode(),
            cb=on_msg,
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        await nc.flush()
        conn.send("ready")
        cpu0 = time.process_time()
        try:
            await asyncio.wait_for(done.wait(), opts["timeout"])
        except TimeoutError:
            raise BenchError(f"deadline: received {count:,} of {n:,} {errors}") from None
        side.cpu = time.process_time() - cpu0
        side.count = count
        received.value = count
        await nc.close()

    try:
        _run_async(main, opts["client_loop"])
    except Exception as exc:  # report any client failure to the parent
        side.ok, side.error = False, f"subscriber: {exc!r}"
    _report(conn, side)


def natspy_publisher(
    port: int, n: int, size: int, received: Synchronized, conn: Connection, opts: dict[str, Any]
) -> None:
    side = Side()

    async def main() -> None:
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
        await nc.flush()
        payload = b"x" * size
        names = [subj.decode() for subj in subjects(opts["subjects"])]
        cycle = len(names)
        window = opts["window"]
        conn.send("ready")
        if not conn.poll(opts["timeout"]) or conn.recv() != "go":
            raise BenchError("no go signal")
        deadline = time.monotonic() + opts["timeout"]
        publish = nc.publish
        cpu0 = time.process_time()
        side.t_first = time.monotonic()
        for i in range(n):
            await publish(names[i % cycle], payload)
            if i & 1023 == 0:
                while i - received.value > window:
                    if time.monotonic() > deadline:
                        raise BenchError(f"deadline: subscriber stuck at {received.value:,}")
                    await asyncio.sleep(0.001)
                if time.monotonic() > deadline:
                    raise BenchError(f"deadline: published {i:,} of {n:,}")
        await nc.flush(timeout=max(1.0, deadline - time.monotonic()))
        side.t_last = time.monotonic()
        side.cpu = time.process_time() - cpu0
        side.count = n
        await nc.close()

    try:
        _run_async(main, opts["client_loop"])
    except Exception as exc:  # report any client failure to the parent
        side.ok, side.error = False, f"publisher: {exc!r}"
    _report(conn, side)


CLIENTS = {
    "raw": (raw_publisher, raw_subscriber),
    "nats-py": (natspy_publisher, natspy_subscriber),
}


# -- one measurement -------------------------------------------------------------------------


@dataclass
class Result:
    load: str
    server: str
    messages: int
    size: int
    received: int = 0
    rate: float = 0.0  # received / (first publish -> last receive)
    publish_rate: float = 0.0  # sent / (first publish -> publisher's final flush)
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds / wall seconds
    # Server CPU per message: steadier than the rate when other jobs share the machine.
    server_us_per_msg: float = 0.0
    idle_wait: float | None = 0.0  # seconds waited for an idle machine; None: gave up
    bound: str = ""
    error: str = ""


def _recv(conn: Connection, what: str, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise BenchError(f"{what}: no answer within {timeout:.0f}s")
    try:
        return conn.recv()
    except EOFError:
        raise BenchError(f"{what}: process died") from None


def _expect_ready(conn: Connection, what: str, timeout: float) -> None:
    answer = _recv(conn, f"{what} start", timeout)
    if answer != "ready":
        error = answer.get("error") if isinstance(answer, dict) else answer
        raise BenchError(f"{what} did not start: {error}")


def measure(load: str, server: ServerProcess, name: str, n: int, opts: dict[str, Any]) -> Result:
    """Run one load against a running server; the child processes never outlive this."""
    ctx = mp.get_context("spawn")
    received = ctx.Value("q", 0, lock=False)
    pub_fn, sub_fn = CLIENTS[load]
    result = Result(load=load, server=name, messages=n, size=opts["size"])
    sub_parent, sub_child = ctx.Pipe()
    pub_parent, pub_child = ctx.Pipe()
    args = (server.port, n, opts["size"], received)
    sub = ctx.Process(target=sub_fn, args=(*args, sub_child, opts), daemon=True)
    pub = ctx.Process(target=pub_fn, args=(*args, pub_child, opts), daemon=True)
    if opts["wait_idle"] > 0:
        result.idle_wait = wait_idle(opts["wait_idle"])
    try:
        sub.start()
        _expect_ready(sub_parent, "subscriber", opts["stall_timeout"] + 30)
        pub.start()
        _expect_ready(pub_parent, "publisher", opts["stall_timeout"] + 30)
        cpu0 = server.cpu_seconds()
        busy0 = machine_busy_seconds()
        pub_parent.send("go")
        limit = opts["timeout"] + 10
        pside = Side(**_recv(pub_parent, "publisher", limit))
        sside = Side(**_recv(sub_parent, "subscriber", limit))
        server_cpu = server.cpu_seconds() - cpu0
        busy = machine_busy_seconds() - busy0
        if not pside.ok or not sside.ok:
            raise BenchError("; ".join(e for e in (pside.error, sside.error) if e))
        wall = sside.t_last - pside.t_first
        result.received = sside.count
        result.seconds = wall
        result.rate = sside.count / wall
        result.publish_rate = pside.count / (pside.t_last - pside.t_first)
        result.cpu = {
            "publisher": pside.cpu / wall,
            "subscriber": sside.cpu / wall,
            "server": server_cpu / wall,
        }
        result.server_us_per_msg = server_cpu / max(1, sside.count) * 1e6
        # CPU the machine spent on anything else meanwhile (other jobs, the kernel's
        # softirq work not charged to our processes, this driver): noise indicator.
        own = pside.cpu + sside.cpu + server_cpu
        result.cpu["other"] = max(0.0, busy - own) / wall
        result.bound = _bound(name, result.cpu)
    except BenchError as exc:
        result.error = str(exc)
    finally:
        for proc in (pub, sub):
            if proc.pid is None:
                continue  # never started
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return result


def _bound(server: str, cpu: dict[str, float]) -> str:
    """Which side the rate was limited by, judged from CPU use (1.0 = one core busy)."""
    busy = [side for side, use in cpu.items() if use >= 0.85 and side != "other"]
    cores = os.cpu_count() or 1
    if sum(cpu.values()) >= 0.9 * cores:
        return "machine (all cores busy)" + (": " + "+".join(busy) if busy else "")
    if server == "tether" and "server" in busy:
        return "server"  # one event loop thread: one busy core is its ceiling
    clients = [side for side in busy if side != "server"]
    if clients:
        return "+".join(clients)
    return "server" if "server" in busy else "latency/io (no side saturated)"


# -- driver ----------------------------------------------------------------------------------


@contextmanager
def _server(name: str, opts: dict[str, Any]) -> Iterator[ServerProcess]:
    if name == "tether":
        with start_tether(
            wrapper=shlex.split(opts["tether_wrapper"]),
            python_args=shlex.split(opts["tether_python_args"]),
        ) as srv:
            yield srv
    else:
        with start_nats_server() as srv:
            yield srv


def run(opts: dict[str, Any]) -> list[Result]:
    results: list[Result] = []
    counts = {"raw": opts["messages"], "nats-py": opts["natspy_messages"]}
    for rep in range(opts["repeat"]):
        for load in opts["loads"]:
            servers = list(opts["servers"])
            if rep % 2:
                servers.reverse()  # alternate the order so neither side always goes first
            for name in servers:
                try:
                    with _server(name, opts) as srv:
                        res = measure(load, srv, name, counts[load], opts)
                except PeerStartError as exc:
                    res = Result(load, name, counts[load], opts["size"], error=str(exc))
                results.append(res)
                _print_run(res, rep)
    return results


def _print_run(r: Result, rep: int) -> None:
    if r.error:
        print(f"  [{rep + 1}] {r.load:8} {r.server:12} ERROR: {r.error}", flush=True)
        return
    cpu = " ".join(f"{k[:3]}={v:.0%}" for k, v in r.cpu.items())
    if r.idle_wait is None:
        cpu += " NOISY: machine busy before start"
    print(
        f"  [{rep + 1}] {r.load:8} {r.server:12} {r.rate:>12,.0f} msg/s"
        f"  (publish {r.publish_rate:,.0f} msg/s, {r.seconds:.2f}s, "
        f"server {r.server_us_per_msg:.2f} us/msg, cpu {cpu}; bound: {r.bound})",
        flush=True,
    )


def summarize(results: list[Result], opts: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for load in opts["loads"]:
        row: dict[str, Any] = {}
        for name in opts["servers"]:
            ok = [r for r in results if r.load == load and r.server == name and not r.error]
            rates = [r.rate for r in ok]
            cost = [r.server_us_per_msg for r in ok]
            row[name] = {
                "server_us_per_msg": statistics.median(cost) if cost else None,
                "median": statistics.median(rates) if rates else None,
                "best": max(rates) if rates else None,
                "runs": [round(x) for x in rates],
            }
        for stat in ("median", "best"):
            t = row.get("tether", {}).get(stat)
            ns = row.get("nats-server", {}).get(stat)
            row["ratio" if stat == "median" else "ratio_best"] = (t / ns) if t and ns else None
        row["target"], row["stretch"] = TARGETS[load]
        summary[load] = row
    return summary


def print_table(summary: dict[str, Any], opts: dict[str, Any]) -> None:
    """Medians over the repeats, then the best run of each (less disturbed by other load)."""
    counts = {"raw": opts["messages"], "nats-py": opts["natspy_messages"]}

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


def environment() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import uvloop

        uvloop_version = uvloop.__version__
    except ImportError:
        uvloop_version = None
    try:
        natspy = importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        natspy = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model or platform.processor(),
        "python": platform.python_version(),
        "uvloop": uvloop_version,
        "nats_py": natspy,
        "tether": tether_version(),
        "nats_server": nats_server_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="raw load (default 1M)")
    p.add_argument("--nats-py-messages", type=int, default=100_000, help="nats-py load")
    p.add_argument("--quick", action="store_true", help="100k raw, 20k nats-py")
    p.add_argument("--size", type=int, default=128, help="payload bytes (default 128)")
    p.add_argument(
        "--subjects",
        type=int,
        default=1,
        help="publish round-robin over N subjects (subscriber uses a wildcard); default 1",
    )
    p.add_argument("--load", choices=[*LOADS, "all"], default="all")
    p.add_argument("--server", choices=[*SERVERS, "all"], default="all")
    p.add_argument("--repeat", type=int, default=1, help="runs per load and server")
    p.add_argument("--batch", type=int, default=1000, help="raw: PUB frames per sendall")
    p.add_argument("--sync-every", type=int, default=10_000, help="raw: PING/PONG every N")
    p.add_argument(
        "--window",
        type=int,
        default=100_000,
        help="max messages the publisher may be ahead of the subscriber",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="deadline per measurement (s)")
    p.add_argument(
        "--stall-timeout", type=float, default=20.0, help="raw: max wait for any socket read"
    )
    p.add_argument(
        "--client-loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="nats-py clients' event loop",
    )
    p.add_argument(
        "--tether-wrapper",
        default="",
        help="prefix for Tether's command, e.g. 'py-spy record -o /tmp/t.txt -f raw --'",
    )
    p.add_argument(
        "--tether-python-args",
        default="",
        help="interpreter args for Tether, e.g. '-m cProfile -o /tmp/t.prof'",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=30.0,
        help="before each measurement wait up to N s for other CPU load to stop (0: don't)",
    )
    p.add_argument("--self-test", action="store_true", help="check the MSG counter and exit")
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.nats_py_messages = 100_000, 20_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        self_test()
        print("MsgCounter self-test passed")
        return 0
    opts: dict[str, Any] = {
        "messages": args.messages,
        "natspy_messages": args.nats_py_messages,
        "size": args.size,
        "subjects": args.subjects,
        "loads": LOADS if args.load == "all" else (args.load,),
        "servers": SERVERS if args.server == "all" else (args.server,),
        "repeat": args.repeat,
        "batch": args.batch,
        "sync_every": args.sync_every,
        "window": args.window,
        "timeout": args.timeout,
        "stall_timeout": args.stall_timeout,
        "client_loop": args.client_loop,
        "wait_idle": args.wait_idle,
        "tether_wrapper": args.tether_wrapper,
        "tether_python_args": args.tether_python_args,
    }
    env = environment()
    print(
        f"core pub/sub: {env['nproc']} CPU ({env['cpu']}), Python {env['python']}, "
        f"uvloop {env['uvloop']}, nats-py {env['nats_py']}, "
        f"tether {env['tether']}, nats-server {env['nats_server']}"
    )
    print(
        f"payload {args.size} B, {args.subjects} subject(s); "
        f"raw {args.messages:,} msgs, nats-py {args.nats_py_messages:,}"
    )
    results = run(opts)
    summary = summarize(results, opts)
    print_table(summary, opts)
    failed = [r for r in results if r.error]
    out = {
        "benchmark": "core_pubsub",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else argv,
        "environment": env,
        "summary": summary,
        "runs": [asdict(r) for r in results],
    }
    print(json.dumps(out, separators=(",", ":")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
