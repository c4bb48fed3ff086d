"""Per-message TTLs, subject delete markers and republish through nats-py (JetStream and
KV), against a real ``tether serve`` (SQLite store)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, RePublish, StreamConfig
from nats.js.errors import BadRequestError, KeyNotFoundError, ServerError
from nats.js.kv import KeyValue

from tether.testing import RunningServer, run_server

NS = 1_000_000_000


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def eventually_gone(kv: KeyValue, key: str, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await kv.get(key)
        except KeyNotFoundError:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{key} did not expire"
        await asyncio.sleep(0.1)


async def stored(js: JetStreamContext, stream: str, messages: int) -> tuple[int, int]:
    """(messages, first_seq) of ``stream`` once it holds ``messages`` (polled: an expiry
    comes late on a loaded machine); fails after 10 s."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        state = (await js.stream_info(stream)).state
        if state.messages == messages:
            return state.messages, state.first_seq
        assert asyncio.get_running_loop().time() < deadline, f"{stream}: {state}"
        await asyncio.sleep(0.05)


async def test_publish_with_a_ttl(js: JetStreamContext) -> None:
    await js.add_stream(StreamConfig(name="T", subjects=["t.>"], allow_msg_ttl=True))
    ack = await js.publish("t.short", b"x", msg_ttl=1)
    await js.publish("t.long", b"y", msg_ttl=3600)
    await js.publish("t.never", b"z", headers={"Nats-TTL": "never"})
    assert ack.seq == 1
    with pytest.raises(BadRequestError) as excinfo:
        await js.publish("t.bad", b"x", headers={"Nats-TTL": "500ms"})
    assert excinfo.value.err_code == 10165
    assert await stored(js, "T", 2) == (2, 2)


async def test_a_ttl_on_a_stream_without_allow_msg_ttl_is_refused(js: JetStreamContext) -> None:
    await js.add_stream(StreamConfig(name="N", subjects=["n"]))
    with pytest.raises(BadRequestError) as excinfo:
        await js.publish("n", b"x", msg_ttl=5)
    assert (excinfo.value.err_code, excinfo.value.description) == (
        10166,
        "per-message TTL is disabled",
    )


async def test_kv_per_key_ttl_and_limit_markers_seen_by_a_watcher(js: JetStreamContext) -> None:
    kv = await js.create_key_value(KeyValueConfig(bucket="SESS", limit_marker_ttl=1))
    status = await kv.status()
    assert status.marker_ttl == 1
    watcher = await kv.watchall(include_history=True)
    assert await watcher.updates(timeout=2) is None  # nothing yet
    await kv.create("user1", b"token", msg_ttl=1)
    await kv.put("user2", b"kept")
    update = await watcher.updates(timeout=2)
    assert update is not None and (update.key, update.value) == ("user1", b"token")
    await watcher.updates(timeout=2)  # user2
    await eventually_gone(kv, "user1")
    # The server's delete marker reaches the watcher as a purge of the key.
    marker = await watcher.updates(timeout=3)
    assert marker is not None and marker.key == "user1" and marker.operation == "PURGE"
    assert (await kv.get("user2")).value == b"kept"
    # The key can be created again once it expired.
    assert await kv.create("user1", b"again") > 0
    await watcher.stop()


async def test_kv_purge_with_a_ttl_goes_away(js: JetStreamContext) -> None:
    kv = await js.create_key_value(KeyValueConfig(bucket="P", history=5))
    await kv.put("k", b"1")
    await kv.purge("k", msg_ttl=1)
    info = await js.stream_info("KV_P")
    assert info.state.messages == 1  # the purge marker
    assert (await stored(js, "KV_P", 0))[0] == 0


async def test_republish_headers_and_headers_only(nc: Client, js: JetStreamContext) -> None:
    got: list[Msg] = []

    async def collect(msg: Msg) -> None:
        got.append(msg)

    sub = await nc.subscribe("out.>", cb=collect)
    await js.add_stream(
        StreamConfig(name="R", subjects=["r.>"], republish=RePublish(src="r.>", dest="out.>"))
    )
    await js.add_stream(
        StreamConfig(
            name="H",
            subjects=["h.*"],
            republish=RePublish(src="h.*", dest="out.h.{{wildcard(1)}}", headers_only=True),
        )
    )
    await js.publish("r.a", b"one")
    await js.publish("r.b", b"two", headers={"X-Custom": "v"})
    await js.publish("r.a", b"three")
    await js.publish("h.x", b"12345")
    await nc.flush()
    for _ in range(50):
        if len(got) == 4:
            break
        await asyncio.sleep(0.05)
    assert [(m.subject, m.data) for m in got] == [
        ("out.a", b"one"),
        ("out.b", b"two"),
        ("out.a", b"three"),
        ("out.h.x", b""),
    ]
    h = [m.headers or {} for m in got]
    assert [x["Nats-Sequence"] for x in h] == ["1", "2", "3", "1"]
    assert [x["Nats-Last-Sequence"] for x in h] == ["0", "0", "1", "0"]
    assert h[1]["X-Custom"] == "v" and h[1]["Nats-Subject"] == "r.b"
    assert h[3]["Nats-Msg-Size"] == "5" and h[3]["Nats-Stream"] == "H"
    assert all("Nats-Time-Stamp" in x for x in h)
    await sub.unsubscribe()


async def test_republish_refused_when_it_forms_a_cycle(js: JetStreamContext) -> None:
    with pytest.raises(ServerError) as excinfo:
        await js.add_stream(
            StreamConfig(name="C", subjects=["c.>"], republish=RePublish(src="c.>", dest="c.x"))
        )
    assert excinfo.value.description == (
        "stream configuration for republish destination forms a cycle"
    )


async def test_kv_republish(nc: Client, js: JetStreamContext) -> None:
    got: list[Msg] = []

    async def collect(msg: Msg) -> None:
        got.append(msg)

    await nc.subscribe("changes.>", cb=collect)
    kv = await js.create_key_value(
        KeyValueConfig(bucket="RP", republish=RePublish(src="$KV.RP.>", dest="changes.>"))
    )
    await kv.put("a", b"1")
    await kv.delete("a")
    await nc.flush()
    for _ in range(50):
        if len(got) == 2:
            break
        await asyncio.sleep(0.05)
    assert [m.subject for m in got] == ["changes.a", "changes.a"]
    assert got[0].data == b"1" and (got[1].headers or {}).get("KV-Operation") == "DEL"
