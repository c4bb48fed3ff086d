"""Atomic batches, counters and message schedules: the same requests against Tether and
nats-server, compared field by field.

Each scenario is a list of publishes and API requests sent with nats-py; every reply
(PubAcks with their ``batch``/``count``/``val``, error PubAcks, empty replies, stream
configurations) is normalized (times, ids and the ``_nats`` metadata dropped, file
storage byte counts dropped as in the stream conformance) and the lists must be equal.
Schedules also compare what was stored once they fired: subjects, headers, bodies.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from typing import Any

import nats
import pytest
from conformance_support import Peers
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout

pytestmark = pytest.mark.peer

_VOLATILE = {"ts", "created", "first_ts", "last_ts", "time", "cluster", "server_id"}


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in _VOLATILE:
                continue
            if key == "metadata" and isinstance(item, dict):
                item = {k: v for k, v in item.items() if not k.startswith("_nats")}
                if not item:
                    continue
            out[key] = normalize(item)
        return out
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def request(nc: Client, subject: str, body: Any = b"", headers: Any = None) -> Any:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        msg = await nc.request(subject, data, headers=headers, timeout=2)
    except NatsTimeout:
        return "<no reply>"
    if not msg.data:
        return "<empty reply>"
    doc = json.loads(msg.data)
    # nats-server writes `"duplicate": true` with a space; the value is what counts.
    return normalize(doc)


Step = tuple[str, Any, Any]  # (subject, body, headers)


async def run(url: str, steps: list[Step]) -> list[Any]:
    nc = await nats.connect(url)
    try:
        return [await request(nc, subject, body, headers) for subject, body, headers in steps]
    finally:
        await nc.close()


async def compare(peers: Peers, steps: list[Step]) -> list[Any]:
    theirs = await run(peers.nats, steps)
    ours = await run(peers.tether, steps)
    for step, a, b in zip(steps, theirs, ours, strict=True):
        assert b == a, f"{step[0]} {step[2]}: nats-server {a!r}, Tether {b!r}"
    return ours


def batch(batch_id: str, seq: int, commit: str = "", **more: str) -> dict[str, str]:
    out = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq), **more}
    if commit:
        out["Nats-Batch-Commit"] = commit
    return out


async def test_atomic_batches(peers: Peers) -> None:
    create = {"name": "AB", "subjects": ["ab.>"], "allow_atomic": True, "allow_rollup_hdrs": True}
    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.AB", create, None),
        ("$JS.API.STREAM.CREATE.NB", {"name": "NB", "subjects": ["nb.>"]}, None),
        ("nb.x", b"d", batch("x", 1)),
        ("ab.x", b"1", batch("b1", 1)),
        ("ab.y", b"2", batch("b1", 2)),
        ("ab.x", b"3", batch("b1", 3, "1")),
        ("ab.x", b"4", batch("b2", 1)),
        ("ab.x", b"5", batch("b2", 2, "eob")),
        ("ab.x", b"d", batch("b4", 1, "eob")),
        ("ab.x", b"d", batch("b5", 2)),
        ("ab.x", b"d", batch("b5b", 1001)),
        ("ab.x", b"d", batch("b6", 1, "yes")),
        ("ab.x", b"d", batch("x" * 65, 1)),
        ("ab.x", b"d", {"Nats-Batch-Id": "b7"}),
        ("ab.x", b"d", batch("b8", 0)),
        ("ab.x", b"d", batch("g", 1)),
        ("ab.x", b"d", batch("g", 3)),
        ("ab.x", b"d", batch("g", 2, "1")),
        ("ab.x", b"d", batch("m", 1, **{"Nats-Msg-Id": "m1"})),
        ("ab.x", b"d", batch("m", 2, "1", **{"Nats-Msg-Id": "m1"})),
        ("ab.x", b"d", batch("e", 1, "1", **{"Nats-Expected-Last-Msg-Id": "m1"})),
        ("ab.x", b"d", batch("s", 1, **{"Nats-Expected-Last-Sequence": "1"})),
        ("ab.x", b"d", batch("s", 2, "1")),
        ("ab.x", b"d", batch("i", 1, "1", **{"Nats-Msg-Id": "m1"})),
        ("ab.x", b"d", batch("i2", 1, "1", **{"Nats-Msg-Id": "m1"})),
        ("ab.z", b"d", batch("p", 1, **{"Nats-Expected-Last-Subject-Sequence": "0"})),
        ("ab.z", b"d", batch("p", 2, "1", **{"Nats-Expected-Last-Subject-Sequence": "0"})),
        ("ab.x", b"d", batch("r", 1, "1", **{"Nats-Rollup": "sub"})),
        ("ab.x", b"d", batch("", 1, "1")),
        ("ab.x", b"d", batch("c", 1, "1", **{"Nats-Incr": "1"})),
        ("$JS.API.STREAM.INFO.AB", b"", None),
        ("$JS.API.STREAM.MSG.GET.AB", {"seq": 5}, None),
        ("$JS.API.STREAM.UPDATE.AB", {"name": "AB", "subjects": ["ab.>"]}, None),
        ("ab.x", b"d", batch("off", 1)),
    ]
    await compare(peers, steps)


async def test_atomic_batches_with_msg_ids(peers: Peers) -> None:
    """Batches deduplicated by Nats-Msg-Id: a repeat inside the batch, or of a message
    stored before (on its own or by a batch), refuses the batch whole; the ids of a
    batch stored count for the publishes after it."""
    create = {"name": "AD", "subjects": ["ad.>"], "allow_atomic": True}

    def ided(batch_id: str, seq: int, msg_id: str, commit: str = "") -> dict[str, str]:
        return batch(batch_id, seq, commit, **{"Nats-Msg-Id": msg_id})

    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.AD", create, None),
        ("ad.x", b"s", {"Nats-Msg-Id": "s1"}),
        ("ad.x", b"1", ided("d1", 1, "d1a")),
        ("ad.y", b"2", batch("d1", 2)),
        ("ad.x", b"3", ided("d1", 3, "d1c", "1")),
        ("ad.x", b"d", ided("d2", 1, "n1")),
        ("ad.x", b"d", ided("d2", 2, "s1", "1")),  # a single publish's id
        ("ad.x", b"d", ided("d3", 1, "d1c")),  # an earlier batch's id
        ("ad.x", b"d", ided("d3", 2, "n2", "1")),
        ("ad.x", b"d", ided("d4", 1, "x")),
        ("ad.x", b"d", batch("d4", 2)),
        ("ad.x", b"d", ided("d4", 3, "x")),  # twice in the batch
        ("ad.x", b"d", ided("d4", 4, "y", "1")),
        # The msg id first (a map's order): the same batch.
        ("ad.x", b"5", {"Nats-Msg-Id": "d5a", **batch("d5", 1)}),
        ("ad.x", b"6", {"Nats-Msg-Id": "d5b", **batch("d5", 2)}),
        ("ad.x", b"d", batch("d5", 3, "eob")),
        ("ad.x", b"d", {"Nats-Msg-Id": "d1a"}),  # a duplicate of a batch's message
        ("ad.x", b"d", {"Nats-Msg-Id": "n1"}),  # the refused batch's ids are free
        ("ad.x", b"d", {"Nats-Msg-Id": "s2", "Nats-Expected-Last-Msg-Id": "n1"}),
        ("ad.x", b"7", ided("d6", 1, "d6a")),
        ("ad.x", b"8", ided("d6", 2, "d6b", "1")),
        ("ad.x", b"d", {"Nats-Expected-Last-Msg-Id": "d6b"}),
        ("$JS.API.STREAM.INFO.AD", b"", None),
    ]
    await compare(peers, steps)
    assert await stored(peers.tether, "AD") == await stored(peers.nats, "AD")


async def test_atomic_batches_on_streams_whose_limits_evict_or_refuse(peers: Peers) -> None:
    """max_msgs, max_bytes and max_msgs_per_subject evict during a batch as for
    publishes one by one (a batch larger than the limit keeps its own last messages);
    discard new refuses a batch that would not fit, whole."""
    base = {"allow_atomic": True, "storage": "memory"}
    steps: list[Step] = [
        (
            "$JS.API.STREAM.CREATE.EM",
            {"name": "EM", "subjects": ["em.>"], "max_msgs": 3, **base},
            None,
        ),
        ("em.x", b"1", None),
        ("em.x", b"2", None),
        ("em.x", b"3", None),
        ("em.x", b"4", batch("m1", 1)),
        ("em.y", b"5", batch("m1", 2, "1")),
        ("$JS.API.STREAM.INFO.EM", b"", None),
        *[("em.x", str(i).encode(), batch("m2", i)) for i in range(1, 6)],
        ("em.x", b"d", batch("m2", 6, "eob")),
        ("$JS.API.STREAM.INFO.EM", b"", None),
        ("$JS.API.STREAM.MSG.GET.EM", {"seq": 7}, None),
        ("$JS.API.STREAM.MSG.GET.EM", {"seq": 8}, None),
        (
            "$JS.API.STREAM.CREATE.EB",
            {"name": "EB", "subjects": ["eb.>"], "max_bytes": 400, **base},
            None,
        ),
        ("eb.x", b"x" * 100, None),
        *[("eb.x", b"y" * 60, batch("b1", i)) for i in range(1, 4)],
        ("eb.x", b"y" * 60, batch("b1", 4, "1")),
        ("$JS.API.STREAM.INFO.EB", b"", None),
        ("eb.x", b"z" * 300, batch("b2", 1)),
        ("eb.x", b"z" * 300, batch("b2", 2, "1")),  # the first one does not fit after it
        ("$JS.API.STREAM.INFO.EB", b"", None),
        (
            "$JS.API.STREAM.CREATE.EN",
            {"name": "EN", "subjects": ["en.>"], "max_msgs": 4, "discard": "new", **base},
            None,
        ),
        ("en.x", b"1", batch("n1", 1)),
        ("en.x", b"2", batch("n1", 2)),
        ("en.x", b"3", batch("n1", 3, "1")),
        ("en.x", b"4", batch("n2", 1)),
        ("en.x", b"5", batch("n2", 2, "1")),  # one too many: none of them
        ("en.x", b"4", batch("n3", 1, "1")),
        ("$JS.API.STREAM.INFO.EN", b"", None),
        (
            "$JS.API.STREAM.CREATE.ES",
            {"name": "ES", "subjects": ["es.>"], "max_msgs_per_subject": 2, "max_msgs": 4, **base},
            None,
        ),
        ("es.a", b"0", None),
        ("es.a", b"1", batch("s1", 1)),
        ("es.b", b"2", batch("s1", 2)),
        ("es.a", b"3", batch("s1", 3)),
        ("es.b", b"4", batch("s1", 4)),
        ("es.c", b"5", batch("s1", 5, "1")),
        ("$JS.API.STREAM.INFO.ES", {"subjects_filter": ">"}, None),
    ]
    await compare(peers, steps)
    for name in ("EM", "EB", "EN", "ES"):
        assert await stored(peers.tether, name) == await stored(peers.nats, name)


async def test_atomic_batches_with_discard_new_per_subject(peers: Peers) -> None:
    """discard new with discard_new_per_subject refuses a batch (10077) when a subject's
    stored messages and the batch's own for it pass max_msgs_per_subject, none of it
    stored, for a batch of plain messages as for one with headers its commit checks
    one message at a time; a rollup passes."""
    create = {
        "name": "DP",
        "subjects": ["dp.>"],
        "allow_atomic": True,
        "allow_rollup_hdrs": True,
        "storage": "memory",
        "discard": "new",
        "discard_new_per_subject": True,
        "max_msgs_per_subject": 2,
    }
    here = {"Nats-Expected-Stream": "DP"}  # not a plain batch: checked message by message
    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.DP", create, None),
        ("dp.a", b"1", batch("p1", 1)),
        ("dp.a", b"2", batch("p1", 2)),
        ("dp.a", b"3", batch("p1", 3, "1")),  # three to dp.a in one batch
        ("dp.a", b"1", batch("p2", 1, **{"Nats-Msg-Id": "i1"})),
        ("dp.b", b"2", batch("p2", 2, "1", **{"Nats-Msg-Id": "i2"})),
        ("dp.a", b"3", batch("p3", 1)),
        ("dp.b", b"4", batch("p3", 2, "1")),
        ("dp.a", b"5", batch("p4", 1, "1", **{"Nats-Msg-Id": "i3"})),
        ("dp.d", b"6", {"Nats-Msg-Id": "i3"}),  # the refused batch's id is not kept
        ("dp.c", b"1", batch("h1", 1, **here)),
        ("dp.c", b"2", batch("h1", 2, **here)),
        ("dp.c", b"3", batch("h1", 3, "1", **here)),
        ("dp.c", b"1", batch("h2", 1, **here)),
        ("dp.b", b"2", batch("h2", 2, "1", **here)),
        ("dp.a", b"r", batch("r1", 1, "1", **{"Nats-Rollup": "sub"})),
        ("$JS.API.STREAM.INFO.DP", {"subjects_filter": ">"}, None),
    ]
    await compare(peers, steps)
    assert await stored(peers.tether, "DP") == await stored(peers.nats, "DP")


async def test_atomic_batches_are_republished(peers: Peers) -> None:
    """A stream with ``republish`` republishes every message of a stored batch (with
    its batch headers and its subject's previous sequence), none of a refused one."""
    create = {
        "name": "RP",
        "subjects": ["rp.>"],
        "allow_atomic": True,
        "max_msgs": 4,
        "republish": {"src": ">", "dest": "out.>"},
    }
    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.RP", create, None),
        ("rp.a", b"0", None),
        ("rp.a", b"1", batch("r1", 1)),
        ("rp.b", b"2", batch("r1", 2)),
        ("rp.a", b"3", batch("r1", 3, "1")),
        ("rp.a", b"4", batch("r2", 1, **{"Nats-Msg-Id": "i4"})),
        ("rp.a", b"5", batch("r2", 2, **{"Nats-Msg-Id": "i5"})),
        ("rp.a", b"d", batch("r2", 3, "eob")),
        ("rp.a", b"x", batch("r3", 1, "1", **{"Nats-Msg-Id": "i4"})),  # refused
        ("rp.b", b"6", batch("r4", 1, **{"Nats-Expected-Last-Sequence": "6"})),
        ("rp.b", b"7", batch("r4", 2, "1")),
    ]

    async def republished(url: str) -> list[Any]:
        nc = await nats.connect(url)
        got: list[Any] = []

        async def heard(msg: Any) -> None:
            head = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Time-Stamp"}
            got.append((msg.subject, head, msg.data))

        try:
            await nc.subscribe("out.>", cb=heard)
            await nc.flush()
            await run(url, steps)
            await nc.flush()
            await asyncio.sleep(0.3)
        finally:
            await nc.close()
        return got

    ours = await republished(peers.tether)
    assert ours == await republished(peers.nats)
    assert len(ours) == 8


