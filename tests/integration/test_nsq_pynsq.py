"""pynsq, NSQ's official Python client, against ``tether serve``: its Writer and Reader
as applications use them (they run on tornado, which runs on this test's event loop)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import nsq
import pytest

from tether.testing import RunningServer, run_server

_topics = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


def address(server: RunningServer) -> str:
    return f"{server.host}:{server.nsq_port}"


def topic() -> str:
    return f"pynsq.t{next(_topics)}"


async def wait_until(condition: Callable[[], bool], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def writer_for(server: RunningServer) -> nsq.Writer:
    writer = nsq.Writer([address(server)])
    await wait_until(lambda: bool(writer.conns))
    return writer


async def publish(writer: nsq.Writer, name: str, bodies: list[bytes]) -> None:
    """PUB each body and wait for every OK."""
    answers: list[Any] = []
    for body in bodies:
        writer.pub(name, body, callback=lambda conn, data: answers.append(data))
    await wait_until(lambda: len(answers) == len(bodies))
    assert answers == [b"OK"] * len(bodies)


def close(writer: nsq.Writer) -> None:
    for conn in list(writer.conns.values()):
        conn.close()


def reader(server: RunningServer, name: str, channel: str, **options: Any) -> nsq.Reader:
    options.setdefault("max_in_flight", 10)
    return nsq.Reader(
        topic=name,
        channel=channel,
        nsqd_tcp_addresses=[address(server)],
        lookupd_poll_interval=60,
        **options,
    )


async def test_writer_and_reader(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    await publish(writer, name, [b"m%d" % i for i in range(20)])
    got: list[bytes] = []

    def handler(msg: nsq.Message) -> bool:
        got.append(msg.body)
        return True

    r = reader(server, name, "archive", message_handler=handler)
    try:
        await wait_until(lambda: len(got) == 20)
        assert sorted(got) == sorted(b"m%d" % i for i in range(20))
        # MPUB too, after the reader is there.
        answers: list[Any] = []
        writer.mpub(name, [b"x", b"y", b"z"], callback=lambda c, d: answers.append(d))
        await wait_until(lambda: len(got) == 23)
        assert answers == [b"OK"]
    finally:
        r.close()
        close(writer)


async def test_readers_share_a_channel(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    seen: dict[int, list[bytes]] = {0: [], 1: [], 2: []}

    def handler_for(i: int) -> Callable[[nsq.Message], bool]:
        def handler(msg: nsq.Message) -> bool:
            seen[i].append(msg.body)
            return True

        return handler

    readers = [reader(server, name, "work", message_handler=handler_for(i)) for i in range(3)]
    try:
        await wait_until(lambda: all(r.conns for r in readers))
        await asyncio.sleep(0.2)  # every reader subscribed and at RDY 1
        await publish(writer, name, [b"%d" % i for i in range(90)])
        await wait_until(lambda: sum(map(len, seen.values())) == 90)
        everything = sorted(b for got in seen.values() for b in got)
        assert everything == sorted(b"%d" % i for i in range(90))  # each exactly once
        assert all(seen.values()), {i: len(v) for i, v in seen.items()}
    finally:
        for r in readers:
            r.close()
        close(writer)


async def test_every_channel_gets_every_message(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    readers = [
        reader(server, name, ch, message_handler=lambda m, ch=ch: got[ch].append(m.body) or True)
        for ch in got
    ]
    try:
        await wait_until(lambda: all(r.conns for r in readers))
        await asyncio.sleep(0.2)
        await publish(writer, name, [b"%d" % i for i in range(25)])
        await wait_until(lambda: len(got["a"]) == 25 and len(got["b"]) == 25)
        assert sorted(got["a"]) == sorted(got["b"]) == sorted(b"%d" % i for i in range(25))
    finally:
        for r in readers:
            r.close()
        close(writer)


async def test_max_in_flight_is_honoured(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    await publish(writer, name, [b"%d" % i for i in range(20)])
    held: list[nsq.Message] = []
    most = 0

    def handler(msg: nsq.Message) -> None:
        nonlocal most
        msg.enable_async()
        held.append(msg)
        most = max(most, sum(1 for m in held if not m.has_responded()))

    r = reader(server, name, "slow", message_handler=handler, max_in_flight=5)
    try:
        await wait_until(lambda: len(held) == 5)
        await asyncio.sleep(0.5)
        assert len(held) == 5  # nothing more while 5 are unfinished
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(held) < 20 or not all(m.has_responded() for m in held):
            assert loop.time() < deadline
            for msg in held:
                if not msg.has_responded():
                    msg.finish()
            await asyncio.sleep(0.05)
        assert most == 5
        assert sorted(m.body for m in held) == sorted(b"%d" % i for i in range(20))
    finally:
        r.close()
        close(writer)


async def test_requeue_with_backoff_redelivers(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    attempts: list[tuple[bytes, int]] = []

    def handler(msg: nsq.Message) -> None:
        attempts.append((msg.body, msg.attempts))
        if msg.attempts == 1:
            msg.requeue(backoff=True, delay=0)
        else:
            msg.finish()

    r = reader(server, name, "retry", message_handler=handler, max_backoff_duration=1)
    try:
        await publish(writer, name, [b"once"])
        await wait_until(lambda: len(attempts) == 2)
        assert attempts == [(b"once", 1), (b"once", 2)]
        await asyncio.sleep(0.3)
        assert len(attempts) == 2  # finished: not delivered again
    finally:
        r.close()
        close(writer)


async def test_touch_keeps_a_long_handler_s_message(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    deliveries: list[int] = []

    async def handler(msg: nsq.Message) -> None:
        deliveries.append(msg.attempts)
        msg.enable_async()
        for _ in range(8):  # 2.4 s, with a msg_timeout of 1 s
            await asyncio.sleep(0.3)
            msg.touch()
        msg.finish()

    r = reader(server, name, "long", message_handler=handler, msg_timeout=1)
    try:
        await publish(writer, name, [b"slow work"])
        await wait_until(lambda: bool(deliveries))
        await asyncio.sleep(3.0)
        assert deliveries == [1]  # never timed out, never redelivered
    finally:
        r.close()
        close(writer)


async def test_an_untouched_message_times_out_and_comes_again(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    deliveries: list[int] = []

    def handler(msg: nsq.Message) -> None:
        deliveries.append(msg.attempts)
        msg.enable_async()
        if msg.attempts > 1:
            msg.finish()

    r = reader(server, name, "forgetful", message_handler=handler, msg_timeout=1)
    try:
        await publish(writer, name, [b"lost"])
        await wait_until(lambda: len(deliveries) == 2, within=5)
        assert deliveries == [1, 2]
    finally:
        r.close()
        close(writer)


class GivingUpReader(nsq.Reader):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.given_up: list[tuple[bytes, int]] = []
        super().__init__(*args, **kwargs)

    def giving_up(self, message: nsq.Message) -> None:
        self.given_up.append((message.body, message.attempts))


async def test_max_tries_gives_up(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    attempts: list[int] = []

    def handler(msg: nsq.Message) -> None:
        attempts.append(msg.attempts)
        msg.requeue(backoff=False, delay=0)

    r = GivingUpReader(
        topic=name,
        channel="doomed",
        nsqd_tcp_addresses=[address(server)],
        message_handler=handler,
        max_tries=3,
        max_in_flight=1,
        lookupd_poll_interval=60,
    )
    try:
        await publish(writer, name, [b"poison"])
        await wait_until(lambda: bool(r.given_up))
        assert attempts == [1, 2, 3]
        assert r.given_up == [(b"poison", 4)]
        await asyncio.sleep(0.3)
        assert attempts == [1, 2, 3]  # given up means finished
    finally:
        r.close()
        close(writer)


async def test_deflate_is_negotiated(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    got: list[bytes] = []
    r = reader(
        server,
        name,
        "squeezed",
        message_handler=lambda m: got.append(m.body) or True,
        deflate=True,
    )
    try:
        await wait_until(lambda: bool(r.conns))
        await publish(writer, name, [b"z" * 1000, b"small"])
        await wait_until(lambda: len(got) == 2)
        assert sorted(got) == [b"small", b"z" * 1000]
        conn = next(iter(r.conns.values()))
        assert type(conn.encoder).__name__ == "DeflateEncoder"
    finally:
        r.close()
        close(writer)


async def test_deferred_publish_arrives_later(server: RunningServer) -> None:
    name = topic()
    writer = await writer_for(server)
    got: list[float] = []
    loop = asyncio.get_running_loop()
    r = reader(server, name, "later", message_handler=lambda m: got.append(loop.time()) or True)
    try:
        await wait_until(lambda: bool(r.conns))
        await asyncio.sleep(0.2)
        answers: list[Any] = []
        sent = loop.time()
        writer.dpub(name, 700, b"soon", callback=lambda c, d: answers.append(d))
        await wait_until(lambda: bool(got))
        assert answers == [b"OK"]
        assert got[0] - sent >= 0.6
    finally:
        r.close()
        close(writer)
