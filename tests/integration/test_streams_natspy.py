"""JetStream streams through nats-py's JetStream manager and ``js.publish``, against a real
``tether serve`` (SQLite store)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)
from nats.js.manager import JetStreamManager

from tether.testing import RunningServer, run_server

API = "$JS.API"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def api(nc: Client, subject: str, body: Any = b"", wait: float = 2.0) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await nc.request(f"{API}.{subject}", raw, timeout=wait)
    return json.loads(reply.data)


def err_code(excinfo: pytest.ExceptionInfo[APIError]) -> int | None:
    return excinfo.value.err_code


# -- management ------------------------------------------------------------------------------


async def test_account_info_counts_streams_and_storage(
    jsm: JetStreamManager, js: JetStreamContext
) -> None:
    before = await jsm.account_info()
    await jsm.add_stream(name="ACC", subjects=["acc.>"])
    await js.publish("acc.1", b"hello")
    info = await jsm.account_info()
    assert info.streams == before.streams + 1
    assert info.storage > before.storage
    assert info.limits.max_streams == -1


async def test_create_info_recreate_and_delete(jsm: JetStreamManager) -> None:
    created = await jsm.add_stream(name="LIFE", subjects=["life.*"], description="d")
    cfg = created.config
    assert (cfg.name, cfg.subjects, cfg.description) == ("LIFE", ["life.*"], "d")
    assert (cfg.max_msgs, cfg.max_bytes, cfg.max_msgs_per_subject) == (-1, -1, -1)
    assert cfg.duplicate_window == 120.0
    assert cfg.storage == StorageType.FILE
    assert created.state.messages == 0
    assert created.state.first_seq == 0
    again = await jsm.add_stream(name="LIFE", subjects=["life.*"], description="d")
    assert again.config == cfg
    with pytest.raises(BadRequestError) as excinfo:
        await jsm.add_stream(name="LIFE", subjects=["life.>"])
    assert err_code(excinfo) == 10058
    assert (await jsm.stream_info("LIFE")).config.name == "LIFE"
    assert await jsm.delete_stream("LIFE") is True
    with pytest.raises(NotFoundError) as excinfo:
        await jsm.stream_info("LIFE")
    assert err_code(excinfo) == 10059
    with pytest.raises(NotFoundError):
        await jsm.delete_stream("LIFE")


async def test_a_stream_without_subjects_captures_its_name(
    jsm: JetStreamManager, js: JetStreamContext
) -> None:
    info = await jsm.add_stream(name="BARE")
    assert info.config.subjects == ["BARE"]
    ack = await js.publish("BARE", b"x")
    assert (ack.stream, ack.seq) == ("BARE", 1)


async def test_update_allows_some_changes_and_refuses_others(
    jsm: JetStreamManager, js: JetStreamContext
) -> None:
    await jsm.add_stream(name="UPD", subjects=["upd.a"], deny_delete=True)
    for _ in range(5):
        await js.publish("upd.a", b"x")
    updated = await jsm.update_stream(
        StreamConfig(name="UPD", subjects=["upd.a", "upd.b"], max_msgs=2, deny_delete=True)
    )
    assert updated.config.subjects == ["upd.a", "upd.b"]
    assert (updated.state.messages, updated.state.first_seq) == (2, 4)
    assert (await js.publish("upd.b", b"y")).seq == 6
    refused = [
        StreamConfig(name="UPD", subjects=["upd.a"], storage=StorageType.MEMORY, deny_delete=True),
        StreamConfig(name="UPD", subjects=["upd.a"]),  # would cancel deny_delete
    ]
    for config in refused:
        with pytest.raises(ServerError) as excinfo:
            await jsm.update_stream(config)
        assert err_code(excinfo) == 10052
    with pytest.raises(NotFoundError):
        await jsm.update_stream(StreamConfig(name="NOPE", subjects=["nope"]))


async def test_subjects_may_not_overlap_between_streams(jsm: JetStreamManager) -> None:
    await jsm.add_stream(name="OV1", subjects=["ov.*"])
    with pytest.raises(BadRequestError) as excinfo:
        await jsm.add_stream(name="OV2", subjects=["ov.a"])
    assert err_code(excinfo) == 10065
    await jsm.add_stream(name="OV3", subjects=["ov2.>"])
    with pytest.raises(BadRequestError) as excinfo:
        await jsm.update_stream(StreamConfig(name="OV3", subjects=["ov.>"]))
    assert err_code(excinfo) == 10065


async def test_bad_names_bodies_and_unknown_streams(nc: Client) -> None:
    for name in ("a*b", "a>b"):
        reply = await api(nc, f"STREAM.CREATE.{name}", {"name": name})
        assert reply["error"]["err_code"] == 10052
    # A name with a dot is more tokens than the API expects: no reply at all.
    with pytest.raises(NatsTimeout):
        await api(nc, "STREAM.CREATE.a.b", {"name": "a.b"}, wait=0.5)
    # A space cannot be in a subject; the body's name is still checked.
    reply = await api(nc, "STREAM.UPDATE.ab", {"name": "a b"})
    assert reply["error"]["err_code"] == 10052
    reply = await api(nc, "STREAM.CREATE.ab", {"name": "a b"})
    assert reply["error"]["err_code"] == 10056
    reply = await api(nc, "STREAM.CREATE.BAD", b"{not json")
    assert (reply["error"]["code"], reply["error"]["err_code"]) == (400, 10025)
    for call in ("STREAM.INFO.NOPE", "STREAM.PURGE.NOPE", "STREAM.DELETE.NOPE"):
        reply = await api(nc, call)
        assert reply["error"]["err_code"] == 10059, call


async def test_info_with_a_subjects_filter(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="SF", subjects=["sf.>"])
    for subject in ("sf.a", "sf.b", "sf.a", "sf.c.d"):
        await js.publish(subject, b"x")
    info = await jsm.stream_info("SF", subjects_filter="sf.*")
    assert info.state.subjects == {"sf.a": 2, "sf.b": 1}
    info = await jsm.stream_info("SF", subjects_filter=">")
    assert info.state.subjects == {"sf.a": 2, "sf.b": 1, "sf.c.d": 1}
    assert (await jsm.stream_info("SF")).state.subjects is None


async def test_names_and_list_with_subject_filter_and_paging(
    nc: Client, jsm: JetStreamManager
) -> None:
    for i in range(5):
        await jsm.add_stream(name=f"PAGE{i}", subjects=[f"page.{i}"])
    await jsm.add_stream(name="OTHER", subjects=["other.>"])
    assert await jsm.find_stream_name_by_subject("page.3") == "PAGE3"
    assert await jsm.find_stream_name_by_subject("other.x.y") == "OTHER"
    with pytest.raises(NotFoundError):
        await jsm.find_stream_name_by_subject("nobody")
    names = await api(nc, "STREAM.NAMES", {"subject": "page.*"})
    assert names["total"] == 5 and names["streams"] == [f"PAGE{i}" for i in range(5)]
    page = await api(nc, "STREAM.NAMES", {"offset": 4})
    assert (page["total"], page["offset"], page["limit"]) == (6, 4, 1024)
    assert page["streams"] == ["PAGE3", "PAGE4"]
    listed = await api(nc, "STREAM.LIST", {"offset": 5})
    assert [s["config"]["name"] for s in listed["streams"]] == ["PAGE4"]
    assert (listed["total"], listed["limit"]) == (6, 256)
    infos = await jsm.streams_info()
    assert sorted(i.config.name or "" for i in infos) == ["OTHER"] + [f"PAGE{i}" for i in range(5)]


async def test_purge_all_by_filter_below_seq_and_keep(
    jsm: JetStreamManager, js: JetStreamContext
) -> None:
    await jsm.add_stream(name="PRG", subjects=["prg.*"])

    async def fill() -> None:
        for i in range(10):
            await js.publish("prg.a" if i % 2 == 0 else "prg.b", str(i).encode())

    await fill()
    assert await jsm.purge_stream("PRG", subject="prg.a", keep=1)
    info = await jsm.stream_info("PRG", subjects_filter=">")
    assert info.state.subjects == {"prg.a": 1, "prg.b": 5}
    assert await jsm.purge_stream("PRG", seq=8)
    assert (await jsm.stream_info("PRG")).state.first_seq == 8
    assert await jsm.purge_stream("PRG", keep=1)
    state = (await jsm.stream_info("PRG")).state
    assert (state.messages, state.first_seq, state.last_seq) == (1, 10, 10)
    assert await jsm.purge_stream("PRG")
    state = (await jsm.stream_info("PRG")).state
    assert (state.messages, state.first_seq, state.last_seq) == (0, 11, 10)
    assert (await js.publish("prg.a", b"again")).seq == 11
    await jsm.add_stream(name="NOPURGE", subjects=["np"], deny_purge=True)
    with pytest.raises(ServerError) as excinfo:
        await jsm.purge_stream("NOPURGE")
    assert err_code(excinfo) == 10110


# -- reading ----------------------------------------------------------------------------------


async def test_msg_get_by_seq_last_and_next_subject(
    jsm: JetStreamManager, js: JetStreamContext
) -> None:
    await jsm.add_stream(name="GET", subjects=["get.>"])
    await js.publish("get.a", b"1")
    await js.publish("get.b", b"2", headers={"Custom": "yes"})
    await js.publish("get.a", b"3")
    await js.publish("get.c.d", b"4")
    msg = await jsm.get_msg("GET", 2)
    assert (msg.subject, msg.seq, msg.data) == ("get.b", 2, b"2")
    assert msg.headers == {"Custom": "yes"}
    assert (await jsm.get_last_msg("GET", "get.a")).seq == 3
    assert (await jsm.get_last_msg("GET", "get.*")).seq == 3
    assert (await jsm.get_last_msg("GET", "get.>")).seq == 4
    nxt = await jsm.get_msg("GET", seq=2, subject="get.a", next=True)
    assert nxt.seq == 3
    nxt = await jsm.get_msg("GET", seq=1, subject="get.c.*", next=True)
    assert nxt.seq == 4
    with pytest.raises(NotFoundError) as excinfo:
        await jsm.get_msg("GET", 99)
    assert err_code(excinfo) == 10037
    with pytest.raises(NotFoundError):
        await jsm.get_last_msg("GET", "get.zzz")


async def test_msg_delete_and_deny_delete(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="DEL", subjects=["del"])
    for _ in range(3):
        await js.publish("del", b"x")
    assert await jsm.delete_msg("DEL", 2)
    with pytest.raises(BadRequestError) as excinfo:
        await jsm.delete_msg("DEL", 2)
    assert err_code(excinfo) == 10043
    with pytest.raises(NotFoundError):
        await jsm.get_msg("DEL", 2)
    state = (await jsm.stream_info("DEL")).state
    assert (state.messages, state.num_deleted) == (2, 1)
    await jsm.add_stream(name="NODEL", subjects=["nodel"], deny_delete=True)
    await js.publish("nodel", b"x")
    with pytest.raises(ServerError) as excinfo:
        await jsm.delete_msg("NODEL", 1)
    assert err_code(excinfo) == 10057
    assert (await jsm.get_msg("NODEL", 1)).data == b"x"


async def test_direct_get_needs_allow_direct(
    nc: Client, jsm: JetStreamManager, js: JetStreamContext
) -> None:
    await jsm.add_stream(name="NODIRECT", subjects=["nd"])
    await js.publish("nd", b"x")
    with pytest.raises(NoRespondersError):
        await nc.request(f"{API}.DIRECT.GET.NODIRECT", b'{"seq":1}', timeout=2)
    with pytest.raises(NoRespondersError):
        await nc.request(f"{API}.DIRECT.GET.NODIRECT.nd", b"", timeout=2)
    await jsm.update_stream(StreamConfig(name="NODIRECT", subjects=["nd"], allow_direct=True))
    assert (await jsm.get_msg("NODIRECT", 1, direct=True)).data == b"x"


async def test_direct_get_both_forms(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="DIR", subjects=["dir.>"], allow_direct=True)
    await js.publish("dir.a", b"1")
    await js.publish("dir.b", b"2", headers={"Custom": "yes"})
    await js.publish("dir.a", b"3")
    msg = await jsm.get_msg("DIR", 2, direct=True)
    assert (msg.subject, msg.seq, msg.data) == ("dir.b", 2, b"2")
    assert msg.headers is not None and msg.headers["Custom"] == "yes"
    last = await jsm.get_last_msg("DIR", "dir.a", direct=True)  # DIRECT.GET.DIR.dir.a
    assert (last.seq, last.data) == (3, b"3")
    nxt = await jsm.get_msg("DIR", seq=2, subject="dir.a", next=True, direct=True)
    assert nxt.seq == 3
    with pytest.raises(NotFoundError):
        await jsm.get_msg("DIR", 42, direct=True)


async def direct_batch(nc: Client, stream: str, request: dict[str, Any]) -> list[Any]:
    """A batched DIRECT.GET: every reply up to and including the end-of-batch status."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"{API}.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
    replies = []
    try:
        while True:
            msg = await sub.next_msg(timeout=2)
            replies.append(msg)
            if msg.headers and "Status" in msg.headers:
                return replies
    finally:
        await sub.unsubscribe()


