"""Pull delivery and acks over the wire: runs, subscriptions that end, malformed acks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from tether.testing import RunningServer

NEXT = "$JS.API.CONSUMER.MSG.NEXT.P.C"


@pytest.fixture
async def nc(memory_server: RunningServer) -> AsyncIterator[Client]:
    client = await nats.connect(memory_server.url)
    js = client.jetstream()
    await js.add_stream(name="P", subjects=["p.>"])
    await js.add_consumer("P", ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT))
    for i in range(20):
        await js.publish("p.x", str(i).encode())
    yield client
    await client.close()


async def _collect(client: Client, subject: str, into: list[Msg], max_msgs: int = 0) -> None:
    async def handler(msg: Msg) -> None:
        into.append(msg)

    await client.subscribe(subject, cb=handler, max_msgs=max_msgs)


async def _settle(got: list[list[Msg]], total: int) -> None:
    for _ in range(100):
        if sum(map(len, got)) >= total:
            return
        await asyncio.sleep(0.02)


async def test_a_subscription_that_ends_mid_batch(nc: Client) -> None:
    a: list[Msg] = []
    b: list[Msg] = []
    await _collect(nc, "_INBOX.t.a", a, max_msgs=3)  # UNSUB after 3: dropped mid-batch
    await _collect(nc, "_INBOX.t.b", b)
    body = json.dumps({"batch": 10, "expires": 5_000_000_000}).encode()
    await nc.publish(NEXT, body, reply="_INBOX.t.a")
    await nc.publish(NEXT, body, reply="_INBOX.t.b")
    await nc.flush()
    await _settle([a, b], 13)
    # a's request is served at once with its whole batch; its subscription ends with the
    # third message (the other seven are sent to nobody, and wait for their ack wait);
    # b's request gets the next 10.
    assert [int(m.data) for m in a] == [0, 1, 2]
    assert [int(m.data) for m in b] == list(range(10, 20))
    info = await nc.jetstream().consumer_info("P", "C")
    assert info.num_ack_pending == 20 and info.num_waiting == 0


async def test_two_waiting_requests_share_new_messages(nc: Client) -> None:
    js = nc.jetstream()
    got: dict[str, list[Msg]] = {"a": [], "b": []}
    await _collect(nc, "_INBOX.w.a", got["a"])
    await _collect(nc, "_INBOX.w.b", got["b"])
    await js.add_consumer(
        "P", ConsumerConfig(durable_name="N", ack_policy=AckPolicy.EXPLICIT, deliver_policy="new")
    )
    body = json.dumps({"batch": 3, "expires": 5_000_000_000}).encode()
    await nc.publish("$JS.API.CONSUMER.MSG.NEXT.P.N", body, reply="_INBOX.w.a")
    await nc.publish("$JS.API.CONSUMER.MSG.NEXT.P.N", body, reply="_INBOX.w.b")
    await nc.flush()
    for i in range(6):
        await js.publish("p.x", f"new {i}".encode())
    await _settle([got["a"], got["b"]], 6)
    assert [m.data for m in got["a"]] == [b"new 0", b"new 2", b"new 4"]
    assert [m.data for m in got["b"]] == [b"new 1", b"new 3", b"new 5"]
    for m in got["a"] + got["b"]:
        assert m.reply.startswith("$JS.ACK.P.N.1.")
        await m.ack()
    await nc.flush()
    assert (await js.consumer_info("P", "N")).num_ack_pending == 0


async def test_a_long_run_arrives_whole_and_in_order(nc: Client) -> None:
    """A run longer than the early-written head (64 frames) goes out in two writes;
    the client sees every message once, in stream order, with its ack subject."""
    js = nc.jetstream()
    for i in range(20, 400):
        await js.publish("p.x", str(i).encode())
    got: list[Msg] = []
    await _collect(nc, "_INBOX.long", got)
    body = json.dumps({"batch": 400, "expires": 5_000_000_000}).encode()
    await nc.publish(NEXT, body, reply="_INBOX.long")
    await nc.flush()
    await _settle([got], 400)
    assert [int(m.data) for m in got] == list(range(400))
    assert [int(m.reply.split(".")[5]) for m in got] == list(range(1, 401))


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.P.C.1.².1.1.0",
        "$JS.ACK.P.C.1.٣.1.1.0",
        "$JS.ACK.P.C.1." + "9" * 30 + ".1.1.0",  # more than a uint64
        "$JS.ACK.P.C.1.2",
        "$JS.ACK.P.C.1.2.3.4.5.6",
        "$JS.ACK.P",
        "$JS.ACK.x.y.P.C.1.-1.1.1.0",
    ],
)
async def test_malformed_acks_are_ignored(nc: Client, subject: str) -> None:
    await nc.publish(subject, b"+ACK")
    with pytest.raises(nats.errors.TimeoutError):
        await nc.request(subject, b"+ACK", timeout=0.3)  # no reply for a non-number
    sub = await nc.jetstream().pull_subscribe("p.x", durable="C")
    msgs = await sub.fetch(2, timeout=5)
    for m in msgs:
        await m.ack()
    await nc.flush()
    info = await nc.jetstream().consumer_info("P", "C")
    assert info.num_ack_pending == 0 and info.ack_floor.stream_seq == 2
    assert nc.is_connected
