"""Runs of publishes with headers: the shortcut must do exactly what publishing each
message on its own does.

The parser hands the complete HPUBs of one read to one subject to the connection in
one call (``on_hpub_run``), the router hands them to a stream capture that takes such
runs, and the broker stores those whose headers hold nothing but a TTL and a msg id a
stretch at a time (``Broker.publish_headered``), leaving any other message to the
one-by-one path. Each is compared with the message-by-message path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from transport_support import connect as _connect

from tether.engine.broker import Broker
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.limits import ServerLimits
from tether.engine.streams.stream import Stream
from tether.protocol.nats.parser import Parser
from tether.server.config import ServerConfig
from tether.server.nats.server import NatsServer
from tether.storage.base import StorageError
from tether.storage.group_commit import Batch
from tether.storage.memory import MemoryStore

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'


# -- the broker ---------------------------------------------------------------------------------


class FlakyStore(MemoryStore):
    """A memory store whose commits fail while ``full`` is set (a full disk)."""

    full = False

    def _hand_off(self, batch: Batch) -> None:
        if self.full:
            self._group.settle(batch, StorageError("database or disk is full"))
        else:
            super()._hand_off(batch)


class RecordingSink:
    """A PubAckSink and broker listener writing down, in order, everything it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        for i, reply in enumerate(replies):
            if reply:
                self.events.append(("ack", first_seq + (0 if duplicate else i), reply, duplicate))

    def pub_failed(self, stream: str, replies: list[str], error: ApiError) -> None:
        for reply in replies:
            if reply:
                self.events.append(("failed", reply, error.to_dict()))

    def on_stream_changed(self, stream: Stream) -> None:
        pass

    def on_stream_deleted(self, stream: Stream) -> None:
        pass

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        self.events.append(("committed", tuple(seqs)))

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        self.events.append(("removed", tuple(seqs)))


def block(*fields: tuple[str, bytes]) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(b"%s: %s\r\n" % (k.encode(), v) for k, v in fields) + b"\r\n"


# Header blocks: repeated byte for byte (TTLs), each its own (msg ids, some repeated for
# duplicates), refused (a bad TTL, a msg id that is not UTF-8) and ones with headers of
# their own handling (expectations, rollup), which the run leaves to the general path.
BLOCKS = st.one_of(
    st.sampled_from(
        [
            b"",
            block(),
            block(("Nats-TTL", b"1h")),
            block(("Nats-TTL", b"2")),
            block(("Nats-TTL", b"never")),
            block(("Nats-TTL", b"bogus")),
            block(("X-App", b"1"), ("Nats-TTL", b"30s")),
            block(("X-App", b"2")),
            block(("Nats-Msg-Id", b"\xff\xfe")),
            block(("Nats-Expected-Last-Sequence", b"3")),
            block(("Nats-Rollup", b"sub")),
            block(("nats-ttl", b"1h")),
        ]
    ),
    st.integers(0, 6).map(lambda i: block(("Nats-Msg-Id", b"id-%d" % i))),
    st.integers(0, 6).map(lambda i: block(("Nats-Msg-Id", b"id-%d" % i), ("Nats-TTL", b"5s"))),
)
# Limits that refuse or evict (taken message by message) or none (stored a stretch at
# a time), with the settings the headers meet.
limits = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "max_msgs": st.integers(1, 6),
            "max_bytes": st.integers(80, 600),
            "max_msgs_per_subject": st.integers(1, 3),
            "max_msg_size": st.integers(0, 90),
            "discard": st.sampled_from(["old", "new"]),
            # the server's bound on the file streams (not a stream setting)
            "server_max_storage": st.integers(600, 2000),  # room for max_bytes
        },
    ),
)
features = st.fixed_dictionaries(
    {"allow_msg_ttl": st.booleans()},
    optional={
        "no_ack": st.booleans(),
        "allow_rollup_hdrs": st.booleans(),
        "subject_delete_marker_ttl": st.sampled_from([10**9, 60 * 10**9]),
        "duplicate_window": st.sampled_from([2 * 10**9, 10 * 10**9]),
    },
)
configs = st.builds(lambda a, b: {**a, **b}, limits, features)
# A tick: runs of (subject, [(header block, payload length, with a reply)]) and whether
# its commit fails; then seconds of the clock going by.
runs = st.tuples(
    st.sampled_from(["s.a", "s.b"]),
    st.lists(st.tuples(BLOCKS, st.integers(0, 30), st.booleans()), min_size=1, max_size=8),
)
ticks = st.lists(
    st.tuples(st.lists(runs, min_size=1, max_size=3), st.booleans(), st.sampled_from([0, 3])),
    min_size=1,
    max_size=4,
)


