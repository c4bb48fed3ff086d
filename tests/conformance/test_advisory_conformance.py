"""JetStream lifecycle advisories (``$JS.EVENT.ADVISORY.>``) on Tether and nats-server.

One scenario (streams and consumers created, updated and deleted through the API, an
ephemeral consumer left to expire) runs on both servers while a plain core subscription
listens. nats-server sends an advisory after or before the API reply, depending on which
of its goroutines gets there first, so under load its advisories can come in another
order than the requests: the two servers' advisories are compared as collections, and
Tether's order (the requests' order, always) against the list here. Ids, timestamps,
server ids and client connection details differ by nature and are left out.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conformance_support import Peers

pytestmark = pytest.mark.peer

_VOLATILE = ("id", "timestamp")
_AUDIT = "$JS.EVENT.ADVISORY.API"
# The connection's start, id and server id differ by nature; Tether does not measure rtt.
_CLIENT_VOLATILE = ("start", "id", "server", "rtt")
_REQUESTS = 15  # API requests in the scenario, each audited
_RUN_OUT = {
    "type": "io.nats.jetstream.advisory.v1.consumer_pause",
    "stream": "ADV",
    "consumer": "D",
    "paused": False,
    "pause_until": "<until>",
}


async def _scenario(url: str) -> list[tuple[str, dict[str, Any]]]:
    nc = await nats.connect(url)
    seen: list[tuple[str, dict[str, Any]]] = []

    async def listen(msg: Any) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=listen)
    await nc.flush()

    async def api(subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        reply = await nc.request("$JS.API." + subject, data, timeout=5)
        return dict(json.loads(reply.data))

    try:
        await api("STREAM.CREATE.ADV", {"name": "ADV", "subjects": ["adv.>"]})
        await api("STREAM.CREATE.ADV", {"name": "ADV", "subjects": ["adv.>"]})  # identical
        await api("STREAM.UPDATE.ADV", {"name": "ADV", "subjects": ["adv.>"], "max_msgs": 10})
        await api("STREAM.CREATE.ADV", {"name": "ADV", "subjects": ["other.>"]})  # refused
        durable = {"durable_name": "D", "ack_policy": "explicit"}
        await api("CONSUMER.CREATE.ADV.D", {"stream_name": "ADV", "config": durable})
        await api("CONSUMER.CREATE.ADV.D", {"stream_name": "ADV", "config": durable})
        await api(  # an update: no advisory
            "CONSUMER.CREATE.ADV.D",
            {"stream_name": "ADV", "config": {**durable, "max_waiting": 10}},
        )
        await api("STREAM.INFO.ADV")
        gone = {"durable_name": "GONE", "ack_policy": "explicit"}
        await api("CONSUMER.CREATE.ADV.GONE", {"stream_name": "ADV", "config": gone})
        await api("CONSUMER.DELETE.ADV.GONE")
        await api(
            "CONSUMER.CREATE.ADV.SHORT",
            {
                "stream_name": "ADV",
                "config": {
                    "name": "SHORT",
                    "ack_policy": "explicit",
                    "inactive_threshold": 200_000_000,
                },
            },
        )
        await _until(lambda: any(s.endswith("DELETED.ADV.SHORT") for s, _ in seen), seen)
        await api("CONSUMER.PAUSE.ADV.D", {"pause_until": "2099-01-01T00:00:00Z"})
        await api("CONSUMER.PAUSE.ADV.D", {})  # resumed
        # A pause that runs out by itself, in whole seconds (formatted alike by both).
        end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        until = end.isoformat().replace("+00:00", "Z")
        await api("CONSUMER.PAUSE.ADV.D", {"pause_until": until})
        await _until(lambda: sum(s.endswith("PAUSE.ADV.D") for s, _ in seen) == 4, seen)
        await api("STREAM.DELETE.ADV")
        # nats-server sends advisories from its own queue: wait for the last ones.
        await _until(lambda: sum(s == _AUDIT for s, _ in seen) == _REQUESTS, seen)
        await _until(lambda: any(s.endswith("STREAM.DELETED.ADV") for s, _ in seen), seen)
    finally:
        await nc.close()
    # Each server has its own pause end.
    return list(json.loads(json.dumps(seen).replace(until, "<until>")))


async def _until(done: Callable[[], bool], seen: list[tuple[str, dict[str, Any]]]) -> None:
    # Generous: on a loaded machine an inactivity expiry or a pause end can come late.
    deadline = asyncio.get_running_loop().time() + 30
    while not done():
        assert asyncio.get_running_loop().time() < deadline, [s for s, _ in seen]
        await asyncio.sleep(0.05)


def _lifecycle(seen: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for subject, body in seen:
        if subject == _AUDIT:
            continue
        assert all(body.get(k) for k in _VOLATILE), body
        out.append((subject, {k: v for k, v in body.items() if k not in _VOLATILE}))
    assert ("$JS.EVENT.ADVISORY.CONSUMER.PAUSE.ADV.D", _RUN_OUT) in out
    return out


def _audits(seen: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for subject, body in seen:
        if subject != _AUDIT:
            continue
        response = json.loads(body["response"])
        out.append(
            {
                "keys": sorted(body),
                "type": body["type"],
                "subject": body["subject"],
                "request": json.loads(body["request"]) if "request" in body else None,
                "response_type": response["type"],
                "error": response.get("error"),
                "client": {
                    k: "<varies>" if k in _CLIENT_VOLATILE else v for k, v in body["client"].items()
                },
            }
        )
    return out


def _sorted(items: list[Any]) -> list[str]:
    return sorted(json.dumps(item, sort_keys=True) for item in items)


@pytest.mark.xfail(
    strict=False,
    reason="known issue: passes alone and after its neighbours, but in the full suite one "
    "awaited advisory has not arrived within 30 s; under investigation",
)
async def test_lifecycle_and_audit_advisories_match(nats_peer_url: str) -> None:
    from tether.testing import run_server

    with run_server() as tether:
        peers = Peers(tether.url, nats_peer_url)
        theirs, ours = await asyncio.gather(_scenario(peers.nats), _scenario(peers.tether))
    assert _sorted(_lifecycle(ours)) == _sorted(_lifecycle(theirs))
    assert [s for s, _ in ours if s != _AUDIT] == [
        "$JS.EVENT.ADVISORY.STREAM.CREATED.ADV",
        "$JS.EVENT.ADVISORY.STREAM.UPDATED.ADV",
        "$JS.EVENT.ADVISORY.CONSUMER.CREATED.ADV.D",
        "$JS.EVENT.ADVISORY.CONSUMER.CREATED.ADV.GONE",
        "$JS.EVENT.ADVISORY.CONSUMER.DELETED.ADV.GONE",
        "$JS.EVENT.ADVISORY.CONSUMER.CREATED.ADV.SHORT",
        "$JS.EVENT.ADVISORY.CONSUMER.DELETED.ADV.SHORT",
        "$JS.EVENT.ADVISORY.CONSUMER.PAUSE.ADV.D",
        "$JS.EVENT.ADVISORY.CONSUMER.PAUSE.ADV.D",
        "$JS.EVENT.ADVISORY.CONSUMER.PAUSE.ADV.D",
        "$JS.EVENT.ADVISORY.CONSUMER.PAUSE.ADV.D",  # the pause ran out
        "$JS.EVENT.ADVISORY.CONSUMER.DELETED.ADV.D",
        "$JS.EVENT.ADVISORY.STREAM.DELETED.ADV",
    ]
    assert _sorted(_audits(ours)) == _sorted(_audits(theirs))
    assert [a["subject"] for a in _audits(ours)][:2] == ["$JS.API.STREAM.CREATE.ADV"] * 2
    for subject, body in ours:
        if subject == _AUDIT:  # the requester: its connection, on this server
            assert {"start", "id"} <= set(body["client"])
            assert body["client"]["server"] == body["server"] != ""
    assert len(_audits(ours)) == _REQUESTS
