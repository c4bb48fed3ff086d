"""JetStream lifecycle advisories (``$JS.EVENT.ADVISORY.>``) on Tether and nats-server.

One scenario (streams and consumers created, updated and deleted through the API, an
ephemeral consumer left to expire) runs on both servers while a plain core subscription
listens. nats-server sends an advisory after or before the API reply, depending on which
of its goroutines gets there first, so under load its advisories can come in another
order than the requests: the two servers' advisories are compared as collections, and
Tether's order (the requests' order, always) against the list here. Ids, timestamps,
server ids and client connection details differ by nature and are left out.

The pause that runs out by itself ends at a wall-clock time the client picks: a server
that gets the request after that time answers ``paused: false`` and never sends the
run-out advisory. The end leaves room for a few times the previous pause request's round
trip; should the request still come late, the run is told apart (by the reply, and the
client's clock past the end) and the scenario run again on both servers, instead of
waiting for an advisory that cannot come.

nats-server (2.15) queues the advisories of a stream's deletion (its consumers' and its
own) on the stream's send queue just before it tells the stream's send loop to quit; the
loop picks either at random when both are ready, so on a busy machine it can quit with
them unsent. What nats-server dropped there is not compared (what it sent is); Tether's
own list must have them all.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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
# Sent as the stream is deleted: nats-server may drop them (see above).
_AT_DELETE = (
    "$JS.EVENT.ADVISORY.CONSUMER.DELETED.ADV.D",
    "$JS.EVENT.ADVISORY.STREAM.DELETED.ADV",
)
_RUN_OUT = {
    "type": "io.nats.jetstream.advisory.v1.consumer_pause",
    "stream": "ADV",
    "consumer": "D",
    "paused": False,
    "pause_until": "<until>",
}


@dataclass
class _Run:
    """One server's run of the scenario: what it heard, and a timed log for a failure."""

    server: str
    may_drop_at_delete: bool = False
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    start: float = 0.0
    late_pause: bool = False  # the timed pause reached the server after its end

    def note(self, text: str) -> None:
        self.log.append(f"{asyncio.get_running_loop().time() - self.start:8.3f}s {text}")

    async def until(self, what: str, done: Callable[[], bool]) -> None:
        # Generous: on a loaded machine an inactivity expiry or a pause end can come late.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not done():
            if loop.time() >= deadline:
                history = "\n".join(self.log)
                raise AssertionError(f"{self.server}: no {what} within 30 s; heard:\n{history}")
            await asyncio.sleep(0.05)

    async def settle(self, done: Callable[[], bool], within: float) -> None:
        """Wait up to ``within`` seconds for what may never come."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not done():
            if loop.time() >= deadline:
                return
            await asyncio.sleep(0.05)


async def _scenario(url: str, run: _Run) -> list[tuple[str, dict[str, Any]]]:
    run.start = asyncio.get_running_loop().time()
    nc = await nats.connect(url)
    seen = run.seen

    async def listen(msg: Any) -> None:
        seen.append((msg.subject, json.loads(msg.data)))
        run.note(f"heard {msg.subject}")

    await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=listen)
    await nc.flush()

    async def api(subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        run.note(f"asked {subject} {data.decode()}")
        reply = await nc.request("$JS.API." + subject, data, timeout=5)
        run.note(f"answer {reply.data.decode()[:160]}")
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
        await run.until(
            "deletion of the inactive SHORT",
            lambda: any(s.endswith("DELETED.ADV.SHORT") for s, _ in seen),
        )
        await api("CONSUMER.PAUSE.ADV.D", {"pause_until": "2099-01-01T00:00:00Z"})
        asked = datetime.now(UTC)
        await api("CONSUMER.PAUSE.ADV.D", {})  # resumed
        # A pause that runs out by itself, in whole seconds (formatted alike by both). Its
        # end leaves room for a few times what the last pause request took (Tether answers
        # once the pause is on disk, and a busy disk can take a second).
        room = max(timedelta(seconds=1), 4 * (datetime.now(UTC) - asked))
        end = (datetime.now(UTC) + room).replace(microsecond=0) + timedelta(seconds=1)
        until = end.isoformat().replace("+00:00", "Z")
        reply = await api("CONSUMER.PAUSE.ADV.D", {"pause_until": until})
        if reply.get("paused") is True:
            await run.until(
                "advisory that the pause ran out",
                lambda: sum(s.endswith("PAUSE.ADV.D") for s, _ in seen) >= 4,
            )
        else:
            # Only a request that came after the end may be answered so.
            assert datetime.now(UTC) >= end, (run.server, until, reply)
            run.late_pause = True
        await api("STREAM.DELETE.ADV")
        # nats-server sends advisories from its own queue: wait for the last ones.
        await run.until(
            f"{_REQUESTS} API audits", lambda: sum(s == _AUDIT for s, _ in seen) >= _REQUESTS
        )

        def deleted() -> bool:
            return all(any(s == d for s, _ in seen) for d in _AT_DELETE)

        if run.may_drop_at_delete:
            # Queued before the answer: sent by now, or seconds from now at most, if at all.
            await run.settle(deleted, within=5)
        else:
            await run.until("stream deletion advisories", deleted)
    finally:
        await nc.close()
    # Each server has its own pause end.
    return list(json.loads(json.dumps(seen).replace(until, "<until>")))


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


async def test_lifecycle_and_audit_advisories_match(nats_peer_url: str) -> None:
    from tether.testing import run_server

    with run_server() as tether:
        peers = Peers(tether.url, nats_peer_url)
        for _ in range(3):
            runs = _Run("nats-server", may_drop_at_delete=True), _Run("tether")
            theirs, ours = await asyncio.gather(
                _scenario(peers.nats, runs[0]), _scenario(peers.tether, runs[1])
            )
            if not any(run.late_pause for run in runs):
                break
        else:
            pytest.fail("the timed pause reached a server after its end in 3 runs")
    theirs_l, ours_l = _lifecycle(theirs), _lifecycle(ours)
    dropped = [item for item in ours_l if item[0] in _AT_DELETE and item not in theirs_l]
    assert _sorted(ours_l) == _sorted(theirs_l + dropped)
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