async def test_schedules_and_api_levels_in_atomic_batches(peers: Peers) -> None:
    config = {"name": "AS", "subjects": ["as.>"], "allow_atomic": True, "allow_msg_schedules": True}
    at = _at(4)  # after both servers' steps: its firing does not shift their sequences
    plan = {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "as.out"}
    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.AS", config, None),
        ("as.data", b"d", batch("s", 1)),
        ("as.sched", b"d", batch("s", 2, "1", **plan)),
        (
            "as.sched2",
            b"d",
            batch("t", 1, **{"Nats-Schedule": "bogus", "Nats-Schedule-Target": "as.out"}),
        ),
        ("as.sched2", b"d", batch("t", 2, "1")),
        ("as.x", b"d", batch("r", 1, **{"Nats-Required-Api-Level": "9"})),
        ("as.x", b"d", batch("r2", 1)),
        ("as.x", b"d", batch("r2", 2, "1", **{"Nats-Required-Api-Level": "x"})),
        ("as.x", b"d", batch("r3", 1, "1", **{"Nats-Required-Api-Level": "1"})),
        ("$JS.API.STREAM.MSG.GET.AS", {"last_by_subj": "as.x"}, None),
    ]
    await compare(peers, steps)
    await _settled(peers, "AS", at)  # the schedule set by the batch fires
    assert await stored(peers.tether, "AS") == await stored(peers.nats, "AS")


