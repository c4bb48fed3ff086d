"""JetStream stream API: the same requests against Tether and nats-server, compared.

Every scenario is a list of steps (raw requests, publishes, batched reads). Each step's
reply is normalized (timestamps, ids, version-specific fields dropped) and the lists
from both servers must be equal. Deliberate differences are normalized away here
only when ``docs/compatibility.md`` documents them.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from conformance_support import Peers
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

pytestmark = pytest.mark.peer

NS = 1_000_000_000

# Fields whose values differ by nature (time, identity) or by server version.
_VOLATILE = {"ts", "created", "first_ts", "last_ts", "time", "cluster", "server_id"}


# -- steps ------------------------------------------------------------------------------


@dataclass
class Req:
    """A request; ``body`` dicts are sent as JSON. ``wait`` bounds the reply wait."""

    subject: str
    body: Any = b""
    headers: dict[str, str] | None = None
    wait: float = 2.0


@dataclass
class Batch:
    """A batched DIRECT.GET: collect replies until the end-of-batch status."""

    subject: str
    body: dict[str, Any]


@dataclass
class Pub:
    """A publish without a reply subject, then a round trip so it has been processed."""

    subject: str
    payload: bytes = b""
    headers: dict[str, str] | None = None


@dataclass
class WaitEmpty:
    """Poll STREAM.INFO until the stream is empty (max_age expiry), bounded."""

    stream: str
    timeout: float = 10.0


@dataclass
class Scenario:
    name: str
    steps: list[Any] = field(default_factory=list)


def _body(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


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
            if key == "api" and isinstance(item, dict):
                continue  # request counters and the API level (see compatibility.md)
            out[key] = normalize(item)
        error = out.get("error")
        if isinstance(error, dict) and error.get("err_code") == 10025:
            # The decoder's own message follows "invalid JSON: " (Go's vs msgspec's).
            error["description"] = "invalid JSON: <detail>"
        return out
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def _observe(msg: Msg) -> Any:
    headers = dict(msg.headers or {})
    status = headers.pop("Status", None)
    if status is not None or (headers and not msg.data.startswith(b"{")):
        desc = headers.pop("Description", "")
        headers.pop("Nats-Time-Stamp", None)
        return {"status": status, "description": desc, "headers": headers, "data": msg.data}
    try:
        doc = json.loads(msg.data)
    except ValueError:
        return {"raw": msg.data, "headers": headers}
    return normalize(doc)


async def _request(nc: Client, step: Req) -> Any:
    try:
        msg = await nc.request(
            step.subject, _body(step.body), timeout=step.wait, headers=step.headers
        )
    except NoRespondersError:
        return "no responders"
    except NatsTimeout:
        return "no reply"
    return _observe(msg)


async def _batch(nc: Client, step: Batch) -> Any:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(step.subject, _body(step.body), reply=inbox)
    out = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2)
            except NatsTimeout:
                out.append("no reply")
                break
            obs = _observe(msg)
            out.append(obs)
            if isinstance(obs, dict) and obs.get("status") is not None:
                break
    finally:
        await sub.unsubscribe()
    return out


async def _wait_empty(nc: Client, step: WaitEmpty) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + step.timeout
    while True:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{step.stream}", b"", timeout=2)
        state = json.loads(reply.data)["state"]
        if state["messages"] == 0 or loop.time() > deadline:
            return normalize(state)
        await asyncio.sleep(0.05)


async def run_scenario(url: str, scenario: Scenario) -> list[Any]:
    nc = await nats.connect(url)
    out: list[Any] = []
    try:
        for step in scenario.steps:
            if isinstance(step, Req):
                out.append(await _request(nc, step))
            elif isinstance(step, Batch):
                out.append(await _batch(nc, step))
            elif isinstance(step, Pub):
                await nc.publish(step.subject, step.payload, headers=step.headers)
                await nc.flush()
                out.append("published")
            elif isinstance(step, WaitEmpty):
                out.append(await _wait_empty(nc, step))
            else:  # pragma: no cover - a typo in a scenario
                raise TypeError(step)
    finally:
        # Leave the server empty for the next scenario.
        names = await nc.request("$JS.API.STREAM.NAMES", b"", timeout=2)
        for name in json.loads(names.data).get("streams") or []:
            await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=2)
        await nc.close()
    return out


# -- scenarios --------------------------------------------------------------------------

API = "$JS.API"


def create(name: str, **config: Any) -> Req:
    return Req(f"{API}.STREAM.CREATE.{name}", {"name": name, **config})


def update(name: str, **config: Any) -> Req:
    return Req(f"{API}.STREAM.UPDATE.{name}", {"name": name, **config})


def info(name: str, body: Any = b"") -> Req:
    return Req(f"{API}.STREAM.INFO.{name}", body)


def pub(subject: str, payload: bytes = b"x", **headers: str) -> Req:
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()} or None
    return Req(subject, payload, hdrs)


def msg_get(name: str, body: Any) -> Req:
    return Req(f"{API}.STREAM.MSG.GET.{name}", body)


def msg_delete(name: str, body: Any) -> Req:
    return Req(f"{API}.STREAM.MSG.DELETE.{name}", body)


def purge(name: str, body: Any = b"") -> Req:
    return Req(f"{API}.STREAM.PURGE.{name}", body)


def direct(name: str, body: Any = b"", subject: str = "") -> Req:
    tail = f".{subject}" if subject else ""
    return Req(f"{API}.DIRECT.GET.{name}{tail}", body)


NO_REPLY = 0.5  # how long to wait where the peer sends nothing

SCENARIOS = [
    Scenario(
        "account info",
        [
            Req(f"{API}.INFO"),
            create("A", subjects=["a.>"]),
            pub("a.1", b"hello"),
            Req(f"{API}.INFO"),
        ],
    ),
    Scenario(
        "create, info, identical re-create, conflicting re-create",
        [
            create("S", subjects=["s.*", "t.>"]),
            info("S"),
            create("S", subjects=["s.*", "t.>"]),
            create("S", subjects=["s.*"]),
            create("X", subjects=["s.a"]),
            create("Y", subjects=["t.a.>"]),
            create("D"),
            info("D"),
            info("NOPE"),
            info("S", "{bad"),
            Req(f"{API}.STREAM.NOPE"),
        ],
    ),
    Scenario(
        "create with every option",
        [
            create(
                "FULL",
                description="all of it",
                subjects=["f.>"],
                retention="limits",
                max_consumers=10,
                max_msgs=100,
                max_bytes=100_000,
                max_age=3600 * NS,
                max_msgs_per_subject=5,
                max_msg_size=1024,
                discard="new",
                discard_new_per_subject=True,
                storage="memory",
                num_replicas=1,
                duplicate_window=60 * NS,
                deny_delete=True,
                deny_purge=False,
                allow_rollup_hdrs=True,
                allow_direct=True,
                metadata={"team": "core"},
            ),
            create("WQ", subjects=["wq"], retention="workqueue"),
            create("INT", subjects=["int"], retention="interest", max_age=NS),
            create("ZEROS", max_msgs=0, max_bytes=0, max_msg_size=0, max_consumers=0),
            create("NEG", max_msgs=-5, max_bytes=-2),
            create("FS", first_seq=100),
            info("FS"),
        ],
    ),
    Scenario(
        "names and bodies that are refused",
        [
            Req(f"{API}.STREAM.CREATE.a.b", {"name": "a.b"}, wait=NO_REPLY),
            create("a*b"),
            create("a>b"),
            create("a/b"),
            create("a\\b"),
            Req(f"{API}.STREAM.CREATE.ab", {"name": "a b"}),
            Req(f"{API}.STREAM.CREATE.E1", b""),
            Req(f"{API}.STREAM.CREATE.E2", {"subjects": ["e2"]}),
            Req(f"{API}.STREAM.CREATE.E3", b"{bad json"),
            Req(f"{API}.STREAM.CREATE.E4", {"name": "OTHER"}),
            Req(f"{API}.STREAM.CREATE.E5", {"name": "E5", "max_msgs": "ten"}),
            create("E6", sealed=True),
            create("E7", max_age=50_000_000),
            create("E8", max_age=-1),
            create("E9", max_age=10 * NS, duplicate_window=20 * NS),
            create("E10", duplicate_window=50_000_000),
            create("E11", duplicate_window=-1),
            create("E12", subjects=["e12", "e12"]),
            create("E13", subjects=["e13.*", "e13.a"]),
            create("E14", subjects=[">"]),
            create("E15", subjects=["$JS.API.>"]),
            create("E16", subjects=["a..b"]),
            create("E17", discard_new_per_subject=True, max_msgs_per_subject=1),
            create("E18", discard="new", discard_new_per_subject=True),
            create("E19", deny_purge=True, allow_rollup_hdrs=True),
            create("E20", num_replicas=3),
            create("E21", retention="sometimes"),
            create("E22", storage="tape"),
            create("E23", discard="maybe"),
            create("E24", max_age=10 * NS),
            info("E24"),
        ],
    ),
    Scenario(
        "update: allowed and refused changes",
        [
            create("U", subjects=["u.>"], max_msgs=10, deny_delete=True, deny_purge=True),
            update(
                "U",
                subjects=["u.>", "v.>"],
                max_msgs=20,
                description="more",
                deny_delete=True,
                deny_purge=True,
                allow_direct=True,
            ),
            update("U", subjects=["u.>"], deny_delete=True, deny_purge=True, retention="interest"),
            update("U", subjects=["u.>"], deny_delete=True, deny_purge=True, retention="workqueue"),
            update("U", subjects=["u.>"], deny_delete=True, deny_purge=True, storage="memory"),
            update("U", subjects=["u.>"], deny_purge=True),
            update("U", subjects=["u.>"], deny_delete=True),
            update("U", subjects=["u.>"], deny_delete=True, deny_purge=True, max_age=20 * NS),
            update("NOPE", subjects=["nope"]),
            Req(f"{API}.STREAM.UPDATE.U", {"name": "V", "subjects": ["u.>"]}),
            Req(f"{API}.STREAM.UPDATE.U", b"{nope"),
            Req(f"{API}.STREAM.UPDATE.U", b""),
            create("W", subjects=["w.>"]),
            update("W", subjects=["w.>", "u.x"]),
            pub("w.1"),
            pub("w.2"),
            update("W", subjects=["w.>"], sealed=True),
            pub("w.3"),
            update("W", subjects=["w.>"]),
            purge("W"),
            msg_delete("W", {"seq": 1}),
            info("W"),
        ],
    ),
    Scenario(
        "publish: acks, dedup and expectations",
        [
            create("P", subjects=["p.>"]),
            pub("p.a", b"one"),
            pub("p.a", b"two", Nats_Msg_Id="m1"),
            pub("p.a", b"two again", Nats_Msg_Id="m1"),
            pub("p.b", b"three", Nats_Expected_Stream="P"),
            pub("p.b", b"x", Nats_Expected_Stream="Q"),
            pub("p.b", b"x", Nats_Expected_Last_Sequence="1"),
            pub("p.b", b"four", Nats_Expected_Last_Sequence="3"),
            pub("p.c", b"five", Nats_Expected_Last_Subject_Sequence="0"),
            pub("p.c", b"x", Nats_Expected_Last_Subject_Sequence="0"),
            pub("p.c", b"x", Nats_Expected_Last_Subject_Sequence="4"),
            pub("p.c", b"six", Nats_Expected_Last_Subject_Sequence="5"),
            pub(
                "p.d",
                b"seven",
                Nats_Expected_Last_Subject_Sequence="4",
                Nats_Expected_Last_Subject_Sequence_Subject="p.b",
            ),
            pub("p.d", b"x", Nats_Expected_Last_Subject_Sequence_Subject="p.b"),
            pub("p.e", b"eight", Nats_Msg_Id="m2"),
            pub("p.e", b"nine", Nats_Expected_Last_Msg_Id="m2"),
            pub("p.e", b"x", Nats_Expected_Last_Msg_Id="m2"),
            pub("p.e", b"x", Nats_Expected_Last_Sequence="abc"),
            pub("p.e", b"x", Nats_Rollup="sub"),
            pub("p.e", b"x", Nats_TTL="5"),
            pub("p.e", b"x", Nats_TTL="0"),
            pub("p.e", b"x", Nats_TTL="1m"),
            pub("p.e", b"x", Nats_TTL="500ms"),
            pub("p.e", b"x", Nats_TTL="never"),
            Pub("p.f", b"no reply"),
            Req("nobody.listens", b"x"),
            info("P", {"subjects_filter": ">"}),
            info("P", {"subjects_filter": "p.c"}),
            info("P", {"subjects_filter": "q.*"}),
            info("P", {"subjects_filter": ""}),
        ],
    ),
    Scenario(
        "rollups",
        [
            create("R", subjects=["r.>"], allow_rollup_hdrs=True),
            pub("r.a", b"1"),
            pub("r.a", b"2"),
            pub("r.b", b"3"),
            pub("r.a", b"4", Nats_Rollup="sub"),
            info("R", {"subjects_filter": ">"}),
            pub("r.c", b"5", Nats_Rollup="all"),
            info("R", {"subjects_filter": ">"}),
            pub("r.c", b"6", Nats_Rollup="everything"),
            pub("r.c", b"7", Nats_Rollup="SUB"),
            msg_get("R", {"seq": 5}),
        ],
    ),
    Scenario(
        "limits: discard old and new, per subject, sizes",
        [
            create("L", subjects=["l.>"], max_msgs=3, storage="memory"),
            *(pub(f"l.{i}", b"x" * i) for i in range(1, 6)),
            info("L"),
            create("LP", subjects=["lp.>"], max_msgs_per_subject=2),
            *(pub(f"lp.{i % 2}", b"y") for i in range(5)),
            info("LP", {"subjects_filter": ">"}),
            create("LN", subjects=["ln.>"], max_msgs=2, discard="new"),
            pub("ln.a"),
            pub("ln.b"),
            pub("ln.c"),
            create("LB", subjects=["lb"], max_bytes=100, discard="new", storage="memory"),
            pub("lb", b"z" * 40),
            pub("lb", b"z" * 40),
            pub("lb", b"z" * 40),
            info("LB"),
            create("LBO", subjects=["lbo"], max_bytes=100, storage="memory"),
            pub("lbo", b"z" * 40),
            pub("lbo", b"z" * 40),
            pub("lbo", b"z" * 40),
            info("LBO"),
            create(
                "LS",
                subjects=["ls.>"],
                max_msgs_per_subject=1,
                discard="new",
                discard_new_per_subject=True,
            ),
            pub("ls.a"),
            pub("ls.a"),
            pub("ls.b"),
            create("LSO", subjects=["lso.>"], max_msgs_per_subject=1, max_msgs=2, discard="new"),
            pub("lso.a"),
            pub("lso.b"),
            pub("lso.a"),
            pub("lso.c"),
            info("LSO"),
            create("LM", subjects=["lm"], max_msg_size=10),
            pub("lm", b"0123456789"),
            pub("lm", b"0123456789a"),
            pub("lm", b"01234", X_Pad="1234567890"),
        ],
    ),
    Scenario(
        "max_age expires on a timer",
        [
            create("AGE", subjects=["age"], max_age=300_000_000, storage="memory"),
            pub("age", b"1"),
            pub("age", b"2"),
            WaitEmpty("AGE"),
            pub("age", b"3"),
            info("AGE"),
        ],
    ),
    Scenario(
        "purge: all, filter, seq, keep",
        [
            create("PG", subjects=["pg.>"], storage="memory"),
            *(pub(f"pg.{'ab'[i % 2]}", str(i).encode()) for i in range(10)),
            purge("PG", {"filter": "pg.a", "keep": 2}),
            info("PG", {"subjects_filter": ">"}),
            purge("PG", {"seq": 5}),
            info("PG", {"subjects_filter": ">"}),
            purge("PG", {"filter": "pg.b", "seq": 8}),
            info("PG", {"subjects_filter": ">"}),
            purge("PG", {"keep": 1}),
            info("PG"),
            purge("PG", {"seq": 3, "keep": 1}),
            purge("PG", {"filter": "pg.*.x.>"}),
            purge("PG", "{bad"),
            purge("PG"),
            info("PG"),
            pub("pg.a", b"after"),
            info("PG"),
            purge("NOPE"),
            create("PD", subjects=["pd"], deny_purge=True),
            purge("PD"),
        ],
    ),
    Scenario(
        "message get",
        [
            create("G", subjects=["g.>"]),
            pub("g.a", b"1"),
            pub("g.b", b"2", Custom="yes"),
            pub("g.a", b""),
            pub("g.c.d", b"4"),
            msg_get("G", {"seq": 1}),
            msg_get("G", {"seq": 2}),
            msg_get("G", {"seq": 3}),
            msg_get("G", {"seq": 99}),
            msg_get("G", {"last_by_subj": "g.a"}),
            msg_get("G", {"last_by_subj": "g.*"}),
            msg_get("G", {"last_by_subj": "g.>"}),
            msg_get("G", {"last_by_subj": "g.x"}),
            msg_get("G", {"next_by_subj": "g.a"}),
            msg_get("G", {"seq": 2, "next_by_subj": "g.a"}),
            msg_get("G", {"seq": 2, "next_by_subj": "g.>"}),
            msg_get("G", {"seq": 5, "next_by_subj": "g.>"}),
            msg_get("G", {"seq": 1, "last_by_subj": "g.a"}),
            msg_get("G", {"last_by_subj": "g.a", "next_by_subj": "g.a"}),
            msg_get("G", {"seq": 1, "batch": 2}),
            msg_get("G", {"seq": 1, "no_hdr": True}),
            msg_get("G", {"seq": 2, "no_hdr": True}),
            msg_get("G", {}),
            msg_get("G", b""),
            msg_get("G", b"{bad"),
            msg_get("NOPE", {"seq": 1}),
        ],
    ),
    Scenario(
        "message delete",
        [
            create("MD", subjects=["md"]),
            pub("md", b"1"),
            pub("md", b"2"),
            pub("md", b"3"),
            msg_delete("MD", {"seq": 2}),
            msg_delete("MD", {"seq": 2}),
            msg_delete("MD", {"seq": 9}),
            msg_delete("MD", {"seq": 1, "no_erase": True}),
            msg_delete("MD", {}),
            msg_delete("MD", b""),
            msg_delete("MD", {"seq": 0}),
            info("MD"),
            msg_delete("NOPE", {"seq": 1}),
            create("MDD", subjects=["mdd"], deny_delete=True),
            pub("mdd"),
            msg_delete("MDD", {"seq": 1}),
        ],
    ),
    Scenario(
        "direct get",
        [
            create("ND", subjects=["nd"]),
            pub("nd"),
            direct("ND", {"seq": 1}),
            direct("ND", subject="nd"),
            create("DG", subjects=["dg.>"], allow_direct=True),
            pub("dg.a", b"1"),
            pub("dg.b", b"2", Custom="yes"),
            pub("dg.a", b"3"),
            pub("dg.c", b"4"),
            direct("DG", {"seq": 2}),
            direct("DG", {"last_by_subj": "dg.a"}),
            direct("DG", {"last_by_subj": "dg.*"}),
            direct("DG", {"next_by_subj": "dg.a", "seq": 2}),
            direct("DG", subject="dg.b"),
            direct("DG", subject="dg.zzz"),
            direct("DG", {"seq": 99}),
            direct("DG", {}),
            direct("DG", b"{bad"),
            direct("DG", {"seq": 1, "last_by_subj": "dg.a"}),
            Batch(f"{API}.DIRECT.GET.DG", {"seq": 1, "batch": 3}),
            Batch(f"{API}.DIRECT.GET.DG", {"seq": 2, "batch": 10}),
            Batch(f"{API}.DIRECT.GET.DG", {"seq": 1, "batch": 10, "max_bytes": 30}),
            Batch(f"{API}.DIRECT.GET.DG", {"seq": 1, "batch": 10, "next_by_subj": "dg.a"}),
            Batch(f"{API}.DIRECT.GET.DG", {"seq": 9, "batch": 2}),
        ],
    ),
    Scenario(
        "odds and ends",
        [
            Req(f"{API}.FOO", wait=NO_REPLY),
            Req(f"{API}.STREAM.INFO", wait=NO_REPLY),
            Req(f"{API}.STREAM.INFO.A.B", wait=NO_REPLY),
            Req(f"{API}.STREAM.MSG.NOPE.X", wait=NO_REPLY),
            direct("NOPE", {"seq": 1}),
            create("O", subjects=["o.>"], allow_direct=True),
            *(pub("o.a", str(i).encode()) for i in range(1, 6)),
            purge("O", {"seq": 3}),
            msg_delete("O", {"seq": 1}),
            msg_delete("O", {"seq": 4}),
            msg_delete("O", {"seq": 4, "extra": 1}),
            msg_delete("O", {"seq": -1}),
            info("O", {"deleted_details": True}),
            info("O", {"subjects_filter": ">", "offset": 1}),
            info("O", {"nope": 1}),
            info("O", b"not json"),
            Batch(f"{API}.DIRECT.GET.O", {"seq": 1, "batch": 5}),
            direct("O", {"seq": 3, "no_hdr": True}),
            direct("O", {"seq": 3}, subject="o.a"),
            direct("O", {"seq": 3, "unknown": True}),
            msg_get("O", {"start_time": "2000-01-01T00:00:00Z"}),
            purge("O", {"filter": "a..b"}),
            purge("O", {"filter": "o.>", "seq": 1000}),
            purge("O", b"not json"),
            create("PB", subjects=["pb"]),
            pub("pb"),
            pub("pb"),
            purge("PB", {"seq": 10}),
            info("PB"),
            pub("pb"),
            create("S2", subjects=["s2"], foo=1),
            create("S5", subjects=["s5"], description="", first_seq=0, pedantic=True),
            create("S6", subjects=[">"], no_ack=True),
            Req(f"{API}.STREAM.DELETE.S6"),
            # Not all of $JS.EVENT.>: nats-server's own STREAM.CREATED advisory for S7
            # would race into the reply's state (Tether publishes fewer advisories,
            # see consumers.md).
            create("S7", subjects=["$JS.EVENT.METRIC.>"]),
            create("S8", subjects=["$SYS.ACCOUNT.>"]),
            create("S9", subjects=["$SYS.>"]),
            create("S10", subjects=["s10"], num_replicas=6),
            create("S11", subjects=["s11"], num_replicas=-1),
            create("S12", subjects=["s12"], mirror_direct=True),
            create("S13", subjects=["s13"], compression="s2"),
            create("S14", subjects=["s14"], consumer_limits={"max_ack_pending": 5}),
            create("TTL", subjects=["ttl"], allow_msg_ttl=True),
            pub("ttl", b"no ttl"),
            pub("ttl", b"bad ttl", Nats_TTL="1ms"),
            update("TTL", subjects=["ttl"]),
            create("NA", subjects=["na"], no_ack=True),
            Req("na", b"x", wait=NO_REPLY),
            info("NA"),
            Req(f"{API}.STREAM.LIST", {"subject": "none"}),
            Req(f"{API}.STREAM.LIST", b"{bad"),
        ],
    ),
    Scenario(
        # nats-server's file store counts its record (subject + payload + 30, with
        # headers + headers + 34), its memory store subject + headers + payload + 16.
        "stream bytes after publishes, deletes and purges, file and memory",
        [
            *(
                step
                for storage, name in (("file", "BF"), ("memory", "BM"))
                for step in (
                    create(name, subjects=[f"{name}.>"], storage=storage),
                    pub(f"{name}.a", b"hello"),
                    info(name),
                    pub(f"{name}.a", b"hello", K="v"),
                    info(name),
                    pub(f"{name}.b", b""),
                    pub(f"{name}.b", b"", K="v", Other="value"),
                    pub(f"{name}.c", b"x" * 1000, K="v"),
                    pub(f"{name}.\u00e9t\u00e9", b"a subject counts its UTF-8 bytes"),
                    info(name, {"subjects_filter": ">"}),
                    msg_delete(name, {"seq": 2}),
                    info(name),
                    purge(name, {"filter": f"{name}.b"}),
                    info(name),
                    msg_get(name, {"seq": 5}),
                )
            ),
            Req(f"{API}.INFO"),
            purge("BF"),
            info("BF"),
            Req(f"{API}.INFO"),
        ],
    ),
    Scenario(
        # Compression changes what is on disk, never what a stream counts or gives
        # back: sizes, limits and reads are those of the messages as sent.
        "a compressed stream counts, limits and reads back the messages as sent",
        [
            create("Z", subjects=["z.>"], compression="s2", allow_direct=True, max_msg_size=1500),
            pub("z.a", b"abcdefghij" * 100),
            pub("z.a", b"abcdefghij" * 100, K="v"),
            pub("z.b", b"x" * 10),
            pub("z.c", b"y" * 1501),
            info("Z", {"subjects_filter": ">"}),
            msg_get("Z", {"seq": 2}),
            direct("Z", {"seq": 1}),
            update("Z", subjects=["z.>"], allow_direct=True, max_msg_size=1500),
            pub("z.a", b"klmnopqrst" * 100),
            info("Z"),
            update("Z", subjects=["z.>"], compression="s2", allow_direct=True, max_msg_size=1500),
            msg_get("Z", {"seq": 4}),
            msg_get("Z", {"last_by_subj": "z.a"}),
            # zm + 1000 + 30 = 1032 counted per message however small it is stored.
            create("ZM", subjects=["zm"], compression="s2", max_bytes=2064, discard="new"),
            *(pub("zm", b"z" * 1000) for _ in range(3)),
            info("ZM"),
        ],
    ),
    Scenario(
        "byte limits at the exact boundary, file and memory",
        [
            # dn + 18 bytes + 30 = 50 in a file stream; dm + 32 bytes + 16 = 50 in memory.
            create("DNF", subjects=["dn"], max_bytes=100, discard="new"),
            pub("dn", b"x" * 18),
            pub("dn", b"x" * 18),
            pub("dn", b""),
            info("DNF"),
            create("DNM", subjects=["dm"], max_bytes=100, discard="new", storage="memory"),
            pub("dm", b"x" * 32),
            pub("dm", b"x" * 32),
            pub("dm", b""),
            info("DNM"),
            # 50 + (dh + 18-byte headers + 4 bytes + 34 = 58) = 108 exactly.
            create("DNH", subjects=["dh"], max_bytes=108, discard="new"),
            pub("dh", b"x" * 18),
            pub("dh", b"x" * 4, K="v"),
            pub("dh", b""),
            info("DNH"),
            create("DNH2", subjects=["dh2"], max_bytes=109, discard="new"),
            pub("dh2", b"x" * 17),
            pub("dh2", b"x" * 4, K="v"),
            pub("dh2", b"x" * 5, K="v"),
            info("DNH2"),
            # One byte short of two messages: each publish evicts the one before.
            create("DOF", subjects=["do"], max_bytes=99),
            *(pub("do", b"x" * 18) for _ in range(3)),
            info("DOF"),
            create("DOF2", subjects=["do2"], max_bytes=100),
            *(pub("do2", b"x" * 17) for _ in range(3)),
            info("DOF2"),
            create("DOM", subjects=["dom"], max_bytes=99, storage="memory"),
            *(pub("dom", b"x" * 31, K="v") for _ in range(3)),
            info("DOM"),
            # max_msg_size compares headers + payload only.
            *(
                step
                for storage, name in (("file", "MSF"), ("memory", "MSM"))
                for step in (
                    create(name, subjects=[name], max_msg_size=20, storage=storage),
                    pub(name, b"x" * 20),
                    pub(name, b"x" * 21),
                    pub(name, b"x" * 2, K="v"),
                    pub(name, b"x" * 3, K="v"),
                    info(name),
                )
            ),
        ],
    ),
    Scenario(
        "key-value bucket bytes",
        [
            create(
                "KV_cfg",
                subjects=["$KV.cfg.>"],
                max_msgs_per_subject=1,
                allow_rollup_hdrs=True,
                deny_delete=True,
                allow_direct=True,
                discard="new",
                max_bytes=400,
            ),
            pub("$KV.cfg.k", b"value one"),
            pub("$KV.cfg.k", b"value two, longer"),
            pub("$KV.cfg.other", b"v"),
            info("KV_cfg"),
            pub("$KV.cfg.k", b"", KV_Operation="DEL"),
            pub("$KV.cfg.other", b"", KV_Operation="PURGE", Nats_Rollup="sub"),
            info("KV_cfg"),
            pub("$KV.cfg.big", b"x" * 300),
            info("KV_cfg"),
        ],
    ),
    Scenario(
        "names and list with filters and paging",
        [
            create("N1", subjects=["n.1.>"]),
            create("N2", subjects=["n.2"]),
            create("N3", subjects=["other"]),
            Req(f"{API}.STREAM.NAMES"),
            Req(f"{API}.STREAM.NAMES", {"subject": "n.>"}),
            Req(f"{API}.STREAM.NAMES", {"subject": "n.1.x"}),
            Req(f"{API}.STREAM.NAMES", {"subject": "n.*.x"}),
            Req(f"{API}.STREAM.NAMES", {"subject": "none"}),
            Req(f"{API}.STREAM.NAMES", {"offset": 1}),
            Req(f"{API}.STREAM.NAMES", {"offset": 10}),
            Req(f"{API}.STREAM.NAMES", b"{bad"),
            Req(f"{API}.STREAM.LIST", {"offset": 2}),
            Req(f"{API}.STREAM.LIST", {"subject": "n.2"}),
            Req(f"{API}.STREAM.LIST", {"subject": "none"}),
            Req(f"{API}.STREAM.DELETE.N2"),
            Req(f"{API}.STREAM.DELETE.N2"),
            Req(f"{API}.STREAM.NAMES"),
        ],
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_same_replies_as_nats_server(peers: Peers, scenario: Scenario) -> None:
    expected = await run_scenario(peers.nats, scenario)
    actual = await run_scenario(peers.tether, scenario)
    diffs = []
    for i, (step, want, got) in enumerate(zip(scenario.steps, expected, actual, strict=True)):
        if want != got:
            diffs.append(f"step {i} {step}:\n  nats-server: {want}\n  tether:      {got}")
    assert not diffs, "\n".join(diffs)


def test_normalize_drops_only_what_may_differ() -> None:
    doc = {
        "ts": "x",
        "config": {"name": "S", "storage": "file", "metadata": {"_nats.ver": "2", "k": "v"}},
        "state": {"messages": 1, "bytes": 40, "first_ts": "y"},
        "error": {"code": 400, "err_code": 10025, "description": "invalid JSON: at offset 2"},
    }
    assert normalize(doc) == {
        "config": {"name": "S", "storage": "file", "metadata": {"k": "v"}},
        "state": {"messages": 1, "bytes": 40},  # sizes are compared, file and memory alike
        "error": {"code": 400, "err_code": 10025, "description": "invalid JSON: <detail>"},
    }
    memory = {"config": {"storage": "memory"}, "state": {"bytes": 40}}
    assert normalize(memory) == memory
