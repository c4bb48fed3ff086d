"""JetStream management and publishing with the SDK, against nats-server and Tether."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from tether.client import (
    ApiError,
    ConsumerConfig,
    ConsumerNotFound,
    JetStream,
    NoStreamResponse,
    PublishStalled,
    StorageType,
    StreamConfig,
    StreamNotFound,
    WrongLastMsgId,
    WrongLastSequence,
    connect,
)
from tether.client.testing import PeerServer

_names = itertools.count(1)


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def server(request: pytest.FixtureRequest) -> Iterator[PeerServer]:
    with PeerServer(request.param) as srv:
        yield srv


@pytest.fixture
async def js(server: PeerServer) -> AsyncIterator[JetStream]:
    nc = await connect(server.url)
    yield nc.jetstream(timeout=5)
    await nc.close()


def fresh() -> str:
    return f"S{next(_names)}"


async def test_stream_lifecycle(js: JetStream) -> None:
    name = fresh()
    info = await js.add_stream(
        name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.MEMORY
    )
    assert info.config.name == name and info.state.messages == 0
    again = await js.add_stream(
        StreamConfig(name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.MEMORY)
    )
    assert again.config.subjects == [f"{name.lower()}.>"]  # identical re-create succeeds
    updated = await js.update_stream(
        name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.MEMORY, max_msgs=10
    )
    assert updated.config.max_msgs == 10
    for i in range(3):
        await js.publish(f"{name.lower()}.x", b"%d" % i)
    assert (await js.stream_info(name)).state.last_seq == 3
    assert name in await js.stream_names()
    assert name in {s.config.name for s in await js.streams()}
    assert await js.purge_stream(name) == 3
    assert (await js.stream_info(name)).state.messages == 0
    assert await js.delete_stream(name)
    with pytest.raises(StreamNotFound) as err:
        await js.stream_info(name)
    assert err.value.code == 404 and err.value.err_code == 10059


async def test_consumer_lifecycle(js: JetStream) -> None:
    name = fresh()
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    info = await js.add_consumer(
        name, ConsumerConfig(durable_name="C", ack_wait=2.5, max_deliver=4)
    )
    assert info.name == "C" and info.config.ack_wait == 2.5 and info.config.max_deliver == 4
    assert (await js.consumer_info(name, "C")).num_pending == 0
    assert [c.name for c in await js.consumers(name)] == ["C"]
    assert await js.delete_consumer(name, "C")
    with pytest.raises(ConsumerNotFound):
        await js.consumer_info(name, "C")
    await js.delete_stream(name)


async def test_publish_acks_dedup_and_expectations(js: JetStream) -> None:
    name = fresh()
    subject = f"{name.lower()}.a"
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    first = await js.publish(subject, b"one", msg_id="m-1")
    assert (first.stream, first.seq, first.duplicate) == (name, 1, False)
    dup = await js.publish(subject, b"one", msg_id="m-1")
    assert (dup.seq, dup.duplicate) == (1, True)
    assert (await js.publish(subject, b"two", expected_last_seq=1)).seq == 2
    with pytest.raises(WrongLastSequence):
        await js.publish(subject, b"x", expected_last_seq=1)
    with pytest.raises(WrongLastMsgId):
        await js.publish(subject, b"x", expected_last_msg_id="nope")
    assert (await js.publish(subject, b"3", expected_last_subject_seq=2)).seq == 3
    with pytest.raises(ApiError) as err:
        await js.publish(subject, b"x", expected_stream="OTHER")
    assert err.value.err_code == 10060
    with pytest.raises(NoStreamResponse):
        await js.publish("nothing.captures.this", b"x")
    await js.delete_stream(name)


async def test_publish_async_bounds_unacknowledged_publishes(
    js: JetStream, server: PeerServer
) -> None:
    name = fresh()
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    limited = js.conn.jetstream(max_pending_acks=16)
    most = 0
    acks = []
    for i in range(500):
        acks.append(await limited.publish_async(f"{name.lower()}.x", b"%d" % i))
        most = max(most, limited.publish_async_pending)
    await limited.publish_async_completed(timeout=10)
    assert most <= 16 and limited.publish_async_pending == 0
    assert [(await a).seq for a in acks] == list(range(1, 501))
    assert (await js.stream_info(name)).state.messages == 500

    strict = js.conn.jetstream(max_pending_acks=4, backpressure=False)
    for i in range(4):
        await strict.publish_async(f"{name.lower()}.y", b"%d" % i)
    with pytest.raises(PublishStalled):
        await strict.publish_async(f"{name.lower()}.y", b"too many")
    await strict.publish_async_completed(timeout=5)

    failing = await limited.publish_async(f"{name.lower()}.z", b"x", expected_last_seq=1)
    with pytest.raises(WrongLastSequence):
        await failing
    await asyncio.sleep(0)
    assert limited.publish_async_failures == 1
    await js.delete_stream(name)
