"""Create a stream, publish with acks, and pull with explicit acks.

NATS_URL=nats://127.0.0.1:4222 .venv/bin/python examples/client/publish_and_fetch.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from tether.client import AckPolicy, ConsumerConfig, StreamNotFound, Timeout, connect


async def main() -> None:
    nc = await connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"), name="example")
    js = nc.jetstream()
    with contextlib.suppress(StreamNotFound):
        await js.delete_stream("ORDERS")  # start from scratch
    await js.add_stream(name="ORDERS", subjects=["orders.>"])

    # One publish, waiting for the stream's ack (deduplicated by its message id).
    ack = await js.publish("orders.new", b"order 1", msg_id="order-1")
    print(f"stored as {ack.stream}#{ack.seq}")

    # Many publishes with at most max_pending_acks acks outstanding.
    for n in range(2, 101):
        await js.publish_async("orders.new", b"order %d" % n, msg_id=f"order-{n}")
    await js.publish_async_completed(timeout=10)

    # A durable pull consumer; fetch() returns what is there, or waits up to the timeout.
    sub = await js.pull_subscribe(
        "ORDERS", "billing", ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
    )
    handled = 0
    while True:
        try:
            batch = await sub.fetch(25, timeout=1)
        except Timeout:
            break  # nothing more within a second
        for msg in batch:
            meta = msg.metadata
            if meta.num_delivered == 1 and meta.stream_seq == 7:
                await msg.nak(delay=0.1)  # try this one again shortly
                continue
            await msg.ack()
            handled += 1
    print(f"handled {handled} orders")
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