async def test_direct_get_batch(nc: Client, jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="BATCH", subjects=["b.*"], allow_direct=True)
    for i in range(1, 7):
        await js.publish("b.x" if i % 3 else "b.y", b"%d" % i)
    await jsm.delete_msg("BATCH", 2)
    replies = await direct_batch(nc, "BATCH", {"seq": 1, "batch": 3})
    *msgs, eob = replies
    assert [int(m.headers["Nats-Sequence"]) for m in msgs] == [1, 3, 4]
    assert [m.data for m in msgs] == [b"1", b"3", b"4"]
    assert [m.headers["Nats-Num-Pending"] for m in msgs] == ["4", "3", "2"]
    assert [m.headers["Nats-Last-Sequence"] for m in msgs] == ["0", "1", "3"]
    assert (eob.headers["Status"], eob.headers["Description"]) == ("204", "EOB")
    assert (eob.headers["Nats-Num-Pending"], eob.headers["Nats-Last-Sequence"]) == ("2", "4")
    filtered = await direct_batch(nc, "BATCH", {"seq": 1, "batch": 10, "next_by_subj": "b.y"})
    assert [m.data for m in filtered[:-1]] == [b"3", b"6"]
    assert filtered[-1].headers["Nats-Num-Pending"] == "0"
    limited = await direct_batch(nc, "BATCH", {"seq": 1, "batch": 10, "max_bytes": 8})
    assert [m.data for m in limited[:-1]] == [b"1", b"3"]  # stops at the one reaching 8
    missing = await direct_batch(nc, "BATCH", {"seq": 100, "batch": 2})
    assert [m.headers["Status"] for m in missing] == ["404"]


