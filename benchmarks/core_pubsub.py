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
    .venv/bin/python benchmarks/core_pubsub.py --quick --tls  # TLS clients: both servers
        # read the same tls block (certificates made for the run)
    .venv/bin/python benchmarks/core_pubsub.py --quick --permissions  # as a user with
        # publish/subscribe permissions: both servers read the same authorization block
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # after the sys.path tweak above
    BenchError,
    Cli,
    FrameReader,
    Meter,
    ServerProcess,
    connect_frame,
    describe,
    environment,
    finish,
    print_table,
    raw_connect,
    run_async,
    run_matrix,
    settle,
    show_run,
    start_nats_server,
    start_tether,
    summarize,
)

SUBJECT = b"bench.core"
SID = b"1"
SERVERS = ("tether", "nats-server")
LOADS = ("raw", "nats-py")
TARGETS = {"raw": (0.3, 0.5), "nats-py": (0.9, 0.9)}  # (target, stretch) Tether/nats-server
CONNECT = connect_frame("core_pubsub", headers=False)
# --permissions: one user whose permissions allow the benchmark's subjects and deny a
# neighbour, so every publish and every wildcard delivery is checked.
USER = {"user": "bench", "pass": "bench"}
PERMISSIONS_CONF = """authorization {
  users: [
    {user: bench, password: bench, permissions: {
      publish: {allow: ["bench.>"], deny: ["bench.secret"]}
      subscribe: {allow: ["bench.>", "_INBOX.>"], deny: ["bench.secret"]}
    }}
  ]
}
"""


def _connect(opts: dict[str, Any]) -> bytes:
    if not opts.get("permissions"):
        return CONNECT
    fields = json.loads(CONNECT[len(b"CONNECT ") :])
    return b"CONNECT " + json.dumps({**fields, **USER}).encode() + b"\r\n"


def _credentials(opts: dict[str, Any]) -> dict[str, str]:
    return {"user": USER["user"], "password": USER["pass"]} if opts.get("permissions") else {}


# -- MSG counting (raw subscriber) -----------------------------------------------------------


class MsgCounter(FrameReader):
    """Counts MSG/HMSG frames in a byte stream fed in arbitrary pieces.

    ``frames`` is the cycle of frames the publisher's messages turn into (one per
    subject, all the same length). The fast path compares whole runs of the expected
    cycle against a pre-built template (one memcmp for up to ``run`` frames); anything
    else (another size, a PING, a frame split across reads) goes through the general
    one-frame parser, so the count is exact for any framing and any split. Server
    PINGs are counted in ``pings``; the caller answers each with PONG.
    """

    def __init__(self, frames: list[bytes], run: int = 4096) -> None:
        super().__init__(self._on_msg)
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
        self.count = 0

    def scan(self, buf: bytearray, end: int) -> int:
        pos = 0
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
                step = self.frame(buf, pos, end)
                if step == 0:
                    break  # incomplete frame: wait for more bytes
                pos += step
        return pos

    def _on_msg(self, buf: bytearray, line: int, eol: int, *_: int) -> None:
        """A frame off the fast path: count it, resynchronise with the cycle."""
        self.count += 1
        index = self.heads.get(bytes(buf[line:eol]))
        if index is not None:
            self.phase = (index + 1) % self.cycle


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


def _client_tls(opts: dict[str, Any]) -> ssl.SSLContext | None:
    """--tls: a client context trusting the run's CA."""
    if not opts.get("tls_ca"):
        return None
    return ssl.create_default_context(cafile=opts["tls_ca"])


