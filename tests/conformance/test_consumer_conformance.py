"""Consumers: the same pull/ack scenarios against Tether and nats-server, compared.

Each scenario is a list of steps (API requests, publishes, pull requests collected for a
moment, acks). Every observation is normalized (timestamps, generated names dropped)
and the lists from both servers must be equal: statuses and their headers, ack
subjects (minus the timestamp token), consumer configs and counters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest
from conformance_support import Peers
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from tether.testing import run_server

pytestmark = pytest.mark.peer

API = "$JS.API"
_VOLATILE = {
    "ts",
    "created",
    "last_active",
    "cluster",
    "metadata",
    "pause_until",
    "pause_remaining",
    "first_ts",
    "last_ts",
}


@pytest.fixture(scope="module")
def peers(nats_peer_url: str) -> Iterator[Peers]:
    """conftest's pair, with a memory store: these scenarios test no durability."""
    with run_server(store="memory") as tether:
        yield Peers(tether.url, nats_peer_url)


# -- observations ----------------------------------------------------------------------------


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: normalize(v) for k, v in value.items() if k not in _VOLATILE}
        error = out.get("error")
        if isinstance(error, dict) and error.get("err_code") == 10025:
            error["description"] = "invalid JSON: <detail>"
        return out
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def observe(msg: Msg) -> Any:
    headers = dict(msg.headers or {})
    status = headers.pop("Status", None)
    if status is not None:
        desc = headers.pop("Description", "")
        if status == "400":
            desc = desc.split(" - ")[0]  # the peer quotes Go's JSON error text
        return ("status", status, desc, sorted(headers.items()))
    if msg.reply.startswith("$JS.ACK."):
        tokens = msg.reply.split(".")
        del tokens[7]  # the message timestamp
        return ("msg", msg.subject, msg.data, ".".join(tokens), sorted(headers.items()))
    if msg.data.startswith(b"{"):
        return normalize(json.loads(msg.data))
    return ("raw", msg.data)


