"""nats-py's KeyValue and ObjectStore against ``tether serve``.

Both are client-side in nats-py, built on streams, direct gets and ordered push
consumers (watch, keys, history, object listing), so they exercise the consumer
machinery the way real applications do.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from tether.testing import RunningServer, run_server

_buckets = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv


async def bucket(js: JetStreamContext, history: int = 5, direct: bool = True) -> KeyValue:
    return await js.create_key_value(bucket=f"B{next(_buckets)}", history=history, direct=direct)


async def test_bind_to_existing_bucket(js: JetStreamContext) -> None:
    kv = await bucket(js, direct=False)  # reads through STREAM.MSG.GET instead
    await kv.put("k", b"v")
    again = await js.key_value(kv._name)
    assert (await again.get("k")).value == b"v"


async def test_put_get_update_create(js: JetStreamContext) -> None:
    kv = await bucket(js)
    rev = await kv.put("k1", b"v1")
    entry = await kv.get("k1")
    assert (entry.value, entry.revision) == (b"v1", rev)
    rev2 = await kv.update("k1", b"v2", last=rev)
    assert (await kv.get("k1")).value == b"v2"
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("k1", b"v3", last=rev)
    await kv.create("k2", b"new")
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.create("k2", b"again")
    assert rev2 > rev


async def test_delete_purge_history_keys(js: JetStreamContext) -> None:
    kv = await bucket(js)
    await kv.put("a", b"1")
    await kv.put("a", b"2")
    await kv.put("b", b"x")
    await kv.put("c", b"y")
    assert sorted(await kv.keys()) == ["a", "b", "c"]
    assert [e.value for e in await kv.history("a")] == [b"1", b"2"]
    await kv.delete("b")
    with pytest.raises(KeyNotFoundError):
        await kv.get("b")
    assert sorted(await kv.keys()) == ["a", "c"]
    await kv.create("b", b"back")  # create over a delete marker
    await kv.purge("a")
    history = await kv.history("a")
    assert len(history) == 1 and history[0].operation == "PURGE"
    await kv.purge("b")
    await kv.purge("c")
    with pytest.raises(NoKeysError):
        await kv.keys()


async def test_watch(js: JetStreamContext) -> None:
    kv = await bucket(js)
    await kv.put("x", b"1")
    await kv.put("y", b"2")
    watcher = await kv.watchall()
    initial = []
    async for entry in watcher:
        if entry is None:
            break
        initial.append((entry.key, entry.value))
    assert initial == [("x", b"1"), ("y", b"2")]
    await kv.put("z", b"3")
    await kv.delete("x")
    update = await watcher.updates(timeout=2)
    assert update is not None and (update.key, update.value) == ("z", b"3")
    deleted = await watcher.updates(timeout=2)
    assert deleted is not None and (deleted.key, deleted.operation) == ("x", "DEL")
    await watcher.stop()


async def test_watch_on_empty_bucket_signals_at_once(js: JetStreamContext) -> None:
    kv = await bucket(js)
    watcher = await kv.watch("k.*")
    assert await watcher.updates(timeout=1) is None
    await kv.put("k.1", b"v")
    entry = await watcher.updates(timeout=2)
    assert entry is not None and entry.key == "k.1"
    await watcher.stop()


async def test_object_store(js: JetStreamContext) -> None:
    obs = await js.create_object_store(f"O{next(_buckets)}")
    data = bytes(range(256)) * 2000  # 512 KB: several chunks
    info = await obs.put("blob", data)
    assert info.size == len(data) and info.chunks > 1
    result = await obs.get("blob")
    assert result.data == data
    assert (await obs.get_info("blob")).digest == info.digest
    await obs.put("small", b"tiny")
    assert sorted(i.name for i in await obs.list()) == ["blob", "small"]
    await obs.put("blob", b"replaced")
    assert (await obs.get("blob")).data == b"replaced"
    await obs.delete("blob")
    assert [i.name for i in await obs.list(ignore_deletes=True)] == ["small"]
    deleted = {i.name: i.deleted for i in await obs.list()}
    assert deleted == {"small": False, "blob": True}


async def test_watch_survives_many_updates(js: JetStreamContext) -> None:
    kv = await bucket(js, history=1)
    watcher = await kv.watchall()
    assert await watcher.updates(timeout=1) is None
    for i in range(200):
        await kv.put(f"k{i % 10}", b"%d" % i)
    seen = []
    for _ in range(200):
        entry = await watcher.updates(timeout=2)
        assert entry is not None
        seen.append(entry.revision)
    assert seen == sorted(seen) and len(set(seen)) == 200
    await watcher.stop()
    await asyncio.sleep(0)