async def _publish(config: dict[str, Any], plan: list[Any], as_runs: bool) -> Any:
    store = FlakyStore()
    await store.open()
    clock = FakeClock()
    broker = Broker(store, clock)
    config = dict(config)
    bound = config.pop("server_max_storage", None)
    if bound is not None:
        broker.set_limits(ServerLimits(max_storage=bound))
    await broker.load()
    sink = RecordingSink()
    broker.listeners.append(sink)
    if config.get("subject_delete_marker_ttl"):
        config = {**config, "allow_msg_ttl": True, "allow_rollup_hdrs": True}
    cfg = json.dumps({"name": "S", "subjects": ["s.*"], **config}).encode()
    await broker.create_stream("S", cfg)
    stream = broker.get_stream("S")
    n = 0

    def one(subject: str, head: bytes, payload: bytes, reply: str) -> None:
        # What the front door does for each message.
        if not reply or stream.config.no_ack:
            broker.publish(stream, subject, head or None, payload, None)
        else:
            broker.publish_reply(stream, subject, head or None, payload, sink, reply)

    for tick_runs, fails, later in plan:
        store.full = fails
        for subject, msgs in tick_runs:
            heads, payloads, replies = [], [], []
            for head, size, with_reply in msgs:
                n += 1
                heads.append(head)
                payloads.append(b"%d" % n * size)
                replies.append(f"_INBOX.{n}" if with_reply else "")
            if not as_runs:
                for args in zip(heads, payloads, replies, strict=True):
                    one(subject, *args)
                continue
            target = None if stream.config.no_ack else sink
            i = 0
            while i < len(payloads):  # what the front door does with a run
                i = broker.publish_headered(stream, subject, heads, payloads, replies, target, i)
                if i < len(payloads):
                    one(subject, heads[i], payloads[i], replies[i])
                    i += 1
        with contextlib.suppress(StorageError):
            await store.flush()
        store.full = False
        if later:
            clock.advance(later)
            await asyncio.sleep(0)
            with contextlib.suppress(StorageError):
                await store.flush()
    stored = [
        (m.seq, m.subject, m.headers, m.data, m.ts) for m in await store.read_range("S", 1, 1000)
    ]
    state = {
        "metas": [stream.meta(seq) for seq in stream.seqs(0)],
        "info": stream.info_state(),
        "last_msg_id": stream.last_msg_id,
        "ttls": (sorted(stream.ttls.due(clock.now() + 10**13)), sorted(stream.ttls.forever)),
    }
    broker.close()
    await store.close()
    return sink.events, stored, state


@settings(max_examples=200, deadline=None)
@given(configs, ticks)
def test_a_headered_run_is_publishing_one_by_one(config: dict[str, Any], plan: list[Any]) -> None:
    assert asyncio.run(_publish(config, plan, True)) == asyncio.run(_publish(config, plan, False))


async def test_a_bad_ttl_in_a_run_refuses_that_message_only() -> None:
    good = block(("Nats-TTL", b"1h"))
    heads = [good, good, block(("Nats-TTL", b"soon")), good, block(("Nats-Msg-Id", b"a"))]
    plan = [([("s.a", [(h, 3, True) for h in heads])], False, 0)]
    events, stored, _ = await _publish({"allow_msg_ttl": True}, plan, True)
    failed = [e for e in events if e[0] == "failed"]
    assert [e[1] for e in failed] == ["_INBOX.3"]
    assert [e[1:3] for e in events if e[0] == "ack"] == [
        (1, "_INBOX.1"),
        (2, "_INBOX.2"),
        (3, "_INBOX.4"),
        (4, "_INBOX.5"),
    ]
    assert [m[0] for m in stored] == [1, 2, 3, 4]


# -- the parser and the connection ------------------------------------------------------------


