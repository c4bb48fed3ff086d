"""Discovery: nsqlookupd's HTTP API served by every node, about itself and its peers.
Two nodes told about each other; pynsq's Reader given one node's address as its
``lookupd_http_addresses`` finds the producers of a topic on both, and so does
``tether.client.Worker`` with discovery."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import nsq
import pytest

from tether.client import AckPolicy, ConsumerConfig, DeliverPolicy, Worker
from tether.client.discovery import Discovery, Producer, jetstream_connector
from tether.testing import RunningServer, run_server

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until(condition: Callable[[], bool], within: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, RunningServer]]:
    fast = tmp_path_factory.mktemp("lookupd") / "tether.toml"
    fast.write_text("nsq_lookupd_poll_interval = 0.3\n")  # peers polled often
    http_a, http_b, dead = free_port(), free_port(), free_port()
    peer_a = [
        "--nsq-lookupd-peer",
        f"127.0.0.1:{http_b}",
        "--nsq-lookupd-peer",
        f"127.0.0.1:{dead}",
    ]
    peer_b = ["--nsq-lookupd-peer", f"127.0.0.1:{http_a}", "--nsq-lookupd-http-port", "-1"]
    with (
        run_server(http_port=http_a, args=[*peer_a, "--config", str(fast)]) as a,
        run_server(http_port=http_b, args=[*peer_b, "--config", str(fast)]) as b,
    ):
        yield a, b


T = TypeVar("T")


async def until(get: Callable[[], Awaitable[T]], done: Callable[[T], Any], within: float = 15) -> T:
    """``get()`` again until ``done`` says yes (peers are polled; a poll may time out
    under load and leave a peer out until the next one)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = await get()
        if done(got):
            return got
        assert loop.time() < deadline, got
        await asyncio.sleep(0.1)


async def lookup(server: RunningServer, topic: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"{server.http_url}/lookup", params={"topic": topic}, headers=V1)


async def publish(server: RunningServer, topic: str, body: bytes) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{server.http_url}/pub", params={"topic": topic}, content=body)
        assert r.status_code == 200


async def test_lookup_lists_producers_on_both_nodes(
    pair: tuple[RunningServer, RunningServer],
) -> None:
    a, b = pair
    await publish(a, "both", b"from a")
    await publish(b, "both", b"from b")
    await publish(b, "only_b", b"x")
    ports: set[int] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while ports != {a.nsq_port, b.nsq_port}:
        assert loop.time() < deadline, ports
        r = await lookup(a, "both")
        if r.status_code == 200:
            ports = {p["tcp_port"] for p in r.json()["producers"]}
        await asyncio.sleep(0.1)
    doc = (await lookup(a, "both")).json()
    for producer in doc["producers"]:
        assert set(producer) >= {
            "remote_address",
            "hostname",
            "broadcast_address",
            "tcp_port",
            "http_port",
            "version",
        }
        assert producer["broadcast_address"] == "127.0.0.1"
    assert {p["http_port"] for p in doc["producers"]} == {a.http_port, b.http_port}
    # A topic only b has: a still finds it; one nobody has is 404.
    r = await until(lambda: lookup(a, "only_b"), lambda r: r.status_code == 200)
    assert [p["tcp_port"] for p in r.json()["producers"]] == [b.nsq_port]
    r = await lookup(a, "nobody")
    assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
    async with httpx.AsyncClient(base_url=a.http_url, headers=V1) as http:
        topics = (await http.get("/topics")).json()["topics"]
        assert {"both", "only_b"} <= set(topics)
        nodes = (await http.get("/nodes")).json()["producers"]
        assert {n["tcp_port"] for n in nodes} == {a.nsq_port, b.nsq_port}  # the dead peer is not
        assert (await http.get("/lookup")).json() == {"message": "MISSING_ARG_TOPIC"}
        assert (await http.get("/ping")).text == "OK"


