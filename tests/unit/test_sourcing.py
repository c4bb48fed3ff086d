"""Mirrors and sources in the engine: configuration checks, the header a copy carries,
and the copying itself over a real store — including where each feed resumes after the
broker is rebuilt from that store (what a restart does)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.sourcing import SourcingService
from tether.engine.sourcing.feed import copy_headers
from tether.engine.streams.config import decode_config, normalize
from tether.engine.streams.sourcing import (
    SourceSpec,
    TransformConfig,
    format_time,
    go_hash,
    parse_source_header,
    parse_time,
    source_header,
    stream_identity,
)
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import SqliteStore

NS = 1_000_000_000


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


def refused(**config: Any) -> tuple[int, str]:
    config.setdefault("name", "S")
    with pytest.raises(ApiError) as caught:
        normalize(decode_config(body(**config)))
    return caught.value.err_code, caught.value.description


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "err_code", "text"),
    [
        ({"subjects": ["a"], "mirror": {"name": "O"}}, 10034, "stream mirrors can not contain"),
        ({"first_seq": 3, "mirror": {"name": "O"}}, 10143, "stream mirrors can not have first"),
        (
            {"mirror": {"name": "O"}, "sources": [{"name": "P"}]},
            10031,
            "stream mirrors can not also contain",
        ),
        ({"mirror": {"name": "a.b"}}, 10142, "mirrored stream name is invalid"),
        ({"sources": [{"name": "O"}, {"name": "O"}]}, 10140, "duplicate source"),
        ({"sources": [{"name": ""}]}, 10141, "sourced stream name is invalid"),
        (
            {"sources": [{"name": "O", "subject_transforms": [{"src": "a..b", "dest": "c"}]}]},
            10145,
            "source transform source: invalid subject a..b",
        ),
        (
            {"sources": [{"name": "O", "subject_transforms": [{"src": "a.*", "dest": "$2"}]}]},
            10146,
            "source transform: invalid mapping destination: wildcard index out of range",
        ),
        (
            {"subjects": ["a.*"], "subject_transform": {"src": "a.*", "dest": "{{bad(1)}}"}},
            10156,
            "stream transform: invalid mapping destination: unknown function in {{bad(1)}}",
        ),
        (
            {"sources": [{"name": "O", "external": {"api": "$JS.API", "deliver": ""}}]},
            10021,
            "stream external api prefix $JS.API must not overlap with $JS.API",
        ),
        (
            {"sources": [{"name": "O", "external": {"api": "$JS.a.API", "deliver": "d.*"}}]},
            10024,
            "stream external delivery prefix d.* must not contain wildcards",
        ),
    ],
)
def test_bad_mirrors_sources_and_transforms(
    config: dict[str, Any], err_code: int, text: str
) -> None:
    code, description = refused(**config)
    assert code == err_code
    assert description.startswith(text)


def test_a_mirror_has_no_subjects_and_no_duplicate_window() -> None:
    cfg = normalize(decode_config(body(name="M", mirror={"name": "O", "filter_subject": ""})))
    out = cfg.to_dict()
    assert "subjects" not in out and "duplicate_window" not in out
    assert out["mirror"] == {"name": "O"}


def test_index_names_and_the_source_header() -> None:
    plain = SourceSpec(name="O")
    assert plain.index_name() == "O > >"
    filtered = SourceSpec(name="O", filter_subject="a.*")
    assert filtered.index_name() == "O a.* >"
    transformed = SourceSpec(
        name="O",
        subject_transforms=[TransformConfig("a.*", "b.$1"), TransformConfig("c", "")],
    )
    assert transformed.index_name() == "O a.*\fc b.$1\f>"
    assert source_header("O a.* >", 7, "a.x", "id") == "O 7 a.* > a.x id"
    assert parse_source_header("O 7 a.* > a.x id") == ("O a.* >", 7)
    assert parse_source_header("garbage") is None


def test_hashes_are_nats_servers() -> None:
    # Checked against nats-server 2.15: the identity of a stream created at this time.
    assert go_hash("2026-11-24T19:04:01.285248938Z") == "9nTQdR44"
    assert format_time(parse_time("2026-11-24T19:04:01.2852Z")) == "2026-11-24T19:04:01.2852Z"
    assert format_time(parse_time("2026-11-24T20:04:01+01:00")) == "2026-11-24T19:04:01Z"
    assert stream_identity(parse_time("2026-11-24T19:04:01.285248938Z")) == "9nTQdR44"


def test_copies_drop_expectations_and_replace_the_stamp() -> None:
    block = (
        b"NATS/1.0\r\nNats-Expected-Stream: O\r\nNats-Msg-Id: 1\r\n"
        b"Nats-Stream-Source: X 1 > > a\r\nNats-Batch-Id: b\r\n\r\n"
    )
    assert copy_headers(block, "O 3 > > a i") == (
        b"NATS/1.0\r\nNats-Msg-Id: 1\r\nNats-Stream-Source: O 3 > > a i\r\n\r\n"
    )
    assert copy_headers(b"", "") == b""
    assert copy_headers(b"", "O 1 > > a") == b"NATS/1.0\r\nNats-Stream-Source: O 1 > > a\r\n\r\n"


# -- copying -----------------------------------------------------------------------------------


async def open_broker(path: Path) -> tuple[Broker, SourcingService]:
    store = SqliteStore(path)
    await store.open()
    broker = Broker(store, FakeClock())
    await broker.load()
    service = SourcingService(broker)
    await service.start()
    return broker, service


async def publish(broker: Broker, stream: str, subject: str, headers: bytes | None = None) -> int:
    done: asyncio.Future[PubAck | ApiError] = asyncio.get_running_loop().create_future()
    broker.publish(broker.get_stream(stream), subject, headers, b"x", done.set_result)
    ack = await done
    assert isinstance(ack, PubAck)
    return ack.seq


async def until(check: Any, within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def close(broker: Broker, service: SourcingService) -> None:
    await service.stop()
    broker.close()
    await broker.store.close()


async def origin_seqs(broker: Broker, name: str) -> list[int]:
    stream = broker.get_stream(name)
    out = []
    for msg in await broker.read_many(stream, list(stream.seqs())):
        stamp = msg.headers.decode().split("Nats-Stream-Source: ")[1].split("\r\n")[0]
        out.append(int(stamp.split(" ")[1]))
    return out


async def test_mirror_and_source_resume_after_a_rebuild(tmp_path: Path) -> None:
    broker, service = await open_broker(tmp_path)
    await broker.create_stream("O", body(name="O", subjects=["o.*"]))
    for i in range(5):
        await publish(broker, "O", f"o.{i % 2}")
    await broker.create_stream("M", body(name="M", mirror={"name": "O"}))
    await broker.create_stream(
        "S", body(name="S", subjects=["s"], sources=[{"name": "O", "filter_subject": "o.1"}])
    )
    await until(lambda: broker.get_stream("M").last_seq == 5)
    await until(lambda: len(broker.get_stream("S")) == 2)
    assert await origin_seqs(broker, "S") == [2, 4]
    # The feed counts a copy once it is durable, a moment after the stream indexed it.
    await until(lambda: service.info(broker.get_stream("S"))["sources"][0].get("seq") == 4)
    info = service.info(broker.get_stream("S"))["sources"][0]
    assert (info["name"], info["lag"], info["seq"], info["filter_subject"]) == ("O", 0, 4, "o.1")
    await close(broker, service)

    # Rebuilt from the store: each feed starts right after what its stream holds.
    broker, service = await open_broker(tmp_path)
    for i in range(5, 9):
        await publish(broker, "O", f"o.{i % 2}")
    await until(lambda: broker.get_stream("M").last_seq == 9)
    await until(lambda: len(broker.get_stream("S")) == 4)
    await asyncio.sleep(0.05)
    assert await origin_seqs(broker, "S") == [2, 4, 6, 8]
    assert len(broker.get_stream("M")) == 9
    await close(broker, service)


async def test_a_mirror_keeps_its_origins_gaps(tmp_path: Path) -> None:
    broker, service = await open_broker(tmp_path)
    await broker.create_stream("O", body(name="O", subjects=["o"]))
    for _ in range(4):
        await publish(broker, "O", "o")
    await broker.delete_message("O", 2)
    await broker.create_stream("M", body(name="M", mirror={"name": "O"}))
    await until(lambda: broker.get_stream("M").last_seq == 4)
    mirror = broker.get_stream("M")
    assert list(mirror.seqs()) == [1, 3, 4]
    assert mirror.meta(3) is not None and mirror.meta(3).ts == broker.get_stream("O").meta(3).ts  # type: ignore[union-attr]
    await close(broker, service)


async def test_a_missing_origin_is_reported_then_followed(tmp_path: Path) -> None:
    broker, service = await open_broker(tmp_path)
    await broker.create_stream("S", body(name="S", subjects=["s"], sources=[{"name": "LATER"}]))
    stream = broker.get_stream("S")
    await until(lambda: "error" in service.info(stream)["sources"][0])
    assert service.info(stream)["sources"][0]["error"]["err_code"] == 10059
    await broker.create_stream("LATER", body(name="LATER", subjects=["later"]))
    await publish(broker, "LATER", "later")
    await until(lambda: len(broker.get_stream("S")) == 1, within=10)
    assert "error" not in service.info(stream)["sources"][0]
    await close(broker, service)


async def test_a_delete_marker_keeps_the_transformed_subject() -> None:
    # The marker is stored under the subject of the message that expired, which the
    # input transform already produced: transforming it again would move it elsewhere.
    store = MemoryStore()
    await store.open()
    clock = FakeClock()
    broker = Broker(store, clock)
    await broker.load()
    config = body(
        name="T",
        subjects=["k.*"],
        subject_transform={"src": "k.*", "dest": "k.{{partition(7,1)}}"},
        allow_msg_ttl=True,
        subject_delete_marker_ttl=5 * NS,
    )
    await broker.create_stream("T", config)
    seq = await publish(broker, "T", "k.abc", b"NATS/1.0\r\nNats-TTL: 1s\r\n\r\n")
    stream = broker.get_stream("T")
    meta = stream.meta(seq)
    assert meta is not None and meta.subject == "k.5"
    clock.advance(6)  # a TTL below the markers' is raised to it
    await broker.store.flush()
    marker = stream.last_by_subject("k.5")
    assert marker > seq
    assert [m.subject for m in await broker.read_many(stream, list(stream.seqs()))] == ["k.5"]
    broker.close()
    await store.close()


async def test_a_recreated_origin_is_copied_again_from_its_start(tmp_path: Path) -> None:
    broker, service = await open_broker(tmp_path)
    await broker.create_stream("O", body(name="O", subjects=["o"]))
    for _ in range(3):
        await publish(broker, "O", "o")
    await broker.create_stream("S", body(name="S", subjects=["s"], sources=[{"name": "O"}]))
    await until(lambda: len(broker.get_stream("S")) == 3)
    await broker.delete_stream("O")
    broker.clock.advance(1)  # type: ignore[attr-defined]  # another creation time
    await broker.create_stream("O", body(name="O", subjects=["o"]))
    for _ in range(2):
        await publish(broker, "O", "o")
    await until(lambda: len(broker.get_stream("S")) == 5, within=10)
    assert await origin_seqs(broker, "S") == [1, 2, 3, 1, 2]
    await close(broker, service)

    # The new identity is in the newest copy's header: after a restart nothing repeats.
    broker, service = await open_broker(tmp_path)
    await publish(broker, "O", "o")
    await until(lambda: len(broker.get_stream("S")) == 6)
    await asyncio.sleep(0.05)
    assert await origin_seqs(broker, "S") == [1, 2, 3, 1, 2, 3]
    await close(broker, service)