class Recorder:
    """A parser handler that writes down each frame, and each run it is handed."""

    def __init__(self, runs: bool) -> None:
        self.frames: list[tuple[Any, ...]] = []
        self.runs = 0
        if runs:
            self.on_hpub_run = self._on_hpub_run

    def on_pub(self, subject: str, reply: str, payload: bytes) -> None:
        self.frames.append(("pub", subject, reply, payload))

    def on_hpub(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None:
        self.frames.append(("hpub", subject, reply, headers, payload))

    def _on_hpub_run(
        self, subject: str, replies: list[str], headers: list[bytes], payloads: list[bytes]
    ) -> None:
        self.runs += 1
        for reply, head, payload in zip(replies, headers, payloads, strict=True):
            self.on_hpub(subject, reply, head, payload)

    def on_sub(self, subject: str, queue: str, sid: str) -> None:
        self.frames.append(("sub", subject, queue, sid))

    def on_ping(self) -> None:
        self.frames.append(("ping",))


def hpub(subject: bytes, reply: bytes, head: bytes, payload: bytes) -> bytes:
    return b"HPUB %s %s%d %d\r\n%s%s\r\n" % (
        subject,
        reply + b" " if reply else b"",
        len(head),
        len(head) + len(payload),
        head,
        payload,
    )


TTL = block(("Nats-TTL", b"1h"))
wire_frames = st.one_of(
    st.tuples(
        st.sampled_from([b"cap.x", b"cap.y", b"sub.a", b"a..b"]),
        st.sampled_from([b"", b"r.1", b"_INBOX.9"]),
        st.sampled_from([TTL, b"", block(("Nats-Msg-Id", b"m")), block(("Nats-TTL", b"x"))]),
        st.binary(max_size=3),
    ).map(lambda f: hpub(*f)),
    st.sampled_from(
        [
            b"PUB cap.x 1\r\nx\r\n",
            b"PUB cap.x r.1 0\r\n\r\n",
            b"SUB sub.* 1\r\n",
            b"SUB cap.x 2\r\n",
            b"SUB r.1 3\r\n",
            b"PING\r\n",
            b"HPUB cap.x 30 20\r\n",  # a header larger than the message
            b"HPUB  cap.x 12 13\r\nNATS/1.0\r\n\r\nh\r\n",
            b"HPUB cap.x 12 13\r\nNATS/1.0\r\n\r\nhX\r\n",  # no CRLF after the payload
            b"HPUB cap.x r.1 12 13\r\nNATS/1.0\r\n\r\nh\r\n",
            b"HPUB cap.x r.2 12 13\r\nNATS/1.0\r\n\r\nhX\r\n",  # the same, broken
            b"HPUB cap.x r.1  r.2 12 13\r\nNATS/1.0\r\n\r\nh\r\n",  # two replies
            b"HPUB cap.x r.3\t12 13\r\nNATS/1.0\r\n\r\nh\r\n",
        ]
    ),
)


def _parse(stream: bytes, cuts: list[int], runs: bool) -> tuple[list[Any], str, int]:
    handler = Recorder(runs)
    parser = Parser(handler, server_side=True)  # type: ignore[arg-type]
    error = ""
    pos = 0
    try:
        for cut in [*sorted(cuts), len(stream)]:
            if cut >= pos:
                parser.feed(stream[pos:cut])
                pos = cut
    except Exception as exc:
        error = repr(exc)
    return handler.frames, error, handler.runs


@settings(max_examples=300, deadline=None)
@given(st.lists(wire_frames, max_size=25), st.lists(st.integers(0, 600), max_size=4))
def test_the_parser_hands_hpub_runs_in_order(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    assert _parse(stream, cuts, True)[:2] == _parse(stream, cuts, False)[:2]


def test_one_read_of_hpubs_to_one_subject_is_one_run() -> None:
    stream = b"".join(hpub(b"cap.x", b"r.%d" % i, TTL, b"p") for i in range(20))
    frames, error, run_calls = _parse(stream + b"PING\r\n" + stream[:100], [], True)
    assert error == ""
    assert run_calls == 1
    assert [f[2] for f in frames[:20]] == [f"r.{i}" for i in range(20)]
    assert frames[20] == ("ping",)


def test_hpubs_without_a_reply_are_one_run() -> None:
    # As an atomic batch sends them: no reply but on the last, sizes changing now and then.
    heads = [
        block(("Nats-Batch-Id", b"b"), ("Nats-Batch-Sequence", b"%d" % i)) for i in range(1, 13)
    ]
    stream = b"".join(
        hpub(b"cap.x", b"r.1" if i == 11 else b"", h, b"p") for i, h in enumerate(heads)
    )
    frames, error, run_calls = _parse(stream, [], True)
    assert error == ""
    assert run_calls == 1
    assert [f[2] for f in frames] == [""] * 11 + ["r.1"]
    assert [f[3] for f in frames] == heads
    assert frames == _parse(stream, [], False)[0]


async def _serve(stream: bytes, cuts: list[int], runs: bool) -> tuple[bytes, list[Any], bool]:
    """Feed ``stream`` to a server whose capture of ``cap.*`` takes runs of either
    kind; returns what was written, what the capture got, and whether it closed."""
    server = NatsServer(ServerConfig())
    captured: list[Any] = []

    def handler(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        captured.append((subject, reply, headers, payload))

    def run_handler(subject: str, replies: list[str], payloads: list[bytes]) -> None:
        captured.extend((subject, r, None, p) for r, p in zip(replies, payloads, strict=True))

    def headered(
        subject: str, replies: list[str], heads: list[bytes], payloads: list[bytes]
    ) -> None:
        for reply, head, payload in zip(replies, heads, payloads, strict=True):
            captured.append((subject, reply, head or None, payload))

    server.router.subscribe_internal(
        "cap.*", handler, run_handler=run_handler, headered_handler=headered
    )
    conn, transport = _connect(server)
    conn.data_received(CONNECT)
    conn.flush_now()
    transport.written.clear()
    conn._runs = runs
    pos = 0
    for cut in [*sorted(cuts), len(stream)]:
        if cut >= pos:
            conn.data_received(stream[pos:cut])
            pos = cut
    conn.flush_now()
    return bytes(transport.written), captured, transport.closed


@settings(max_examples=300, deadline=None)
@given(st.lists(wire_frames, max_size=25), st.lists(st.integers(0, 600), max_size=4))
def test_hpub_runs_route_like_single_publishes(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    assert asyncio.run(_serve(stream, cuts, True)) == asyncio.run(_serve(stream, cuts, False))
