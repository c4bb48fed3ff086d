"""Priority groups, consumer reset and multi_last through nats-py against ``tether serve``.

nats-py 2.16 has no API for priority groups, so those consumers are created and pulled
with plain requests, the way the ADR-42 clients send them; acks, reset's effect and the
rest go through nats-py's JetStream context.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from tether.testing import RunningServer, run_server

API = "$JS.API"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv


async def request(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = json.loads((await nc.request(subject, data, timeout=2)).data)
    assert isinstance(reply, dict)
    return reply


async def pull(nc: Client, stream: str, consumer: str, body: dict[str, Any]) -> list[Msg]:
    """One pull request; its messages until the batch is done or a status ends it."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", json.dumps(body).encode(), reply=inbox
    )
    got: list[Msg] = []
    try:
        while len([m for m in got if not m.headers or "Status" not in m.headers]) < body["batch"]:
            msg = await sub.next_msg(timeout=max(body.get("expires", 0) / 1e9, 0.5) + 0.5)
            got.append(msg)
            if msg.headers and "Status" in msg.headers:
                break
    except nats.errors.TimeoutError:
        pass
    await sub.unsubscribe()
    return got


async def test_pinned_client_failover_with_natspy_acks(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(name="PIN", subjects=["pin.>"])
    created = await request(
        nc,
        f"{API}.CONSUMER.CREATE.PIN.workers",
        {
            "stream_name": "PIN",
            "config": {
                "durable_name": "workers",
                "ack_policy": "explicit",
                "priority_groups": ["jobs"],
                "priority_policy": "pinned_client",
                "priority_timeout": 5_000_000_000,
            },
        },
    )
    assert created["config"]["priority_policy"] == "pinned_client"
    assert created["priority_groups"] == [{"group": "jobs", "pinned_ts": "0001-01-01T00:00:00Z"}]
    for i in range(4):
        await js.publish("pin.a", b"job %d" % i)
    first = await pull(nc, "PIN", "workers", {"batch": 2, "expires": 500_000_000, "group": "jobs"})
    assert [m.data for m in first] == [b"job 0", b"job 1"]
    pin = first[0].headers["Nats-Pin-Id"] if first[0].headers else ""
    assert pin and all(m.headers and m.headers["Nats-Pin-Id"] == pin for m in first)
    for msg in first:
        await msg.ack_sync()  # nats-py's acks work on pinned deliveries
    # Another client without the pin waits as a standby and gets nothing.
    # Its request lasts long enough to outlive a slow machine's pauses: the unpin below
    # ends its wait.
    standby = pull(nc, "PIN", "workers", {"batch": 1, "expires": 10_000_000_000, "group": "jobs"})
    task = asyncio.ensure_future(standby)
    await asyncio.sleep(0.3)
    assert not task.done()
    info = await request(nc, f"{API}.CONSUMER.INFO.PIN.workers")
    assert info["priority_groups"][0]["pinned_client_id"] == pin
    # An operator unpins: the standby takes over with a new pin.
    assert await request(nc, f"{API}.CONSUMER.UNPIN.PIN.workers", {"group": "jobs"}) == {
        "type": "io.nats.jetstream.api.v1.consumer_unpin_response"
    }
    (taken,) = await task
    assert taken.data == b"job 2"
    assert taken.headers is not None and taken.headers["Nats-Pin-Id"] not in ("", pin)
    # The old holder's id is stale now.
    stale = await pull(
        nc, "PIN", "workers", {"batch": 1, "expires": 500_000_000, "group": "jobs", "id": pin}
    )
    assert stale[0].headers is not None and stale[0].headers["Status"] == "423"


async def test_overflow_serves_the_backup_only_past_its_threshold(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(name="OVF", subjects=["ovf.>"])
    await request(
        nc,
        f"{API}.CONSUMER.CREATE.OVF.c",
        {
            "stream_name": "OVF",
            "config": {
                "durable_name": "c",
                "ack_policy": "explicit",
                "priority_groups": ["g"],
                "priority_policy": "overflow",
            },
        },
    )
    for i in range(3):
        await js.publish("ovf.a", b"%d" % i)
    backup = {"batch": 1, "expires": 300_000_000, "group": "g", "min_pending": 5}
    assert [m.headers["Status"] for m in await pull(nc, "OVF", "c", backup) if m.headers] == ["408"]
    for i in range(3):
        await js.publish("ovf.a", b"%d" % i)
    (got,) = await pull(nc, "OVF", "c", backup)
    assert got.data == b"0"


async def test_reset_redelivers_from_a_sequence_to_a_natspy_pull(nc: Client) -> None:
    js: JetStreamContext = nc.jetstream()
    await js.add_stream(name="RST", subjects=["rst.>"])
    for i in range(5):
        await js.publish("rst.a", b"%d" % i)
    sub = await js.pull_subscribe("rst.a", durable="r", stream="RST")
    for msg in await sub.fetch(5, timeout=2):
        await msg.ack_sync()
    reply = await request(nc, f"{API}.CONSUMER.RESET.RST.r", {"seq": 3})
    assert reply["type"] == "io.nats.jetstream.api.v1.consumer_reset_response"
    assert reply["reset_seq"] == 3
    assert reply["delivered"] == {"consumer_seq": 0, "stream_seq": 2}
    again = await sub.fetch(5, timeout=1)
    assert [m.data for m in again] == [b"2", b"3", b"4"]
    assert [m.metadata.sequence.consumer for m in again] == [1, 2, 3]


async def test_multi_last_direct_get(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(name="ML", subjects=["ml.>"], allow_direct=True)
    for subject, data in [("ml.a", b"1"), ("ml.b", b"2"), ("ml.a", b"3"), ("ml.c", b"4")]:
        await js.publish(subject, data)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    body = json.dumps({"multi_last": ["ml.a", "ml.b"], "up_to_seq": 3}).encode()
    await nc.publish(f"{API}.DIRECT.GET.ML", body, reply=inbox)
    got = [await sub.next_msg(timeout=2) for _ in range(3)]
    assert [(m.data, m.headers and m.headers.get("Nats-Subject")) for m in got[:2]] == [
        (b"2", "ml.b"),
        (b"3", "ml.a"),
    ]
    eob = got[2].headers or {}
    assert (eob["Status"], eob["Nats-UpTo-Sequence"], eob["Nats-Last-Sequence"]) == (
        "204",
        "3",
        "3",
    )