class Session:
    """One client's view of a scenario; every step appends to ``log``."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.log: list[Any] = []
        self.acks: dict[int, str] = {}  # stream seq -> last ack subject seen

    async def req(self, subject: str, body: Any = b"", keep: bool = True) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            msg = await self.nc.request(subject, data, timeout=2)
            out = observe(msg)
        except NoRespondersError:
            out = "no responders"
        except NatsTimeout:
            out = "no reply"
        if keep:
            self.log.append(out)
        return out

    async def pub(self, subject: str, n: int = 1, data: bytes = b"x") -> None:
        # Stored messages always get an answer: a long timeout only bounds a slow machine.
        for i in range(n):
            await self.nc.request(subject, data + b"%d" % i, timeout=10)

    async def pull(self, stream: str, consumer: str, body: Any = b"", wait: float = 1.0) -> None:
        """A pull request; replies are collected until a status ends it, the batch is
        complete (plus a moment for a trailing status), or ``wait`` passes."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        batch = _batch_of(data)
        await self.nc.publish(f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", data, reply=inbox)
        got: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        delivered = 0
        while (left := deadline - loop.time()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except NatsTimeout:
                break
            if msg.reply.startswith("$JS.ACK."):
                self.acks[int(msg.reply.split(".")[5])] = msg.reply
                delivered += 1
                if delivered == batch:
                    deadline = min(deadline, loop.time() + 0.1)
            got.append(observe(msg))
            if got[-1][0] == "status" and got[-1][1] in ("400", "404", "408", "409"):
                break
        await sub.unsubscribe()
        self.log.append(got)

    async def collect(
        self, sub: Any, wait: float, until: Callable[[list[Any]], bool] | None = None
    ) -> None:
        """Everything a subscription receives for ``wait`` seconds, or up to the moment
        ``until`` holds for what it has received (``wait`` then only bounds a failure:
        a loaded machine delays deliveries and heartbeats)."""
        got: list[Any] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while (left := deadline - loop.time()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except NatsTimeout:
                break
            if msg.reply.startswith("$JS.ACK."):
                self.acks[int(msg.reply.split(".")[5])] = msg.reply
            got.append(observe(msg))
            if until is not None and until(got):
                break
        self.log.append(got)

    async def ack(self, seq: int, body: bytes = b"+ACK", reply: bool = False) -> None:
        subject = self.acks[seq]
        if reply:
            self.log.append(("ack reply", (await self.nc.request(subject, body, timeout=2)).data))
        else:
            await self.nc.publish(subject, body)
            await self.nc.flush()

    async def info(self, stream: str, consumer: str) -> None:
        await asyncio.sleep(0.02)  # acks are asynchronous on nats-server
        await self.req(f"{API}.CONSUMER.INFO.{stream}.{consumer}")

    async def stream(self, name: str, **config: Any) -> None:
        # Not logged, so not left to req's short "no reply": a slow machine's late answer
        # would otherwise surface steps later as "no responders".
        data = json.dumps({"name": name, **config}).encode()
        await self.nc.request(f"{API}.STREAM.CREATE.{name}", data, timeout=10)

    async def consumer(self, stream: str, name: str, **config: Any) -> None:
        body = {"stream_name": stream, "config": {"durable_name": name, **config}}
        await self.req(f"{API}.CONSUMER.CREATE.{stream}.{name}", body)


def _batch_of(body: bytes) -> int:
    text = body.strip()
    if text.startswith(b"{"):
        try:
            return max(int(json.loads(text).get("batch") or 1), 1)
        except ValueError:
            return 1
    return int(text) if text.isdigit() else 1


async def run(url: str, scenario: Any) -> list[Any]:
    nc = await nats.connect(url)
    session = Session(nc)
    try:
        await scenario(session)
    finally:
        names = await nc.request(f"{API}.STREAM.NAMES", b"", timeout=2)
        for name in json.loads(names.data).get("streams") or []:
            await nc.request(f"{API}.STREAM.DELETE.{name}", b"", timeout=2)
        await nc.close()
    return session.log


async def compare(peers: Peers, scenario: Any) -> None:
    theirs, ours = await asyncio.gather(run(peers.nats, scenario), run(peers.tether, scenario))
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        assert b == a, f"step {i} differs"


# -- scenarios ---------------------------------------------------------------------------------


async def pull_and_ack(s: Session) -> None:
    await s.stream("S", subjects=["s.>"])
    await s.consumer("S", "C", ack_policy="explicit", ack_wait=5_000_000_000, max_deliver=3)
    await s.pull("S", "C", {"batch": 2, "no_wait": True})
    await s.pub("s.a", 4)
    await s.info("S", "C")
    await s.pull("S", "C", {"batch": 2, "no_wait": True})
    await s.pull("S", "C", {"batch": 5, "no_wait": True})
    await s.info("S", "C")
    await s.ack(1, reply=True)
    await s.ack(1, reply=True)  # a second ack is answered too
    await s.ack(2, b"-NAK")
    await s.ack(3, b"+TERM bad")
    await s.ack(4, b"+WPI")
    await s.info("S", "C")
    await s.pull("S", "C", b"3")
    await s.ack(2)
    await s.info("S", "C")
    await s.pull("S", "C", {"batch": 2, "no_wait": True})


async def statuses(s: Session) -> None:
    await s.stream("T", subjects=["t.>"])
    await s.consumer("T", "C", ack_policy="explicit", max_waiting=1)
    await s.pull("T", "C", {"batch": 1, "expires": 100_000_000})
    await s.pull("T", "C", {"batch": 1, "no_wait": True, "expires": 100_000_000})
    await s.pull("T", "C", {"batch": 1, "expires": 100_000_000, "idle_heartbeat": 80_000_000})
    await s.pull("T", "C", b"{bad")
    await s.pub("t.a", 2)
    await s.pull("T", "C", {"batch": 2, "max_bytes": 10})
    await s.pull("T", "C", {"batch": 1, "max_bytes": 1000, "no_wait": True})
    await s.pull("T", "C", {"batch": 1, "expires": -5})
    await s.pull("T", "C", {"batch": 0})
    await s.req(f"{API}.CONSUMER.MSG.NEXT.T.nope", b"")
    await s.info("T", "C")


async def heartbeats(s: Session) -> None:
    await s.stream("H", subjects=["h.>"])
    await s.consumer("H", "C", ack_policy="explicit")
    await s.pull("H", "C", {"batch": 2, "expires": 500_000_000, "idle_heartbeat": 200_000_000})
    await s.pub("h.a", 1)
    await s.pull("H", "C", {"batch": 1, "expires": 500_000_000, "idle_heartbeat": 200_000_000})


async def ack_policies(s: Session) -> None:
    await s.stream("P", subjects=["p.>"])
    await s.pub("p.a", 4)
    await s.consumer("P", "ALL", ack_policy="all")
    await s.pull("P", "ALL", {"batch": 4, "no_wait": True})
    await s.ack(3)
    await s.info("P", "ALL")
    await s.ack(2, b"-NAK")
    await s.info("P", "ALL")
    await s.consumer("P", "NONE", ack_policy="none")
    await s.pull("P", "NONE", {"batch": 2, "no_wait": True})
    await s.info("P", "NONE")
    await s.consumer("P", "MAP", ack_policy="explicit", max_ack_pending=2)
    await s.pull("P", "MAP", {"batch": 4, "no_wait": True})
    await s.info("P", "MAP")


async def deliver_policies(s: Session) -> None:
    await s.stream("D", subjects=["d.>"])
    await s.pub("d.a", 2)
    await s.pub("d.b", 2)
    await s.pub("d.a", 1)
    await s.consumer("D", "ALL", ack_policy="none")
    await s.consumer("D", "LAST", ack_policy="none", deliver_policy="last")
    await s.consumer("D", "NEW", ack_policy="none", deliver_policy="new")
    await s.consumer(
        "D", "SEQ", ack_policy="none", deliver_policy="by_start_sequence", opt_start_seq=4
    )
    await s.consumer(
        "D", "LPS", ack_policy="none", deliver_policy="last_per_subject", filter_subject="d.>"
    )
    await s.consumer("D", "FILT", ack_policy="none", filter_subjects=["d.b"])
    for name in ("ALL", "LAST", "NEW", "SEQ", "LPS", "FILT"):
        await s.pull("D", name, {"batch": 9, "no_wait": True})
        await s.info("D", name)


async def consumer_api(s: Session) -> None:
    await s.stream("A", subjects=["a.>"])
    await s.consumer("A", "C1", ack_policy="explicit")
    await s.consumer("A", "C1", ack_policy="explicit")  # identical: fine
    await s.consumer("A", "C1", ack_policy="all")  # 10012
    await s.consumer("A", "C1", ack_policy="explicit", max_ack_pending=5)  # an update
    await s.consumer("A", "C2", ack_policy="explicit", deliver_subject="push.c2")
    body = {"stream_name": "A", "config": {"name": "E1", "filter_subject": "a.x"}}
    await s.req(f"{API}.CONSUMER.CREATE.A.E1.a.y", body)  # 10131
    await s.req(f"{API}.CONSUMER.CREATE.A.E1.a.x", body)
    await s.req(f"{API}.CONSUMER.DURABLE.CREATE.A.D1", {"stream_name": "A", "config": {}})
    bad: list[dict[str, Any]] = [
        {"flow_control": True},
        {"idle_heartbeat": 1_000_000_000},
        {"deliver_subject": "x", "flow_control": True},
        {"deliver_subject": "x", "idle_heartbeat": 1000},
        {"deliver_subject": "x", "max_waiting": 10},
        {"max_deliver": 2, "backoff": [1, 2, 3]},
        {"filter_subject": "a.x", "filter_subjects": ["a.y"]},
        {"filter_subjects": ["a.>", "a.b"]},
        {"deliver_policy": "by_start_sequence"},
        {"deliver_policy": "by_start_time"},
        {"deliver_policy": "all", "opt_start_seq": 3},
        {"deliver_policy": "last_per_subject"},
    ]
    for config in bad:
        await s.req(
            f"{API}.CONSUMER.CREATE.A.BAD",
            {"stream_name": "A", "config": {"name": "BAD", **config}},
        )
    await s.req(f"{API}.CONSUMER.CREATE.A.X", {"stream_name": "B", "config": {"name": "X"}})
    await s.req(f"{API}.CONSUMER.CREATE.NONE.X", {"stream_name": "NONE", "config": {"name": "X"}})
    await s.req(f"{API}.CONSUMER.NAMES.A")
    await s.req(f"{API}.CONSUMER.LIST.A")
    await s.req(f"{API}.CONSUMER.DELETE.A.C1")
    await s.req(f"{API}.CONSUMER.DELETE.A.C1")
    await s.req(f"{API}.CONSUMER.INFO.A.C1")
    await s.req(f"{API}.CONSUMER.PAUSE.A.C2", {"pause_until": "2099-01-01T00:00:00Z"})
    await s.req(f"{API}.CONSUMER.PAUSE.A.C2", {})
    await s.req(f"{API}.STREAM.INFO.A")


async def workqueue(s: Session) -> None:
    await s.stream("W", subjects=["w.>"], retention="workqueue", storage="memory")
    await s.consumer("W", "A", ack_policy="none")
    await s.consumer("W", "A", ack_policy="explicit", filter_subject="w.a")
    await s.pub("w.a", 2)
    await s.pull("W", "A", {"batch": 2, "no_wait": True})
    await s.ack(1, reply=True)
    await s.req(f"{API}.STREAM.INFO.W")
    # (nats-server 2.15.1 resets a consumer's counters when a conflicting create is
    # refused, a bug fixed later: the refusals come last here.)
    await s.consumer("W", "B", ack_policy="explicit")
    await s.consumer("W", "B", ack_policy="explicit", filter_subject="w.>")
    await s.consumer("W", "B", ack_policy="explicit", filter_subject="w.b")


async def redelivery(s: Session) -> None:
    await s.stream("R", subjects=["r.>"])
    await s.consumer("R", "C", ack_policy="explicit", ack_wait=300_000_000, max_deliver=2)
    await s.pub("r.a", 3)
    await s.pull("R", "C", {"batch": 3, "no_wait": True})
    await s.ack(2)
    await asyncio.sleep(0.45)
    await s.info("R", "C")
    await s.pull("R", "C", {"batch": 5, "no_wait": True})
    await asyncio.sleep(0.45)
    await s.info("R", "C")
    await s.pull("R", "C", {"batch": 5, "no_wait": True})


async def push(s: Session) -> None:
    await s.stream("U", subjects=["u.>"])
    await s.pub("u.a", 2)
    sub = await s.nc.subscribe("push.in")
    await s.consumer(
        "U", "P", ack_policy="explicit", deliver_subject="push.in", idle_heartbeat=200_000_000
    )
    # The two messages, then the first idle heartbeat (200 ms later; later ones are timing).
    await s.collect(sub, 5.0, until=lambda got: tuple(got[-1])[:2] == ("status", "100"))
    await s.info("U", "P")
    await s.ack(1)
    await s.ack(2)
    await sub.unsubscribe()
    await s.info("U", "P")


async def max_bytes_with_headers(s: Session) -> None:
    # A pull's max_bytes counts subject, ack reply, headers and payload, whatever the
    # stream's storage counts for its own bytes.
    for name, storage in (("MBF", "file"), ("MBM", "memory")):
        await s.stream(name, subjects=[f"{name}.>"], storage=storage)
        await s.consumer(name, "C", ack_policy="explicit")
        for i in range(4):
            await s.nc.request(f"{name}.a", b"payload %d" % i, headers={"K": "v"}, timeout=2)
        for max_bytes in (50, 90, 91, 200):
            await s.pull(name, "C", {"batch": 4, "max_bytes": max_bytes, "expires": 200_000_000})
        await s.info(name, "C")
        await s.req(f"{API}.STREAM.INFO.{name}")


@pytest.mark.parametrize(
    "scenario",
    [
        pull_and_ack,
        max_bytes_with_headers,
        statuses,
        heartbeats,
        ack_policies,
        deliver_policies,
        consumer_api,
        workqueue,
        redelivery,
        push,
    ],
    ids=lambda f: f.__name__,
)
async def test_same_as_nats_server(peers: Peers, scenario: Any) -> None:
    await compare(peers, scenario)
