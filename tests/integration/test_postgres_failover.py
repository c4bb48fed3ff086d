"""Two Tether nodes over one PostgreSQL database: one active, one standby.

Against a real PostgreSQL server (the session's ``postgres_server``), with nats-py
clients given both nodes' URLs:

* kill -9 of the active node under acked publish and consume load: the standby is
  active within the configured bound, no acknowledged message is lost or stored
  twice, and the consumer goes on from its ack floor;
* fencing: the active node is paused (SIGSTOP) until the standby has taken over; once
  resumed, its writes are refused and it steps down (exit status 3);
* PostgreSQL restarted under load: clear errors while it is down, then the node goes
  on, with every acknowledged message stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.client import JetStreamContext

from tether.testing import HaNode, PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

POLL = 0.2
SESSION_TIMEOUT = 2.0
# A crashed node's session ends at once: the standby takes the lock at its next poll,
# then loads the store and opens its listener.
TAKEOVER_BOUND = POLL + 4.0

_databases = itertools.count(1)


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database(f"failover_{next(_databases)}")


def _node(name: str, database: str, tmp_path: Path) -> HaNode:
    return HaNode(name, database, tmp_path, poll=POLL, session_timeout=SESSION_TIMEOUT)


@pytest.fixture
def pair(database: str, tmp_path: Path) -> Iterator[tuple[HaNode, HaNode]]:
    a, b = _node("a", database, tmp_path), _node("b", database, tmp_path)
    a.peers, b.peers = [b.port], [a.port]
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


async def _start_pair(a: HaNode, b: HaNode) -> None:
    a.start()
    await a.wait_for("Server is ready", 30)
    b.start()
    await b.wait_for("Standby: another node is active", 30)


@contextlib.asynccontextmanager
async def _client(*urls: str, reconnect: bool = True) -> AsyncIterator[nats.NATS]:
    nc = await nats.connect(
        servers=list(urls),
        allow_reconnect=reconnect,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.05,
        connect_timeout=1,
        dont_randomize=True,
    )
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _publish_until_acked(js: object, i: int, errors: list[str]) -> None:
    """Publish message ``i`` (its id as Nats-Msg-Id) until it is acknowledged."""
    while True:
        try:
            await js.publish(  # type: ignore[attr-defined]
                f"orders.{i % 7}", str(i).encode(), headers={"Nats-Msg-Id": str(i)}, timeout=2
            )
            return
        except (NatsError, TimeoutError, OSError) as exc:
            errors.append(repr(exc))
            await asyncio.sleep(0.05)


async def test_kill_9_of_the_active_node_under_load(pair: tuple[HaNode, HaNode]) -> None:
    a, b = pair
    await _start_pair(a, b)
    assert a.http("/readyz") == (200, {"status": "ok", "role": "active"})
    assert b.http("/readyz") == (503, {"status": "unavailable", "role": "standby"})
    assert b.http("/healthz") == (200, {"status": "ok", "role": "standby"})

    total = 1500
    async with _client(a.url, b.url) as nc:
        assert nc.connected_url is not None and nc.connected_url.port == a.port
        assert {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"} <= set(
            nc._server_info.get("connect_urls", [])
        )
        js = nc.jetstream(timeout=2)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        await js.add_consumer(
            "ORDERS",
            # Deliveries whose ack died with the node come again after ack_wait.
            ConsumerConfig(durable_name="work", ack_policy=AckPolicy.EXPLICIT, ack_wait=2),
        )
        sub = await js.pull_subscribe_bind("work", "ORDERS")

        acked: set[int] = set()
        pub_errors: list[str] = []
        seen: Counter[int] = Counter()
        confirmed: set[int] = set()  # acks the server confirmed (double ack)
        after_confirmed: list[int] = []  # delivered again although the ack was confirmed
        kill_at = asyncio.Event()
        finished = asyncio.Event()

        async def publisher(lane: int, lanes: int) -> None:
            for i in range(lane, total, lanes):
                await _publish_until_acked(js, i, pub_errors)
                acked.add(i)
                if len(acked) >= total // 3:
                    kill_at.set()

        async def consumer() -> None:
            # Runs until the consumer has nothing left, not until every ack was
            # confirmed: an ack applied whose reply was lost (the node died, or the
            # reply came after the client's timeout) is rightly never delivered again.
            while not finished.is_set():
                try:
                    msgs = await sub.fetch(100, timeout=0.5)
                except (NatsError, TimeoutError, OSError):
                    await asyncio.sleep(0.02)
                    continue
                for m in msgs:
                    i = int(m.data)
                    seen[i] += 1
                    if i in confirmed:
                        after_confirmed.append(i)
                    try:
                        await m.ack_sync(timeout=2)
                    except (NatsError, TimeoutError, OSError):
                        continue
                    confirmed.add(i)

        lanes = 16
        publishers = [asyncio.ensure_future(publisher(k, lanes)) for k in range(lanes)]
        consuming = asyncio.ensure_future(consumer())
        await asyncio.wait_for(kill_at.wait(), 60)
        a.signal(signal.SIGKILL)
        killed = time.monotonic()
        takeover = await b.wait_for("Server is ready", 30)
        took = time.monotonic() - killed
        await asyncio.wait_for(asyncio.gather(*publishers), 60)
        await asyncio.wait_for(_drained(js, seen, total), 60)
        finished.set()
        await asyncio.wait_for(consuming, 10)

        assert took <= TAKEOVER_BOUND, f"takeover took {took:.2f}s ({takeover:.2f}s)"
        assert b.http("/readyz") == (200, {"status": "ok", "role": "active"})
        assert acked == set(range(total))
        info = await js.stream_info("ORDERS")
        assert info.state.messages == total, "an acknowledged message was lost or doubled"
        stored: Counter[int] = Counter()
        for seq in range(1, info.state.last_seq + 1):
            with contextlib.suppress(Exception):
                stored[int((await js.get_msg("ORDERS", seq)).data or b"-1")] += 1
        assert set(stored) == set(range(total)) and set(stored.values()) == {1}
        assert after_confirmed == [], "a confirmed ack was forgotten by the new active node"
        assert set(seen) == set(range(total))
        consumer_info = await js.consumer_info("ORDERS", "work")
        assert consumer_info.num_ack_pending == 0
        assert consumer_info.num_pending == 0
        assert consumer_info.ack_floor.stream_seq == info.state.last_seq


async def _drained(js: JetStreamContext, seen: Counter[int], total: int) -> None:
    """Until every message was seen and the consumer has none pending or unacked."""
    while True:
        if len(seen) == total:
            with contextlib.suppress(NatsError, TimeoutError, OSError):
                info = await js.consumer_info("ORDERS", "work")
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    return
        await asyncio.sleep(0.2)


async def test_a_paused_active_node_is_fenced_off_when_it_resumes(
    pair: tuple[HaNode, HaNode],
) -> None:
    a, b = pair
    await _start_pair(a, b)
    async with _client(a.url, reconnect=False) as on_a:
        js_a = on_a.jetstream(timeout=2)
        await js_a.add_stream(StreamConfig(name="FENCE", subjects=["fence.>"]))
        await js_a.publish("fence.before", b"before")

        a.signal(signal.SIGSTOP)
        try:
            await b.wait_for("Server is ready", SESSION_TIMEOUT + 10)
            async with _client(b.url) as on_b:
                js_b = on_b.jetstream(timeout=2)
                ack = await js_b.publish("fence.after", b"by-b")
                assert ack.seq == 2
                # Sent to the paused node, handled once it runs again: never confirmed.
                late = asyncio.ensure_future(js_a.publish("fence.late", b"by-a", timeout=3))
                await asyncio.sleep(0.2)
        finally:
            a.signal(signal.SIGCONT)
        with pytest.raises((NatsError, TimeoutError, OSError)):
            await late
        assert await a.exit_code(15) == 3, a.log
        assert "Stepping down" in a.log
        async with _client(b.url) as on_b:
            js_b = on_b.jetstream(timeout=2)
            info = await js_b.stream_info("FENCE")
            assert info.state.messages == 2
            assert (await js_b.get_msg("FENCE", 2)).data == b"by-b"
            ack = await js_b.publish("fence.more", b"more")
            assert ack.seq == 3


async def test_postgresql_restarted_under_load(
    database: str, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    node = _node("solo", database, tmp_path)
    try:
        node.start()
        await node.wait_for("Server is ready", 30)
        async with _client(node.url) as nc:
            js = nc.jetstream(timeout=2)
            await js.add_stream(StreamConfig(name="R", subjects=["orders.>"]))
            errors: list[str] = []
            acked: set[int] = set()
            counter = itertools.count()
            stop = asyncio.Event()

            async def publisher() -> None:
                while not stop.is_set():
                    i = next(counter)
                    await _publish_until_acked(js, i, errors)
                    acked.add(i)

            tasks = [asyncio.ensure_future(publisher()) for _ in range(4)]
            await asyncio.sleep(1.0)
            before = len(acked)
            await asyncio.to_thread(postgres_server.restart, "fast")
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            assert len(acked) > before, "publishing did not resume after the restart"
            info = await js.stream_info("R")
            assert info.state.messages == len(acked)
            ids: Counter[int] = Counter()
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                with contextlib.suppress(Exception):
                    ids[int((await js.get_msg("R", seq)).data or b"-1")] += 1
            assert set(ids) == acked and set(ids.values()) == {1}
        assert node.http("/readyz")[0] == 200
        assert node.proc is not None and node.proc.poll() is None
        # While PostgreSQL was down clients heard 503s and the log said why, no traceback.
        assert errors and "refused by the store" in node.log
        assert "Traceback" not in node.log
    finally:
        node.kill()


async def test_tether_client_follows_the_takeover(pair: tuple[HaNode, HaNode]) -> None:
    """Tether's own client, given both URLs, publishes on through a kill -9."""
    from tether.client import connect

    a, b = pair
    await _start_pair(a, b)
    nc = await connect([a.url, b.url], randomize=False, max_reconnect_attempts=-1)
    try:
        js = nc.jetstream(timeout=2)
        await js.add_stream(name="CLIENT", subjects=["client.>"])
        assert (await js.publish("client.x", b"1", msg_id="1")).seq == 1
        a.signal(signal.SIGKILL)
        acked = None
        deadline = time.monotonic() + 20
        while acked is None and time.monotonic() < deadline:
            try:
                acked = await js.publish("client.x", b"2", msg_id="2")
            except Exception:  # reconnecting, no responders: the next try
                await asyncio.sleep(0.05)
        assert acked is not None and acked.seq == 2
        assert nc.connected_address is not None and str(b.port) in nc.connected_address
        assert (await js.stream_info("CLIENT")).state.messages == 2
    finally:
        await nc.close()
