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
    .venv/bin/python benchmarks/pull_consume.py --store postgres  # on a local PostgreSQL
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _postgres  # after the sys.path tweak above
from _harness import (
    BenchError,
    Cli,
    FrameReader,
    PeerStartError,
    RawConn,
    ServerProcess,
    connect_frame,
    environment,
    finish,
    loadavg,
    start_server,
    subject_reply,
)

STREAM = "BENCH"
SUBJECT = b"bench.x"
SIZE = 128
TARGETS = {"nats-py": 1.0, "raw": 0.5}
CONNECT = connect_frame("pull_consume")


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

        def on_msg(
            buf: bytearray, line: int, eol: int, hlen: int, *_: int, seen: dict = seen
        ) -> None:
            subj, reply = subject_reply(buf, line, eol, hlen)
            if hlen < 0:
                assert reply is not None and reply.startswith(b"$JS.ACK.BENCH.RAW.1.")
                seen["msgs"] += 1
            else:
                assert buf[eol + 11 : eol + 14] == b"408" and subj.startswith(b"_INBOX.pc.")
                seen["status"] += 1

        reader = FrameReader(on_msg)
        for pos in range(0, len(stream), step):
            reader.feed(stream[pos : pos + step])
        assert seen == {"msgs": 1999, "status": 4}, (step, seen)
        assert reader.pings == 20 and not reader.buf, step


# -- loads -----------------------------------------------------------------------------------


def prepublish(port: int, n: int, stall: float, timeout: float) -> None:
    """Pipelined PUBs with a reply inbox, at most 10k unacknowledged (not timed)."""
    state = {"acks": 0, "errors": 0, "first": ""}

    def on_msg(buf: bytearray, line: int, eol: int, hlen: int, ps: int, plen: int) -> None:
        if hlen < 0 and buf.startswith(b'{"stream"', ps):
            state["acks"] += 1
        else:
            what = buf[eol + 2 : eol + 2 + hlen] if hlen >= 0 else buf[ps : ps + plen]
            state["errors"] += 1
            state["first"] = state["first"] or repr(bytes(what))[:200]

    conn = RawConn(port, on_msg, stall, CONNECT)
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

    def on_msg(buf: bytearray, line: int, eol: int, hlen: int, *_: int) -> None:
        subj, reply = subject_reply(buf, line, eol, hlen)
        if hlen >= 0 and subj.startswith(b"_INBOX.pc."):  # a status for a request
            code = bytes(buf[eol + 11 : eol + 14]).decode(errors="replace")
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

    conn = RawConn(port, on_msg, stall, CONNECT)
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
    res["loadavg"] = loadavg()[0]
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
        store = opts["store"]
        if _postgres.is_postgres(store):
            store = _postgres.resolve(store)
            _postgres.reset(store)
        with start_server(name, opts, store=store, jetstream=True) as srv:
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
    cli = Cli(
        __doc__,
        servers=("tether", "nats-server"),
        quick={"natspy_messages": 20_000, "raw_messages": 50_000},
        quick_help="20k nats-py, 50k raw",
        self_test=("test the frame parser and exit", self_test, "parser self-test passed"),
        unit="load",
        stall_help="max wait for any data (s)",
        wait_idle=None,
        repeat=False,
        client_loop=False,
        profile=False,
    )
    p = cli.parser
    p.add_argument("--natspy-messages", type=int, default=50_000, help="nats-py load (50k)")
    p.add_argument("--raw-messages", type=int, default=200_000, help="raw load (200k)")
    p.add_argument(
        "--store",
        default="memory",
        help="Tether's store: memory, sqlite, postgres (a throwaway local PostgreSQL) or"
        " postgresql://USER:PASS@HOST/DB (its tether_* tables are dropped)",
    )
    p.add_argument("--fetch", type=int, default=500, help="nats-py fetch size (500)")
    p.add_argument("--batch", type=int, default=1000, help="raw: batch per request (1000)")
    p.add_argument("--depth", type=int, default=2, help="raw: requests outstanding (2)")
    p.add_argument("--expires", type=float, default=5.0, help="raw: request expiry (s)")
    p.add_argument("--max-ack-pending", type=int, default=10_000, help="raw consumer (10k)")
    args = cli.parse(argv)
    if args.store not in ("memory", "sqlite") and not _postgres.is_postgres(args.store):
        p.error("--store: expected memory, sqlite, postgres or postgresql://…")
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
    env = environment()
    load0 = loadavg()
    print(
        f"pull consume: {env['nproc']} CPU, Python {env['python']}, "
        f"tether {env['tether']} (store {args.store}) vs nats-server {env['nats_server']}; "
        f"load average {load0}"
    )
    print(
        f"{opts['stored']:,} x {SIZE} B stored; nats-py {args.natspy_messages:,} "
        f"(fetch {args.fetch}); raw {args.raw_messages:,} (batch {args.batch}, "
        f"depth {args.depth}, max_ack_pending {args.max_ack_pending:,})",
        flush=True,
    )
    results = [r for name in args.servers for r in run_server(name, opts)]
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
    return finish(
        "pull_consume",
        argv,
        results,
        python=env["python"],
        tether=env["tether"],
        nats_server=env["nats_server"],
        loadavg={"start": load0, "end": loadavg()},
        ratios=ratios,
    )


if __name__ == "__main__":
    sys.exit(main())