# -- publishing -------------------------------------------------------------------------------


async def test_publish_acks_and_dedup(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="PUB", subjects=["pub.>"])
    ack = await js.publish("pub.a", b"one")
    assert (ack.stream, ack.seq, ack.duplicate) == ("PUB", 1, None)
    first = await js.publish("pub.a", b"two", headers={"Nats-Msg-Id": "m1"})
    again = await js.publish("pub.a", b"two", headers={"Nats-Msg-Id": "m1"})
    assert (first.seq, again.seq, again.duplicate) == (2, 2, True)
    assert (await jsm.stream_info("PUB")).state.messages == 2
    ack = await js.publish("pub.b", b"three", stream="PUB")
    assert ack.seq == 3
    with pytest.raises(BadRequestError) as excinfo:
        await js.publish("pub.b", b"x", stream="OTHER")
    assert err_code(excinfo) == 10060


async def test_publish_expectations(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="EXP", subjects=["exp.>"])
    await js.publish("exp.a", b"1", headers={"Nats-Msg-Id": "id1"})
    await js.publish("exp.b", b"2")

    async def refused(subject: str, headers: dict[str, str]) -> int | None:
        with pytest.raises(BadRequestError) as excinfo:
            await js.publish(subject, b"x", headers=headers)
        return err_code(excinfo)

    assert await refused("exp.a", {"Nats-Expected-Last-Sequence": "1"}) == 10071
    assert (await js.publish("exp.a", b"3", headers={"Nats-Expected-Last-Sequence": "2"})).seq == 3
    assert await refused("exp.a", {"Nats-Expected-Last-Subject-Sequence": "1"}) == 10071
    ok = await js.publish("exp.a", b"4", headers={"Nats-Expected-Last-Subject-Sequence": "3"})
    assert ok.seq == 4
    first_on_c = await js.publish(
        "exp.c", b"5", headers={"Nats-Expected-Last-Subject-Sequence": "0"}
    )
    assert first_on_c.seq == 5
    other_subject = {
        "Nats-Expected-Last-Subject-Sequence": "2",
        "Nats-Expected-Last-Subject-Sequence-Subject": "exp.b",
    }
    assert (await js.publish("exp.d", b"6", headers=other_subject)).seq == 6
    assert await refused("exp.d", {"Nats-Expected-Last-Msg-Id": "id1"}) == 10070
    await js.publish("exp.e", b"7", headers={"Nats-Msg-Id": "id7"})
    ok = await js.publish("exp.e", b"8", headers={"Nats-Expected-Last-Msg-Id": "id7"})
    assert ok.seq == 8