class RawClient:
    """A blocking NATS connection speaking the text protocol directly."""

    def __init__(
        self,
        port: int,
        stall_timeout: float,
        connect: bytes = CONNECT,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.sock, rest = raw_connect(port, connect, stall_timeout, tls)
        self.stall_timeout = stall_timeout
        self.buf = bytearray(rest)

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
        client = RawClient(port, opts["stall_timeout"], _connect(opts), _client_tls(opts))
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
        client = RawClient(port, opts["stall_timeout"], _connect(opts), _client_tls(opts))
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
            f"nats://localhost:{port}",
            allow_reconnect=False,
            error_cb=on_error,
            tls=_client_tls(opts),
            **_credentials(opts),
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
        run_async(main(), opts["client_loop"])
    except Exception as exc:  # report any client failure to the parent
        side.ok, side.error = False, f"subscriber: {exc!r}"
    _report(conn, side)


def natspy_publisher(
    port: int, n: int, size: int, received: Synchronized, conn: Connection, opts: dict[str, Any]
) -> None:
    side = Side()

    async def main() -> None:
        import nats

        nc = await nats.connect(
            f"nats://localhost:{port}",
            allow_reconnect=False,
            tls=_client_tls(opts),
            **_credentials(opts),
        )
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
        run_async(main(), opts["client_loop"])
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
    result.idle_wait = settle(opts["wait_idle"])
    try:
        sub.start()
        _expect_ready(sub_parent, "subscriber", opts["stall_timeout"] + 30)
        pub.start()
        _expect_ready(pub_parent, "publisher", opts["stall_timeout"] + 30)
        meter = Meter(server)
        pub_parent.send("go")
        limit = opts["timeout"] + 10
        pside = Side(**_recv(pub_parent, "publisher", limit))
        sside = Side(**_recv(sub_parent, "subscriber", limit))
        server_cpu = meter.stop().server
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
        result.cpu["other"] = meter.other(pside.cpu + sside.cpu) / wall  # noise indicator
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


def run(args: argparse.Namespace) -> list[Result]:
    if args.tls:
        with _tls_files() as (conf, ca):
            args.tls_ca = ca
            return _run(args, lambda name: _with_conf(name, conf))
    return _run(args, _with_permissions if args.permissions else None)


def _run(
    args: argparse.Namespace, start: Callable[[str], AbstractContextManager[ServerProcess]] | None
) -> list[Result]:
    opts = vars(args)
    counts = {"raw": args.messages, "nats-py": args.nats_py_messages}
    return run_matrix(
        args,
        args.loads,
        lambda load, name, srv: measure(load, srv, name, counts[load], opts),
        lambda load, name, error: Result(load, name, counts[load], args.size, error=error),
        _print_run,
        start=start,
    )


@contextmanager
def _tls_files() -> Iterator[tuple[str, str]]:
    """--tls: a CA and a server certificate made for the run (trustme, the test extra),
    and the tls block both servers read: (configuration text, CA file)."""
    import trustme

    with tempfile.TemporaryDirectory(prefix="tether-bench-tls-") as tmp:
        ca = trustme.CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        pem, ca_pem = Path(tmp) / "server.pem", Path(tmp) / "ca.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(pem)
        ca.cert_pem.write_to_path(ca_pem)
        conf = f'tls {{\n  cert_file: "{pem}"\n  key_file: "{pem}"\n}}\n'
        yield conf, str(ca_pem)


@contextmanager
def _with_conf(name: str, conf: str) -> Iterator[ServerProcess]:
    """The server ``name`` reading ``conf`` (nats-server's format)."""
    if name == "nats-server":
        with start_nats_server(config=conf) as srv:
            yield srv
        return
    with tempfile.TemporaryDirectory(prefix="tether-bench-conf-") as tmp:
        path = Path(tmp) / "server.conf"
        path.write_text(conf)
        with start_tether(args=["--config", str(path), "--nsq-port", "0"]) as srv:
            yield srv


@contextmanager
def _with_permissions(name: str) -> Iterator[ServerProcess]:
    """The server ``name`` reading :data:`PERMISSIONS_CONF` (nats-server's format)."""
    if name == "nats-server":
        with start_nats_server(config=PERMISSIONS_CONF) as srv:
            yield srv
        return
    with tempfile.TemporaryDirectory(prefix="tether-bench-conf-") as tmp:
        conf = Path(tmp) / "server.conf"
        conf.write_text(PERMISSIONS_CONF)
        with start_tether(args=["--config", str(conf)]) as srv:
            yield srv


def _print_run(r: Result, rep: int) -> None:
    details = f"publish {r.publish_rate:,.0f} msg/s, {r.seconds:.2f}s"
    show_run(r, rep, details, f"; bound: {r.bound}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cli = Cli(
        __doc__,
        servers=SERVERS,
        quick={"messages": 100_000, "nats_py_messages": 20_000},
        quick_help="100k raw, 20k nats-py",
        self_test=("check the MSG counter and exit", self_test, "MsgCounter self-test passed"),
        stall="--stall-timeout",
        stall_help="raw: max wait for any socket read",
    )
    p = cli.parser
    p.add_argument("--messages", type=int, default=1_000_000, help="raw load (default 1M)")
    p.add_argument("--nats-py-messages", type=int, default=100_000, help="nats-py load")
    p.add_argument("--size", type=int, default=128, help="payload bytes (default 128)")
    p.add_argument(
        "--subjects",
        type=int,
        default=1,
        help="publish round-robin over N subjects (subscriber uses a wildcard); default 1",
    )
    p.add_argument("--load", choices=[*LOADS, "all"], default="all")
    p.add_argument("--batch", type=int, default=1000, help="raw: PUB frames per sendall")
    p.add_argument("--sync-every", type=int, default=10_000, help="raw: PING/PONG every N")
    p.add_argument(
        "--tls",
        action="store_true",
        help="clients use TLS (plaintext INFO, then the upgrade); same tls block on both servers",
    )
    p.add_argument(
        "--permissions",
        action="store_true",
        help="connect as a user with publish/subscribe permissions (same block on both servers)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=100_000,
        help="max messages the publisher may be ahead of the subscriber",
    )
    args = cli.parse(argv)
    args.loads = LOADS if args.load == "all" else (args.load,)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment(uvloop=True)
    print(f"core pub/sub: {describe(env)}")
    print(
        f"payload {args.size} B, {args.subjects} subject(s); "
        f"raw {args.messages:,} msgs, nats-py {args.nats_py_messages:,}"
    )
    results = run(args)
    summary = summarize(results, args.loads, args.servers, TARGETS)
    print_table(summary, {"raw": args.messages, "nats-py": args.nats_py_messages})
    return finish("core_pubsub", argv, results, environment=env, summary=summary)


if __name__ == "__main__":
    sys.exit(main())
