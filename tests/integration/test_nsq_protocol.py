"""The NSQ front door byte by byte: nsqd's frames and errors, fatal or not, its limits,
and messages crossing between NSQ and NATS."""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
from collections.abc import Iterator

import nats
import pytest

from tether.protocol.nsq import FrameReader, commands
from tether.protocol.nsq.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, Frame
from tether.testing import RunningServer, run_server

_topics = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    args = ["--nsq-port", "-1"]
    with run_server(args=args) as srv:
        yield srv


def topic() -> str:
    return f"raw.t{next(_topics)}"


class Client:
    """A raw NSQ client: bytes out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader()
        self.pending: list[Frame] = []

    @classmethod
    async def connect(cls, server: RunningServer, magic: bool = True) -> Client:
        reader, writer = await asyncio.open_connection(server.host, server.nsq_port)
        client = cls(reader, writer)
        if magic:
            await client.send(commands.MAGIC_V2)
        return client

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def next(self, within: float = 5.0, skip_heartbeats: bool = True) -> Frame:
        while True:
            while not self.pending:
                data = await asyncio.wait_for(self.reader.read(65536), within)
                assert data, "connection closed"
                self.pending += self.frames.feed(data)
            frame = self.pending.pop(0)
            if skip_heartbeats and frame == Frame(FRAME_RESPONSE, b"_heartbeat_"):
                continue
            return frame

    async def closed(self, within: float = 5.0) -> bool:
        """Whether the server closes the connection (after what it had to say)."""
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), within)
            if not data:
                self.writer.close()
                return True
            self.pending += self.frames.feed(data)

    async def subscribe(self, name: str, channel: str, rdy: int = 0) -> None:
        await self.send(commands.sub(name, channel))
        assert await self.next() == Frame(FRAME_RESPONSE, b"OK")
        if rdy:
            await self.send(commands.rdy(rdy))

    def close(self) -> None:
        self.writer.close()


def ok() -> Frame:
    return Frame(FRAME_RESPONSE, b"OK")


def err(text: bytes) -> Frame:
    return Frame(FRAME_ERROR, text)


async def test_identify_negotiation(server: RunningServer) -> None:
    c = await Client.connect(server)
    await c.send(commands.identify({"feature_negotiation": True, "msg_timeout": 5000}))
    frame = await c.next()
    assert frame.frame_type == FRAME_RESPONSE
    answer = json.loads(frame.data)
    assert list(answer) == [
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
        "topology_region",
        "topology_zone",
    ]
    assert answer["max_rdy_count"] == 2500
    assert answer["msg_timeout"] == 5000
    assert answer["tls_v1"] is False and answer["auth_required"] is False
    await c.send(commands.nop())
    c.close()


async def test_identify_without_negotiation_is_ok(server: RunningServer) -> None:
    c = await Client.connect(server)
    await c.send(commands.identify({"client_id": "x", "short_id": "ignored"}))
    assert await c.next() == ok()
    c.close()


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"{", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (
            b'{"heartbeat_interval": 999}',
            b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
        ),
        (b'{"msg_timeout": 900001}', b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
        (b'{"sample_rate": 100}', b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        (b'{"output_buffer_size": 10}', b"E_BAD_BODY IDENTIFY output buffer size (10) is invalid"),
        (
            b'{"feature_negotiation": true, "deflate": true, "snappy": true}',
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
        ),
    ],
)
async def test_identify_errors_are_fatal(server: RunningServer, body: bytes, text: bytes) -> None:
    c = await Client.connect(server)
    await c.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    assert await c.next() == err(text)
    assert await c.closed()


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"HELLO\n", b"E_INVALID invalid command HELLO"),
        (b"RDY 1\n", b"E_INVALID cannot RDY in current state"),
        (b"FIN 0000000000000001\n", b"E_INVALID cannot FIN in current state"),
        (b"REQ 0000000000000001 0\n", b"E_INVALID cannot REQ in current state"),
        (b"TOUCH 0000000000000001\n", b"E_INVALID cannot TOUCH in current state"),
        (b"CLS\n", b"E_INVALID cannot CLS in current state"),
        (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
        (b"SUB t/x c\n", b'E_BAD_TOPIC SUB topic name "t/x" is not valid'),
        (b"SUB t c c\n", b"OK"),
        (b"SUB t #ephemeral\n", b'E_BAD_CHANNEL SUB channel name "#ephemeral" is not valid'),
        (b"PUB bad!topic\n", b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
        (b"PUB t\n\x00\x00\x00\x00", b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (b"PUB t\n\x00\x10\x00\x01", b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
        (b"MPUB t\n\x00\x50\x00\x01", b"E_BAD_BODY MPUB body too big 5242881 > 5242880"),
        (b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        (b"AUTH\n\x00\x00\x00\x01x", b"E_AUTH_DISABLED AUTH disabled"),
    ],
)
async def test_errors_of_a_fresh_connection(
    server: RunningServer, data: bytes, text: bytes
) -> None:
    c = await Client.connect(server)
    await c.send(data)
    frame = await c.next()
    if text == b"OK":  # nsqd ignores parameters past the ones it reads
        assert frame == ok()
        c.close()
        return
    assert frame == err(text)
    assert await c.closed()


async def test_a_bad_magic_gets_e_bad_protocol(server: RunningServer) -> None:
    c = await Client.connect(server, magic=False)
    await c.send(b"  V1")
    assert await c.next() == err(b"E_BAD_PROTOCOL")
    assert await c.closed()


async def test_subscribed_state_errors(server: RunningServer) -> None:
    name = topic()
    c = await Client.connect(server)
    await c.subscribe(name, "ch")
    # Non-fatal: FIN, REQ and TOUCH of an id that is not in flight.
    await c.send(commands.fin(b"00000000000000aa"))
    assert await c.next() == err(b"E_FIN_FAILED FIN 00000000000000aa failed ID not in flight")
    await c.send(commands.req(b"00000000000000aa", 0))
    assert await c.next() == err(b"E_REQ_FAILED REQ 00000000000000aa failed ID not in flight")
    await c.send(commands.touch(b"zzzzzzzzzzzzzzzz"))
    assert await c.next() == err(b"E_TOUCH_FAILED TOUCH zzzzzzzzzzzzzzzz failed ID not in flight")
    # Still open: a PUB works.
    await c.send(commands.pub(name, b"x"))
    assert await c.next() == ok()
    # Fatal: a second SUB, a malformed id, RDY out of range.
    await c.send(b"FIN 123\n")
    assert await c.next() == err(b"E_INVALID invalid message ID")
    assert await c.closed()
    c = await Client.connect(server)
    await c.subscribe(name, "ch2")
    await c.send(commands.rdy(2501))
    assert await c.next() == err(b"E_INVALID RDY count 2501 out of range 0-2500")
    assert await c.closed()
    c = await Client.connect(server)
    await c.subscribe(name, "ch3")
    await c.send(b"RDY -1\n")
    assert await c.next() == err(b"E_INVALID RDY could not parse count -1")
    assert await c.closed()
    c = await Client.connect(server)
    await c.subscribe(name, "ch4")
    await c.send(commands.sub(name, "ch4"))
    assert await c.next() == err(b"E_INVALID cannot SUB in current state")
    assert await c.closed()


async def test_rdy_caps_what_is_in_flight(server: RunningServer) -> None:
    name = topic()
    pub = await Client.connect(server)
    await pub.send(commands.mpub(name, [b"%d" % i for i in range(10)]))
    assert await pub.next() == ok()
    c = await Client.connect(server)
    await c.subscribe(name, "capped", rdy=3)
    got = [await c.next() for _ in range(3)]
    assert all(f.frame_type == FRAME_MESSAGE for f in got)
    with pytest.raises(TimeoutError):
        await c.next(within=0.4)  # three in flight: nothing more
    await c.send(commands.fin(got[0].message().id))
    fourth = await c.next()
    assert fourth.message().body == b"3"
    messages = [f.message() for f in got]
    assert [m.body for m in messages] == [b"0", b"1", b"2"]
    assert [m.attempts for m in messages] == [1, 1, 1]
    # The id is the stream sequence, 16 hex digits; the timestamp is in nanoseconds.
    assert messages[0].id == b"%016x" % int(messages[0].id, 16)
    assert messages[0].timestamp > 1_600_000_000 * 10**9
    # REQ: the message comes again, with attempts 2; FIN of the old delivery then fails.
    await c.send(commands.req(messages[1].id, 0))
    again = (await c.next()).message()
    assert (again.id, again.body, again.attempts) == (messages[1].id, b"1", 2)
    # CLS: CLOSE_WAIT, then nothing more is sent, but FIN still works.
    await c.send(commands.cls())
    assert await c.next() == Frame(FRAME_RESPONSE, b"CLOSE_WAIT")
    await c.send(commands.fin(again.id) + commands.fin(messages[2].id) + commands.nop())
    with pytest.raises(TimeoutError):
        await c.next(within=0.4)
    c.close()
    pub.close()


async def test_pub_answers_in_order_after_the_commit(server: RunningServer) -> None:
    name = topic()
    c = await Client.connect(server)
    data = b"".join(commands.pub(name, b"%d" % i) for i in range(100))
    data += commands.mpub(name, [b"a", b"b"]) + commands.dpub(name, 0, b"now")
    await c.send(data)
    frames = [await c.next() for _ in range(102)]
    assert frames == [ok()] * 102
    c.close()


async def test_heartbeats_and_the_read_deadline(server: RunningServer) -> None:
    c = await Client.connect(server)
    await c.send(commands.identify({"heartbeat_interval": 1000}))
    assert await c.next() == ok()
    beat = await c.next(skip_heartbeats=False, within=3)
    assert beat == Frame(FRAME_RESPONSE, b"_heartbeat_")
    # Nothing sent for twice the interval: the server hangs up.
    assert await c.closed(within=4)


async def test_sub_needs_heartbeats(server: RunningServer) -> None:
    c = await Client.connect(server)
    await c.send(commands.identify({"heartbeat_interval": -1}))
    assert await c.next() == ok()
    await c.send(commands.sub(topic(), "c"))
    assert await c.next() == err(b"E_INVALID cannot SUB with heartbeats disabled")
    assert await c.closed()


async def test_a_slow_consumer_is_cut_off() -> None:
    with run_server(store="memory", args=["--max-pending", "200000"]) as srv:
        name = topic()
        pub = await Client.connect(srv)
        body = b"x" * 50_000
        await pub.send(commands.mpub(name, [body] * 60))
        assert await pub.next() == ok()
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        writer.write(commands.MAGIC_V2 + commands.sub(name, "c") + commands.rdy(2500))
        await writer.drain()
        await asyncio.sleep(1.0)  # never read: the server's buffer fills
        total = 0
        while True:
            data = await asyncio.wait_for(reader.read(1 << 20), 5)
            if not data:
                break
            total += len(data)
        assert total < 60 * len(body)  # cut off before everything went out
        writer.close()
        pub.close()


async def test_nats_publish_reaches_an_nsq_channel(server: RunningServer) -> None:
    name = topic()
    c = await Client.connect(server)
    await c.subscribe(name, "from-nats", rdy=10)  # creates the topic (its stream)
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        ack = await js.publish("nsq." + name.replace(".", "~"), b"hello from nats")
        assert ack.stream == "NSQ_" + name.replace(".", "~")
        msg = (await c.next()).message()
        assert msg.body == b"hello from nats"
        assert msg.id == b"%016x" % ack.seq
        await c.send(commands.fin(msg.id))
    finally:
        await nc.close()
        c.close()


async def test_nsq_publish_reaches_a_nats_consumer(server: RunningServer) -> None:
    name = topic()
    c = await Client.connect(server)
    await c.send(commands.pub(name, b"hello from nsq"))
    assert await c.next() == ok()
    stream = "NSQ_" + name.replace(".", "~")
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe("nsq." + name.replace(".", "~"), "natsreader", stream=stream)
        msgs = await sub.fetch(1, timeout=5)
        assert msgs[0].data == b"hello from nsq"
        assert msgs[0].subject == "nsq." + name.replace(".", "~")
        await msgs[0].ack()
    finally:
        await nc.close()
        c.close()


async def test_ephemeral_channel_vanishes_with_its_last_client(server: RunningServer) -> None:
    name = topic()
    c = await Client.connect(server)
    await c.subscribe(name, "tmp#ephemeral")
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        stream = "NSQ_" + name.replace(".", "~")
        names = [ci.name async for ci in _consumers(js, stream)]
        assert "tmp#ephemeral" in names
        c.close()
        for _ in range(100):
            names = [ci.name async for ci in _consumers(js, stream)]
            if "tmp#ephemeral" not in names:
                break
            await asyncio.sleep(0.05)
        assert "tmp#ephemeral" not in names
        assert "#backlog" in names  # the topic holds its messages again
    finally:
        await nc.close()


async def _consumers(js: nats.js.JetStreamContext, stream: str):  # type: ignore[no-untyped-def]
    for info in await js.consumers_info(stream):
        yield info


async def test_past_the_size_bound_pub_fails_with_e_pub_failed() -> None:
    """Topics are streams: past the server's bound for them (``max_file_store``, by
    default 3/4 of the free disk) a PUB is refused with nsqd's fatal E_PUB_FAILED and
    the reason, and the connection closed, where nsqd itself would take it."""
    args = ["--nsq-port", "-1", "--max-file-store", "250"]
    with run_server(store="memory", args=args) as srv:
        c = await Client.connect(srv)
        name = topic()
        # Each message counts 100 + its subject + 30 bytes: the second crosses 250.
        for _ in range(2):
            await c.send(commands.pub(name, b"x" * 100))
            assert await c.next() == ok()
        await c.send(commands.pub(name, b"x"))
        assert await c.next() == err(b"E_PUB_FAILED PUB failed insufficient resources")
        assert await c.closed()
        # Reading what is stored still works.
        c = await Client.connect(srv)
        await c.subscribe(name, "ch", rdy=5)
        frames = [await c.next() for _ in range(2)]
        assert all(frame.frame_type == FRAME_MESSAGE for frame in frames)
        c.close()
