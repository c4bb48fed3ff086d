"""Priority groups, consumer reset and the other 2.11 to 2.14 consumer features, against
Tether and nats-server, compared step by step (the scenarios' machinery is
``test_consumer_conformance``'s).

Pin ids are random on both servers: every id a log shows (``Nats-Pin-Id``,
``pinned_client_id``, ``pinned_id``) is replaced by ``PIN<n>`` in order of appearance
before the logs are compared.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.subscription import Subscription

sys.path.insert(0, str(Path(__file__).parent))
from test_consumer_conformance import API, Peers, Session, observe, peers, run

pytestmark = pytest.mark.peer
__all__ = ["peers"]  # the fixture, shared with the consumer scenarios

_PIN_KEYS = ("pinned_client_id", "pinned_id")
_ADVISORY_VOLATILE = ("id", "timestamp")
_ZERO_TIME = "0001-01-01T00:00:00Z"


def _pins_in(value: Any, found: list[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if k in _PIN_KEYS and isinstance(v, str) and v not in found:
                found.append(v)
            _pins_in(v, found)
    elif isinstance(value, list | tuple):
        if len(value) == 2 and value[0] == "Nats-Pin-Id" and value[1] not in found:
            found.append(value[1])
        for v in value:
            _pins_in(v, found)


def _replace(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, dict):
        out = {k: _replace(v, names) for k, v in value.items()}
        if out.get("pinned_ts", _ZERO_TIME) != _ZERO_TIME:
            out["pinned_ts"] = "<set>"  # a time: only whether it is set is compared
        return out
    if isinstance(value, tuple):
        return tuple(_replace(v, names) for v in value)
    if isinstance(value, list):
        return [_replace(v, names) for v in value]
    return value


async def until(what: str, done: Callable[[], bool]) -> None:
    """Wait for something observable (a delivery, an advisory) instead of a fixed time:
    a loaded machine delays timers and deliveries. The deadline only bounds a failure."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not done():
        assert loop.time() < deadline, f"not within 10 s: {what}"
        await asyncio.sleep(0.01)


async def num_waiting(s: Session, stream: str, consumer: str, n: int) -> None:
    """Wait until the consumer holds ``n`` waiting pull requests (its info, not logged)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        msg = await s.nc.request(f"{API}.CONSUMER.INFO.{stream}.{consumer}", b"", timeout=2)
        waiting = json.loads(msg.data).get("num_waiting", 0)
        if waiting == n:
            return
        assert loop.time() < deadline, f"{stream} > {consumer}: {waiting} waiting, not {n}"
        await asyncio.sleep(0.01)


async def stored(s: Session, stream: str, n: int) -> None:
    """Wait until ``stream`` holds ``n`` messages published without waiting for their
    acks (its info, not logged)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        msg = await s.nc.request(f"{API}.STREAM.INFO.{stream}", b"", timeout=2)
        count = json.loads(msg.data).get("state", {}).get("messages", 0)
        if count == n:
            return
        assert loop.time() < deadline, f"{stream}: {count} messages stored, not {n}"
        await asyncio.sleep(0.01)


def canonical_pins(log: list[Any]) -> list[Any]:
    found: list[str] = []
    _pins_in(log, found)
    return _replace(log, {pin: f"PIN{i}" for i, pin in enumerate(found, 1)})


async def compare(peers: Peers, scenario: Any) -> None:
    theirs, ours = await asyncio.gather(run(peers.nats, scenario), run(peers.tether, scenario))
    theirs, ours = canonical_pins(theirs), canonical_pins(ours)
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        assert b == a, f"step {i} differs"


def last_pin(s: Session) -> str:
    """The pin id the last pull's messages carried."""
    for entry in reversed(s.log[-1]):
        if entry[0] == "msg":
            for key, value in entry[4]:
                if key == "Nats-Pin-Id":
                    return str(value)
    raise AssertionError("no pinned message in the last pull")


