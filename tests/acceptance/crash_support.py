"""What the kill -9 tests share: reading a whole stream back, payloads, the seed.

Imported by the crash test modules (``--import-mode=importlib``: they put this
directory on ``sys.path`` first). Not a test module itself.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from nats.aio.client import Client


async def read_stream(nc: Client, stream: str) -> dict[int, tuple[str, bytes, str]]:
    """Every message of ``stream``: seq -> (subject, payload, msg id), via batched DIRECT.GET.

    The stream must allow direct gets. A sequence read twice fails the test.
    """
    out: dict[int, tuple[str, bytes, str]] = {}
    start = 1
    while True:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        request = json.dumps({"seq": start, "batch": 1000}).encode()
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", request, reply=inbox)
        pending = -1
        try:
            while True:
                msg = await sub.next_msg(timeout=5)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return out
                if status == "204":
                    pending = int(headers["Nats-Num-Pending"])
                    start = int(headers["Nats-Last-Sequence"]) + 1
                    break
                seq = int(headers["Nats-Sequence"])
                assert seq not in out, f"{stream}: sequence {seq} read twice"
                out[seq] = (headers["Nats-Subject"], msg.data, headers.get("Nats-Msg-Id", ""))
        finally:
            await sub.unsubscribe()
        if pending == 0:
            return out


async def api(nc: Client, subject: str, body: Any = None) -> dict[str, Any]:
    """One ``$JS.API`` request; an error answer fails the test."""
    data = b"" if body is None else json.dumps(body).encode()
    reply: dict[str, Any] = json.loads((await nc.request(subject, data, timeout=5)).data)
    assert "error" not in reply, (subject, reply)
    return reply


def payload_for(key: str, rng: random.Random) -> bytes:
    return key.encode() + b":" + rng.randbytes(rng.randint(8, 300)).hex().encode()


def crash_seed() -> int:
    """``TETHER_CRASH_SEED`` if set (to replay a run), else a fresh random seed."""
    return int(os.environ.get("TETHER_CRASH_SEED", "0")) or random.SystemRandom().randrange(
        1, 2**31
    )
