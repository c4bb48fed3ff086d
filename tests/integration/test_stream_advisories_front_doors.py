"""Stream advisories come from the engine, not from the NATS API handlers: a stream
made, changed or deleted through the HTTP or the NSQ front door is announced on
``$JS.EVENT.ADVISORY.STREAM.*`` like one made over NATS, so a NATS tool watching the
advisories sees every stream of the server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import nats
import pytest
from natspy_support import flush_subscriptions

from tether.testing import RunningServer, run_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def test_http_and_nsq_streams_are_advised(server: RunningServer) -> None:
    nc = await nats.connect(server.url)
    try:
        advisories = await nc.subscribe("$JS.EVENT.ADVISORY.STREAM.>")
        await flush_subscriptions(nc)

        async def next_advisory() -> tuple[str, str, str]:
            msg = await advisories.next_msg(timeout=5)
            body = json.loads(msg.data)
            assert body["type"] == "io.nats.jetstream.advisory.v1.stream_action"
            return msg.subject, body["stream"], body["action"]

        async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
            assert (await http.put("/channel/adv", data={"token": "ct"})).status_code == 200
            assert await next_advisory() == (
                "$JS.EVENT.ADVISORY.STREAM.CREATED.WB_adv",
                "WB_adv",
                "create",
            )
            assert (await http.post("/topic/create", params={"topic": "advised"})).is_success
            subject, name, action = await next_advisory()
            assert (subject, action) == (f"$JS.EVENT.ADVISORY.STREAM.CREATED.{name}", "create")
            assert (await http.post("/topic/delete", params={"topic": "advised"})).is_success
            assert await next_advisory() == (
                f"$JS.EVENT.ADVISORY.STREAM.DELETED.{name}",
                name,
                "delete",
            )
        # Over NATS as before: once each, not twice now that the engine advises.
        js = nc.jetstream()
        await js.add_stream(name="VIA_NATS", subjects=["via.nats"])
        await js.update_stream(name="VIA_NATS", subjects=["via.nats"], max_msgs=10)
        await js.delete_stream("VIA_NATS")
        seen = [(await next_advisory())[2] for _ in range(3)]
        assert seen == ["create", "modify", "delete"]
        with pytest.raises(nats.errors.TimeoutError):
            await advisories.next_msg(timeout=0.3)
    finally:
        await nc.close()
