"""JetStream client throughput: the Tether SDK against nats-py, same server, one run.

Two loads per client, each on a fresh stream of a fresh server:

* ``publish``: ``N`` async publishes with acks (a window of outstanding acks — 4000, both
  clients' default), then wait until every ack arrived;
* ``consume``: a durable pull consumer with explicit acks; pull and ack all ``N``
  messages (SDK: the continuous ``messages()`` iterator and ``fetch(500)``; nats-py:
  ``fetch(500)``, its fastest pull API), then wait until the server has every ack.

Rate = N / wall time of the load. Each client runs in its own process, one after the
other, so their CPU use (printed per message, with the server's) is their own.

    .venv/bin/python benchmarks/sdk_vs_natspy.py                 # 100k messages, nats-server
    .venv/bin/python benchmarks/sdk_vs_natspy.py --tether        # Tether as well
    .venv/bin/python benchmarks/sdk_vs_natspy.py -n 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # after the sys.path tweak above
    ServerProcess,
    nats_server_version,
    start_nats_server,
    start_tether,
)

PAYLOAD = b"x" * 128
BATCH = 500
LOADS = ("publish", "consume")
CLIENTS = ("tether-sdk", "tether-sdk-fetch", "nats-py")


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the Tether SDK ---------------------------------------------------------------------------


class Clock:
    """Wall time and CPU of the measured part only (not imports, not connecting)."""

    def __enter__(self) -> Clock:
        self.cpu = cpu()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started
        self.cpu = cpu() - self.cpu


async def sdk_publish(url: str, stream: str, n: int) -> Clock:
    from tether.client import connect

    async with await connect(url) as nc:
        js = nc.jetstream()
        subject = f"{stream.lower()}.m"
        with Clock() as clock:
            for _ in range(n):
                await js.publish_async(subject, PAYLOAD)
            await js.publish_async_completed(timeout=120)
        assert js.publish_async_failures == 0
    return clock


async def sdk_consume(url: str, stream: str, n: int, *, use_fetch: bool) -> Clock:
    from tether.client import connect

    async with await connect(url) as nc:
        js = nc.jetstream()
        sub = await js.pull_subscribe(stream, "C")
        got = 0
        with Clock() as clock:
            if use_fetch:
                while got < n:
                    for msg in await sub.fetch(BATCH, timeout=5):
                        await msg.ack()
                        got += 1
            else:
                async with sub.messages(batch=BATCH) as messages:
                    async for msg in messages:
                        await msg.ack()
                        got += 1
                        if got == n:
                            break
            await nc.flush(30)
    return clock


# -- nats-py ----------------------------------------------------------------------------------


async def natspy_publish(url: str, stream: str, n: int) -> Clock:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    subject = f"{stream.lower()}.m"
    with Clock() as clock:
        for _ in range(n):
            await js.publish_async(subject, PAYLOAD)
        await asyncio.wait_for(js.publish_async_completed(), 120)
    await nc.close()
    return clock


async def natspy_consume(url: str, stream: str, n: int) -> Clock:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(f"{stream.lower()}.m", "C", stream=stream)
    got = 0
    with Clock() as clock:
        while got < n:
            for msg in await sub.fetch(BATCH, timeout=5):
                await msg.ack()
                got += 1
        await nc.flush(30)
    await nc.close()
    return clock


LOAD_FUNCS: dict[tuple[str, str], Callable[[str, str, int], Awaitable[Clock]]] = {
    ("tether-sdk", "publish"): sdk_publish,
    ("tether-sdk-fetch", "publish"): sdk_publish,
    ("nats-py", "publish"): natspy_publish,
    ("tether-sdk", "consume"): lambda u, s, n: sdk_consume(u, s, n, use_fetch=False),
    ("tether-sdk-fetch", "consume"): lambda u, s, n: sdk_consume(u, s, n, use_fetch=True),
    ("nats-py", "consume"): natspy_consume,
}


def run_load(client: str, load: str, url: str, stream: str, n: int, out: Any) -> None:
    """Child process: run one load, report its wall time and CPU."""
    clock = asyncio.run(LOAD_FUNCS[client, load](url, stream, n))
    out.send({"seconds": clock.seconds, "cpu": clock.cpu})


# -- set-up and reporting ---------------------------------------------------------------------


async def prepare(url: str, stream: str, n: int, *, fill: bool) -> None:
    """A fresh stream (filled for a consume load) and its durable pull consumer."""
    from tether.client import AckPolicy, ConsumerConfig, connect

    async with await connect(url) as nc:
        js = nc.jetstream(timeout=30)
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        if fill:
            for _ in range(n):
                await js.publish_async(f"{stream.lower()}.m", PAYLOAD)
            await js.publish_async_completed(timeout=120)
            await js.add_consumer(
                stream,
                ConsumerConfig(
                    durable_name="C",
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=60,
                    max_ack_pending=20000,
                ),
            )


async def check(url: str, stream: str, n: int, load: str) -> None:
    from tether.client import connect

    async with await connect(url) as nc:
        js = nc.jetstream(timeout=30)
        if load == "publish":
            messages = (await js.stream_info(stream)).state.messages
            assert messages == n, f"{stream}: {messages} messages stored, expected {n}"
            return
        deadline = time.monotonic() + 30
        while True:  # acks are asynchronous: give the server a moment to apply them all
            info = await js.consumer_info(stream, "C")
            if info.num_ack_pending == 0 and info.num_pending == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{stream}: {info.num_ack_pending} unacked, {info.num_pending} pending"
                )
            await asyncio.sleep(0.05)


def measure(server: ServerProcess, client: str, load: str, n: int, tag: str) -> dict[str, float]:
    stream = f"B{tag}{client.replace('-', '')}{load}".upper()
    asyncio.run(prepare(server.url, stream, n, fill=load == "consume"))
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    server_cpu = server.cpu_seconds()
    proc = ctx.Process(target=run_load, args=(client, load, server.url, stream, n, sender))
    proc.start()
    if not receiver.poll(600):
        proc.kill()
        raise RuntimeError(f"{client} {load} did not finish")
    result: dict[str, float] = receiver.recv()
    proc.join(30)
    result["server_cpu"] = server.cpu_seconds() - server_cpu
    asyncio.run(check(server.url, stream, n, load))
    result["rate"] = n / result["seconds"]
    return result


def bench_server(name: str, server: ServerProcess, n: int, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for load in LOADS:
        for client in CLIENTS:
            if load == "publish" and client == "tether-sdk-fetch":
                continue  # the same code as tether-sdk
            runs = [measure(server, client, load, n, f"{r}") for r in range(rounds)]
            best = max(runs, key=lambda r: r["rate"])
            results[f"{client}/{load}"] = {
                "rate": best["rate"],
                "median_rate": statistics.median(r["rate"] for r in runs),
                "client_us_per_msg": best["cpu"] / n * 1e6,
                "server_us_per_msg": best["server_cpu"] / n * 1e6,
            }
            print(
                f"  {name:11} {load:8} {client:17} {best['rate']:>10,.0f} msg/s"
                f"   client {best['cpu'] / n * 1e6:5.1f} us/msg   server {best['server_cpu'] / n * 1e6:5.1f} us/msg",
                flush=True,
            )
    for load in LOADS:
        base = results[f"nats-py/{load}"]["rate"]
        for client in CLIENTS:
            key = f"{client}/{load}"
            if key in results and client != "nats-py":
                ratio = results[key]["rate"] / base
                results[key]["ratio_vs_natspy"] = ratio
                print(f"  {name:11} {load:8} {client:17} = {ratio:4.1f}x nats-py")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1, help="runs per load; the best is reported")
    parser.add_argument(
        "--tether", action="store_true", help="also run against Tether (sqlite store)"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    print(
        f"{args.messages:,} messages of {len(PAYLOAD)} bytes; nats-server {nats_server_version()}"
    )
    report: dict[str, Any] = {"messages": args.messages, "payload": len(PAYLOAD)}
    with start_nats_server(jetstream=True) as server:
        report["nats-server"] = bench_server("nats-server", server, args.messages, args.rounds)
    if args.tether:
        with start_tether(store="sqlite") as server:
            report["tether"] = bench_server("tether", server, args.messages, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
