"""Per-message TTLs, subject delete markers and republish in the engine, on a FakeClock.

What nats-server 2.15 does, checked against the real binary: a ``Nats-TTL`` expires a
message on its own (``never`` even outlives ``max_age``); with
``subject_delete_marker_ttl`` the expiry of a subject's last message leaves a marker
(``Nats-Marker-Reason: MaxAge``, its own ``Nats-TTL``, ``Nats-Rollup: sub``) whose own
expiry leaves none, a TTL below the markers' is raised to it; deletes and purges leave
no marker.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from headers_support import hdrs

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.streams.expiry import SLOT_NS, MessageTTLs, go_duration, marker_headers
from tether.engine.streams.republish import check_republish, republished
from tether.storage.base import StorageError, StoredMessage
from tether.storage.group_commit import Batch
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore

NS = 1_000_000_000


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


class Publisher:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.results: list[PubAck | ApiError] = []

    def __call__(self, stream: str, subject: str, payload: bytes = b"x", **headers: str) -> None:
        block = hdrs(**headers) if headers else None
        self.broker.publish(
            self.broker.get_stream(stream), subject, block, payload, self.results.append
        )

    async def settle(self) -> list[PubAck | ApiError]:
        await self.broker.store.flush()
        out, self.results = self.results, []
        return out


@pytest.fixture
async def broker(clock: FakeClock) -> AsyncIterator[Broker]:
    store = MemoryStore()
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    yield broker
    broker.close()
    await store.close()


async def stored(broker: Broker, name: str) -> list[StoredMessage]:
    await broker.store.flush()
    return await broker.store.read_range(name, 1, 1000)


def live(broker: Broker, name: str) -> list[int]:
    return list(broker.get_stream(name).seqs(0))


# -- the timer wheel ----------------------------------------------------------------------------


def test_the_wheel_pops_due_slots_only_never_early() -> None:
    ttls = MessageTTLs()
    t0 = 1_700_000_000 * NS
    ttls.add(1, t0 + 5 * NS)
    ttls.add(2, t0 + NS - SLOT_NS // 2)
    ttls.add(3, t0 + NS - 1)  # the same slot as 2
    assert len(ttls) == 3
    assert ttls.next_due() == t0 + NS
    assert ttls.due(t0 + NS - 1) == []  # 3 is not due yet: neither is its slot
    assert ttls.due(t0 + NS) == [2, 3]
    assert ttls.next_due() == t0 + 5 * NS
    assert ttls.due(t0 + 10 * NS) == [1]
    assert ttls.next_due() == 0 and len(ttls) == 0


def test_a_sequence_given_back_is_not_expired_by_its_old_entry() -> None:
    ttls = MessageTTLs()
    ttls.add(7, 10 * NS, durable_seq=6)
    ttls.forget(7)  # a failed commit: 7 is given again, to a message with a later TTL
    ttls.add(7, 20 * NS, durable_seq=6)
    assert ttls.due(10 * NS) == []
    assert ttls.due(20 * NS) == [7]
    # A sequence given back without an entry does not hide the next one's.
    ttls.forget(8)
    ttls.add(8, 30 * NS, durable_seq=7)
    assert ttls.due(30 * NS) == [8]


@pytest.mark.parametrize(
    ("ns", "text"),
    [(2 * NS, "2s"), (90 * NS, "1m30s"), (3600 * NS, "1h0m0s"), (1_500_000_000, "1.5s")],
)
def test_go_duration(ns: int, text: str) -> None:
    assert go_duration(ns) == text


def test_marker_headers_carry_whole_seconds() -> None:
    assert marker_headers(1_500_000_000) == (
        b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 1s\r\nNats-Rollup: sub\r\n\r\n"
    )


# -- per-message TTL ----------------------------------------------------------------------------


async def test_a_ttl_needs_allow_msg_ttl(broker: Broker) -> None:
    await broker.create_stream("S", body(name="S", subjects=["s.>"]))
    pub = Publisher(broker)
    pub("S", "s.a", Nats_TTL="5s")
    pub("S", "s.a", Nats_TTL="bad")
    results = await pub.settle()
    assert [(r.err_code, r.description) for r in results if isinstance(r, ApiError)] == [
        (10166, "per-message TTL is disabled"),
        (10165, "invalid per-message TTL"),
    ]


async def test_ttls_expire_on_the_clock_independently_of_max_age(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream("S", body(name="S", subjects=["s.>"], allow_msg_ttl=True))
    pub = Publisher(broker)
    pub("S", "s.a", Nats_TTL="2s")
    pub("S", "s.b", Nats_TTL="1")
    pub("S", "s.c", Nats_TTL="1m")
    pub("S", "s.d")
    pub("S", "s.e", Nats_TTL="never")
    assert all(isinstance(r, PubAck) for r in await pub.settle())
    clock.advance(0.9)
    assert live(broker, "S") == [1, 2, 3, 4, 5]
    clock.advance(0.3)
    assert live(broker, "S") == [1, 3, 4, 5]
    clock.advance(1)
    assert live(broker, "S") == [3, 4, 5]
    clock.advance(60)
    assert live(broker, "S") == [4, 5]
    assert [m.seq for m in await stored(broker, "S")] == [4, 5]


async def test_max_age_spares_never_and_ttls_can_be_shorter(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream(
        "S", body(name="S", subjects=["s.>"], allow_msg_ttl=True, max_age=10 * NS)
    )
    pub = Publisher(broker)
    pub("S", "s.never", Nats_TTL="never")
    pub("S", "s.short", Nats_TTL="1s")
    pub("S", "s.long", Nats_TTL="1h")  # max_age still applies
    pub("S", "s.plain")
    await pub.settle()
    clock.advance(2)
    assert live(broker, "S") == [1, 3, 4]
    clock.advance(9)
    assert live(broker, "S") == [1]
    pub("S", "s.later")
    await pub.settle()
    stream = broker.get_stream("S")
    assert stream.next_expiry() == clock.now() + 10 * NS  # not the never message's age
    clock.advance(11)
    assert live(broker, "S") == [1]
    # The 1 h TTL of s.long is still in the wheel (entries go when due, not when their
    # message goes earlier): it comes due harmlessly.
    clock.advance(3600)
    assert live(broker, "S") == [1]
    assert stream.next_expiry() == 0


async def test_a_deleted_message_is_skipped_when_its_ttl_is_due(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream("S", body(name="S", subjects=["s.>"], allow_msg_ttl=True))
    pub = Publisher(broker)
    pub("S", "s.a", Nats_TTL="1s")
    pub("S", "s.b", Nats_TTL="1s")
    await pub.settle()
    await broker.delete_message("S", 1)
    clock.advance(2)
    assert live(broker, "S") == []
    assert broker.get_stream("S").state.msgs == 0


# -- subject delete markers -----------------------------------------------------------------------


async def test_config_of_delete_markers(broker: Broker) -> None:
    with pytest.raises(ApiError) as excinfo:
        await broker.create_stream("A", body(name="A", subject_delete_marker_ttl=NS // 2))
    assert excinfo.value.description == "subject delete marker TTL must be at least 1 second"
    with pytest.raises(ApiError) as excinfo:
        await broker.create_stream("A", body(name="A", subject_delete_marker_ttl=-1))
    assert excinfo.value.description == "subject delete marker TTL must not be negative"
    stream, _ = await broker.create_stream(
        "A", body(name="A", subject_delete_marker_ttl=2 * NS, deny_purge=True)
    )
    config = stream.config.to_dict()
    assert config["subject_delete_marker_ttl"] == 2 * NS
    assert (config["allow_msg_ttl"], config["allow_rollup_hdrs"], config["deny_purge"]) == (
        True,
        True,
        False,
    )


async def test_expiry_of_a_subjects_last_message_leaves_one_marker(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream(
        "S", body(name="S", subjects=["s.>"], subject_delete_marker_ttl=2 * NS)
    )
    pub = Publisher(broker)
    pub("S", "s.one", Nats_TTL="1s")  # raised to the markers' 2 s
    pub("S", "s.two", Nats_TTL="2")
    pub("S", "s.two", Nats_TTL="4s")
    pub("S", "s.kept")
    await pub.settle()
    first = await stored(broker, "S")
    assert first[0].headers == hdrs(Nats_TTL="2")
    clock.advance(2.2)
    msgs = await stored(broker, "S")
    # s.one went (a marker for it); s.two still has its second message (no marker).
    assert [(m.seq, m.subject) for m in msgs] == [(3, "s.two"), (4, "s.kept"), (5, "s.one")]
    assert msgs[-1].headers == marker_headers(2 * NS) and msgs[-1].data == b""
    clock.advance(2)
    msgs = await stored(broker, "S")
    assert [(m.seq, m.subject) for m in msgs] == [(4, "s.kept"), (6, "s.two")]
    clock.advance(10)  # the markers expire in turn, leaving no marker of their own
    assert [m.seq for m in await stored(broker, "S")] == [4]


async def test_max_age_leaves_markers_deletes_and_purges_do_not(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream(
        "S",
        body(name="S", subjects=["s.>"], max_age=2 * NS, subject_delete_marker_ttl=3 * NS),
    )
    pub = Publisher(broker)
    for subject in ("s.age", "s.del", "s.purge"):
        pub("S", subject)
    await pub.settle()
    await broker.delete_message("S", 2)
    await broker.purge_stream("S", "s.purge", 0, 0)
    clock.advance(2.1)
    msgs = await stored(broker, "S")
    assert [(m.seq, m.subject) for m in msgs] == [(4, "s.age")]
    assert b"Nats-Marker-Reason: MaxAge" in msgs[0].headers


# -- restarts -------------------------------------------------------------------------------------


async def test_ttls_survive_a_restart_and_expire_on_time(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteStore(tmp_path)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    await broker.create_stream(
        "S", body(name="S", subjects=["s.>"], subject_delete_marker_ttl=5 * NS, max_age=60 * NS)
    )
    pub = Publisher(broker)
    pub("S", "s.a", Nats_TTL="10s")
    pub("S", "s.b", Nats_TTL="30s")
    pub("S", "s.c", Nats_TTL="never")
    await pub.settle()
    broker.close()
    await store.close()

    clock.advance(20)  # s.a expired while the server was down
    store = SqliteStore(tmp_path)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    try:
        await store.flush()
        msgs = await store.read_range("S", 1, 100)
        assert [(m.seq, m.subject) for m in msgs] == [(2, "s.b"), (3, "s.c"), (4, "s.a")]
        assert b"Nats-Marker-Reason" in msgs[-1].headers
        clock.advance(11)  # s.b now; the marker of s.a (5 s) went meanwhile
        await store.flush()
        msgs = await store.read_range("S", 1, 100)
        assert [(m.seq, m.subject) for m in msgs] == [(3, "s.c"), (5, "s.b")]
        clock.advance(100)  # never outlives max_age; the marker of s.b goes
        await store.flush()
        assert [m.seq for m in await store.read_range("S", 1, 100)] == [3]
    finally:
        broker.close()
        await store.close()


# -- republish ------------------------------------------------------------------------------------


def test_republish_config_checks() -> None:
    assert check_republish({"dest": "out.>"}, ["s.>"]) == {"src": ">", "dest": "out.>"}
    assert check_republish(
        {"src": "s.*", "dest": "o.{{wildcard(1)}}", "headers_only": True}, ["s.>"]
    ) == {"src": "s.*", "dest": "o.{{wildcard(1)}}", "headers_only": True}
    for raw, text in [
        ({"src": "s.>", "dest": "s.x"}, "republish destination forms a cycle"),
        ({"src": "s.>", "dest": "o.*"}, "republish with transform from 's.>' to 'o.*' not valid"),
        ({"src": "s.*", "dest": "o.{{wildcard(2)}}"}, "not valid"),
    ]:
        with pytest.raises(ApiError) as excinfo:
            check_republish(raw, ["s.>"])
        assert excinfo.value.err_code == 10052 and text in excinfo.value.description
    with pytest.raises(ApiError) as excinfo:
        check_republish({"dest": "o.>", "bogus": 1}, ["s.>"])
    assert excinfo.value.err_code == 10025


def test_republished_headers() -> None:
    spec = {"src": "s.*", "dest": "o.{{wildcard(1)}}"}
    out = republished(spec, "S", 7, "s.a", hdrs(X="1"), b"body", 1_700_000_000 * NS, 3)
    assert out == (
        "o.a",
        b"NATS/1.0\r\nX: 1\r\nNats-Stream: S\r\nNats-Subject: s.a\r\nNats-Sequence: 7\r\n"
        b"Nats-Time-Stamp: 2023-11-14T22:13:20Z\r\nNats-Last-Sequence: 3\r\n\r\n",
        b"body",
    )
    out = republished({**spec, "headers_only": True}, "S", 7, "s.a", b"", b"body", NS, 0)
    assert out is not None and out[1].endswith(b"Nats-Msg-Size: 4\r\n\r\n") and out[2] == b""
    assert republished(spec, "S", 7, "s.a.b", b"", b"", NS, 0) is None


async def test_republish_goes_out_after_the_commit(broker: Broker) -> None:
    sent: list[tuple[str, bytes, bytes]] = []
    broker.republisher.sink = lambda subject, block, payload: sent.append((subject, block, payload))
    await broker.create_stream(
        "S", body(name="S", subjects=["s.>"], republish={"src": "s.>", "dest": "o.>"})
    )
    pub = Publisher(broker)
    pub("S", "s.a", b"1")
    pub("S", "s.b", b"2")
    pub("S", "s.a", b"3")
    assert sent == []  # nothing before the commit is durable
    await pub.settle()
    assert [s for s, _, _ in sent] == ["o.a", "o.b", "o.a"]
    assert [b.split(b"Nats-Last-Sequence: ")[1][:1] for _, b, _ in sent] == [b"0", b"0", b"1"]
    stream = broker.get_stream("S")
    broker.publish_many(stream, "s.c", [b"4", b"5"], ["", ""], None)
    await broker.store.flush()
    assert [(s, p) for s, _, p in sent[3:]] == [("o.c", b"4"), ("o.c", b"5")]


async def test_a_long_ttl_does_not_hold_up_a_new_streams_max_age(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream("T", body(name="T", subjects=["t.>"], allow_msg_ttl=True))
    pub = Publisher(broker)
    pub("T", "t.a", Nats_TTL="1h")  # the expiry timer is now an hour away
    await pub.settle()
    await broker.create_stream("A", body(name="A", subjects=["a.>"], max_age=NS))
    pub("A", "a.x")
    await pub.settle()
    clock.advance(1.5)
    assert live(broker, "A") == []
    assert live(broker, "T") == [1]


async def test_a_failed_commit_gives_back_a_ttl_without_expiring_the_next_message(
    clock: FakeClock,
) -> None:
    class Flaky(MemoryStore):
        full = False

        def _hand_off(self, batch: Batch) -> None:
            if self.full:
                self._group.settle(batch, StorageError("database or disk is full"))
            else:
                super()._hand_off(batch)

    store = Flaky()
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    try:
        await broker.create_stream("S", body(name="S", subjects=["s.>"], allow_msg_ttl=True))
        pub = Publisher(broker)
        store.full = True
        pub("S", "s.a", Nats_TTL="1s")
        with pytest.raises(StorageError):
            await store.flush()
        pub.results.clear()
        store.full = False
        pub("S", "s.b", Nats_TTL="10s")  # stored at the sequence given back
        assert await pub.settle() == [PubAck("S", 1)]
        clock.advance(2)
        assert live(broker, "S") == [1]
        clock.advance(9)
        assert live(broker, "S") == []
    finally:
        broker.close()
        await store.close()


async def test_a_copied_message_keeps_its_ttl_from_its_origins_time(
    broker: Broker, clock: FakeClock
) -> None:
    await broker.create_stream("M", body(name="M", subjects=["m.>"], allow_msg_ttl=True))
    stream = broker.get_stream("M")
    acks: list[PubAck | ApiError] = []
    stamp = clock.now() - 5 * NS  # stored at the origin 5 s ago
    msg = StoredMessage(1, "m.a", hdrs(Nats_TTL="10s"), b"x", stamp)
    broker.append_mirrored(stream, msg, acks.append)
    await broker.store.flush()
    assert acks == [PubAck("M", 1)]
    clock.advance(4)
    assert live(broker, "M") == [1]
    clock.advance(1.2)
    assert live(broker, "M") == []


async def test_a_damaged_message_costs_no_other_its_ttl_at_load(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    await broker.create_stream(
        "S", body(name="S", subjects=["s.>"], allow_msg_ttl=True, duplicate_window=NS)
    )
    pub = Publisher(broker)
    for subject in ("s.a", "s.b", "s.c"):
        pub("S", subject, Nats_TTL="10s")
    await pub.settle()
    broker.close()
    await store.close()
    clock.advance(5)  # out of the duplicate window: the load reads only the last message
    with sqlite3.connect(tmp_path / "tether.db") as db:
        db.execute("UPDATE messages SET data = CAST('damaged' AS BLOB) WHERE seq = 2")
    store = SqliteStore(tmp_path, cache_bytes=0)
    await store.open()
    broker = Broker(store, clock)
    await broker.load()
    try:
        clock.advance(6)
        assert live(broker, "S") == [2]  # the damaged one waits for `tether store repair`
    finally:
        broker.close()
        await store.close()