async def test_rollups(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="NOROLL", subjects=["noroll"])
    with pytest.raises(ServerError) as excinfo:
        await js.publish("noroll", b"x", headers={"Nats-Rollup": "sub"})
    assert err_code(excinfo) == 10111
    await jsm.add_stream(name="ROLL", subjects=["roll.*"], allow_rollup_hdrs=True)
    for subject in ("roll.a", "roll.a", "roll.b"):
        await js.publish(subject, b"x")
    await js.publish("roll.a", b"sum", headers={"Nats-Rollup": "sub"})
    info = await jsm.stream_info("ROLL", subjects_filter=">")
    assert info.state.subjects == {"roll.a": 1, "roll.b": 1}
    await js.publish("roll.c", b"all", headers={"Nats-Rollup": "all"})
    state = (await jsm.stream_info("ROLL")).state
    assert (state.messages, state.first_seq, state.last_seq) == (1, 5, 5)


async def test_capture_and_no_responders(
    nc: Client, jsm: JetStreamManager, js: JetStreamContext
) -> None:
    await jsm.add_stream(name="CAP", subjects=["cap.*"])
    assert (await js.publish("cap.x", b"x")).seq == 1
    with pytest.raises(NoStreamResponseError):
        await js.publish("cap.x.deeper", b"x")
    with pytest.raises(NoStreamResponseError):
        await js.publish("uncaptured", b"x")
    await nc.publish("cap.y", b"fire and forget")  # no reply subject: stored, no ack
    await nc.flush()
    assert (await jsm.get_last_msg("CAP", "cap.y")).data == b"fire and forget"


