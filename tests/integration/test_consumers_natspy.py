"""Consumers through nats-py against a real ``tether serve``: pulls, acks, push, ordered."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Iterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import Error as JsError
from nats.js.errors import FetchTimeoutError, NotFoundError

from tether.testing import RunningServer, run_server

_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv


async def stream(js: JetStreamContext, **config: object) -> str:
    """A fresh stream ``S<n>`` capturing ``s<n>.>``; returns its subject prefix."""
    n = next(_names)
    await js.add_stream(name=f"S{n}", subjects=[f"s{n}.>"], **config)  # type: ignore[arg-type]
    return f"s{n}"


async def publish(js: JetStreamContext, subject: str, count: int) -> None:
    for i in range(count):
        await js.publish(subject, b"m%d" % i)


def cfg(**fields: object) -> api.ConsumerConfig:
    return api.ConsumerConfig(**fields)  # type: ignore[arg-type]


async def eventually(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``condition`` until it holds (a loaded machine delays expiries and the work
    that follows an ack's reply); fail after 10 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not await condition():
        if loop.time() > deadline:
            pytest.fail(f"not within 10 s: {what}")
        await asyncio.sleep(0.02)


async def stored(js: JetStreamContext, s: str) -> int:
    return (await js.stream_info(s.upper())).state.messages


# -- pull ------------------------------------------------------------------------------------------


async def test_fetch_one_and_many(js: JetStreamContext) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 10)
    sub = await js.pull_subscribe(f"{s}.>", durable="D")
    (one,) = await sub.fetch(1, timeout=1)
    assert one.data == b"m0" and one.subject == f"{s}.a"
    meta = one.metadata
    assert (meta.sequence.stream, meta.sequence.consumer, meta.num_delivered) == (1, 1, 1)
    assert meta.num_pending == 9 and meta.stream == s.upper()
    await one.ack()
    many = await sub.fetch(20, timeout=1)
    assert [m.data for m in many] == [b"m%d" % i for i in range(1, 10)]
    for m in many:
        await m.ack()
    await js._nc.flush()
    info = await sub.consumer_info()
    assert info.num_pending == 0 and info.num_ack_pending == 0
    assert info.delivered.stream_seq == 10 and info.ack_floor.stream_seq == 10


async def test_fetch_timeouts(js: JetStreamContext) -> None:
    s = await stream(js)
    sub = await js.pull_subscribe(f"{s}.>", durable="D")
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=0.3)
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(5, timeout=0.3)
    # A fetch that is waiting when messages arrive gets them.
    task = asyncio.ensure_future(sub.fetch(3, timeout=5))
    await asyncio.sleep(0.1)
    await publish(js, f"{s}.a", 2)
    got = await task
    # nats-py returns what the first delivery brought: one or both messages, in order.
    assert [m.data for m in got] in ([b"m0"], [b"m0", b"m1"])


async def test_fetch_with_heartbeat(js: JetStreamContext) -> None:
    s = await stream(js)
    sub = await js.pull_subscribe(f"{s}.>", durable="D")
    # Heartbeats arrive, so an empty fetch is a FetchTimeoutError (not a lost server).
    with pytest.raises(FetchTimeoutError):
        await sub.fetch(1, timeout=0.6, heartbeat=0.1)
    await publish(js, f"{s}.a", 1)
    (msg,) = await sub.fetch(1, timeout=1, heartbeat=0.1)
    assert msg.data == b"m0"


async def test_concurrent_fetches_share_the_backlog(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    sub1 = await js.pull_subscribe(f"{s}.>", durable="D")
    sub2 = await js.pull_subscribe_bind("D", stream=s.upper())
    first = asyncio.ensure_future(sub1.fetch(10, timeout=2))
    second = asyncio.ensure_future(sub2.fetch(10, timeout=2))
    await asyncio.sleep(0.2)
    await publish(js, f"{s}.a", 20)
    got = (await first) + (await second)
    seqs = sorted(m.metadata.sequence.stream for m in got)
    assert len(seqs) == len(set(seqs))
    assert set(seqs) <= set(range(1, 21))


async def test_max_waiting_and_statuses(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await js.add_consumer(s.upper(), cfg(durable_name="D", max_waiting=1))
    inbox = nc.new_inbox()
    statuses: list[tuple[str, str]] = []

    async def on(msg: Msg) -> None:
        assert msg.headers is not None
        statuses.append((msg.headers.get("Status", ""), msg.headers.get("Description", "")))

    await nc.subscribe(inbox, cb=on)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{s.upper()}.D"
    await nc.publish(subject, b'{"batch": 1, "expires": 300000000}', reply=inbox)
    await nc.publish(subject, b'{"batch": 1, "expires": 300000000}', reply=inbox)
    await nc.publish(subject, b'{"batch": 1, "no_wait": true}', reply=inbox)

    async def three() -> bool:
        return len(statuses) >= 3

    await eventually(three, f"three statuses, got {statuses}")  # the last: 408 after 300 ms
    assert ("409", "Exceeded MaxWaiting") in statuses
    assert ("404", "No Messages") in statuses
    assert ("408", "Request Timeout") in statuses
    info = await js.consumer_info(s.upper(), "D")
    assert info.num_waiting == 0


async def test_msg_next_to_missing_consumer_has_no_responders(
    js: JetStreamContext, nc: Client
) -> None:
    s = await stream(js)
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request(f"$JS.API.CONSUMER.MSG.NEXT.{s.upper()}.nope", b"", timeout=1)


# -- acks -----------------------------------------------------------------------------------------------


async def test_every_ack_kind(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 6)
    sub = await js.pull_subscribe(f"{s}.>", durable="D", config=cfg(ack_wait=0.5, max_deliver=5))
    msgs = await sub.fetch(6, timeout=1)
    assert len(msgs) == 6
    reply = await msgs[0].ack_sync()  # ack with a reply subject gets an empty reply
    assert reply.data == b""
    await msgs[1].ack()
    await msgs[2].nak()
    await msgs[3].nak(delay=0.3)
    await msgs[4].term()
    await msgs[5].in_progress()
    await nc.flush()
    info = await sub.consumer_info()
    assert info.num_ack_pending == 3  # 2 (queued), 3 (delayed), 5 (in progress)
    assert info.ack_floor.stream_seq == 2
    (again,) = await sub.fetch(1, timeout=1)
    assert again.metadata.sequence.stream == 3 and again.metadata.num_delivered == 2
    await again.ack()
    later = await sub.fetch(2, timeout=1)
    assert sorted(m.metadata.sequence.stream for m in later) in ([4], [4, 6])
    for m in later:
        await m.ack()
    await nc.flush()
    info = await sub.consumer_info()
    assert info.num_redelivered == 0  # acked redeliveries are forgotten
    assert info.num_ack_pending == 2 - len(later)  # 5 was terminated, 6 still in progress


async def test_ack_next(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 3)
    sub = await js.pull_subscribe(f"{s}.>", durable="D")
    (first,) = await sub.fetch(1, timeout=1)
    inbox = nc.new_inbox()
    got = await nc.subscribe(inbox)
    assert first.reply
    await nc.publish(first.reply, b'+NXT {"batch": 2}', reply=inbox)
    nxt = [await got.next_msg(1), await got.next_msg(1)]
    assert [m.data for m in nxt] == [b"m1", b"m2"]
    info = await sub.consumer_info()
    assert info.ack_floor.stream_seq == 1 and info.num_ack_pending == 2


async def test_ack_wait_redelivery_and_max_deliver_advisory(
    js: JetStreamContext, nc: Client
) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 1)
    advisories = await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{s.upper()}.D")
    sub = await js.pull_subscribe(f"{s}.>", durable="D", config=cfg(ack_wait=0.3, max_deliver=2))
    (m1,) = await sub.fetch(1, timeout=1)
    assert m1.metadata.num_delivered == 1
    (m2,) = await sub.fetch(1, timeout=2)
    assert m2.metadata.num_delivered == 2
    # As on nats-server, it dies when its next turn comes: here, at the next fetch.
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=0.6)
    event = json.loads((await advisories.next_msg(2)).data)
    assert event["type"] == "io.nats.jetstream.advisory.v1.max_deliver"
    assert (event["stream_seq"], event["deliveries"]) == (1, 2)


async def test_ack_policies(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 4)
    sub_all = await js.pull_subscribe(f"{s}.>", durable="ALL", config=cfg(ack_policy="all"))
    msgs = await sub_all.fetch(4, timeout=1)
    await msgs[2].ack_sync()
    info = await sub_all.consumer_info()
    assert info.ack_floor.stream_seq == 3 and info.num_ack_pending == 1
    sub_none = await js.pull_subscribe(f"{s}.>", durable="NONE", config=cfg(ack_policy="none"))
    await sub_none.fetch(2, timeout=1)
    info = await sub_none.consumer_info()
    assert info.num_ack_pending == 0 and info.ack_floor.stream_seq == 2


# -- push and ordered ---------------------------------------------------------------------------------


async def test_push_durable_with_callback(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await publish(js, f"{s}.a", 5)
    got: list[bytes] = []
    done = asyncio.Event()

    async def cb(msg: Msg) -> None:
        got.append(msg.data)
        if len(got) == 5:
            done.set()

    sub = await js.subscribe(f"{s}.>", durable="P", cb=cb)
    await asyncio.wait_for(done.wait(), 2)
    await nc.flush()
    await asyncio.sleep(0.05)
    info = await sub.consumer_info()
    assert info.push_bound and info.num_ack_pending == 0  # auto-acked by nats-py
    with pytest.raises(JsError):
        await js.subscribe(f"{s}.>", durable="P")  # already bound


async def test_push_queue_group(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    seen: list[int] = []

    async def cb(msg: Msg) -> None:
        seen.append(msg.metadata.sequence.stream)

    await js.subscribe(f"{s}.>", queue="workers", cb=cb)
    await js.subscribe(f"{s}.>", queue="workers", cb=cb)
    await publish(js, f"{s}.a", 10)
    for _ in range(50):
        if len(seen) >= 10:
            break
        await asyncio.sleep(0.05)
    assert sorted(seen) == list(range(1, 11))


async def test_ordered_consumer_with_flow_control(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    big = b"x" * 300_000
    for _ in range(12):  # 3.6 MB: past the 2 MiB first flow-control window
        await js.publish(f"{s}.a", big)
    got: list[int] = []
    done = asyncio.Event()

    async def cb(msg: Msg) -> None:
        got.append(msg.metadata.sequence.stream)
        if len(got) == 12:
            done.set()

    sub = await js.subscribe(f"{s}.>", cb=cb, ordered_consumer=True, idle_heartbeat=0.5)
    await asyncio.wait_for(done.wait(), 10)
    assert got == list(range(1, 13))
    await sub.unsubscribe()


async def test_push_idle_heartbeats(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await js.add_consumer(
        s.upper(), cfg(deliver_subject=inbox, idle_heartbeat=0.1, ack_policy="none")
    )
    hb = await sub.next_msg(1)
    assert hb.headers is not None and hb.headers.get("Status") == "100"
    assert hb.headers.get("Nats-Last-Consumer") == "0"


# -- the consumer API -----------------------------------------------------------------------------------


async def test_consumer_api(js: JetStreamContext) -> None:
    s = await stream(js)
    info = await js.add_consumer(s.upper(), cfg(durable_name="A", ack_policy="explicit"))
    assert info.config.ack_wait == 30 and info.config.max_ack_pending == 1000
    assert info.config.max_waiting == 512 and info.config.max_deliver == -1
    again = await js.add_consumer(s.upper(), cfg(durable_name="A", ack_policy="explicit"))
    assert again.created == info.created
    with pytest.raises(nats.js.errors.ServerError):
        await js.add_consumer(s.upper(), cfg(durable_name="A", ack_policy="all"))
    await js.add_consumer(s.upper(), cfg(name="B", ack_policy="explicit"))
    names = sorted(c.name for c in await js.consumers_info(s.upper()))
    assert names == ["A", "B"]
    assert await js.delete_consumer(s.upper(), "A")
    with pytest.raises(NotFoundError):
        await js.consumer_info(s.upper(), "A")
    sinfo = await js.stream_info(s.upper())
    assert sinfo.state.consumer_count == 1


async def test_ephemeral_is_deleted_when_inactive(js: JetStreamContext) -> None:
    s = await stream(js)
    info = await js.add_consumer(s.upper(), cfg(inactive_threshold=0.3, ack_policy="explicit"))
    assert info.config.inactive_threshold == pytest.approx(0.3)

    async def gone() -> bool:
        try:
            await js.consumer_info(s.upper(), info.name)  # an info is no activity
        except NotFoundError:
            return True
        return False

    await eventually(gone, "the inactive ephemeral deleted")


async def test_workqueue_removes_acked(js: JetStreamContext) -> None:
    s = await stream(js, retention="workqueue")
    await publish(js, f"{s}.a", 3)
    sub = await js.pull_subscribe(f"{s}.>", durable="W")
    msgs = await sub.fetch(3, timeout=1)
    await msgs[0].ack_sync()
    await msgs[1].term()  # no reply: removed a moment later

    async def one_left() -> bool:
        return await stored(js, s) == 1

    await eventually(one_left, "the acked and the terminated message removed")
    with pytest.raises(nats.js.errors.BadRequestError):
        await js.add_consumer(s.upper(), cfg(durable_name="W2", ack_policy="explicit"))


async def test_interest_removes_when_all_acked(js: JetStreamContext) -> None:
    s = await stream(js, retention="interest")
    a = await js.pull_subscribe(f"{s}.>", durable="A")
    b = await js.pull_subscribe(f"{s}.>", durable="B")
    await publish(js, f"{s}.a", 2)
    for m in await a.fetch(2, timeout=1):
        await m.ack_sync()
    await asyncio.sleep(0.05)  # room for a wrong removal
    assert await stored(js, s) == 2
    (m,) = await b.fetch(1, timeout=1)
    await m.ack_sync()

    async def one_left() -> bool:
        return await stored(js, s) == 1

    await eventually(one_left, "the message both consumers acked removed")


# -- restarts -----------------------------------------------------------------------------------------------


async def test_nothing_acked_is_redelivered_after_restart() -> None:
    with run_server() as srv:
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        await js.add_stream(name="R", subjects=["r.>"])
        await publish(js, "r.a", 10)
        sub = await js.pull_subscribe("r.>", durable="D", config=cfg(ack_wait=0.5))
        msgs = await sub.fetch(6, timeout=1)
        for m in msgs[:4]:
            await m.ack_sync()
        await nc.close()

        srv.restart()  # clean stop: every state is saved
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind("D", stream="R")
        info = await sub.consumer_info()
        assert info.ack_floor.stream_seq == 4 and info.num_ack_pending == 2
        await asyncio.sleep(0.5)
        got = await sub.fetch(10, timeout=1)
        # Bodies come from disk now (cold cache): still in order, then the end of batch.
        assert [m.metadata.sequence.stream for m in got] == [5, 6, 7, 8, 9, 10]
        for m in got[:3]:
            await m.ack_sync()  # answered once the consumer's state is saved
        await nc.close()

        srv.kill()  # crash: what was saved survives
        srv.start()
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind("D", stream="R")
        await asyncio.sleep(0.6)
        got = await sub.fetch(10, timeout=1)
        acked = {m.metadata.sequence.stream for m in got}
        assert len(acked) == 3 and acked.isdisjoint({1, 2, 3, 4})
        await nc.close()


# -- Tether extensions and less common options ------------------------------------------------------


async def test_priority_order(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    for i, priority in enumerate([1, 5, 3, 5, 0]):
        headers = {"Tether-Priority": str(priority)}
        await js.publish(f"{s}.a", b"m%d" % i, headers=headers)
    body = {
        "stream_name": s.upper(),
        "config": {"durable_name": "P", "ack_policy": "explicit", "priority_order": True},
    }
    reply = json.loads(
        (await nc.request(f"$JS.API.CONSUMER.CREATE.{s.upper()}.P", json.dumps(body).encode())).data
    )
    assert reply["config"]["priority_order"] is True
    sub = await js.pull_subscribe_bind("P", stream=s.upper())
    got = await sub.fetch(5, timeout=1)
    # Highest priority first, oldest first among equal priorities.
    assert [m.data for m in got] == [b"m1", b"m3", b"m2", b"m0", b"m4"]
    plain = await js.pull_subscribe(f"{s}.>", durable="PLAIN")
    assert [m.data for m in await plain.fetch(2, timeout=1)] == [b"m0", b"m1"]


async def test_headers_only(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await js.publish(f"{s}.a", b"payload", headers={"K": "v"})
    sub = await js.pull_subscribe(f"{s}.>", durable="H", config=cfg(headers_only=True))
    (msg,) = await sub.fetch(1, timeout=1)
    assert msg.data == b""
    assert msg.headers is not None
    assert msg.headers.get("K") == "v" and msg.headers.get("Nats-Msg-Size") == "7"


async def test_interest_stream_without_consumers_keeps_nothing(js: JetStreamContext) -> None:
    s = await stream(js, retention="interest")
    await publish(js, f"{s}.a", 3)

    async def empty() -> bool:
        return await stored(js, s) == 0

    await eventually(empty, "nothing kept")


async def test_stream_delete_ends_waiting_pulls(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await js.add_consumer(s.upper(), cfg(durable_name="D", ack_policy="explicit"))
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{s.upper()}.D"
    await nc.publish(subject, b'{"batch": 1, "expires": 5000000000}', reply=inbox)
    await nc.flush()
    await js.delete_stream(s.upper())
    status = await sub.next_msg(1)
    assert status.headers is not None
    assert (status.headers.get("Status"), status.headers.get("Description")) == (
        "409",
        "Consumer Deleted",
    )


async def test_requests_go_when_their_inbox_goes(js: JetStreamContext, nc: Client) -> None:
    s = await stream(js)
    await js.add_consumer(s.upper(), cfg(durable_name="D", ack_policy="explicit"))
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{s.upper()}.D"
    await nc.publish(subject, b'{"batch": 5, "expires": 10000000000}', reply=inbox)
    await nc.flush()
    assert (await js.consumer_info(s.upper(), "D")).num_waiting == 1
    await sub.unsubscribe()
    await nc.flush()
    assert (await js.consumer_info(s.upper(), "D")).num_waiting == 0
    await publish(js, f"{s}.a", 1)  # nobody is waiting: it stays pending
    info = await js.consumer_info(s.upper(), "D")
    assert (info.num_pending, info.num_ack_pending) == (1, 0)
