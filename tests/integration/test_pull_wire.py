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

from tether.testing import RawClient, RunningServer

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


def _frames(data: bytes) -> list[tuple[str, str, bytes]]:
    """(subject, reply, payload with any header block) of each MSG/HMSG in ``data``."""
    frames: list[tuple[str, str, bytes]] = []
    pos = 0
    while (nl := data.find(b"\r\n", pos)) >= 0:
        parts = data[pos:nl].split()
        pos = nl + 2
        if parts and parts[0] in (b"MSG", b"HMSG"):
            size = int(parts[-1])
            reply = parts[3].decode() if len(parts) == (6 if parts[0] == b"HMSG" else 5) else ""
            frames.append((parts[1].decode(), reply, data[pos : pos + size]))
            pos += size + 2
    return frames


@pytest.mark.parametrize(
    ("monitored", "pedantic"),
    [(False, False), (True, False), (False, True)],
    ids=["alone", "monitored", "pedantic"],
)
async def test_acks_written_together_act_as_one_by_one(
    nc: Client, memory_server: RunningServer, monitored: bool, pedantic: bool
) -> None:
    """Acks of every kind in one write (the server takes them as one batch); the same
    with a client subscribed to ``$JS.ACK.>`` (then each is routed on its own), and from
    a pedantic client (acks handled one by one, the bad subject reported)."""
    seen: list[Msg] = []
    if monitored:
        await _collect(nc, "$JS.ACK.>", seen)
        await nc.flush()
    raw = await RawClient.connect(memory_server.host, memory_server.port)
    try:
        options = {"verbose": False, "pedantic": pedantic, "headers": True, "no_responders": True}
        await raw.send(b"CONNECT %s\r\n" % json.dumps(options).encode())
        pull = b'{"batch":10}'
        await raw.send(
            b"SUB _INBOX.raw.> 1\r\nPUB %s _INBOX.raw.next %d\r\n" % (NEXT.encode(), len(pull))
        )
        await raw.send(pull + b"\r\n")
        assert await raw.sync()
        acks = [reply for _, reply, _ in _frames(raw.take())]
        assert len(acks) == 10
        unknown = acks[0].replace(".P.C.", ".P.GONE.")
        batch = [
            (acks[0], b"", b""),
            (acks[1], b"_INBOX.raw.r2", b"+ACK"),
            (acks[2], b"", b"+TERM"),
            (unknown, b"_INBOX.raw.gone", b"+ACK"),
            ("$JS.ACK..P.C", b"", b""),
            (acks[3], b"", b"+WPI"),
            *((a, b"", b"+ACK") for a in acks[4:]),
        ]
        await raw.send(
            b"".join(
                b"PUB %s %s%d\r\n%s\r\n"
                % (s.encode(), reply + b" " if reply else b"", len(body), body)
                for s, reply, body in batch
            )
        )
        assert await raw.sync()
        # The ack's reply goes out once the ack is committed: maybe after the PONG.
        await raw.wait_for(lambda: len(_frames(raw.unread)) >= 2)
        answer = raw.take()
        replies = _frames(answer)
    finally:
        await raw.close()
    # The ack's empty reply (sent once the ack is committed, so after the other one).
    by_inbox = {subject: payload for subject, _, payload in replies}
    assert by_inbox["_INBOX.raw.r2"] == b""
    assert by_inbox["_INBOX.raw.gone"].startswith(b"NATS/1.0 503")
    assert len(replies) == 2
    assert (b"-ERR 'Invalid Publish Subject'" in answer) == pedantic
    info = await nc.jetstream().consumer_info("P", "C")
    assert info.num_ack_pending == 1  # the message in progress
    assert info.ack_floor.stream_seq == 3 and info.num_redelivered == 0
    if monitored:
        await _settle([seen], 11)
        assert [m.subject for m in seen] == [a for a, _, _ in batch if ".." not in a]
