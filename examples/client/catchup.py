"""A catch-up subscription: replay a stream from a checkpoint, then follow it live.

NATS_URL=nats://127.0.0.1:4222 .venv/bin/python examples/client/catchup.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

from tether.client import CatchUpSubscription, JsMsg, StreamNotFound, connect

CHECKPOINT = Path(tempfile.gettempdir()) / "catchup-example.checkpoint"


async def main() -> None:
    nc = await connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    js = nc.jetstream()
    with contextlib.suppress(StreamNotFound):
        await js.delete_stream("EVENTS")
    CHECKPOINT.unlink(missing_ok=True)
    await js.add_stream(name="EVENTS", subjects=["events.>"])
    for n in range(1, 501):  # history written while we were away
        await js.publish_async("events.page", b"view %d" % n)
    await js.publish_async_completed(timeout=10)

    start = int(CHECKPOINT.read_text()) + 1 if CHECKPOINT.exists() else 1
    total = 0
    caught_up = asyncio.Event()

    def project(msg: JsMsg) -> None:
        nonlocal total
        total += 1  # update a read model; every sequence arrives once, in order
        if msg.metadata.stream_seq == 520:
            caught_up.set()

    def save(seq: int) -> None:
        CHECKPOINT.write_text(str(seq))

    async with CatchUpSubscription(
        js, "EVENTS", project, start_seq=start, checkpoint=save, checkpoint_every=100
    ) as sub:
        await sub.wait_live(10)
        for n in range(501, 521):  # live traffic now arrives over push
            await js.publish("events.page", b"view %d" % n)
        await asyncio.wait_for(caught_up.wait(), 10)
    print(f"projected {total} events; checkpoint at {CHECKPOINT.read_text()}")
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
