"""Pull consumer throughput: Tether against nats-server, nats-py and a raw pipelined client.

Each server (Tether with ``--store memory`` by default, then nats-server ``-js``) gets
a fresh stream ``BENCH`` (subjects ``bench.>``) holding ``max(--natspy-messages,
--raw-messages)`` messages of 128 B, published beforehand with pipelined raw PUBs
(not timed). Then two loads, each on its own durable explicit-ack pull consumer:

* ``nats-py``: ``js.pull_subscribe(durable="PY")``, ``fetch(500)`` and ``await
  msg.ack()`` for each message until ``--natspy-messages`` (50k) are consumed, then
  ``flush()``. What a Python application sees.
* ``raw``: one raw socket SUBscribed to ``_INBOX.pc.*`` sends ``PUB
  $JS.API.CONSUMER.MSG.NEXT.BENCH.RAW _INBOX.pc.<i> {"batch":B,"expires":…}`` keeping
  ``--depth`` (2) requests outstanding, and answers every delivered ``MSG`` with ``PUB
  <ack subject> 0`` (an empty body is ``+ACK``), the acks of one read written together,
  until ``--raw-messages`` (200k) are consumed; then a PING/PONG so the server has read
  every ack. The consumer is created with ``max_ack_pending`` ``--max-ack-pending``
  (10k) so the default 1000 does not throttle the pipeline. Afterwards CONSUMER.INFO
  must show ``num_ack_pending == 0`` and ``num_pending == 0``.

Rate = messages / (first request -> all acks flushed). Server CPU per message comes
from /proc for the server's process tree over the same interval. Every wait has a
deadline; everything runs on 127.0.0.1 in temporary directories removed afterwards.

    .venv/bin/python benchmarks/pull_consume.py                   # 50k nats-py, 200k raw
    .venv/bin/python benchmarks/pull_consume.py --quick           # 20k nats-py, 50k raw
    .venv/bin/python benchmarks/pull_consume.py --store sqlite    # Tether on SQLite
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import selectors
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peers import (  # after the sys.path tweak above
    PeerStartError,
    ServerProcess,
    nats_server_version,
    start_nats_server,
    start_tether,
    tether_version,
)

HOST = "127.0.0.1"
STREAM = "BENCH"
SUBJECT = b"bench.x"
SIZE = 128
TARGETS = {"nats-py": 1.0, "raw": 0.5}
CONNECT = (
    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
    b'"echo":true,"protocol":1,"lang":"raw","version":"0","name":"pull_consume"}\r\n'
)

# on_frame(subject, reply or None, headers or None, buf, payload_start, payload_len)
OnFrame = Callable[[bytes, "bytes | None", "bytes | None", bytes, int, int], None]


class BenchError(RuntimeError):
    """A stall, a deadline, a closed connection, a server error or a wrong count."""


class RawConn:
    """A non-blocking raw NATS connection: buffered writes, frames parsed across reads."""

    def __init__(self, port: int, on_frame: OnFrame, stall: float) -> None:
        self.on_frame = on_frame
        self.stall = stall
        self.pongs = 0
        self.out = bytearray()
        self.buf = b""
        sock = socket.create_connection((HOST, port), timeout=stall)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.sel = selectors.DefaultSelector()
        try:
            first = b""
            while b"\r\n" not in first:
                chunk = sock.recv(65536)  # bounded by the socket timeout
                if not chunk:
                    raise BenchError("server closed the connection before INFO")
                first += chunk
            if not first.startswith(b"INFO "):
                raise BenchError(f"expected INFO, got {first[:80]!r}")
            sock.setblocking(False)
            self.sel.register(sock, selectors.EVENT_READ)
            self.mask = selectors.EVENT_READ
            self.last_data = time.monotonic()
            self.feed(first[first.index(b"\r\n") + 2 :])
            self.send(CONNECT)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sel.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.out += data

    def pump(self, timeout: float = 0.2) -> None:
        """Write what the socket takes, read and parse what arrived (waits <= timeout)."""
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
        want = self.pongs + 1
        self.send(b"PING\r\n")
        while self.pongs < want:
            if time.monotonic() > deadline:
                raise BenchError("no PONG before the deadline")
            self.pump()

    def feed(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, end = 0, len(buf)
        find, startswith, on_frame = buf.find, buf.startswith, self.on_frame
        while pos < end:
            eol = find(b"\r\n", pos)
            if eol < 0:
                if end - pos > 4096:
                    raise BenchError(f"control line too long: {buf[pos : pos + 80]!r}")
                break
            if startswith(b"MSG ", pos):
                parts = buf[pos + 4 : eol].split(b" ")
                size = int(parts[-1])
                stop = eol + 4 + size
                if stop > end:
                    break
                on_frame(parts[0], parts[2] if len(parts) == 4 else None, None, buf, eol + 2, size)
                pos = stop
            elif startswith(b"HMSG ", pos):
                parts = buf[pos + 5 : eol].split(b" ")
                hlen, total = int(parts[-2]), int(parts[-1])
                stop = eol + 4 + total
                if stop > end:
                    break
                reply = parts[2] if len(parts) == 5 else None
                hdr = buf[eol + 2 : eol + 2 + hlen]
                on_frame(parts[0], reply, hdr, buf, eol + 2 + hlen, total - hlen)
                pos = stop
            else:
                line = buf[pos:eol]
                op = line.split(b" ", 1)[0].upper()
                if op == b"PING":
                    self.out += b"PONG\r\n"
                elif op == b"PONG":
                    self.pongs += 1
                elif op == b"-ERR":
                    raise BenchError(f"server error: {line.decode(errors='replace')}")
                elif op not in (b"+OK", b"INFO"):
                    raise BenchError(f"unexpected frame: {line[:80]!r}")
                pos = eol + 2
        self.buf = buf[pos:]


def self_test() -> None:
    """The parser on MSG/HMSG/PING frames split at every size."""
    frames = []
    for i in range(1, 2000):
        ack = b"$JS.ACK.BENCH.RAW.1.%d.%d.1795319468562162575.%d" % (i, i, 2000 - i)
        frames.append(b"MSG bench.x 1 %s %d\r\n%s\r\n" % (ack, SIZE, b"x" * SIZE))
        if i % 97 == 0:
            frames.append(b"PING\r\n")
        if i % 499 == 0:
            hdr = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n"
            frames.append(b"HMSG _INBOX.pc.%d 1 %d %d\r\n%s\r\n" % (i, len(hdr), len(hdr), hdr))
    stream = b"".join(frames)
    for step in (1, 2, 3, 7, 64, 1000, 65536):
        seen = {"msgs": 0, "status": 0}

        def on_frame(
            subj: bytes, reply: bytes | None, hdr: bytes | None, *_: Any, seen: dict = seen
        ) -> None:
            if hdr is None:
                assert reply is not None and reply.startswith(b"$JS.ACK.BENCH.RAW.1.")
                seen["msgs"] += 1
            else:
                assert hdr[9:12] == b"408" and subj.startswith(b"_INBOX.pc.")
                seen["status"] += 1

        conn = RawConn.__new__(RawConn)
        conn.on_frame, conn.buf, conn.out, conn.pongs = on_frame, b"", bytearray(), 0
        for pos in range(0, len(stream), step):
            conn.feed(stream[pos : pos + step])
        assert seen == {"msgs": 1999, "status": 4}, (step, seen)
        assert conn.out == b"PONG\r\n" * 20 and not conn.buf, step


# -- loads -----------------------------------------------------------------------------------


def prepublish(port: int, n: int, stall: float, timeout: float) -> None:
    """Pipelined PUBs with a reply inbox, at most 10k unacknowledged (not timed)."""
    state = {"acks": 0, "errors": 0, "first": ""}

    def on_frame(subj: bytes, reply: Any, hdr: Any, buf: bytes, ps: int, plen: int) -> None:
        if hdr is None and buf.startswith(b'{"stream"', ps):
            state["acks"] += 1
        else:
            state["errors"] += 1
            state["first"] = state["first"] or repr(hdr or buf[ps : ps + plen])[:200]

    conn = RawConn(port, on_frame, stall)
    try:
        conn.send(b"SUB _INBOX.pp.* 1\r\n")
        frame = b"PUB %s _INBOX.pp.1 %d\r\n%s\r\n" % (SUBJECT, SIZE, b"x" * SIZE)
        sent = 0
        deadline = time.monotonic() + timeout
        while state["acks"] + state["errors"] < n:
            if time.monotonic() > deadline:
                raise BenchError(f"pre-publish deadline: {state['acks']:,} of {n:,} acked")
            k = min(1000, n - sent, 10_000 - (sent - state["acks"] - state["errors"]))
            if k > 0 and len(conn.out) < (1 << 20):
                conn.send(frame * k)
                sent += k
            conn.pump()
        if state["errors"]:
            raise BenchError(f"{state['errors']:,} publishes failed, first: {state['first']}")
    finally:
        conn.close()


async def natspy_consume(url: str, n: int, batch: int, limit: float) -> int:
    """fetch(batch) + ack() each until n consumed; returns the count."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe("bench.>", durable="PY", stream=STREAM)
        deadline = time.monotonic() + limit
        got = 0
        while got < n:
            if time.monotonic() > deadline:
                raise BenchError(f"nats-py deadline: {got:,} of {n:,}")
            msgs = await sub.fetch(min(batch, n - got), timeout=5)
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
        await nc.flush(timeout=10)
        return got
    finally:
        await nc.close()