async def test_a_tombstoned_producer_leaves_the_lookup(
    pair: tuple[RunningServer, RunningServer],
) -> None:
    a, b = pair
    await publish(a, "graves", b"from a")
    await publish(b, "graves", b"from b")
    node_b = f"127.0.0.1:{b.http_port}"

    def has_both(r: httpx.Response) -> bool:
        return r.status_code == 200 and len(r.json()["producers"]) == 2

    await until(lambda: lookup(a, "graves"), has_both)  # a has polled b
    async with httpx.AsyncClient(base_url=a.http_url) as http:

        async def tombstone_then_nodes() -> dict[int, Any]:
            r = await http.post("/topic/tombstone", params={"topic": "graves", "node": node_b})
            assert (r.status_code, r.text) == (200, "")
            nodes = (await http.get("/nodes")).json()["producers"]
            return {
                n["tcp_port"]: dict(zip(n["topics"], n["tombstones"], strict=True)) for n in nodes
            }

        # (Retried: under load a poll of b may time out, and b is left out until the next.)
        nodes = await until(tombstone_then_nodes, lambda n: n.get(b.nsq_port, {}).get("graves"))
        assert nodes[a.nsq_port]["graves"] is False
        doc = (await lookup(a, "graves")).json()
        assert [p["tcp_port"] for p in doc["producers"]] == [a.nsq_port]
        r = await http.post("/topic/tombstone", params={"topic": "graves"})
        assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_NODE"})
        r = await http.post("/topic/tombstone", params={"node": node_b})
        assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
        r = await http.get("/topic/tombstone", params={"topic": "graves", "node": node_b})
        assert r.status_code == 405
    # b's own answer is its own: the tombstone was a's.
    await until(lambda: lookup(b, "graves"), has_both)


async def test_lookupd_s_own_port(pair: tuple[RunningServer, RunningServer]) -> None:
    _, b = pair
    port = int(b.stderr.split("Listening for nsqlookupd queries on 127.0.0.1:")[1].split()[0])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=V1) as http:
        assert (await http.get("/ping")).text == "OK"
        assert set((await http.get("/info")).json()) == {"version"}
        assert (await http.get("/channels")).json() == {"message": "MISSING_ARG_TOPIC"}
        assert (await http.post("/pub?topic=x", content=b"x")).status_code == 404


async def test_a_pynsq_reader_discovers_both_nodes(
    pair: tuple[RunningServer, RunningServer],
) -> None:
    a, b = pair
    await publish(a, "disc", b"a1")
    await publish(b, "disc", b"b1")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        r = await lookup(a, "disc")
        if r.status_code == 200 and len(r.json()["producers"]) == 2:
            break
        assert loop.time() < deadline
        await asyncio.sleep(0.1)
    got: list[bytes] = []

    def handler(msg: nsq.Message) -> bool:
        got.append(msg.body)
        return True

    reader = nsq.Reader(
        topic="disc",
        channel="c",
        lookupd_http_addresses=[a.http_url],
        lookupd_poll_interval=1,
        message_handler=handler,
        max_in_flight=10,
    )
    try:
        await wait_until(lambda: len(reader.conns) == 2)
        await wait_until(lambda: sorted(got) == [b"a1", b"b1"])
        await publish(b, "disc", b"b2")
        await wait_until(lambda: b"b2" in got)
    finally:
        reader.close()


async def test_a_worker_discovers_both_nodes(pair: tuple[RunningServer, RunningServer]) -> None:
    """tether.client.Worker with discovery: lookups on one node, a source per producer
    (over NATS, on the topic's stream), ``max_in_flight`` shared by both."""
    a, b = pair
    for srv, body in ((a, b"wa1"), (a, b"wa2"), (b, b"wb1"), (b, b"wb2")):
        await publish(srv, "work", body)
    config = ConsumerConfig(
        durable_name="workers", ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL
    )
    connect, close = jetstream_connector("NSQ_work", "workers", config)
    discovery = Discovery([a.http_url], "work", connect, poll_interval=0.3)
    got: list[bytes] = []

    async def handler(msg: Any) -> None:
        got.append(msg.data)

    worker = Worker([], handler, max_in_flight=3, heartbeat=None, discovery=discovery)
    try:
        await worker.start()
        await wait_until(lambda: sorted(got) == [b"wa1", b"wa2", b"wb1", b"wb2"])
        assert set(discovery.known) == {f"127.0.0.1:{a.nsq_port}", f"127.0.0.1:{b.nsq_port}"}
        assert sum(s.rdy for s in worker.ready.sources) <= 3
        await publish(b, "work", b"wb3")
        await wait_until(lambda: b"wb3" in got)
    finally:
        await worker.stop()
        await close()


async def test_discovery_skips_an_address_that_does_not_answer() -> None:
    async def never(producer: Producer) -> None:
        raise AssertionError("nothing to connect to")

    discovery = Discovery([f"127.0.0.1:{free_port()}"], "t", never, request_timeout=0.5)
    assert await discovery.poll() == []
    assert list(discovery.failed) == discovery.addresses