async def test_size_and_discard_new_limits(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="SIZE", subjects=["size"], max_msg_size=10)
    await js.publish("size", b"0123456789")
    with pytest.raises(BadRequestError) as excinfo:
        await js.publish("size", b"0123456789X")
    assert err_code(excinfo) == 10054
    await jsm.add_stream(name="FULL", subjects=["full.*"], max_msgs=2, discard=DiscardPolicy.NEW)
    await js.publish("full.a", b"1")
    await js.publish("full.b", b"2")
    with pytest.raises(ServiceUnavailableError) as excinfo:
        await js.publish("full.c", b"3")
    assert err_code(excinfo) == 10077
    assert excinfo.value.description == "maximum messages exceeded"


async def test_max_age_expires_on_a_timer(jsm: JetStreamManager, js: JetStreamContext) -> None:
    await jsm.add_stream(name="AGE", subjects=["age"], max_age=0.3)
    await js.publish("age", b"1")
    await js.publish("age", b"2")
    deadline = time.monotonic() + 10
    while (await jsm.stream_info("AGE")).state.messages:
        assert time.monotonic() < deadline, "messages did not expire"
        await asyncio.sleep(0.05)
    state = (await jsm.stream_info("AGE")).state
    assert (state.first_seq, state.last_seq) == (3, 2)


async def test_max_age_applies_after_a_restart() -> None:
    max_age = 1.0
    with run_server() as srv:
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        await nc.jsm().add_stream(name="AGED", subjects=["aged"], max_age=max_age)
        await js.publish("aged", b"old")
        stored_at = time.monotonic()
        await nc.close()
        srv.kill()
        # Let the message age past max_age while the server is down.
        await asyncio.sleep(max(0.0, stored_at + max_age + 0.1 - time.monotonic()))
        srv.start()
        nc = await nats.connect(srv.url)
        try:
            state = (await nc.jsm().stream_info("AGED")).state
            assert (state.messages, state.first_seq, state.last_seq) == (0, 2, 1)
            assert (await nc.jetstream().publish("aged", b"new")).seq == 2
        finally:
            await nc.close()


async def test_a_key_value_bucket_is_a_stream_that_works(
    js: JetStreamContext, jsm: JetStreamManager
) -> None:
    kv = await js.create_key_value(bucket="CFG", history=2)
    info = await jsm.stream_info("KV_CFG")
    assert info.config.allow_msg_ttl is True
    assert info.config.max_msgs_per_subject == 2
    assert await kv.put("a", b"1") == 1
    assert await kv.put("a", b"2") == 2
    assert await kv.create("b", b"first") == 3
    entry = await kv.get("a")
    assert (entry.value, entry.revision) == (b"2", 2)
    assert await kv.update("a", b"3", last=2) == 4
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("a", b"stale", last=2)
    await kv.put("a", b"5")  # history 2: the oldest of "a" goes
    assert (await jsm.stream_info("KV_CFG", subjects_filter=">")).state.subjects == {
        "$KV.CFG.a": 2,
        "$KV.CFG.b": 1,
    }
