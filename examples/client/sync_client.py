"""The blocking facade, for scripts and thread-based code.

NATS_URL=nats://127.0.0.1:4222 .venv/bin/python examples/client/sync_client.py
"""

from __future__ import annotations

import contextlib
import os

from tether.client import StreamNotFound, Timeout
from tether.client.sync import connect

with connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222")) as nc:
    js = nc.jetstream()
    with contextlib.suppress(StreamNotFound):
        js.delete_stream("TASKS")
    js.add_stream(name="TASKS", subjects=["tasks.>"])
    for n in range(3):
        print("published", js.publish("tasks.new", b"task %d" % n).seq)
    js.add_consumer("TASKS", durable_name="runner", ack_policy="explicit")
    sub = js.pull_subscribe("TASKS", "runner")
    try:
        for msg in sub.fetch(10, timeout=1):
            print("got", msg.data.decode(), "delivery", msg.metadata.num_delivered)
            msg.ack()
    except Timeout:
        print("nothing to do")
