"""``tether bench``: throughput and latency of a running server, as ``nats bench`` measures
them (core publish and subscribe, JetStream publish and fetch), with a summary table
and ``--csv`` for spreadsheets.

Every client is its own connection in this process. Core subscribers and JetStream
publishers measure latency: the time between sending a message and seeing it arrive
(core; the send time travels in the payload) or its PubAck (JetStream: every publish
when synchronous, one in ``--sample`` with a window).
"""

from __future__ import annotations

import asyncio
import csv
import json
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tether.cli._typer import group
from tether.cli.output import console
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    open_connection,
    remote,
    run,
)
from tether.client import (
    AckPolicy,
    Connection,
    ConsumerConfig,
    ConsumerNotFound,
    StreamNotFound,
    Timeout,
)

bench_app = group("bench", "Benchmarks: pub, sub, js pub, js consume.")
js_app = group("js", "JetStream benchmarks: pub (sync or windowed), consume (fetch).")
bench_app.add_typer(js_app, name="js")

_STAMP = struct.Struct("<q")


@dataclass
class Stats:
    """One client's result."""

    test: str
    client: int
    messages: int = 0
    size: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def row(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        out: dict[str, Any] = {
            "test": self.test,
            "client": self.client,
            "messages": self.messages,
            "size": self.size,
            "seconds": round(self.seconds, 6),
            "msgs_per_sec": round(self.rate, 1),
            "mb_per_sec": round(self.rate * self.size / 1e6, 3),
        }
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
            out[f"{name}_ms"] = (
                round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None
            )
        return out


def _aggregate(test: str, parts: list[Stats], start: float, end: float) -> Stats:
    total = Stats(test, 0, size=parts[0].size if parts else 0)
    total.messages = sum(p.messages for p in parts)
    total.seconds = end - start
    for p in parts:
        total.latencies.extend(p.latencies)
    return total


def _split(messages: int, clients: int) -> list[int]:
    base, extra = divmod(messages, clients)
    return [base + (1 if i < extra else 0) for i in range(clients)]


def _payload(size: int) -> bytearray:
    return bytearray(b"x" * max(size, 0))


class Live:
    """A progress bar fed from counters by a timer, so the hot loops pay nothing."""

    def __init__(self, label: str, total: int) -> None:
        self.done = [0]
        self.progress = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self.task = self.progress.add_task(label, total=total)
        self._ticker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Live:
        self.progress.start()

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.2)
                self.progress.update(self.task, completed=sum(self.done))

        self._ticker = asyncio.create_task(tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.progress.stop()


async def _connect_all(target: Target, clients: int) -> list[Connection]:
    return list(await asyncio.gather(*(open_connection(target) for _ in range(clients))))


async def _close_all(conns: list[Connection]) -> None:
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


def _report(
    results: list[Stats], summary: list[Stats], csv_path: Path | None, as_json: bool
) -> None:
    rows = [s.row() for s in summary] + [r.row() for r in results]
    if csv_path is not None:
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if as_json:
        sys.stdout.write(
            json.dumps({"summary": rows[: len(summary)], "clients": rows[len(summary) :]}, indent=2)
            + "\n"
        )
        return

    def ms(v: Any) -> str:
        return "" if v is None else f"{v:.2f}"

    shown = [r for r in rows if r["client"] == 0 or len(results) > 1]
    title = f"Benchmark: {rows[0]['test']}, {rows[0]['size']}-byte messages"
    out = Table(title=title, title_justify="left")
    for i, column in enumerate(
        ["Client", "Messages", "msg/s", "MB/s", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    ):
        out.add_column(column, justify="right" if i else "left", no_wrap=True)
    for r in shown:
        out.add_row(
            "all" if r["client"] == 0 else str(r["client"]),
            f"{r['messages']:,}",
            f"{r['msgs_per_sec']:,.0f}",
            f"{r['mb_per_sec']:.2f}",
            ms(r["p50_ms"]),
            ms(r["p90_ms"]),
            ms(r["p99_ms"]),
            ms(r["max_ms"]),
        )
    console.print(out)


MsgsOpt = Annotated[int, typer.Option("--msgs", help="Messages in all.", min=1)]
SizeOpt = Annotated[int, typer.Option("--size", help="Payload bytes.", min=0)]
ClientsOpt = Annotated[int, typer.Option("--clients", help="Connections.", min=1)]
CsvOpt = Annotated[Path | None, typer.Option("--csv", help="Also write the results here.")]
SubjectArg = Annotated[str, typer.Argument(help="Subject.")]


@remote(bench_app, "pub")
def pub(
    target: Target,
    subject: SubjectArg = "bench",
    msgs: MsgsOpt = 100_000,
    size: SizeOpt = 128,
    clients: ClientsOpt = 1,
    csv_path: CsvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Core publish: how fast the server takes messages (no subscriber needed)."""

    async def work(first: Connection) -> tuple[list[Stats], list[Stats]]:
        conns = [first, *await _connect_all(target, clients - 1)]
        results = [Stats("pub", i + 1, size=size) for i in range(clients)]
        payload = bytes(_payload(size))
        try:
            async with Live("publishing", msgs) as live:
                live.done = [0] * clients

                async def one(i: int, conn: Connection, n: int) -> None:
                    t0 = time.perf_counter()
                    for k in range(n):
                        await conn.publish(subject, payload)
                        if not k & 1023:
                            live.done[i] = k
                    await conn.flush(timeout=60)
                    live.done[i] = n
                    results[i].messages, results[i].seconds = n, time.perf_counter() - t0

                start = time.perf_counter()
                await asyncio.gather(
                    *(
                        one(i, c, n)
                        for i, (c, n) in enumerate(zip(conns, _split(msgs, clients), strict=True))
                    )
                )
                end = time.perf_counter()
        finally:
            await _close_all(conns[1:])
        return results, [_aggregate("pub", results, start, end)]

    results, summary = run(target, work)
    _report(results, summary, csv_path, as_json)


@remote(bench_app, "sub")
def sub(
    target: Target,
    subject: SubjectArg = "bench",
    msgs: MsgsOpt = 100_000,
    size: SizeOpt = 128,
    clients: ClientsOpt = 1,
    csv_path: CsvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Core fan-out: --clients subscribers each receive --msgs from one publisher here."""
    size = max(size, _STAMP.size)

    async def work(pub_conn: Connection) -> tuple[list[Stats], list[Stats]]:
        conns = await _connect_all(target, clients)
        results = [Stats("sub", i + 1, size=size) for i in range(clients)]
        try:
            async with Live("receiving", msgs * clients) as live:
                live.done = [0] * clients
                subs = [await c.subscribe(subject, max_msgs=msgs) for c in conns]
                await asyncio.gather(*(c.flush() for c in conns))

                async def receive(i: int) -> None:
                    stats, sub = results[i], subs[i]
                    t0 = 0.0
                    sample = max(1, msgs // 10_000)
                    for k in range(msgs):
                        msg = await sub.next_msg(timeout=30)
                        now = time.perf_counter_ns()
                        if not k:
                            t0 = now / 1e9
                        if not k % sample:
                            stats.latencies.append((now - _STAMP.unpack_from(msg.data)[0]) / 1e9)
                            live.done[i] = k
                    stats.messages, stats.seconds = msgs, time.perf_counter() - t0
                    live.done[i] = msgs

                receivers = [asyncio.create_task(receive(i)) for i in range(clients)]
                payload = _payload(size)
                start = time.perf_counter()
                for k in range(msgs):
                    _STAMP.pack_into(payload, 0, time.perf_counter_ns())
                    await pub_conn.publish(subject, bytes(payload))
                    if not k & 255:
                        # Let the subscribers (same loop) read, as separate processes
                        # would, rather than queue the whole run behind the publisher.
                        await asyncio.sleep(0)
                await pub_conn.flush(timeout=60)
                try:
                    await asyncio.gather(*receivers)
                except (Timeout, TimeoutError):
                    got = sum(live.done)
                    raise Failure(
                        f"subscribers stopped receiving after about {got:,} messages "
                        "(a slow consumer?)"
                    ) from None
                end = time.perf_counter()
        finally:
            await _close_all(conns)
        return results, [_aggregate("sub", results, start, end)]

    results, summary = run(target, work)
    _report(results, summary, csv_path, as_json)


StreamOpt = Annotated[str, typer.Option("--stream", help="Stream (created if missing).")]


async def _ensure_stream(conn: Connection, stream: str, subject: str, storage: str) -> None:
    js = conn.jetstream()
    try:
        await js.stream_info(stream)
    except StreamNotFound:
        await js.api(
            f"STREAM.CREATE.{stream}",
            {"name": stream, "subjects": [subject], "storage": storage, "num_replicas": 1},
        )


@remote(js_app, "pub")
def js_pub(
    target: Target,
    subject: SubjectArg = "benchstream.x",
    msgs: MsgsOpt = 100_000,
    size: SizeOpt = 128,
    clients: ClientsOpt = 1,
    stream: StreamOpt = "benchstream",
    storage: Annotated[
        str, typer.Option("--storage", help="file or memory (new stream).")
    ] = "file",
    sync: Annotated[bool, typer.Option("--sync", help="Wait for each PubAck.")] = False,
    window: Annotated[
        int, typer.Option("--window", help="Unacknowledged publishes at most.", min=1)
    ] = 4000,
    sample: Annotated[
        int, typer.Option("--sample", help="With a window: time one ack in N.", min=1)
    ] = 1000,
    purge: Annotated[bool, typer.Option("--purge", help="Empty the stream first.")] = False,
    csv_path: CsvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """JetStream publish with acks: --sync one at a time, else a window (publish_async)."""

    async def work(first: Connection) -> tuple[list[Stats], list[Stats]]:
        await _ensure_stream(first, stream, subject, storage)
        if purge:
            await first.jetstream().api(f"STREAM.PURGE.{stream}", timeout=120)
        conns = [first, *await _connect_all(target, clients - 1)]
        test = "js pub sync" if sync else f"js pub window {window}"
        results = [Stats(test, i + 1, size=size) for i in range(clients)]
        payload = bytes(_payload(size))
        try:
            async with Live("publishing", msgs) as live:
                live.done = [0] * clients

                async def one(i: int, conn: Connection, n: int) -> None:
                    js = conn.jetstream(max_pending_acks=window, timeout=30)
                    lat = results[i].latencies
                    clock = time.perf_counter
                    t0 = clock()
                    if sync:
                        for k in range(n):
                            t = clock()
                            await js.publish(subject, payload)
                            lat.append(clock() - t)
                            if not k & 255:
                                live.done[i] = k
                    else:
                        timers: list[asyncio.Task[None]] = []

                        async def timed(ack: Any, t: float) -> None:
                            await ack
                            lat.append(clock() - t)

                        publish = js.publish_async
                        for k in range(n):
                            if k % sample:
                                await publish(subject, payload)
                            else:
                                t = clock()
                                ack = await publish(subject, payload)
                                timers.append(asyncio.create_task(timed(ack, t)))
                                live.done[i] = k
                        await js.publish_async_completed(timeout=60)
                        await asyncio.gather(*timers)
                    live.done[i] = n
                    results[i].messages, results[i].seconds = n, clock() - t0

                start = time.perf_counter()
                await asyncio.gather(
                    *(
                        one(i, c, n)
                        for i, (c, n) in enumerate(zip(conns, _split(msgs, clients), strict=True))
                    )
                )
                end = time.perf_counter()
        finally:
            await _close_all(conns[1:])
        return results, [_aggregate(test, results, start, end)]

    results, summary = run(target, work)
    _report(results, summary, csv_path, as_json)


@remote(js_app, "consume")
def js_consume(
    target: Target,
    msgs: MsgsOpt = 100_000,
    clients: ClientsOpt = 1,
    stream: StreamOpt = "benchstream",
    durable: Annotated[
        str, typer.Option("--durable", help="Pull consumer (created if missing).")
    ] = "benchconsumer",
    batch: Annotated[int, typer.Option("--batch", help="Messages per fetch.", min=1)] = 500,
    csv_path: CsvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fetch and ack --msgs through a durable pull consumer (shared by --clients).

    Latency is each fetch's round trip."""

    async def work(first: Connection) -> tuple[list[Stats], list[Stats]]:
        js = first.jetstream()
        try:
            await js.consumer_info(stream, durable)
        except StreamNotFound:
            raise Failure(f"no stream {stream!r}: fill one with tether bench js pub") from None
        except ConsumerNotFound:
            await js.add_consumer(
                stream, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT)
            )
        conns = [first, *await _connect_all(target, clients - 1)]
        results = [Stats(f"js consume fetch {batch}", i + 1) for i in range(clients)]
        remaining = [msgs]
        try:
            async with Live("consuming", msgs) as live:
                live.done = [0] * clients

                async def one(i: int, conn: Connection) -> None:
                    sub = await conn.jetstream().pull_subscribe(stream, durable)
                    stats = results[i]
                    clock = time.perf_counter
                    t0 = clock()
                    while remaining[0] > 0:
                        want = min(batch, remaining[0])
                        t = clock()
                        try:
                            got = await sub.fetch(want, timeout=5)
                        except (Timeout, TimeoutError):
                            break
                        stats.latencies.append(clock() - t)
                        remaining[0] -= len(got)
                        for m in got:
                            m.ack_nowait()
                        if got:
                            stats.size = len(got[-1].data)
                        stats.messages += len(got)
                        live.done[i] = stats.messages
                    await conn.flush(timeout=30)
                    stats.seconds = clock() - t0

                start = time.perf_counter()
                await asyncio.gather(*(one(i, c) for i, c in enumerate(conns)))
                end = time.perf_counter()
        finally:
            await _close_all(conns[1:])
        done = sum(r.messages for r in results)
        if done < msgs:
            raise Failure(f"the stream ran dry after {done:,} of {msgs:,} messages")
        total = _aggregate(results[0].test, results, start, end)
        total.size = max(r.size for r in results)
        return results, [total]

    results, summary = run(target, work)
    _report(results, summary, csv_path, as_json)
