"""NSQ over TCP: pipelined PUB and MPUB, and a consumer with RDY 2500 and pipelined FINs.

There is no nsqd in the package registries, so there is no peer: the numbers are
Tether's alone, against the targets (durable, SQLite store, fsync every commit):
MPUB >= 100k msg/s, single pipelined PUBs >= 30k/s, consumed and FIN'd >= 100k/s.

* ``mpub``: MPUBs of ``--batch`` messages, ``--window`` of them unanswered at a time;
* ``pub``: single PUBs, ``--window`` of them unanswered at a time (each OK comes after
  its group commit);
* ``consume``: ``--messages`` stored first (MPUB), then one client SUBs with RDY 2500
  and FINs every message as soon as it is read; rate = messages / (SUB → last FIN);
* ``pynsq-mpub`` and ``pynsq-consume``: the same with pynsq, NSQ's Python client, as an
  application uses it (``Writer.mpub`` with ``--window`` unanswered, a ``Reader`` with
  ``max_in_flight=2500`` whose handler returns True): what a pynsq user gets.

    .venv/bin/python benchmarks/nsq.py --quick
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # after the sys.path tweak above
    BenchError,
    Cli,
    Meter,
    Run,
    describe,
    environment,
    finish,
    run_async,
    settle,
    show_run,
    start_tether,
)

from tether.protocol.nsq import FRAME_MESSAGE, FRAME_RESPONSE, FrameReader, commands

LOADS = ("mpub", "pub", "consume", "pynsq-mpub", "pynsq-consume")
TARGETS = {"mpub": 100_000, "pub": 30_000, "consume": 100_000}


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(commands.MAGIC_V2 + commands.identify({"heartbeat_interval": 60000}))
    await writer.drain()
    return reader, writer


async def publish(port: int, frames: list[bytes], window: int, stall: float) -> None:
    """Send ``frames`` (PUBs or MPUBs) keeping ``window`` unanswered; wait for every OK."""
    reader, writer = await connect(port)
    parse = FrameReader()
    oks = -1  # the IDENTIFY's OK comes first
    sent = 0
    while oks < len(frames):
        if sent < len(frames) and sent - oks < window:
            k = min(len(frames) - sent, window - (sent - max(oks, 0)))
            writer.write(b"".join(frames[sent : sent + k]))
            sent += k
        data = await asyncio.wait_for(reader.read(1 << 20), stall)
        if not data:
            raise BenchError("connection closed")
        for frame in parse.feed(data):
            if frame.frame_type != FRAME_RESPONSE or frame.data != b"OK":
                raise BenchError(f"unexpected frame {frame}")
            oks += 1
    writer.close()


async def consume(port: int, topic: str, n: int, stall: float, fin_chunk: int = 0) -> None:
    """FIN everything read at once, or (``fin_chunk``) at most that many per write with
    a pause after each, so that each lands in its own server read, as a client that
    finishes messages one handler call at a time (pynsq's Reader) sends them."""
    reader, writer = await connect(port)
    writer.write(commands.sub(topic, "bench") + commands.rdy(2500))
    parse = FrameReader()
    got = 0
    while got < n:
        data = await asyncio.wait_for(reader.read(1 << 22), stall)
        if not data:
            raise BenchError(f"connection closed after {got:,} messages")
        fins = [
            b"FIN " + f.data[10:26] + b"\n"
            for f in parse.feed(data)
            if f.frame_type == FRAME_MESSAGE
        ]
        got += len(fins)
        if not fin_chunk:
            writer.write(b"".join(fins))
            continue
        for i in range(0, len(fins), fin_chunk):
            writer.write(b"".join(fins[i : i + fin_chunk]))
            await writer.drain()
            await asyncio.sleep(0.0005)
    await writer.drain()
    writer.close()


def _pynsq() -> Any:
    """pynsq's ``nsq`` package (this file's directory, on ``sys.path``, has an nsq.py)."""
    here = str(Path(__file__).resolve().parent)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    try:
        if getattr(sys.modules.get("nsq"), "__file__", "") == str(Path(__file__).resolve()):
            del sys.modules["nsq"]
        import nsq

        return nsq
    finally:
        sys.path[:] = saved


async def pynsq_mpub(port: int, topic: str, batches: list[list[bytes]], window: int) -> None:
    nsq = _pynsq()
    writer = nsq.Writer([f"127.0.0.1:{port}"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not writer.conns or any(c.stream is None for c in writer.conns.values()):
        if loop.time() > deadline:
            raise BenchError("pynsq's Writer did not connect")
        await asyncio.sleep(0.01)
    done = asyncio.Event()
    answered = sent = 0
    failures: list[Any] = []

    def answer(conn: Any, data: Any) -> None:
        nonlocal answered
        answered += 1
        if data != b"OK":
            failures.append(data)
        send()
        if answered == len(batches):
            done.set()

    def send() -> None:
        nonlocal sent
        while sent < len(batches) and sent - answered < window:
            writer.mpub(topic, batches[sent], callback=answer)
            sent += 1

    send()
    await done.wait()
    for conn in list(writer.conns.values()):
        conn.close()
    if failures:
        raise BenchError(f"pynsq MPUB failed: {failures[0]}")


async def pynsq_consume(port: int, topic: str, n: int, stall: float) -> None:
    nsq = _pynsq()
    got = 0
    done = asyncio.Event()

    def handler(msg: Any) -> bool:
        nonlocal got
        got += 1
        if got >= n:
            done.set()
        return True

    reader = nsq.Reader(
        topic=topic,
        channel="bench",
        nsqd_tcp_addresses=[f"127.0.0.1:{port}"],
        max_in_flight=2500,
        message_handler=handler,
        lookupd_poll_interval=60,
    )
    try:
        while not done.is_set():
            before = got
            try:
                await asyncio.wait_for(done.wait(), stall)
            except TimeoutError:
                if got == before:
                    raise BenchError(f"pynsq's Reader stalled after {got:,} messages") from None
    finally:
        reader.close()


def measure(load: str, args: Any) -> Run:
    n, body = args.messages, b"x" * args.size
    run = Run(load, "tether", n, idle_wait=settle(args.wait_idle))
    with start_tether(
        store="sqlite",
        args=["--nsq-port", "-1"],
        python_args=shlex.split(args.tether_python_args),
        wrapper=shlex.split(args.tether_wrapper),
    ) as srv:
        port = int(srv.log.split("Listening for NSQ clients on ")[1].split()[0].rsplit(":", 1)[1])
        batches = [commands.mpub("bench", [body] * args.batch) for _ in range(n // args.batch)]
        try:
            if load in ("consume", "pynsq-consume"):
                run_async(publish(port, batches, args.window, args.stall), args.client_loop)
            meter, cpu0 = Meter(srv), time.process_time()
            if load == "mpub":
                job = publish(port, batches, args.window, args.stall)
            elif load == "pub":
                pubs = [commands.pub("bench", body)] * n
                job = publish(port, pubs, args.window * args.batch, args.stall)
            elif load == "pynsq-mpub":
                bodies = [[body] * args.batch for _ in range(n // args.batch)]
                job = pynsq_mpub(port, "bench", bodies, args.window)
            elif load == "pynsq-consume":
                job = pynsq_consume(port, "bench", n, args.stall)
            else:
                job = consume(port, "bench", n, args.stall, args.fin_chunk)
            run_async(job, args.client_loop)
        except (BenchError, OSError, TimeoutError) as exc:
            run.error = f"{type(exc).__name__}: {exc}"
            return run
        return run.record(n, meter.stop(), time.process_time() - cpu0)


def main(argv: list[str] | None = None) -> int:
    quick = {"messages": 50_000}
    cli = Cli(__doc__, servers=("tether",), quick=quick, quick_help="50k messages per load")
    cli.parser.add_argument("--messages", type=int, default=500_000, help="per load (500k)")
    cli.parser.add_argument("--size", type=int, default=100, help="body bytes (100)")
    cli.parser.add_argument("--batch", type=int, default=100, help="messages per MPUB (100)")
    cli.parser.add_argument("--window", type=int, default=20, help="MPUBs unanswered (20)")
    cli.parser.add_argument("--load", choices=[*LOADS, "all"], default="all")
    cli.parser.add_argument(
        "--fin-chunk",
        type=int,
        default=0,
        help="consume: FINs per write, each its own server read (0: all read at once)",
    )
    args = cli.parse(argv)
    env = environment(uvloop=True)
    print(f"nsq: {describe(env)}")
    results: list[Run] = []
    for rep in range(args.repeat):
        for load in LOADS if args.load == "all" else (args.load,):
            run = measure(load, args)
            show_run(run, rep)
            results.append(run)
    for load in TARGETS:
        rates = [r.rate for r in results if r.load == load and not r.error]
        if rates:
            best = max(rates)
            print(
                f"{load:8} best {best:>10,.0f} msg/s  target {TARGETS[load]:,} ({best / TARGETS[load]:.2f}x)"
            )
    return finish("nsq", argv, results, environment=env)


if __name__ == "__main__":
    sys.exit(main())