def raw_consume(port: int, n: int, opts: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """Pipelined MSG.NEXT requests and acks on one socket; returns (count, statuses)."""
    batch, depth, stall = opts["batch"], opts["depth"], opts["stall"]
    expires = int(opts["expires"] * 1e9)
    api = b"$JS.API.CONSUMER.MSG.NEXT.%s.RAW" % STREAM.encode()
    open_reqs: collections.deque[list[int]] = collections.deque()  # [request id, remaining]
    statuses: collections.Counter[str] = collections.Counter()
    acks: list[bytes] = []
    count = [0]

    def on_frame(subj: bytes, reply: Any, hdr: Any, buf: bytes, ps: int, plen: int) -> None:
        if hdr is not None and subj.startswith(b"_INBOX.pc."):  # a status for a request
            code = hdr[9:12].decode(errors="replace")
            statuses[code] += 1
            rid = int(subj[10:])
            for req in open_reqs:
                if req[0] == rid:
                    open_reqs.remove(req)
                    break
            return
        if reply is None:
            raise BenchError(f"delivery without an ack subject on {subj!r}")
        count[0] += 1
        acks.append(b"PUB " + reply + b" 0\r\n\r\n")
        if open_reqs:  # requests are served in order
            head = open_reqs[0]
            head[1] -= 1
            if head[1] <= 0:
                open_reqs.popleft()

    conn = RawConn(port, on_frame, stall)
    try:
        conn.send(b"SUB _INBOX.pc.* 1\r\n")
        conn.ping(time.monotonic() + stall)
        rid = 0
        deadline = time.monotonic() + opts["timeout"]
        while count[0] < n:
            outstanding = sum(r[1] for r in open_reqs)
            while len(open_reqs) < depth and (b := min(batch, n - count[0] - outstanding)) > 0:
                rid += 1
                body = b'{"batch":%d,"expires":%d}' % (b, expires)
                conn.send(b"PUB %s _INBOX.pc.%d %d\r\n%s\r\n" % (api, rid, len(body), body))
                open_reqs.append([rid, b])
                outstanding += b
            conn.pump()
            if acks:
                conn.send(b"".join(acks))
                acks.clear()
            if time.monotonic() > deadline:
                raise BenchError(f"raw deadline: {count[0]:,} of {n:,}")
        if acks:
            conn.send(b"".join(acks))
            acks.clear()
        conn.ping(time.monotonic() + stall)  # every ack read by the server
    finally:
        conn.close()
    return count[0], dict(statuses)


async def consumer_state(url: str, durable: str, want_pending: int | None) -> dict[str, int]:
    """CONSUMER.INFO polled (acks may be applied asynchronously) for up to 10 s until
    nothing awaits an ack (and num_pending == want_pending, if given)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + 10
        while True:
            info = await js.consumer_info(STREAM, durable)
            state = {
                "num_ack_pending": info.num_ack_pending or 0,
                "num_pending": info.num_pending or 0,
                "ack_floor": info.ack_floor.stream_seq if info.ack_floor else 0,
                "delivered": info.delivered.stream_seq if info.delivered else 0,
            }
            ok = state["num_ack_pending"] == 0 and (
                want_pending is None or state["num_pending"] == want_pending
            )
            if ok or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def setup(url: str, max_ack_pending: int) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["bench.>"])
        await js.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name="RAW",
                ack_policy=AckPolicy.EXPLICIT,
                max_ack_pending=max_ack_pending,
            ),
        )
    finally:
        await nc.close()


# -- driver ------------------------------------------------------------------------------------


def measure(srv: ServerProcess, load: str, n: int, opts: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"load": load, "server": srv.name, "messages": n}
    res["loadavg"] = round(os.getloadavg()[0], 2)
    cpu0 = srv.cpu_seconds()
    t0 = time.perf_counter()
    try:
        if load == "nats-py":
            count = asyncio.run(natspy_consume(srv.url, n, opts["fetch"], opts["timeout"]))
            statuses: dict[str, int] = {}
        else:
            count, statuses = raw_consume(srv.port, n, opts)
        elapsed = time.perf_counter() - t0
        cpu = srv.cpu_seconds() - cpu0
    except (BenchError, OSError, TimeoutError, nats.errors.Error) as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        return res
    res.update(
        count=count,
        seconds=round(elapsed, 3),
        rate=count / elapsed,
        server_us_per_msg=cpu / max(1, count) * 1e6,
        server_cpu_share=cpu / elapsed,
        statuses=statuses,
    )
    durable, want = ("PY", None) if load == "nats-py" else ("RAW", opts["stored"] - n)
    state = asyncio.run(consumer_state(srv.url, durable, want))
    res["consumer"] = state
    bad = state["num_ack_pending"] != 0 or (want is not None and state["num_pending"] != want)
    if count != n or bad:
        res["error"] = f"check failed: consumed {count:,} of {n:,}, consumer {state}"
    return res


def run_server(name: str, opts: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    try:
        if name == "tether":
            ctx = start_tether(store=opts["store"])
        else:
            ctx = start_nats_server(jetstream=True)
        with ctx as srv:
            asyncio.run(setup(srv.url, opts["max_ack_pending"]))
            prepublish(srv.port, opts["stored"], opts["stall"], opts["timeout"])
            for load, n in (("nats-py", opts["natspy"]), ("raw", opts["raw"])):
                if n <= 0:
                    continue
                res = measure(srv, load, n, opts)
                res["server"] = name
                results.append(res)
                print_result(res)
    except (PeerStartError, BenchError, OSError, TimeoutError, nats.errors.Error) as exc:
        res = {"load": "setup", "server": name, "error": f"{type(exc).__name__}: {exc}"}
        results.append(res)
        print_result(res)
    return results


def print_result(r: dict[str, Any]) -> None:
    head = f"  {r['load']:8} {r['server']:12}"
    if "rate" not in r:
        print(f"{head} ERROR: {r['error']}", flush=True)
        return
    extra = f", statuses {r['statuses']}" if r.get("statuses") else ""
    print(
        f"{head} {r['rate']:>10,.0f} msg/s  ({r['count']:,} in {r['seconds']:.2f}s, "
        f"server {r['server_us_per_msg']:.1f} us/msg, server CPU {r['server_cpu_share']:.0%}, "
        f"load avg {r['loadavg']:.2f}; consumer {r['consumer']}{extra})"
        + (f" ERROR: {r['error']}" if r.get("error") else ""),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--natspy-messages", type=int, default=50_000, help="nats-py load (50k)")
    p.add_argument("--raw-messages", type=int, default=200_000, help="raw load (200k)")
    p.add_argument("--quick", action="store_true", help="20k nats-py, 50k raw")
    p.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    p.add_argument("--fetch", type=int, default=500, help="nats-py fetch size (500)")
    p.add_argument("--batch", type=int, default=1000, help="raw: batch per request (1000)")
    p.add_argument("--depth", type=int, default=2, help="raw: requests outstanding (2)")
    p.add_argument("--expires", type=float, default=5.0, help="raw: request expiry (s)")
    p.add_argument("--max-ack-pending", type=int, default=10_000, help="raw consumer (10k)")
    p.add_argument("--server", choices=["tether", "nats-server", "all"], default="all")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline per load (s)")
    p.add_argument("--stall", type=float, default=20.0, help="max wait for any data (s)")
    p.add_argument("--self-test", action="store_true", help="test the frame parser and exit")
    args = p.parse_args(argv)
    if args.self_test:
        self_test()
        print("parser self-test passed")
        return 0
    if args.quick:
        args.natspy_messages, args.raw_messages = 20_000, 50_000
    opts: dict[str, Any] = {
        "natspy": args.natspy_messages,
        "raw": args.raw_messages,
        "stored": max(args.natspy_messages, args.raw_messages),
        "store": args.store,
        "fetch": args.fetch,
        "batch": args.batch,
        "depth": args.depth,
        "expires": args.expires,
        "max_ack_pending": args.max_ack_pending,
        "timeout": args.timeout,
        "stall": args.stall,
    }
    load0 = [round(x, 2) for x in os.getloadavg()]
    print(
        f"pull consume: {os.cpu_count()} CPU, Python {platform.python_version()}, "
        f"tether {tether_version()} (store {args.store}) vs nats-server {nats_server_version()}; "
        f"load average {load0}"
    )
    print(
        f"{opts['stored']:,} x {SIZE} B stored; nats-py {args.natspy_messages:,} "
        f"(fetch {args.fetch}); raw {args.raw_messages:,} (batch {args.batch}, "
        f"depth {args.depth}, max_ack_pending {args.max_ack_pending:,})",
        flush=True,
    )
    servers = ["tether", "nats-server"] if args.server == "all" else [args.server]
    results = [r for name in servers for r in run_server(name, opts)]
    rates = {(r["load"], r["server"]): r for r in results if "rate" in r and not r.get("error")}
    ratios = []
    print()
    print(f"{'load':8} {'tether':>10} {'nats-server':>12}  ratio  target  us/msg (t / n)")
    for load, target in TARGETS.items():
        t, n = rates.get((load, "tether")), rates.get((load, "nats-server"))
        if not t or not n:
            continue
        ratio = t["rate"] / n["rate"]
        ratios.append({"load": load, "ratio": ratio, "target": target, "met": ratio >= target})
        print(
            f"{load:8} {t['rate']:>10,.0f} {n['rate']:>12,.0f}  {ratio:5.2f}x  "
            f">= {target:g}x {'met' if ratio >= target else 'MISSED'}  "
            f"{t['server_us_per_msg']:.1f} / {n['server_us_per_msg']:.1f}"
        )
    out = {
        "benchmark": "pull_consume",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else argv,
        "python": platform.python_version(),
        "tether": tether_version(),
        "nats_server": nats_server_version(),
        "loadavg": {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]},
        "ratios": ratios,
        "runs": results,
    }
    print(json.dumps(out, separators=(",", ":"), default=str))
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