class Advisories:
    """Pinned and unpinned advisories of one consumer, in arrival order."""

    def __init__(self, s: Session, stream: str, consumer: str) -> None:
        self.s = s
        self.subjects = [
            f"$JS.EVENT.ADVISORY.CONSUMER.{kind}.{stream}.{consumer}"
            for kind in ("PINNED", "UNPINNED")
        ]
        self.got: list[Any] = []
        self.subs: list[Any] = []

    async def start(self) -> None:
        async def keep(msg: Any) -> None:
            event = json.loads(msg.data)
            for key in _ADVISORY_VOLATILE:
                event.pop(key, None)
            self.got.append((msg.subject, event))

        for subject in self.subjects:
            self.subs.append(await self.s.nc.subscribe(subject, cb=keep))

    async def log(self, expect: int, quiet: float = 0.2) -> None:
        """What arrived since the last call: once ``expect`` advisories are in (nats-server
        sends them from its own queue, a moment after the request), and ``quiet`` more
        seconds for any unexpected one."""
        await until(f"{expect} advisories, got {self.got}", lambda: len(self.got) >= expect)
        await asyncio.sleep(quiet)
        self.s.log.append(self.got)
        self.got = []

    async def stop(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()


# -- scenarios ---------------------------------------------------------------------------------


async def priority_config(s: Session) -> None:
    await s.stream("C", subjects=["c.>"])
    bad: list[dict[str, Any]] = [
        {"priority_policy": "overflow"},
        {"priority_groups": ["a"]},
        {"priority_groups": ["a"], "priority_policy": "none"},
        {"priority_timeout": 1000},
        {"priority_groups": [""], "priority_policy": "overflow"},
        {"priority_groups": ["a.b"], "priority_policy": "overflow"},
        {"priority_groups": ["abcdefghijklmnopq"], "priority_policy": "pinned_client"},
        {"priority_groups": ["a"], "priority_policy": "bogus"},
        {"priority_groups": ["a"], "priority_policy": "overflow", "deliver_subject": "x.y"},
    ]
    for config in bad:
        await s.consumer("C", "BAD", **config)
    await s.consumer("C", "PIN", priority_groups=["a", "b/c"], priority_policy="pinned_client")
    await s.consumer("C", "PRI", priority_groups=["a"], priority_policy="prioritized")
    await s.consumer(
        "C", "OVF", priority_groups=["A=1"], priority_policy="overflow", priority_timeout=5
    )
    # Priority settings may be updated, the policy too.
    await s.consumer("C", "OVF", priority_groups=["x"], priority_policy="pinned_client")
    await s.consumer("C", "OVF")
    await s.req(f"{API}.CONSUMER.INFO.C.OVF")


async def overflow(s: Session) -> None:
    await s.stream("O", subjects=["o.>"])
    await s.consumer("O", "N", ack_policy="explicit")
    for body in (
        {"batch": 1, "no_wait": True, "min_pending": 1},
        {"batch": 1, "no_wait": True, "id": "x"},
        {"batch": 1, "no_wait": True, "priority": 10},
        {"batch": 1, "no_wait": True, "priority": -1},
        {"batch": 1, "no_wait": True, "group": "a", "priority": 3},
    ):
        await s.pull("O", "N", body, wait=5.0)  # each ends with a status at once
    await s.consumer(
        "O", "C", ack_policy="explicit", priority_groups=["a"], priority_policy="overflow"
    )
    for body in (
        {"batch": 1, "no_wait": True},
        {"batch": 1, "no_wait": True, "group": "b"},
        {"batch": 1, "no_wait": True, "group": "a.b"},
        {"batch": 1, "no_wait": True, "group": "a", "id": "x"},
        {"batch": 1, "no_wait": True, "group": "a", "priority": 2},
    ):
        await s.pull("O", "C", body, wait=5.0)
    await s.pub("o.a", 3)
    # Each ends with its batch or a 408 (a longer wait only bounds a slow machine).
    body = {"batch": 5, "expires": 300_000_000, "group": "a", "min_pending": 4}
    await s.pull("O", "C", body, wait=5.0)
    body = {"batch": 1, "expires": 300_000_000, "group": "a", "min_pending": 3}
    await s.pull("O", "C", body, wait=5.0)
    body = {"batch": 1, "expires": 300_000_000, "group": "a", "min_ack_pending": 2}
    await s.pull("O", "C", body, wait=5.0)
    body = {
        "batch": 1,
        "expires": 300_000_000,
        "group": "a",
        "min_ack_pending": 1,
        "min_pending": 9,
    }
    await s.pull("O", "C", body, wait=5.0)
    await s.pull("O", "C", {"batch": 1, "no_wait": True, "group": "a", "min_pending": 100})
    await s.pull("O", "C", {"batch": 1, "no_wait": True, "group": "a"})
    await s.info("O", "C")


async def pinned(s: Session) -> None:
    await s.stream("P", subjects=["p.>"])
    adv = Advisories(s, "P", "C")
    await adv.start()
    await s.consumer(
        "P",
        "C",
        ack_policy="explicit",
        priority_groups=["g"],
        priority_policy="pinned_client",
        priority_timeout=30_000_000_000,
    )
    await s.pub("p.a", 4)
    await s.pull("P", "C", {"batch": 2, "expires": 300_000_000, "group": "g"})
    pin = last_pin(s)
    await adv.log(1)  # pinned
    await s.info("P", "C")
    await s.pull("P", "C", {"batch": 1, "expires": 200_000_000, "group": "g", "id": "nope"})
    # A standby (no id) gets nothing while the pin holds: its request expires (408).
    await s.pull("P", "C", {"batch": 1, "expires": 300_000_000, "group": "g"}, wait=5.0)
    await s.pull("P", "C", {"batch": 1, "expires": 300_000_000, "group": "g", "id": pin})
    await s.req(f"{API}.CONSUMER.UNPIN.P.C", {"group": "g"})
    await adv.log(1)  # unpinned
    await s.info("P", "C")
    # The old pin is stale now: a waiting request with it ends with 423.
    await s.pull("P", "C", {"batch": 1, "expires": 300_000_000, "group": "g", "id": pin})
    await s.pull("P", "C", {"batch": 1, "expires": 300_000_000, "group": "g"})
    await adv.log(1)  # pinned anew
    await s.info("P", "C")
    for body in ({}, {"group": "zz"}, {"group": "a.b"}, {"group": "g", "x": 1}):
        await s.req(f"{API}.CONSUMER.UNPIN.P.C", body)
    await s.req(f"{API}.CONSUMER.UNPIN.P.C", b"")
    await s.req(f"{API}.CONSUMER.UNPIN.P.NOPE", {"group": "g"})
    await s.req(f"{API}.CONSUMER.UNPIN.NOPE.C", {"group": "g"})
    await adv.log(1)  # unpinned by the request with an unknown field
    await adv.stop()


async def pin_timeout(s: Session) -> None:
    await s.stream("T", subjects=["t.>"])
    adv = Advisories(s, "T", "C")
    await adv.start()
    await s.consumer(
        "T",
        "C",
        ack_policy="explicit",
        priority_groups=["g"],
        priority_policy="pinned_client",
        priority_timeout=300_000_000,
    )
    await s.pub("t.a", 2)
    await s.pull("T", "C", {"batch": 1, "no_wait": True, "group": "g"})
    # Nobody pulls with the pin: it times out (the unpinned advisory says when) and the
    # next request gets a new one.
    await adv.log(2)  # pinned, then unpinned by the timeout
    await s.info("T", "C")
    await s.pull("T", "C", {"batch": 1, "no_wait": True, "group": "g"})
    await adv.log(2)  # pinned, then unpinned again by the timeout
    await adv.stop()


async def prioritized(s: Session) -> None:
    await s.stream("Q", subjects=["q.>"])
    await s.consumer(
        "Q", "C", ack_policy="explicit", priority_groups=["g"], priority_policy="prioritized"
    )
    subs = []
    got: list[list[Any]] = []
    for priority in (5, 1, 3, 1):
        inbox = s.nc.new_inbox()
        received: list[Any] = []
        got.append(received)

        async def keep(msg: Any, received: list[Any] = received) -> None:
            received.append(observe(msg))

        subs.append(await s.nc.subscribe(inbox, cb=keep))
        # The lowest priority (5) gets nothing: it must still be waiting, not expired,
        # when its log is taken, however slow the machine.
        body = {"batch": 2, "expires": 30_000_000_000, "group": "g", "priority": priority}
        await s.nc.publish(f"{API}.CONSUMER.MSG.NEXT.Q.C", json.dumps(body).encode(), reply=inbox)
    await num_waiting(s, "Q", "C", 4)  # all four are in before the first message
    # One message at a time, each delivered before the next is stored: the pending count
    # a delivery carries (its ack subject's last token) would otherwise depend on how a
    # delivery races the next publish.
    for i in range(6):
        await s.nc.request("q.a", b"x%d" % i, timeout=10)
        await until(f"delivery {i + 1}", lambda n=i + 1: sum(len(g) for g in got) >= n)
    await asyncio.sleep(0.05)  # for anything unexpected after them
    for sub, received in zip(subs, got, strict=True):
        await sub.unsubscribe()
        s.log.append(list(received))
    await s.info("Q", "C")


async def reset(s: Session) -> None:
    await s.stream("R", subjects=["r.>"])
    await s.pub("r.a", 5)
    await s.consumer("R", "A", ack_policy="explicit")
    await s.consumer("R", "N", ack_policy="explicit", deliver_policy="new")
    await s.consumer(
        "R", "Q", ack_policy="explicit", deliver_policy="by_start_sequence", opt_start_seq=3
    )
    await s.pull("R", "A", {"batch": 3, "no_wait": True})
    await s.ack(1)
    await s.info("R", "A")
    await s.req(f"{API}.CONSUMER.RESET.R.A")
    await s.req(f"{API}.CONSUMER.RESET.R.A", {"seq": 4})
    await s.pull("R", "A", {"batch": 3, "no_wait": True})
    await s.req(f"{API}.CONSUMER.RESET.R.A", {"seq": 100})
    await s.req(f"{API}.CONSUMER.RESET.R.A", b"{bad")
    await s.req(f"{API}.CONSUMER.RESET.R.A", {"seq": 2, "other": 1})
    await s.pull("R", "A", {"batch": 9, "no_wait": True})
    await s.req(f"{API}.CONSUMER.RESET.R.N", {"seq": 2})
    await s.req(f"{API}.CONSUMER.RESET.R.N", {"seq": 0})
    await s.req(f"{API}.CONSUMER.RESET.R.Q", {"seq": 2})
    await s.req(f"{API}.CONSUMER.RESET.R.Q", {"seq": 4})
    await s.req(f"{API}.CONSUMER.RESET.R.NOPE")
    await s.req(f"{API}.CONSUMER.RESET.NOPE.C")


async def config_fields(s: Session) -> None:
    await s.stream("F", subjects=["f.>"], consumer_limits={"max_ack_pending": 50})
    bad: list[dict[str, Any]] = [
        {"direct": True},
        {"direct": True, "deliver_subject": "d.x"},
        {"metadata": {"k": "v" * 140_000}},
    ]
    for config in bad:
        await s.consumer("F", "BAD", **config)
    pedantic: list[dict[str, Any]] = [
        {"max_deliver": -5},
        {"max_waiting": -1},
        {"max_ack_pending": -2},
        {"max_batch": -1},
        {"max_expires": -1},
        {"max_bytes": -1},
        {"inactive_threshold": -1},
        {"priority_timeout": -1},
        {"ack_policy": "explicit", "backoff": [1_000_000_000], "max_ack_pending": 5},
        {"ack_policy": "explicit"},
        {"max_ack_pending": 5, "max_deliver": -1},
    ]
    for config in pedantic:
        body = {
            "stream_name": "F",
            "config": {"durable_name": "PED", **config},
            "pedantic": True,
        }
        await s.req(f"{API}.CONSUMER.CREATE.F.PED", body)
        await s.req(f"{API}.CONSUMER.DELETE.F.PED", keep=False)
    # A direct consumer (push, ephemeral) is not listed.
    await s.stream("D", subjects=["d.>"])
    await s.req(
        f"{API}.CONSUMER.CREATE.D.DX",
        {"stream_name": "D", "config": {"name": "DX", "direct": True, "deliver_subject": "dx.in"}},
    )
    await s.consumer("D", "VISIBLE")
    await s.req(f"{API}.CONSUMER.NAMES.D")
    await s.req(f"{API}.CONSUMER.INFO.D.DX")
    # Not pedantic: the same values are adjusted.
    await s.consumer("F", "LAX", max_deliver=-5, max_batch=-1, priority_timeout=-1)
    # Sampled acks are reported on $JS.EVENT.METRIC.
    got: list[Any] = []

    async def keep(msg: Any) -> None:
        event = json.loads(msg.data)
        for key in (*_ADVISORY_VOLATILE, "ack_time"):
            event.pop(key, None)
        got.append((msg.subject, event))

    metrics = await s.nc.subscribe("$JS.EVENT.METRIC.CONSUMER.ACK.F.*", cb=keep)
    await s.consumer("F", "SAMPLED", ack_policy="explicit", sample_freq="100%")
    await s.pub("f.a", 2)
    await s.pull("F", "SAMPLED", {"batch": 2, "no_wait": True})
    await s.ack(1)
    await s.ack(2)
    await until("2 ack metrics", lambda: len(got) >= 2)  # one per ack: 100% sampled
    await asyncio.sleep(0.05)  # for anything unexpected after them
    await metrics.unsubscribe()
    s.log.append(list(got))


async def pulls(s: Session, consumer: str, *requests: tuple[str, dict[str, Any]]) -> None:
    """Pull requests to ``consumer`` (``STREAM.NAME``), each ``(reply inbox, body)``, in
    order, a moment apart."""
    for inbox, body in requests:
        await s.nc.publish(
            f"{API}.CONSUMER.MSG.NEXT.{consumer}", json.dumps(body).encode(), reply=inbox
        )
        await asyncio.sleep(0.05)


async def until_status(sub: Subscription) -> list[Any]:
    """What ``sub`` receives, observed, up to its first status (or 5 s of quiet: the
    statuses awaited here come from expiries of at most 2 s)."""
    got = []
    while True:
        try:
            msg = await sub.next_msg(timeout=5)
        except Exception:
            break
        got.append(observe(msg))
        if got[-1][0] == "status":
            break
    return got


async def stalls(s: Session) -> None:
    await s.stream("M", subjects=["m.>"])
    await s.consumer("M", "C", ack_policy="explicit", max_ack_pending=2)
    await s.pub("m.a", 5)
    # A one-shot stalled by max_ack_pending stays until it expires (408), as on nats-server.
    await s.pull("M", "C", {"batch": 5, "no_wait": True, "expires": 500_000_000}, wait=5.0)
    # With a heartbeat, the first heartbeat's wake-up ends it with 404 instead.
    await s.consumer("M", "HB", ack_policy="explicit", max_ack_pending=2)
    await s.pull(
        "M",
        "HB",
        {"batch": 5, "no_wait": True, "expires": 2_000_000_000, "idle_heartbeat": 400_000_000},
        wait=5.0,
    )
    # So does another request's expiry.
    await s.consumer("M", "OTHER", ack_policy="explicit", max_ack_pending=2)
    await s.pull("M", "OTHER", {"batch": 1, "no_wait": True})
    one_shot, other = s.nc.new_inbox(), s.nc.new_inbox()
    sub = await s.nc.subscribe(one_shot)
    other_sub = await s.nc.subscribe(other)
    await pulls(
        s,
        "M.OTHER",
        (one_shot, {"batch": 5, "no_wait": True, "expires": 2_000_000_000}),
        (other, {"batch": 1, "expires": 300_000_000}),
    )
    s.log.append(await until_status(sub))
    s.log.append(observe(await other_sub.next_msg(timeout=1)))
    await sub.unsubscribe()
    await other_sub.unsubscribe()
    # An expiring request nobody listens to any more wakes nothing.
    await s.consumer("M", "GONE", ack_policy="explicit", max_ack_pending=1)
    one_shot = s.nc.new_inbox()
    sub = await s.nc.subscribe(one_shot)
    await pulls(
        s,
        "M.GONE",
        (one_shot, {"batch": 5, "no_wait": True, "expires": 1_000_000_000}),
        (s.nc.new_inbox(), {"batch": 1, "expires": 300_000_000}),
    )
    s.log.append(await until_status(sub))
    await sub.unsubscribe()
    # A paused consumer: a one-shot without expires ends at once.
    await s.consumer("M", "PAUSED", ack_policy="explicit", pause_until="2099-01-01T00:00:00Z")
    await s.pull("M", "PAUSED", {"batch": 1, "no_wait": True}, wait=5.0)
    await s.pull("M", "PAUSED", {"batch": 1, "no_wait": True, "expires": 300_000_000}, 5.0)
    await s.pull("M", "C", {"batch": 5, "idle_heartbeat": 1_000_000_000}, wait=5.0)
    await s.pull("M", "C", {"batch": 5, "no_wait": True, "idle_heartbeat": 10}, wait=5.0)
    await s.info("M", "C")


async def direct(s: Session, stream: str, body: Any, headers: dict[str, str] | None = None) -> None:
    """A DIRECT.GET and every reply up to its closing status (time stamps dropped)."""
    inbox = s.nc.new_inbox()
    sub = await s.nc.subscribe(inbox)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await s.nc.publish(f"{API}.DIRECT.GET.{stream}", data, reply=inbox, headers=headers)
    got: list[Any] = []
    while True:
        try:
            msg = await sub.next_msg(timeout=1)
        except Exception:
            got.append("no more")
            break
        hdrs = dict(msg.headers or {})
        hdrs.pop("Nats-Time-Stamp", None)
        got.append((msg.data, sorted(hdrs.items())))
        if "Status" in hdrs:
            break
    await sub.unsubscribe()
    s.log.append(got)


async def direct_multi_last(s: Session) -> None:
    await s.stream("G", subjects=["g.>"], allow_direct=True)
    for subject in ("g.a", "g.b", "g.a", "g.c.x", "g.b", "g.c.y", "g.a"):
        await s.nc.request(subject, subject.encode(), timeout=2)
    await s.nc.request("g.h", b"h", headers={"k": "v"}, timeout=2)
    for body in (
        {"multi_last": ["g.>"]},
        {"multi_last": ["g.a", "g.c.*"], "batch": 2},
        {"multi_last": ["g.a", "g.>"]},
        {"multi_last": ["g.>"], "up_to_seq": 3},
        {"multi_last": ["g.>"], "seq": 5},
        {"multi_last": ["g.>"], "max_bytes": 5},
        {"multi_last": ["g.>"], "no_hdr": True},
        {"multi_last": ["g.nope"]},
        {"multi_last": ["g.>"], "up_to_time": "2000-01-01T00:00:00Z"},
        {"multi_last": ["g.>"], "up_to_time": "2999-01-01T00:00:00Z"},
        {"multi_last": ["g.>"], "up_to_time": "2200-01-01T00:00:00Z"},
        {"multi_last": ["g.>"], "up_to_seq": 3, "up_to_time": "2999-01-01T00:00:00Z"},
        {"multi_last": ["g.>"], "next_by_subj": "g.a"},
        {"multi_last": ["g.>"], "last_by_subj": "g.a"},
        {"multi_last": []},
        {"up_to_seq": 3},
        {"seq": 2, "batch": 2, "up_to_seq": 1},
        {"seq": 1, "last_by_subj": "g.a"},
        b"",
        b"{bad",
    ):
        await direct(s, "G", body)
    await direct(s, "G", {"seq": 1}, headers={"Nats-Required-Api-Level": "99"})
    await direct(s, "G", {"seq": 1}, headers={"Nats-Required-Api-Level": "1"})
    await s.stream("H", subjects=["h.>"], allow_direct=True)
    for i in range(1030):
        await s.nc.publish(f"h.{i}", b"x")
    await s.nc.flush()
    await stored(s, "H", 1030)
    await direct(s, "H", {"multi_last": ["h.>"]})
    await direct(s, "H", {"multi_last": ["h.1"]})


async def api_level(s: Session) -> None:
    await s.stream("L", subjects=["l.>"])
    await s.consumer("L", "C", ack_policy="explicit")
    for level in ("99", "x", "1", " 1", ""):
        headers = {"Nats-Required-Api-Level": level}
        for subject in (f"{API}.STREAM.INFO.L", f"{API}.CONSUMER.INFO.L.C", f"{API}.INFO"):
            msg = await s.nc.request(subject, b"", headers=headers, timeout=2)
            out = observe(msg)
            s.log.append(out.get("error") if isinstance(out, dict) else out)
    inbox = s.nc.new_inbox()
    sub = await s.nc.subscribe(inbox)
    await s.nc.publish(
        f"{API}.CONSUMER.MSG.NEXT.L.C",
        b'{"batch":1,"no_wait":true}',
        reply=inbox,
        headers={"Nats-Required-Api-Level": "99"},
    )
    s.log.append(observe(await sub.next_msg(timeout=2)))
    await sub.unsubscribe()


async def replay_original(s: Session) -> None:
    """Stored messages go out spaced as they were stored (here 0.5 s apart)."""
    await s.stream("RO", subjects=["ro.>"])
    for i in range(3):
        if i:
            await asyncio.sleep(0.5)
        await s.pub("ro.a", data=b"m%d" % i)
    await s.consumer("RO", "C", ack_policy="explicit", replay_policy="original")
    inbox = s.nc.new_inbox()
    sub = await s.nc.subscribe(inbox)
    body = {"batch": 3, "expires": 3_000_000_000}
    await s.nc.publish(f"{API}.CONSUMER.MSG.NEXT.RO.C", json.dumps(body).encode(), reply=inbox)
    loop = asyncio.get_running_loop()
    start = loop.time()
    got = []
    for _ in range(3):
        msg = await sub.next_msg(timeout=3)
        # Which half-second the message came in: 0, 1, 2 when spaced as stored.
        got.append((observe(msg), round((loop.time() - start) / 0.5)))
    s.log.append(got)
    await sub.unsubscribe()


async def rate_limited_push(s: Session) -> None:
    await s.stream("RL", subjects=["rl.>"], max_msg_size=100)
    await s.pub("rl.a", 4)
    sub = await s.nc.subscribe("rlout.x")
    await s.consumer(
        "RL", "C", ack_policy="explicit", deliver_subject="rlout.x", rate_limit_bps=80_000
    )
    # All four, paced by the rate limit (a loaded machine may stretch the pace).
    await s.collect(sub, 5.0, until=lambda got: len(got) == 4)
    await sub.unsubscribe()
    await s.consumer("RL", "PULL", rate_limit_bps=80_000)


async def ack_flow_control(s: Session) -> None:
    """``ack_policy: flow_control``: the answers to flow control acknowledge."""
    await s.stream("FC", subjects=["fc.>"])
    for config in (
        {"ack_policy": "flow_control"},
        {"ack_policy": "flow_control", "deliver_subject": "fcx.a", "max_ack_pending": -1},
        {"ack_policy": "flow_control", "deliver_subject": "fcx.a", "ack_wait": 5_000_000_000},
        {"ack_policy": "flow_control", "deliver_subject": "fcx.a", "max_deliver": 3},
    ):
        await s.consumer("FC", "BAD", **config)
    for config in (
        {"idle_heartbeat": 1_000_000_000},
        {"flow_control": True, "idle_heartbeat": 2_000_000_000},
    ):
        body = {
            "stream_name": "FC",
            "config": {
                "durable_name": "PED",
                "ack_policy": "flow_control",
                "deliver_subject": "fcx.a",
                "max_ack_pending": 5,
                **config,
            },
            "pedantic": True,
        }
        await s.req(f"{API}.CONSUMER.CREATE.FC.PED", body)
    await s.pub("fc.a", 3)
    sub = await s.nc.subscribe("fcx.in")
    await s.consumer(
        "FC", "C", ack_policy="flow_control", deliver_subject="fcx.in", max_ack_pending=2
    )
    got: list[Any] = []
    delivered = 0
    while delivered < 3:
        try:
            msg = await sub.next_msg(timeout=2)
        except Exception:
            break
        seen = observe(msg)
        if seen[:3] == ("status", "100", "Idle Heartbeat"):
            continue  # when they come is timing
        got.append(seen)
        delivered += seen[0] == "msg"
        if msg.reply.startswith("$JS.FC."):
            await s.info("FC", "C")
            headers = {"Nats-Last-Consumer": "2", "Nats-Last-Stream": "2"}
            await s.nc.publish(msg.reply, b"", headers=headers)
    s.log.append(got)
    await s.info("FC", "C")
    await sub.unsubscribe()


async def persist_mode(s: Session) -> None:
    for i, extra in enumerate(
        [
            {"persist_mode": "default"},
            {"persist_mode": ""},
            {"persist_mode": "bogus"},
            {"persist_mode": "async", "storage": "memory"},
            {"persist_mode": "async", "allow_atomic": True},
        ]
    ):
        await s.req(f"{API}.STREAM.CREATE.PM{i}", {"name": f"PM{i}", **extra})


@pytest.mark.parametrize(
    "scenario",
    [
        priority_config,
        overflow,
        pinned,
        pin_timeout,
        prioritized,
        reset,
        config_fields,
        stalls,
        direct_multi_last,
        api_level,
        persist_mode,
        replay_original,
        rate_limited_push,
        ack_flow_control,
    ],
    ids=lambda f: f.__name__,
)
async def test_same_as_nats_server(peers: Peers, scenario: Any) -> None:
    await compare(peers, scenario)
