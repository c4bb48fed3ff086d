"""Pull consumer throughput: nats-py ``fetch(batch)`` + ``ack()`` against Tether and nats-server.

Each server gets a fresh stream of ``--messages`` messages (128 B, published with
``publish_async`` in windows of 1000), then one durable pull subscription fetches
``--batch`` at a time and acks every message (``msg.ack()``, no reply), until all are
acked. Rate = messages / (first fetch -> last ack flushed). The servers' CPU during the
consume phase is printed too: with nats-py as the client both are usually client-bound.

    .venv/bin/python benchmarks/fetch_ack.py                   # 30k messages, batch 500
    .venv/bin/python benchmarks/fetch_ack.py --store sqlite    # Tether on its SQLite store
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # after the sys.path tweak above
    ServerProcess,
    nats_server_version,
    start_nats_server,
    start_tether,
    tether_version,
)


async def run(server: ServerProcess, messages: int, batch: int) -> tuple[float, float]:
    """Returns (messages per second, server CPU share) of the consume phase."""
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await js.add_stream(name="BENCH", subjects=["bench.>"])
    payload = b"x" * 128
    window = []
    for _ in range(messages):
        window.append(await js.publish_async("bench.x", payload))
        if len(window) >= 1000:
            await asyncio.gather(*window)
            window = []
    await asyncio.gather(*window)
    sub = await js.pull_subscribe("bench.>", durable="D")
    cpu0 = server.cpu_seconds()
    start = time.perf_counter()
    got = 0
    while got < messages:
        msgs = await sub.fetch(batch, timeout=5)
        for msg in msgs:
            await msg.ack()
        got += len(msgs)
    await nc.flush()
    elapsed = time.perf_counter() - start
    cpu = server.cpu_seconds() - cpu0
    for _ in range(100):  # nats-server applies acks asynchronously
        info = await sub.consumer_info()
        if info.ack_floor.stream_seq == messages:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"acks lost: ack floor {info.ack_floor.stream_seq}")
    await nc.close()
    return got / elapsed, cpu / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--store", default="memory", help="Tether's store: memory or sqlite")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"tether {tether_version()} vs nats-server {nats_server_version()}")
    print(f"{args.messages} messages, fetch({args.batch}) + ack, {args.rounds} rounds")
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        with start_tether(store=args.store) as tether:
            rate, cpu = await run(tether, args.messages, args.batch)
        print(f"  tether ({args.store}): {rate:10,.0f} msg/s   server CPU {cpu:4.0%}")
        best["tether"] = max(best.get("tether", 0.0), rate)
        with start_nats_server(jetstream=True) as peer:
            rate, cpu = await run(peer, args.messages, args.batch)
        print(f"  nats-server:     {rate:10,.0f} msg/s   server CPU {cpu:4.0%}")
        best["nats"] = max(best.get("nats", 0.0), rate)
    print(f"best: tether/nats-server = {best['tether'] / best['nats']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
