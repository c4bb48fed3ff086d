"""The server's JetStream limits (nats-server's ``jetstream { max_*_store, limits { } }``):
how a nats-server file, a TOML file and flags set them, and how the engine applies them
(reservations of ``max_bytes``, a full store refusing publishes on every publish path,
consumer and stream defaults and caps, batch limits). tests/conformance compares the
same scenarios with nats-server."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.consumers.config import ConsumerConfig, apply_defaults, validate
from tether.engine.errors import ApiError
from tether.engine.limits import (
    ServerLimits,
    default_max_memory,
    default_max_storage,
    disk_available,
    system_memory,
)
from tether.engine.streams.batches import AtomicBatches
from tether.engine.streams.config import StreamConfig
from tether.server.app import jetstream_limits
from tether.server.banner import friendly_bytes
from tether.server.conf import parse_text
from tether.server.conf.mapping import translate
from tether.server.config import ServerConfig, load_config
from tether.storage.memory import MemoryStore
from tether.storage.sqlite import DB_FILENAME, WAL_SUFFIX

MIB = 1024 * 1024


def conf(text: str) -> tuple[dict[str, Any], list[str], list[str]]:
    result = translate(parse_text(text, filename="t.conf", environ={}))
    return result.values, result.warnings, result.errors


# -- the nats-server file --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("jetstream { max_memory_store: 1MB, max_file_store: 10GB }",
         {"max_memory_store": MIB, "max_file_store": 10 * 1024 * MIB}),
        ('jetstream { max_mem: "512M", max_file: "2G" }',
         {"max_memory_store": 512 * MIB, "max_file_store": 2 * 1024 * MIB}),
        ("jetstream { max_mem_store: 1024 }", {"max_memory_store": 1024}),
        # 0 stores nothing of that kind, as in nats-server; "" is 0 too
        ('jetstream { max_file_store: 0, max_memory_store: "" }',
         {"max_file_store": 0, "max_memory_store": 0}),
        ("jetstream { limits { max_ack_pending: 100, max_request_batch: 10 } }",
         {"js_max_ack_pending": 100, "js_max_request_batch": 10}),
        ('jetstream { limits { duplicate_window: "30s", default_max_consumers: 5 } }',
         {"js_duplicate_window": 30.0, "js_default_max_consumers": 5}),
        ('jetstream { limits { batch { max_inflight_per_stream: 2, max_inflight_total: 3,'
         ' max_msgs: 5, timeout: "1500ms" } } }',
         {"js_batch_max_inflight_per_stream": 2, "js_batch_max_inflight_total": 3,
          "js_batch_max_msgs": 5, "js_batch_timeout": 1.5}),
        # 0 or less keeps nats-server's default
        ('jetstream { limits { max_ack_pending: 0, max_request_batch: -1, duplicate_window: "0s" } }',
         {}),
    ],
)  # fmt: skip
def test_the_jetstream_block_sets_the_limits(text: str, expected: dict[str, Any]) -> None:
    values, warnings, errors = conf(text)
    assert errors == [] and warnings == []
    values.pop("jetstream")
    assert values == expected
    ServerConfig(**values)  # every value is one the settings take


def test_a_negative_store_size_is_nats_servers_default() -> None:
    values, warnings, errors = conf("jetstream {\n  max_file_store: -5, max_mem: -1\n}")
    assert errors == [] and warnings == []
    assert (values["max_file_store"], values["max_memory_store"]) == (-1, -1)


@pytest.mark.parametrize(("count", "expected"), [(0, {}), (-1, -1), (-7, -1), (5, 5)])
def test_default_max_consumers_keeps_lifts_or_sets_the_bound(
    count: int, expected: dict[str, Any] | int
) -> None:
    values, _, errors = conf(f"jetstream {{ limits {{ default_max_consumers: {count} }} }}")
    assert errors == []
    got = values.get("js_default_max_consumers", {})
    assert got == expected
    limits = jetstream_limits(
        ServerConfig(js_default_max_consumers=values.get("js_default_max_consumers", 0))
    )
    assert limits.report()["default_max_consumers"] == (1000 if expected == {} else expected)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('jetstream {\n  max_file_store: "10X"\n}',
         "t.conf:2:3: jetstream.max_file_store: sizes defined as strings must end in K, M, G, T"),
        ('jetstream {\n  max_memory_store: "xM"\n}',
         "t.conf:2:3: jetstream.max_memory_store: 'xM' is not a size"),
        ("jetstream {\n  max_file_store: true\n}",
         "t.conf:2:3: jetstream.max_file_store: must be int64 or string, got a boolean"),
        ("jetstream {\n  limits: 5\n}",
         "t.conf:2:3: jetstream.limits: expected a map { ... }, got 5"),
        ("jetstream { limits {\n  max_batch_size: 5\n} }",
         't.conf:2:3: unknown field "jetstream.limits.max_batch_size"'),
        ("jetstream { limits { batch {\n  size: 5\n} } }",
         't.conf:2:3: unknown field "jetstream.limits.batch.size"'),
        ("jetstream { limits {\n  duplicate_window: 30\n} }",
         't.conf:2:3: jetstream.limits.duplicate_window: expected a duration such as "2m", got 30'),
        ('jetstream { limits {\n  max_ack_pending: "x"\n} }',
         "t.conf:2:3: jetstream.limits.max_ack_pending: expected an integer, got the string 'x'"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_with_their_place(text: str, error: str) -> None:
    _, _, errors = conf(text)
    assert errors == [error]


def test_max_ha_assets_is_warned_about() -> None:
    _, warnings, errors = conf("jetstream { limits {\n  max_ha_assets: 3\n} }")
    assert errors == []
    assert warnings == [
        "t.conf:2:3: jetstream.limits.max_ha_assets ignored: Tether runs as a single server: "
        "nothing is replicated"
    ]


def test_toml_keys_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "tether.toml"
    path.write_text(
        "max_file_store = 1048576\njs_max_ack_pending = 50\njs_duplicate_window = 30.0\n"
        "js_batch_timeout = 2.5\n"
    )
    cfg = load_config(path, {"max_memory_store": 4096, "max_file_store": None})
    assert (cfg.max_memory_store, cfg.max_file_store) == (4096, MIB)
    limits = jetstream_limits(cfg)
    assert limits == ServerLimits(
        max_memory=4096,
        max_storage=MIB,
        max_ack_pending=50,
        duplicate_window_ns=30_000_000_000,
        batch_timeout_ns=2_500_000_000,
    )
    assert limits.report() == {
        "max_ack_pending": 50,
        "max_duplicate_window": 30_000_000_000,
        "max_batch_timeout": 2_500_000_000,
        "default_max_consumers": 1000,
    }
    path.write_text("max_file_store = -2\n")
    with pytest.raises(ValueError, match="max_file_store"):
        load_config(path, {})


def test_an_engine_alone_has_no_size_bound() -> None:
    limits = ServerLimits()
    assert not limits.sized
    assert limits.report() == {"default_max_consumers": 1000}


# -- nats-server's defaults when the sizes are unset -----------------------------------


def test_the_memory_default_is_three_quarters_of_the_ram() -> None:
    # A quarter first, then times 3, as nats-server rounds.
    assert default_max_memory(1003) == 750
    assert default_max_memory(0) == 256 * MIB  # unknown: nats-server's guess
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert system_memory() == ram
    assert default_max_memory() == ram // 4 * 3
    # A store in RAM holds both kinds of stream there: each default is half of it.
    assert default_max_memory(1003, memory_only=True) == 375


class Disk:
    """A file system of ``capacity`` bytes holding the files under ``root`` (plus
    ``taken`` bytes of other writers), in place of ``os.statvfs``: the free space
    shrinks as files grow, and no other process's writes move it."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root, self.capacity, self.taken = root, capacity, 0

    def used(self) -> int:
        return self.taken + sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())

    def statvfs(self, path: Any) -> SimpleNamespace:
        assert Path(path).exists()  # the nearest existing directory is read
        return SimpleNamespace(f_bavail=(self.capacity - self.used()) // 4096, f_bsize=4096)


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Disk:
    fake = Disk(tmp_path, 16 * MIB)
    monkeypatch.setattr(os, "statvfs", fake.statvfs)
    return fake


def test_the_storage_default_is_three_quarters_of_the_free_disk(tmp_path: Path, disk: Disk) -> None:
    for directory in (tmp_path, tmp_path / "not" / "made" / "yet"):
        assert disk_available(directory) == 16 * MIB // 4 * 3
    assert not (tmp_path / "not").exists()  # nothing is made to read it
    disk.taken = 4 * MIB
    assert default_max_storage(tmp_path, memory_only=False) == 12 * MIB // 4 * 3
    assert default_max_storage(None, memory_only=False) == 1024**4  # no local disk: 1 TiB
    # A store in RAM: "file" streams get the other half of the RAM's share.
    assert default_max_storage(tmp_path, memory_only=True) == default_max_memory() // 2


def test_the_store_s_own_files_count_as_available(tmp_path: Path, disk: Disk) -> None:
    # nats-server takes the free disk alone; a store holding data would get a smaller
    # bound on each restart (none at all once it holds 3/4 of the disk).
    def bound() -> int:
        return jetstream_limits(ServerConfig(store=f"sqlite:{tmp_path}")).max_storage

    first = bound()
    assert first == 16 * MIB // 4 * 3
    (tmp_path / DB_FILENAME).write_bytes(b"d" * 9 * MIB)  # its data and free pages
    (tmp_path / (DB_FILENAME + WAL_SUFFIX)).write_bytes(b"w" * 3 * MIB)
    assert bound() == first  # a restart: the same bound
    (tmp_path / "other").write_bytes(b"o" * 2 * MIB)  # others' files take room
    assert bound() == 14 * MIB // 4 * 3
    # A store directory not made yet holds nothing of its own.
    sub = ServerConfig(store=f"sqlite://{tmp_path}/sub")
    assert jetstream_limits(sub).max_storage == 2 * MIB // 4 * 3


def test_unset_sizes_are_worked_out_from_the_store(tmp_path: Path, disk: Disk) -> None:
    ram = default_max_memory()
    for store, memory, storage in [
        (f"sqlite:{tmp_path}", ram, 12 * MIB),
        (f"sqlite://{tmp_path}/sub", ram, 12 * MIB),
        # Every stream lives in RAM: the two share nats-server's 3/4 of it.
        ("memory", ram // 2, ram // 2),
        ("postgresql://u@h/db", ram, 1024**4),
    ]:
        limits = jetstream_limits(ServerConfig(store=store))
        assert (limits.max_memory, limits.max_storage) == (memory, storage)
        assert limits.sized
        assert limits.report() == {"default_max_consumers": 1000}
    limits = jetstream_limits(ServerConfig(store="memory"))
    assert limits.max_memory + limits.max_storage <= ram
    # Set sizes stay as set, 0 included.
    limits = jetstream_limits(ServerConfig(max_memory_store=0, max_file_store=5))
    assert (limits.max_memory, limits.max_storage) == (0, 5)
    limits = jetstream_limits(ServerConfig(store="memory", max_memory_store=ram))
    assert (limits.max_memory, limits.max_storage) == (ram, ram // 2)


def test_the_bounds_are_logged_as_nats_server_logs_them() -> None:
    # nats-server's friendlyBytes: "Max Memory:      17.66 GB"
    assert friendly_bytes(18957385728) == "17.66 GB"
    assert [friendly_bytes(n) for n in (0, 1023, 1024, 1536 * MIB, 1024**4)] == [
        "0 B",
        "1023 B",
        "1.00 KB",
        "1.50 GB",
        "1.00 TB",
    ]


async def test_the_worked_out_bound_is_enforced_as_a_set_one(tmp_path: Path) -> None:
    limits = jetstream_limits(ServerConfig(store="memory"))
    broker = await broker_with(limits)
    bound = limits.max_memory
    assert await refused(broker, "M", {"storage": "memory", "max_bytes": bound + 1}) == 10028
    await broker.create_stream(
        "M", body(name="M", subjects=["m"], max_bytes=bound, storage="memory")
    )
    assert await refused(broker, "N", {"storage": "memory"}) == 10028  # no byte left
    broker.close()


# -- reservations ------------------------------------------------------------------------


def test_check_reservation_is_nats_servers_check_bytes_limits() -> None:
    limits = ServerLimits(max_memory=100, max_storage=1000)
    limits.check_reservation("file", 600, 400)  # exactly full
    with pytest.raises(ApiError) as exc:
        limits.check_reservation("file", 601, 400)
    assert (exc.value.code, exc.value.err_code) == (500, 10047)
    with pytest.raises(ApiError) as exc:
        limits.check_reservation("file", -1, 1000)  # no max_bytes still needs a byte
    assert exc.value.err_code == 10047
    limits.check_reservation("file", 0, 1000)  # an unchanged max_bytes needs none
    with pytest.raises(ApiError) as exc:
        limits.check_reservation("memory", 0, 101)  # already over: nothing passes
    assert (exc.value.err_code, exc.value.description) == (
        10028,
        "insufficient memory resources available",
    )
    ServerLimits().check_reservation("file", 10**18, 10**18)  # no bound


def body(**config: Any) -> bytes:
    return json.dumps(config).encode()


async def broker_with(limits: ServerLimits) -> Broker:
    store = MemoryStore()
    await store.open()
    broker = Broker(store, FakeClock())
    broker.set_limits(limits)
    await broker.load()
    return broker


async def refused(broker: Broker, name: str, config: dict[str, Any]) -> int:
    with pytest.raises(ApiError) as exc:
        await broker.create_stream(name, body(name=name, **config))
    return exc.value.err_code


async def test_max_bytes_is_reserved_per_storage() -> None:
    broker = await broker_with(ServerLimits(max_memory=1000, max_storage=2000))
    assert await refused(broker, "F", {"storage": "file", "max_bytes": 2001}) == 10047
    await broker.create_stream("F", body(name="F", subjects=["f"], storage="file", max_bytes=1500))
    # nats-server counts the stream's own reservation again on an identical create.
    assert await refused(broker, "F", {"subjects": ["f"], "storage": "file", "max_bytes": 1500})
    assert await refused(broker, "G", {"storage": "file", "max_bytes": 501}) == 10047
    await broker.create_stream("G", body(name="G", subjects=["g"], storage="file", max_bytes=500))
    # No room left: a stream without max_bytes needs one byte, even naming no storage.
    assert await refused(broker, "H", {"storage": "file"}) == 10047
    assert await refused(broker, "H", {"subjects": ["h"]}) == 10047
    # The request's max_bytes is checked before the rest of its configuration.
    assert await refused(broker, "H", {"storage": "file", "max_bytes": 9, "max_age": -1}) == 10047
    # Memory streams have their own bound.
    assert await refused(broker, "M", {"storage": "memory", "max_bytes": 1001}) == 10028
    await broker.create_stream("M", body(name="M", subjects=["m"], storage="memory"))
    usage = broker.account_usage()
    assert (usage["reserved_storage"], usage["reserved_memory"]) == (2000, 0)
    # An update reserves only what it adds.
    with pytest.raises(ApiError) as exc:
        await broker.update_stream(
            "F", body(name="F", subjects=["f"], storage="file", max_bytes=1501)
        )
    assert exc.value.err_code == 10047
    await broker.update_stream("F", body(name="F", subjects=["f"], storage="file", max_bytes=1000))
    assert broker.account_usage()["reserved_storage"] == 1500
    broker.close()


async def test_the_duplicate_window_is_capped() -> None:
    broker = await broker_with(ServerLimits(duplicate_window_ns=30_000_000_000))
    stream, _ = await broker.create_stream("D", body(name="D", subjects=["d"]))
    assert stream.config.duplicate_window == 30_000_000_000  # the default, capped
    with pytest.raises(ApiError) as exc:
        await broker.create_stream(
            "E", body(name="E", subjects=["e"], duplicate_window=60_000_000_000)
        )
    assert (exc.value.err_code, exc.value.description) == (
        10052,
        "duplicates window can not be larger then server limit of 30s",
    )
    broker.close()


# -- a full store ------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.acks: list[Any] = []

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        self.acks += [("ack", first_seq + i) for i in range(len(replies))]

    def pub_failed(self, stream: str, replies: list[str], error: ApiError) -> None:
        self.acks += [("err", error.err_code)] * len(replies)


async def test_a_full_store_refuses_publishes_on_every_path() -> None:
    # A file stream counts subject + payload + 30: "f" with 69 bytes is 100.
    broker = await broker_with(ServerLimits(max_storage=250))
    await broker.create_stream("F", body(name="F", subjects=["f", "g.*"], storage="file"))
    await broker.create_stream("N", body(name="N", subjects=["n"], storage="memory"))
    stream = broker.get_stream("F")
    sink = Sink()
    # The message that crosses the bound is stored, the next is refused (10023).
    broker.publish_many(stream, "f", [b"x" * 69] * 4, ["r1", "r2", "r3", "r4"], sink)
    await broker.store.flush()
    # (a refusal is told at once, the acks after the commit)
    assert sorted(sink.acks) == [("ack", 1), ("ack", 2), ("ack", 3), ("err", 10023)]
    assert stream.state.bytes == 300
    out: list[PubAck | ApiError] = []
    broker.publish(stream, "f", b"NATS/1.0\r\nK: v\r\n\r\n", b"x", out.append)
    broker.publish(stream, "f", None, b"x", out.append)
    assert [(e.code, e.err_code, e.description) for e in out if isinstance(e, ApiError)] == [
        (503, 10023, "insufficient resources")
    ] * 2
    sink.acks.clear()
    broker.publish_mixed(stream, ["g.1", "g.2"], [b"a", b"b"], ["r1", "r2"], sink)
    broker.publish_headered(stream, "f", [b"NATS/1.0\r\nK: v\r\n\r\n"], [b"a"], ["r"], sink)
    assert sink.acks == [("err", 10023)] * 3
    # Memory streams are bounded apart: this one has no bound.
    broker.publish(broker.get_stream("N"), "n", None, b"x" * 1000, out.append)
    await broker.store.flush()
    assert out[-1] == PubAck("N", 1)
    # Room again once messages go.
    await broker.purge_stream("F", "", 0, 0)
    broker.publish(stream, "f", None, b"x", out.append)
    await broker.store.flush()
    assert out[-1] == PubAck("F", 4)
    broker.close()


@pytest.mark.parametrize("path", ["many", "mixed", "headered"])
async def test_a_run_crossing_the_bound_is_refused_from_the_same_message(path: str) -> None:
    """The run paths store what fits in one go, and refuse from where one publish at a
    time would: after the message that crosses the bound."""

    async def run(one_by_one: bool) -> list[Any]:
        broker = await broker_with(ServerLimits(max_storage=1000))
        await broker.create_stream("F", body(name="F", subjects=["f.*"], storage="file"))
        stream = broker.get_stream("F")
        sink = Sink()
        hdrs = b"NATS/1.0\r\nK: v\r\n\r\n"
        n = 15
        subjects = ["f.a"] * 5 + ["f.b"] * 10
        payloads = [b"x" * 70] * n
        replies = [f"r{i}" for i in range(n)]
        if one_by_one:
            for i in range(n):
                head = hdrs if path == "headered" else None
                subject = subjects[i] if path == "mixed" else "f.a"

                def told(result: PubAck | ApiError) -> None:
                    if isinstance(result, ApiError):
                        sink.acks.append(("err", result.err_code))
                    else:
                        sink.acks.append(("ack", result.seq))

                broker.publish(stream, subject, head, payloads[i], told)
        else:
            # Five that fit (stored in one go), then ten that cross the bound.
            for part in (slice(0, 5), slice(5, n)):
                p, r = payloads[part], replies[part]
                if path == "many":
                    broker.publish_many(stream, "f.a", p, r, sink)
                elif path == "mixed":
                    broker.publish_mixed(stream, subjects[part], p, r, sink)
                else:
                    assert broker.publish_headered(stream, "f.a", [hdrs] * len(p), p, r, sink)
        await broker.store.flush()
        await asyncio.sleep(0)
        out = [sorted(sink.acks), stream.state.msgs, stream.state.bytes]
        broker.close()
        return out

    batched, single = await run(False), await run(True)
    assert batched == single
    assert ("err", 10023) in batched[0] and batched[1] < 15


async def test_the_streams_of_one_storage_share_the_bound() -> None:
    broker = await broker_with(ServerLimits(max_storage=250))
    for name in ("A", "B"):
        await broker.create_stream(name, body(name=name, subjects=[name.lower()]))
    out: list[PubAck | ApiError] = []
    for _ in range(3):
        broker.publish(broker.get_stream("A"), "a", None, b"x" * 69, out.append)
    await broker.store.flush()
    broker.publish(broker.get_stream("B"), "b", None, b"x", out.append)
    await broker.store.flush()
    assert out == [PubAck("A", 1), PubAck("A", 2), PubAck("A", 3), out[-1]]
    assert isinstance(out[-1], ApiError) and out[-1].err_code == 10023
    await broker.delete_stream("A")
    await broker.store.flush()
    broker.publish(broker.get_stream("B"), "b", None, b"x", out.append)
    await broker.store.flush()
    assert out[-1] == PubAck("B", 1)
    broker.close()


async def test_the_other_streams_bytes_count_at_once() -> None:
    # nats-server keeps the bytes of each storage as they change: what one stream
    # stores counts for the next publish to another, in the same loop turn too.
    broker = await broker_with(ServerLimits(max_storage=250))
    for name in ("A", "B"):
        await broker.create_stream(name, body(name=name, subjects=[name.lower()]))
    a, b = broker.get_stream("A"), broker.get_stream("B")
    out: list[PubAck | ApiError] = []
    broker.publish(b, "b", None, b"x" * 69, out.append)
    for _ in range(2):
        broker.publish(a, "a", None, b"x" * 69, out.append)
    broker.publish(b, "b", None, b"x", out.append)  # 300 bytes held: refused
    await broker.store.flush()
    # (a refusal is told at once, the acks after the commit)
    assert isinstance(out[0], ApiError) and out[0].err_code == 10023
    assert out[1:] == [PubAck("B", 1), PubAck("A", 1), PubAck("A", 2)]
    broker.close()


class NoPass(dict[str, Any]):
    """Streams that refuse to be gone through (a publish must not sum every stream)."""

    def values(self) -> Any:
        raise AssertionError("a pass over every stream")


async def test_a_publish_under_a_bound_does_not_go_through_every_stream() -> None:
    broker = await broker_with(ServerLimits(max_memory=10_000, max_storage=10_000))
    for i in range(3):
        await broker.create_stream(f"S{i}", body(name=f"S{i}", subjects=[f"s.{i}"]))
    stream = broker.get_stream("S0")
    out: list[PubAck | ApiError] = []
    broker.streams = NoPass(broker.streams)
    sink = Sink()
    for _ in range(3):
        broker.publish(stream, "s.0", None, b"x", out.append)
        broker.publish_many(stream, "s.0", [b"y"] * 2, ["r1", "r2"], sink)
        await asyncio.sleep(0)
    await broker.store.flush()
    await asyncio.sleep(0)
    assert out == [PubAck("S0", seq) for seq in (1, 4, 7)]
    assert broker.used("file") == 9 * (3 + 1 + 30)
    broker.streams = dict(broker.streams)
    broker.close()


async def test_the_bytes_held_follow_every_change() -> None:
    store = MemoryStore()
    await store.open()
    broker = Broker(store, FakeClock())
    broker.set_limits(ServerLimits(max_memory=1 << 30, max_storage=1 << 30))
    await broker.load()

    def held() -> tuple[int, int]:
        streams = broker.streams.values()
        file = sum(s.state.bytes for s in streams if s.config.storage == "file")
        memory = sum(s.state.bytes for s in streams if s.config.storage == "memory")
        assert (broker.used("file"), broker.used("memory")) == (file, memory)
        return file, memory

    await broker.create_stream("F", body(name="F", subjects=["f.*"], max_msgs=5))
    await broker.create_stream("M", body(name="M", subjects=["m"], storage="memory"))
    await broker.create_stream("G", body(name="G", subjects=["g"], max_bytes=500))
    sink = Sink()
    out: list[PubAck | ApiError] = []
    broker.publish_many(broker.get_stream("F"), "f.a", [b"x" * 10] * 8, ["r"] * 8, sink)
    broker.publish_mixed(broker.get_stream("F"), ["f.a", "f.b"], [b"a", b"b"], ["r"] * 2, sink)
    for _ in range(4):
        broker.publish(broker.get_stream("M"), "m", None, b"m" * 50, out.append)
        broker.publish(broker.get_stream("G"), "g", None, b"g" * 200, out.append)
    await store.flush()
    assert held()[0] > 0 and held()[1] > 0
    await broker.purge_stream("F", "f.b", 0, 0)
    assert held()
    await broker.update_stream("F", body(name="F", subjects=["f.*"], max_msgs=2))
    assert held()
    await store.flush()
    before = held()
    broker.close()
    # A restart counts what the store holds.
    broker = Broker(store, FakeClock())
    broker.set_limits(ServerLimits(max_memory=1 << 30, max_storage=1 << 30))
    await broker.load()
    assert held() == before
    gone = broker.get_stream("G")
    await broker.delete_stream("G")
    assert held()[0] == before[0] - gone.state.bytes > 0
    gone.remove(gone.state.last_seq)  # a deleted stream no longer counts
    await broker.delete_stream("M")
    assert held() == (before[0] - 2 * (1 + 200 + 30), 0)
    broker.close()


async def test_an_atomic_batch_is_refused_when_the_store_is_full() -> None:
    broker = await broker_with(ServerLimits(max_memory=10))
    await broker.create_stream(
        "A", body(name="A", subjects=["a"], storage="memory", allow_atomic=True)
    )
    stream = broker.get_stream("A")
    out: list[PubAck | ApiError] = []
    broker.publish(stream, "a", None, b"x" * 20, out.append)
    await broker.store.flush()
    block = b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-Batch-Sequence: 1\r\n\r\n"
    assert broker.publish_batch_message(stream, "a", block, b"y", out.append)
    assert isinstance(out[-1], ApiError) and out[-1].err_code == 10023
    broker.close()


# -- consumers and batches ---------------------------------------------------------------


def test_consumer_defaults_and_caps() -> None:
    limits = ServerLimits(max_ack_pending=100, max_request_batch=10)
    stream = StreamConfig(name="S", subjects=["s"])
    pull = apply_defaults(
        ConsumerConfig(durable_name="c", ack_policy="explicit"), stream, False, limits
    )
    assert (pull.max_ack_pending, pull.max_batch) == (100, 10)
    validate(pull, stream, limits)
    push = apply_defaults(
        ConsumerConfig(durable_name="p", ack_policy="explicit", deliver_subject="d"),
        stream,
        False,
        limits,
    )
    assert (push.max_ack_pending, push.max_batch) == (100, 0)
    for config, code, text in [
        (ConsumerConfig(durable_name="c", ack_policy="explicit", max_ack_pending=101), 10121,
         "consumer max ack pending exceeds system limit of 100"),
        (ConsumerConfig(durable_name="c", ack_policy="explicit", max_batch=11), 10125,
         "consumer max request batch exceeds server limit of 10"),
    ]:  # fmt: skip
        apply_defaults(config, stream, False, limits)
        with pytest.raises(ApiError) as exc:
            validate(config, stream, limits)
        assert (exc.value.code, exc.value.err_code, exc.value.description) == (400, code, text)
    with pytest.raises(ApiError) as exc:
        apply_defaults(ConsumerConfig(durable_name="c"), stream, True, limits)
    assert exc.value.err_code == 10157
    # A stream's consumer_limits bound it too, with the same error.
    bounded = StreamConfig(name="S", subjects=["s"], consumer_limits={"max_ack_pending": 50})
    config = ConsumerConfig(durable_name="c", ack_policy="explicit", max_ack_pending=60)
    with pytest.raises(ApiError) as exc:
        validate(apply_defaults(config, bounded, False, limits), bounded, limits)
    assert exc.value.description == "consumer max ack pending exceeds system limit of 50"
    # A larger server limit leaves nats-server's default of 1000.
    big = apply_defaults(
        ConsumerConfig(durable_name="c", ack_policy="explicit"),
        stream,
        False,
        ServerLimits(max_ack_pending=5000),
    )
    assert big.max_ack_pending == 1000


async def test_atomic_batch_limits_follow_the_settings() -> None:
    broker = await broker_with(
        ServerLimits(batch_max_msgs=5, batch_inflight_per_stream=2, batch_timeout_ns=2 * 10**9)
    )
    limits = broker.batches.limits
    assert (limits.max_size, limits.inflight_per_stream, limits.timeout_ns) == (5, 2, 2 * 10**9)
    assert limits.inflight_total == AtomicBatches(FakeClock()).limits.inflight_total
    broker.close()
