"""Create the ORDERS stream and publish sample orders as JSON.

    python examples/spark_pipeline/produce_orders.py --servers nats://127.0.0.1:4222 --count 5000

Each order is ``{"id", "customer", "region", "amount", "created"}``; ``created``
spreads the orders over the last ``--minutes`` minutes so the pipeline has several
windows to aggregate. Orders go to ``orders.<region>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from datetime import UTC, datetime, timedelta

from tether.client import connect

REGIONS = ("eu", "us", "apac")


async def produce(servers: str, count: int, minutes: int, seed: int) -> None:
    rng = random.Random(seed)
    nc = await connect(servers)
    try:
        js = nc.jetstream()
        # allow_direct lets Spark executors read ranges with batched DIRECT.GET.
        await js.add_stream(name="ORDERS", subjects=["orders.>"], allow_direct=True)
        now = datetime.now(UTC)
        for i in range(count):
            created = now - timedelta(seconds=minutes * 60 * (count - i) / count)
            order = {
                "id": i,
                "customer": f"c{rng.randrange(100)}",
                "region": rng.choice(REGIONS),
                "amount": round(rng.uniform(5, 500), 2),
                "created": created.isoformat(),
            }
            # msg_id makes re-running the producer harmless within the dedup window.
            await js.publish_async(
                f"orders.{order['region']}", json.dumps(order).encode(), msg_id=f"order-{i}"
            )
        await js.publish_async_completed(timeout=60)
        info = await js.stream_info("ORDERS")
        print(f"ORDERS holds {info.state.messages} messages")
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="nats://127.0.0.1:4222")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(produce(args.servers, args.count, args.minutes, args.seed))


if __name__ == "__main__":
    main()
