"""A worker: bounded concurrency, retries with growing delays, give-up, backoff.

NATS_URL=nats://127.0.0.1:4222 .venv/bin/python examples/client/worker.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from tether.client import (
    AckPolicy,
    Backoff,
    ConsumerConfig,
    JsMsg,
    Retry,
    StreamNotFound,
    Worker,
    connect,
)


async def main() -> None:
    nc = await connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    js = nc.jetstream()
    with contextlib.suppress(StreamNotFound):
        await js.delete_stream("EMAILS")
    await js.add_stream(name="EMAILS", subjects=["emails.>"])
    for n in range(20):
        await js.publish_async("emails.send", b"mail %d" % n)
    await js.publish_async_completed(timeout=10)
    sub = await js.pull_subscribe("EMAILS", "sender", ConsumerConfig(ack_policy=AckPolicy.EXPLICIT))

    done = asyncio.Event()
    sent: list[bytes] = []
    dead: list[bytes] = []

    async def send_email(msg: JsMsg) -> None:
        if msg.data == b"mail 13":
            raise RuntimeError("mailbox does not exist")  # retried, then given up
        if msg.data == b"mail 7" and msg.metadata.num_delivered == 1:
            raise Retry(delay=0.2, backoff=False)  # a known transient condition
        await asyncio.sleep(0.01)  # the actual work
        sent.append(msg.data)
        if len(sent) + len(dead) == 20:
            done.set()

    def give_up(msg: JsMsg) -> None:
        dead.append(msg.data)  # e.g. write it to a dead-letter store
        if len(sent) + len(dead) == 20:
            done.set()

    worker = Worker(
        sub,
        send_email,
        max_in_flight=5,
        max_attempts=3,
        on_give_up=give_up,
        requeue_delay=0.1,  # nak delay = 0.1 s x attempt number
        backoff=Backoff(initial=0.2, maximum=2.0),
    )
    async with worker:
        await asyncio.wait_for(done.wait(), 30)
    print(f"sent {len(sent)}, gave up on {dead}")
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