async def test_inflight_limit(peers: Peers) -> None:
    steps: list[Step] = [
        (
            "$JS.API.STREAM.CREATE.AI",
            {"name": "AI", "subjects": ["ai.>"], "allow_atomic": True},
            None,
        )
    ]
    steps += [("ai.x", b"d", batch(f"in{i}", 1)) for i in range(51)]
    results = await compare(peers, steps)
    assert results[-1]["error"]["err_code"] == 10210


async def test_counters(peers: Peers) -> None:
    big = "9" * 40
    steps: list[Step] = [
        (
            "$JS.API.STREAM.CREATE.C",
            {"name": "C", "subjects": ["c.>"], "allow_msg_counter": True},
            None,
        ),
        ("$JS.API.STREAM.CREATE.N", {"name": "N", "subjects": ["n.>"]}, None),
        ("c.x", b"", {"Nats-Incr": "1"}),
        ("c.x", b"", {"Nats-Incr": "+5"}),
        ("c.y", b"", {"Nats-Incr": "-10"}),
        ("c.x", b"", {"Nats-Incr": big}),
        ("c.x", b"", {"Nats-Incr": f"-{big}"}),
        ("c.x", b"", {"Nats-Incr": "0"}),
        ("c.x", b"", {"Nats-Incr": "x"}),
        ("c.x", b"x", {"Nats-Incr": "1"}),
        ("c.x", b"zz", {"Nats-Incr": "abc"}),
        ("c.x", b"", None),
        ("c.x", b"", {"Nats-Incr": ""}),
        ("c.x", b"", {"Nats-Incr": "1_0"}),
        ("c.x", b"", {"Nats-Incr": "1", "Nats-Rollup": "sub"}),
        ("c.x", b"", {"Nats-Incr": "1", "Nats-Expected-Stream": "C"}),
        ("c.x", b"", {"Nats-Incr": "1", "Nats-Expected-Last-Sequence": "1"}),
        ("c.x", b"", {"Nats-Incr": "1", "Nats-TTL": "5s"}),
        ("c.x", b"", {"Nats-Incr": "1", "Nats-Msg-Id": "once"}),
        ("n.x", b"", {"Nats-Incr": "1"}),
        ("n.x", b"", {"Nats-Incr": "zz"}),
        ("$JS.API.STREAM.MSG.GET.C", {"last_by_subj": "c.x"}, None),
        ("$JS.API.STREAM.INFO.C", b"", None),
        ("$JS.API.STREAM.UPDATE.C", {"name": "C", "subjects": ["c.>"]}, None),
    ]
    for extra in (
        {"allow_msg_ttl": True},
        {"discard": "new"},
        {"retention": "workqueue"},
        {"allow_msg_schedules": True},
    ):
        config = {"name": "CX", "subjects": ["cx"], "allow_msg_counter": True, **extra}
        steps.append(("$JS.API.STREAM.CREATE.CX", config, None))
    await compare(peers, steps)


