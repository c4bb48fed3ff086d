"""Create the SHOP_ORDERS stream and publish sample orders as JSON.

    .venv/bin/python examples/spark_pipeline/produce_orders.py \\
        --servers nats://127.0.0.1:4222 --count 5000

Each order is ``{"id", "customer", "region", "amount", "created"}`` on subject
``shop.orders.<region>``. The first run spreads ``created`` over the last
``--minutes`` minutes, so the pipeline has several windows to aggregate; later runs
continue from the newest order already in the stream, so their orders are not late
for the pipeline's watermark.

Every run has its own id prefix (``<run>-<n>``), used as the message id
(``Nats-Msg-Id``): a publish retried within a run is stored once, and each run adds
new orders.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import uuid
from datetime import UTC, datetime, timedelta

from tether.client import StreamNameInUse, connect

STREAM = "SHOP_ORDERS"
SUBJECTS = ["shop.orders.>"]
REGIONS = ("eu", "us", "apac")


async def produce(servers: str, count: int, minutes: int, seed: int | None) -> None:
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    nc = await connect(servers)
    try:
        js = nc.jetstream()
        try:
            # Creating a stream that exists with this configuration is a no-op.
            # allow_direct lets Spark read ranges with batched DIRECT.GET on nats-server.
            info = await js.add_stream(name=STREAM, subjects=SUBJECTS, allow_direct=True)
        except StreamNameInUse:
            sys.exit(
                f"stream {STREAM} exists on {servers} with another configuration; "
                "this example needs its own (subjects shop.orders.>, allow_direct): "
                "delete that stream or use another server"
            )
        now = datetime.now(UTC)
        start = now - timedelta(minutes=minutes)
        if info.state.last_seq and info.state.last_ts:
            start = max(start, datetime.fromisoformat(info.state.last_ts))
        for i in range(count):
            order = {
                "id": f"{run}-{i}",
                "customer": f"c{rng.randrange(100)}",
                "region": rng.choice(REGIONS),
                "amount": round(rng.uniform(5, 500), 2),
                "created": (start + (now - start) * (i + 1) / count).isoformat(),
            }
            await js.publish_async(
                f"shop.orders.{order['region']}", json.dumps(order).encode(), msg_id=order["id"]
            )
        await js.publish_async_completed(timeout=60)
        info = await js.stream_info(STREAM)
        print(f"published {count} orders (ids {run}-0..{count - 1}); ", end="")
        print(f"{STREAM} holds {info.state.messages} messages")
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="nats://127.0.0.1:4222")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--minutes", type=int, default=10, help="time span of a first run")
    parser.add_argument("--seed", type=int, help="random seed (default: a fresh one)")
    args = parser.parse_args()
    asyncio.run(produce(args.servers, args.count, args.minutes, args.seed))


if __name__ == "__main__":
    main()
