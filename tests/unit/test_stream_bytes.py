"""Stream bytes as nats-server counts them: the file store's record (subject + payload
+ 30, + headers + 34 with headers) or the memory store's subject + headers + payload +
16, after the stream's configured ``storage`` whatever backend holds the messages; the
same after a restart, and the same sizes behind ``max_bytes``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.storage import FILE_SIZING, MEMORY_SIZING, sizing, subject_size
from tether.storage.base import Store, StoredMessage
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore

HEADERS = b"NATS/1.0\r\nK: v\r\n\r\n"  # an 18-byte header block


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


def expected(storage: str, subject: str, payload: bytes, headers: bytes = b"") -> int:
    size = len(subject.encode()) + len(headers) + len(payload)
    return size + (16 if storage == "memory" else 34 if headers else 30)


def test_the_formulas_are_nats_servers() -> None:
    # Measured on nats-server 2.15.1: "b.a" with "hello" counts 38 bytes in a file
    # stream, 60 with an 18-byte header block; a memory stream 24 and 42.
    assert len(HEADERS) == 18
    assert expected("file", "b.a", b"hello") == 38
    assert expected("file", "b.a", b"hello", HEADERS) == 60
    assert sizing("file") is FILE_SIZING
    assert sizing("memory") is MEMORY_SIZING
    assert FILE_SIZING.overhead(b"") == 30
    assert FILE_SIZING.overhead(HEADERS) == 34
    assert MEMORY_SIZING.overhead(HEADERS) == 16
    msg = StoredMessage(1, "b.a", HEADERS, b"hello", 0)
    assert msg.size == expected("memory", "b.a", b"hello", HEADERS)
    # A subject counts its UTF-8 bytes, as sent.
    assert subject_size("b.a") == 3
    assert subject_size("b.\u00e9t\u00e9") == 7
    assert StoredMessage(1, "\u00e9", b"", b"", 0).size == 2 + 16


@pytest.fixture(params=["memory-store", "sqlite-store"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    store: Store = MemoryStore() if request.param == "memory-store" else SqliteStore(tmp_path)
    await store.open()
    yield store
    await store.close()


async def collect(broker: Broker, calls: list[tuple[str, str, bytes | None, bytes]]) -> list[Any]:
    """What each publish is told, in order (a refusal is told at once, an ack after the
    commit: each publish is awaited before the next)."""
    out: list[PubAck | ApiError] = []
    for stream, subject, headers, payload in calls:
        broker.publish(broker.get_stream(stream), subject, headers, payload, out.append)
        await broker.store.flush()
    return out


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_bytes_follow_the_configured_storage_and_survive_a_reload(
    store: Store, storage: str
) -> None:
    clock = FakeClock()
    broker = Broker(store, clock)
    await broker.load()
    await broker.create_stream("S", body(name="S", subjects=["b.>"], storage=storage))
    stream = broker.get_stream("S")
    acks = await collect(broker, [("S", "b.a", None, b"hello"), ("S", "b.a", HEADERS, b"hello")])
    assert acks == [PubAck("S", 1), PubAck("S", 2)]
    # Runs of publishes (one subject, and one subject each) index in one go.
    broker.publish_many(stream, "b.run", [b"x", b"yy"], ["", ""], None)
    broker.publish_mixed(stream, ["b.m1", "b.\u00e9"], [b"", b"zzz"], ["", ""], None)
    await store.flush()
    sizes = [
        expected(storage, "b.a", b"hello"),
        expected(storage, "b.a", b"hello", HEADERS),
        expected(storage, "b.run", b"x"),
        expected(storage, "b.run", b"yy"),
        expected(storage, "b.m1", b""),
        expected(storage, "b.\u00e9", b"zzz"),
    ]
    assert stream.state.bytes == sum(sizes)
    metas = [stream.meta(seq) for seq in range(1, 7)]
    assert [m.size for m in metas if m] == sizes
    # What a delivery carries: subject + headers + payload, whatever the storage.
    assert [m.size - m.overhead for m in metas if m] == [8, 26, 6, 7, 4, 7]
    usage = broker.account_usage()
    assert usage["storage" if storage == "file" else "memory"] == sum(sizes)
    await broker.delete_message("S", 2)
    assert stream.state.bytes == sum(sizes) - sizes[1]
    broker.close()

    again = Broker(store, clock)
    await again.load()
    try:
        reloaded = again.get_stream("S")
        assert reloaded.state.bytes == sum(sizes) - sizes[1]
        assert [reloaded.meta(seq) for seq in (1, 3, 4, 5, 6)] == [metas[0], *metas[2:]]
        await again.purge_stream("S", "b.run", 0, 0)
        assert reloaded.state.bytes == sizes[0] + sizes[4] + sizes[5]
    finally:
        again.close()


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_max_bytes_counts_the_same_sizes(store: Store, storage: str) -> None:
    broker = Broker(store, FakeClock())
    await broker.load()
    try:
        one = expected(storage, "dn", b"x" * 10)  # "do" counts the same
        with_headers = expected(storage, "dn", b"x" * 10, HEADERS)
        limit = one + with_headers
        await broker.create_stream(
            "NEW",
            body(name="NEW", subjects=["dn"], storage=storage, max_bytes=limit, discard="new"),
        )
        acks = await collect(
            broker,
            [
                ("NEW", "dn", None, b"x" * 10),
                ("NEW", "dn", HEADERS, b"x" * 10),  # exactly at the limit: accepted
                ("NEW", "dn", None, b""),
            ],
        )
        assert acks[:2] == [PubAck("NEW", 1), PubAck("NEW", 2)]
        refused = acks[2]
        assert isinstance(refused, ApiError)
        assert (refused.code, refused.err_code) == (503, 10077)
        assert refused.description == "maximum bytes exceeded"
        assert broker.get_stream("NEW").state.bytes == limit

        await broker.create_stream(
            "OLD", body(name="OLD", subjects=["do"], storage=storage, max_bytes=2 * one - 1)
        )
        # One byte short of two messages: each publish evicts the one before it.
        await collect(broker, [("OLD", "do", None, b"x" * 10)] * 3)
        state = broker.get_stream("OLD").state
        assert (state.msgs, state.first_seq, state.bytes) == (1, 3, one)
    finally:
        broker.close()


async def test_max_msg_size_compares_headers_and_payload(store: Store) -> None:
    broker = Broker(store, FakeClock())
    await broker.load()
    try:
        await broker.create_stream("M", body(name="M", subjects=["m"], max_msg_size=20))
        acks = await collect(
            broker,
            [
                ("M", "m", None, b"x" * 20),
                ("M", "m", None, b"x" * 21),
                ("M", "m", HEADERS, b"xx"),
                ("M", "m", HEADERS, b"xxx"),
            ],
        )
        assert [a.err_code if isinstance(a, ApiError) else a.seq for a in acks] == [
            1,
            10054,
            2,
            10054,
        ]
    finally:
        broker.close()
