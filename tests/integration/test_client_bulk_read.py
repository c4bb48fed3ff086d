"""Block reads (``JetStream.read_blocks``) against a real Tether, and what nats-server
answers to them.

Tether runs on its SQLite store here, so reads go through the reader threads and meet
messages whose commit is still in flight.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from tether.client import (
    BadRequest,
    JetStream,
    MessageBlock,
    NotSupported,
    StreamNotFound,
    connect,
)
from tether.testing import RunningServer, run_nats_server, run_server

_names = itertools.count(1)


@pytest.fixture(scope="module")
def tether() -> Iterator[RunningServer]:
    with run_server() as server:
        yield server


@pytest.fixture
async def js(tether: RunningServer) -> AsyncIterator[JetStream]:
    nc = await connect(tether.url)
    yield nc.jetstream(timeout=5)
    await nc.close()


async def filled(js: JetStream, count: int, size: int = 16) -> str:
    name = f"B{next(_names)}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    for i in range(count):
        headers = {"N": str(i + 1)} if i % 5 == 0 else None
        await js.publish_async(
            f"{name}.{'abc'[i % 3]}", b"%d:" % (i + 1) + b"x" * size, headers=headers
        )
    await js.publish_async_completed()
    return name


async def collect(blocks: AsyncIterator[MessageBlock]) -> list[tuple[int, str, bytes, bytes, int]]:
    return [row async for block in blocks for row in block.rows()]


async def test_whole_stream_in_order_with_headers(js: JetStream) -> None:
    name = await filled(js, 500)
    rows = await collect(js.read_blocks(name, window=64))
    assert [r[0] for r in rows] == list(range(1, 501))
    assert [r[1] for r in rows][:4] == [f"{name}.a", f"{name}.b", f"{name}.c", f"{name}.a"]
    assert all(r[3].startswith(b"%d:" % r[0]) for r in rows)
    assert rows[0][2] == b"NATS/1.0\r\nN: 1\r\n\r\n" and rows[1][2] == b""
    stamps = [r[4] for r in rows]
    assert stamps == sorted(stamps) and stamps[0] > 1_600_000_000 * 10**9
    info = await js.stream_info(name)
    assert info.state.messages == 500  # reading consumes nothing


async def test_ranges_filters_and_no_headers(js: JetStream) -> None:
    name = await filled(js, 90)
    rows = await collect(js.read_blocks(name, 10, 40, subjects=[f"{name}.b"], headers=False))
    assert [r[0] for r in rows] == [s for s in range(10, 40) if (s - 1) % 3 == 1]
    assert all(r[2] == b"" for r in rows)
    rows = await collect(js.read_blocks(name, 80, 500))  # past the end: what exists
    assert [r[0] for r in rows] == list(range(80, 91))
    assert await collect(js.read_blocks(name, 91, 100)) == []
    assert await collect(js.read_blocks(name, 5, 5)) == []


async def test_byte_budget_cuts_windows_and_continues(js: JetStream) -> None:
    """1 KiB requests over 200-byte messages: each window needs several requests."""
    name = await filled(js, 120, size=200)
    blocks = [b async for b in js.read_blocks(name, window=50, max_bytes=1024)]
    assert len(blocks) > 20 and all(b.count <= 5 for b in blocks)
    assert [s for b in blocks for s in b.seq_list()] == list(range(1, 121))


async def test_block_size_follows_block_bytes(js: JetStream) -> None:
    name = await filled(js, 300, size=100)
    small = [b.count async for b in js.read_blocks(name, block_bytes=2048)]
    large = [b.count async for b in js.read_blocks(name, block_bytes=1 << 20)]
    assert sum(small) == sum(large) == 300
    assert len(small) > 15 and max(small) <= 20
    assert large == [300]


async def test_deleted_and_purged_messages_leave_gaps(js: JetStream) -> None:
    name = await filled(js, 60)
    for seq in (1, 2, 30, 31, 59):
        await js.api(f"STREAM.MSG.DELETE.{name}", {"seq": seq})
    await js.purge_stream(name, subject=f"{name}.c")
    rows = await collect(js.read_blocks(name, window=7))
    expected = [s for s in range(1, 61) if s not in (1, 2, 30, 31, 59) and (s - 1) % 3 != 2]
    assert [r[0] for r in rows] == expected


async def test_reads_wait_for_messages_still_in_their_commit(js: JetStream) -> None:
    name = await filled(js, 1)
    futures = [await js.publish_async(f"{name}.a", b"%d" % i) for i in range(2000)]
    # Read to the last sequence assigned while most commits are still in flight.
    rows = await collect(js.read_blocks(name, 1, 2002, window=500))
    assert [r[0] for r in rows] == list(range(1, 2002))
    await asyncio.gather(*futures)


async def test_errors(js: JetStream) -> None:
    with pytest.raises(StreamNotFound):
        await collect(js.read_blocks("NOPE", 1, 10))
    name = await filled(js, 3)
    with pytest.raises(BadRequest, match="invalid subject filter"):
        await collect(js.read_blocks(name, 1, 10, subjects=["a..b"]))
    with pytest.raises(ValueError, match="bad range"):
        js.read_blocks(name, 0, 10)


async def test_raw_request_answers(tether: RunningServer, js: JetStream) -> None:
    """The wire as documented: blocks without headers, then a 204 EOB status."""
    name = await filled(js, 10)
    nc = js.conn
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$TETHER.API.STREAM.READ.{name}", b'{"seq": 4, "batch": 3}', reply=inbox)
    block = await sub.next_msg(timeout=5)
    assert block.raw_headers is None and block.data
    eob = await sub.next_msg(timeout=5)
    assert eob.raw_headers == (
        b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 4\r\nNats-Last-Sequence: 6\r\n\r\n"
    )
    await nc.publish(f"$TETHER.API.STREAM.READ.{name}", b'{"seq": "x"}', reply=inbox)
    bad = await sub.next_msg(timeout=5)
    assert bad.raw_headers is not None and bad.raw_headers.startswith(b"NATS/1.0 400 Bad Request")
    await sub.unsubscribe()


async def test_nats_server_has_no_block_reads() -> None:
    with run_nats_server() as peer:
        nc = await connect(peer.url)
        js = nc.jetstream(timeout=5)
        try:
            await js.add_stream(name="P", subjects=["p.>"])
            await js.publish("p.a", b"x")
            with pytest.raises(NotSupported, match="not Tether"):
                await collect(js.read_blocks("P", 1, 2))
        finally:
            await nc.close()