def _at(seconds: float) -> str:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _settled(peers: Peers, stream: str, at: str) -> None:
    """A second past the ``@at`` time ``at``, then until both servers hold the same in
    ``stream`` (15 s at most): a busy machine may fire a schedule later on one of them."""
    due = dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    await asyncio.sleep(max(0.0, (due - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if await stored(peers.tether, stream) == await stored(peers.nats, stream):
            return
        await asyncio.sleep(0.25)


async def stored(url: str, stream: str) -> list[Any]:
    """What a stream holds: subject, headers (the schedules' times dropped), body."""
    nc = await nats.connect(url)
    try:
        info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"")).data)
        out = []
        for seq in range(info["state"]["first_seq"], info["state"]["last_seq"] + 1):
            body = json.dumps({"seq": seq}).encode()
            doc = json.loads((await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", body)).data)
            if "error" in doc:
                continue
            msg = doc["message"]
            head = base64.b64decode(msg.get("hdrs", "")).decode()
            lines = [h for h in head.split("\r\n")[1:] if h]
            lines = [
                h if not h.startswith("Nats-Schedule-Next: 20") else "Nats-Schedule-Next: <t>"
                for h in lines
            ]
            out.append((msg["subject"], lines, base64.b64decode(msg.get("data", ""))))
        return sorted(out)
    finally:
        await nc.close()


async def test_schedules(peers: Peers) -> None:
    create = {
        "name": "SC",
        "subjects": ["sc.>"],
        "allow_msg_schedules": True,
        "allow_msg_ttl": True,
    }
    at = _at(4)  # after both servers' steps: its firing does not shift their sequences
    steps: list[Step] = [
        ("$JS.API.STREAM.CREATE.SC", create, None),
        ("$JS.API.STREAM.CREATE.NS", {"name": "NS", "subjects": ["ns.>"]}, None),
        ("ns.x", b"d", {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "ns.t"}),
        ("ns.x", b"d", {"Nats-Schedule": "bogus", "Nats-Schedule-Target": "ns.t"}),
        (
            "sc.sch.a",
            b"d",
            {
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": "sc.t.a",
                "Nats-Schedule-TTL": "5m",
                "Foo": "bar",
            },
        ),
        ("sc.sch.b", b"d", {"Nats-Schedule": "@every 1h", "Nats-Schedule-Target": "sc.t.b"}),
        (
            "sc.sch.c",
            b"d",
            {
                "Nats-Schedule": "0 0 9 * * mon-fri",
                "Nats-Schedule-Target": "sc.t.c",
                "Nats-Schedule-Time-Zone": "Europe/Paris",
            },
        ),
        ("sc.sch.d", b"d", {"Nats-Schedule": "@daily", "Nats-Schedule-Target": "sc.t.d"}),
        ("sc.bad", b"d", {"Nats-Schedule": "@every 500ms", "Nats-Schedule-Target": "sc.t.b"}),
        (
            "sc.bad",
            b"d",
            {
                "Nats-Schedule": "0 0 * * * *",
                "Nats-Schedule-Target": "sc.t",
                "Nats-Schedule-Time-Zone": "Nope/Zone",
            },
        ),
        (
            "sc.bad",
            b"d",
            {
                "Nats-Schedule": "@every 1s",
                "Nats-Schedule-Target": "sc.t",
                "Nats-Schedule-Time-Zone": "UTC",
            },
        ),
        ("sc.bad", b"d", {"Nats-Schedule": "* * * * *", "Nats-Schedule-Target": "sc.t"}),
        ("sc.bad", b"d", {"Nats-Schedule": f"@at {at}"}),
        ("sc.bad", b"d", {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "sc.bad"}),
        ("sc.bad", b"d", {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "x.y"}),
        ("sc.bad", b"d", {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "sc.*"}),
        (
            "sc.bad",
            b"d",
            {
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": "sc.t",
                "Nats-Schedule-TTL": "bad",
            },
        ),
        (
            "sc.bad",
            b"d",
            {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": "sc.t", "Nats-Rollup": "all"},
        ),
        ("sc.bad", b"d", {"Nats-Schedule": "@at 2020-01-01", "Nats-Schedule-Target": "sc.t"}),
        ("sc.plain", b"d", {"Nats-Schedule": "", "Nats-Schedule-Target": "sc.t"}),
        ("sc.stop", b"d", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "sc.sch.b"}),
        ("sc.stop", b"d", {"Nats-Scheduler": "sc.sch.c"}),
        ("sc.stop", b"d", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "sc.none"}),
        ("$JS.API.STREAM.UPDATE.SC", {"name": "SC", "subjects": ["sc.>"]}, None),
        (
            "$JS.API.STREAM.CREATE.SX",
            {"name": "SX", "subjects": ["sx"], "allow_msg_schedules": True, "discard": "new"},
            None,
        ),
        (
            "$JS.API.STREAM.CREATE.SY",
            {"name": "SY", "subjects": ["sy"], "allow_msg_schedules": True, "deny_purge": True},
            None,
        ),
        ("sc.data", b"latest", {"Foo": "data"}),
        (
            "sc.sch.s",
            b"d",
            {
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": "sc.t.s",
                "Nats-Schedule-Source": "sc.data",
            },
        ),
        (
            "sc.bad",
            b"d",
            {
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": "sc.t.s",
                "Nats-Schedule-Source": "sc.t.s",
            },
        ),
        (
            "sc.bad",
            b"d",
            {
                "Nats-Schedule": f"@at {at}",
                "Nats-Schedule-Target": "sc.t.s",
                "Nats-Schedule-Source": "sc.*",
            },
        ),
        # Last: a time in the past fires at once (when exactly is the server's business).
        (
            "sc.sch.p",
            b"d",
            {"Nats-Schedule": "@at 2020-01-01T00:00:00+02:00", "Nats-Schedule-Target": "sc.t.p"},
        ),
    ]
    await compare(peers, steps)
    await _settled(peers, "SC", at)  # the @at schedules are due
    assert await stored(peers.tether, "SC") == await stored(peers.nats, "SC")


def _fi(batch_id: str, flow: int, gap: str, seq: int, op: int) -> str:
    return f"_INBOX.fi.{batch_id}.{flow}.{gap}.{seq}.{op}.$FI"


# Fast-ingest scenarios: (batch id, flow, gap mode, [(seq, op, headers)]).
_FAST: list[tuple[str, int, str, list[tuple[int, int, dict[str, str] | None]]]] = [
    ("b1", 2, "ok", [(1, 0, None), (2, 1, None), (3, 1, None), (4, 1, None), (5, 2, None)]),
    ("b2", 10, "ok", [(1, 0, None), (2, 1, None), (4, 1, None), (5, 3, None)]),
    ("b3", 10, "fail", [(1, 0, None), (2, 1, None), (4, 1, None), (5, 2, None)]),
    ("b4", 10, "ok", [(1, 0, None), (2, 1, None), (2, 4, None), (3, 2, None)]),
    ("b5", 10, "ok", [(1, 0, None), (2, 1, {"Nats-Expected-Last-Sequence": "1"}), (3, 2, None)]),
    ("b6", 10, "fail", [(1, 0, None), (2, 1, {"Nats-Expected-Last-Sequence": "1"}), (3, 2, None)]),
    ("b7", -5, "ok", [(1, 0, None), (2, 2, None)]),
    ("b8", 99999, "ok", [(1, 0, None), (2, 2, None)]),
    ("b9", 0, "ok", [(1, 2, None)]),
    ("unknown", 10, "ok", [(3, 1, None)]),
    ("ping", 10, "ok", [(1, 4, None)]),
    ("x" * 65, 10, "ok", [(1, 0, None)]),
    ("pattern", 10, "ok", [(2, 0, None), (1, 1, None), (1, 3, None), (0, 0, None), (1, 9, None)]),
    ("gapmode", 10, "maybe", [(1, 0, None)]),
]


async def _fast_batches(url: str) -> list[Any]:
    nc = await nats.connect(url)
    heard: dict[str, list[str]] = {}

    async def got(msg: Any) -> None:
        batch_id = msg.subject.split(".")[2]
        heard.setdefault(batch_id, []).append(msg.data.decode())

    try:
        create = {"name": "FB", "subjects": ["fb.>"], "allow_batched": True}
        out: list[Any] = [await request(nc, "$JS.API.STREAM.CREATE.FB", create)]
        create = {"name": "FN", "subjects": ["fn.>"]}
        out.append(await request(nc, "$JS.API.STREAM.CREATE.FN", create))
        await nc.subscribe("_INBOX.fi.>", cb=got)
        for batch_id, flow, gap, steps in _FAST:
            for seq, op, headers in steps:
                await nc.publish(
                    "fb.x", b"d", reply=_fi(batch_id, flow, gap, seq, op), headers=headers
                )
            await nc.flush()
            await asyncio.sleep(0.2)
        await nc.publish("fn.x", b"d", reply=_fi("off", 10, "ok", 1, 0))
        for _ in range(60):  # a flow ack every 500 of 1200 messages
            await nc.flush()
        for seq in range(1, 1201):
            op = 0 if seq == 1 else 2 if seq == 1200 else 1
            await nc.publish("fb.big", b"d", reply=_fi("big", 1000, "ok", seq, op))
        info = await _steady(nc, "FB")
        out.append(info["state"]["messages"])
        out.append(
            await request(nc, "$JS.API.STREAM.UPDATE.FB", {"name": "FB", "subjects": ["fb.>"]})
        )
        # The replies of each batch, as a set: which of a gap and an ack goes first is a
        # race on both servers. Stream sequences differ with timing only in the finals.
        out.append({k: sorted(v) for k, v in heard.items()})
        return out
    finally:
        await nc.close()


async def _steady(nc: Client, stream: str) -> dict[str, Any]:
    """The stream's info once its message count held for half a second (a second at
    least, 10 s at most): what a busy server still stores is not cut off mid-way."""
    await asyncio.sleep(0.5)
    info = await request(nc, f"$JS.API.STREAM.INFO.{stream}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        last, info = info, await request(nc, f"$JS.API.STREAM.INFO.{stream}")
        if info["state"]["messages"] == last["state"]["messages"]:
            break
    return info


async def test_fast_ingest_batches(peers: Peers) -> None:
    theirs = await _fast_batches(peers.nats)
    ours = await _fast_batches(peers.tether)
    assert ours[:-1] == theirs[:-1]
    for batch_id in sorted(set(theirs[-1]) | set(ours[-1])):
        assert ours[-1].get(batch_id) == theirs[-1].get(batch_id), batch_id


async def _sourced_counters(url: str) -> list[Any]:
    """Two counter streams sourced into a counter stream (which adds them up,
    ``Nats-Counter-Sources``) and into a plain one (which stores the copies as they are)."""
    nc = await nats.connect(url)
    try:
        out: list[Any] = []
        transforms = [
            {"name": name, "subject_transforms": [{"src": f"{name.lower()}.>", "dest": "agg.>"}]}
            for name in ("O1", "O2")
        ]
        for name, config in (
            ("O1", {"name": "O1", "subjects": ["o1.>"], "allow_msg_counter": True}),
            ("O2", {"name": "O2", "subjects": ["o2.>"], "allow_msg_counter": True}),
            ("AGG", {"name": "AGG", "allow_msg_counter": True, "sources": transforms}),
            ("PLAIN", {"name": "PLAIN", "sources": [{"name": "O1"}]}),
        ):
            out.append((await request(nc, f"$JS.API.STREAM.CREATE.{name}", config)).get("error"))
        for subject, incr in (("o1.x", "5"), ("o2.x", "3"), ("o1.x", "2"), ("o2.x", "-1")):
            out.append(await request(nc, subject, b"", {"Nats-Incr": incr}))
        for stream, subject, count in (("AGG", "agg.x", 4), ("PLAIN", "o1.x", 2)):
            for _ in range(100):  # until the sources have copied everything
                info = await request(nc, f"$JS.API.STREAM.INFO.{stream}")
                if info["state"]["messages"] >= count:
                    break
                await asyncio.sleep(0.1)
            body = {"last_by_subj": subject}
            msg = (await request(nc, f"$JS.API.STREAM.MSG.GET.{stream}", body))["message"]
            head = base64.b64decode(msg["hdrs"]).decode().split("\r\n")
            # Which source's copy lands last (its Nats-Incr) depends on timing: not kept.
            wanted = ("Nats-Counter-Sources",) if stream == "AGG" else ("Nats-Incr",)
            kept = sorted(h for h in head if h.startswith(wanted))
            out.append((stream, base64.b64decode(msg["data"]), kept))
        return out
    finally:
        await nc.close()


async def test_counters_fed_by_sources(peers: Peers) -> None:
    theirs = await _sourced_counters(peers.nats)
    ours = await _sourced_counters(peers.tether)
    assert ours == theirs
    assert theirs[-2][1] == b'{"val":"9"}'


async def _abandoned(url: str) -> list[Any]:
    nc = await nats.connect(url)
    got: list[Any] = []

    async def heard(msg: Any) -> None:
        event = json.loads(msg.data)
        assert event.pop("id") and event.pop("timestamp")
        got.append((msg.subject, event))

    try:
        await nc.subscribe("$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.>", cb=heard)
        config = {"name": "AD", "subjects": ["ad.>"], "allow_atomic": True}
        await request(nc, "$JS.API.STREAM.CREATE.AD", config)
        for headers in (batch("g", 1), batch("g", 3), batch("u", 1), batch("u", 2, "bad")):
            await request(nc, "ad.x", b"d", headers)
        await asyncio.sleep(0.3)
        return got
    finally:
        await nc.close()


async def test_abandoned_batch_advisory(peers: Peers) -> None:
    theirs = await _abandoned(peers.nats)
    assert theirs and theirs == await _abandoned(peers.tether)
