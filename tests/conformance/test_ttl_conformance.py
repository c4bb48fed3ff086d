"""Per-message TTLs, subject delete markers and republish: the same steps against Tether
and the real nats-server, compared field by field.

Each scenario's observations (API replies, PubAcks, stored messages read back with
STREAM.MSG.GET, republished messages) are normalized (times, server ids, the
version-specific metadata, and file-storage byte counts, which docs/compatibility.md
documents) and must be equal. Expiry waits poll for the state both servers reach, so
the scenarios do not depend on either server's timer resolution.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tether.testing import run_server

pytestmark = pytest.mark.peer

NS = 1_000_000_000
API = "$JS.API"
_VOLATILE = {"ts", "created", "first_ts", "last_ts", "time", "cluster", "metadata"}


@pytest.fixture(scope="module")
def tether_url() -> Iterator[str]:
    with run_server() as server:
        yield server.url


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def request(nc: Client, subject: str, body: Any = b"", **headers: str) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()} or None
    msg = await nc.request(subject, data, timeout=3, headers=hdrs)
    return normalize(json.loads(msg.data))


async def create(nc: Client, name: str, **config: Any) -> Any:
    return await request(nc, f"{API}.STREAM.CREATE.{name}", {"name": name, **config})


async def stored(nc: Client, name: str) -> list[Any]:
    """Every live message of the stream as STREAM.MSG.GET returns it, and the state."""
    info = await request(nc, f"{API}.STREAM.INFO.{name}")
    state = info["state"]
    out: list[Any] = [state]
    for seq in range(state["first_seq"], state["last_seq"] + 1):
        reply = await request(nc, f"{API}.STREAM.MSG.GET.{name}", {"seq": seq})
        msg = reply.get("message")
        if msg is not None:
            hdrs = base64.b64decode(msg.get("hdrs") or "")
            data = base64.b64decode(msg.get("data") or "")
            out.append((msg["seq"], msg["subject"], hdrs, data))
    return out


async def wait_for(nc: Client, name: str, last_seq: int, messages: int) -> None:
    """Poll STREAM.INFO until the stream has reached ``last_seq`` with ``messages``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    state: dict[str, Any] = {}
    while loop.time() < deadline:
        state = (await request(nc, f"{API}.STREAM.INFO.{name}"))["state"]
        if state["last_seq"] >= last_seq and state["messages"] == messages:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"{name} never reached {last_seq}/{messages} at {nc.connected_url}: {state}"
    )


async def cleanup(nc: Client) -> None:
    names = json.loads((await nc.request(f"{API}.STREAM.NAMES", b"", timeout=2)).data)
    for name in names.get("streams") or []:
        await nc.request(f"{API}.STREAM.DELETE.{name}", b"", timeout=2)


# -- scenarios -------------------------------------------------------------------------------


async def config_and_publish(nc: Client) -> list[Any]:
    out = [
        await create(nc, "A", subjects=["a.>"]),
        await request(nc, "a.1", b"x", Nats_TTL="5s"),  # TTLs disabled
        await create(nc, "B", subjects=["b.>"], allow_msg_ttl=True),
    ]
    for ttl in ["5s", "1h", "never", "30", "0", "-1", "abc", "500ms", "1s", "0s", "+5", "1.5s"]:
        out.append(await request(nc, "b.x", b"x", Nats_TTL=ttl))
    out += [
        await request(
            nc, f"{API}.STREAM.UPDATE.B", {"name": "B", "subjects": ["b.>"], "allow_msg_ttl": False}
        ),
        await create(nc, "M1", subjects=["m1"], subject_delete_marker_ttl=NS // 2),
        await create(nc, "M2", subjects=["m2"], subject_delete_marker_ttl=-1),
        await create(nc, "M3", subjects=["m3"], subject_delete_marker_ttl=2 * NS, deny_purge=True),
        await create(
            nc, "M4", subjects=["m4"], subject_delete_marker_ttl=90 * NS, max_age=3600 * NS
        ),
        await request(nc, "m3", b"raised", Nats_TTL="1"),
        await request(nc, f"{API}.STREAM.MSG.GET.M3", {"seq": 1}),
    ]
    for republish in [
        {"src": "r.>", "dest": "out.>"},
        {"dest": "out.>"},
        {"src": "r.>", "dest": "r.x"},
        {"src": "r.>", "dest": "out.*"},
        {"src": "r.*", "dest": "out.{{wildcard(2)}}"},
        {"src": "r.*.*", "dest": "out.{{wildcard(2)}}.{{wildcard(1)}}", "headers_only": True},
        {"src": "r.>", "dest": "out.>", "bogus": 1},
    ]:
        out.append(await create(nc, "R", subjects=["r.>"], republish=republish))
        await nc.request(f"{API}.STREAM.DELETE.R", b"", timeout=2)
    return out


async def expiry_and_markers(nc: Client) -> list[Any]:
    out = [
        await create(nc, "E", subjects=["e.>"], subject_delete_marker_ttl=3 * NS),
        await request(nc, "e.a", b"1", Nats_TTL="1"),  # raised to 3 s
        await request(nc, "e.b", b"2", Nats_TTL="never"),
        await request(nc, "e.c", b"3"),
        await request(nc, "e.d", b"4", Nats_TTL="1s"),
        await request(nc, "e.d", b"5", Nats_TTL="1h"),
        await request(nc, f"{API}.STREAM.MSG.DELETE.E", {"seq": 3}),  # no marker
    ]
    # e.a expires (its marker at seq 6); e.d's first (raised to 3 s too) goes without
    # one: e.d still has 5.
    await wait_for(nc, "E", 6, 3)
    out.append(await stored(nc, "E"))
    out.append(await request(nc, f"{API}.STREAM.PURGE.E", {"filter": "e.d"}))  # no marker
    # The marker expires in turn, leaving no marker of its own.
    await wait_for(nc, "E", 6, 1)
    out.append(await stored(nc, "E"))
    return out


async def max_age_markers(nc: Client) -> list[Any]:
    # The marker lives shortly (max_age applies to it too): it is seen through republish.
    got: list[Msg] = []

    async def collect(msg: Msg) -> None:
        got.append(msg)

    await nc.subscribe("gout.>", cb=collect)
    out = [
        await create(
            nc,
            "G",
            subjects=["g.>"],
            max_age=NS,
            allow_msg_ttl=True,
            subject_delete_marker_ttl=10 * NS,
            republish={"src": "g.>", "dest": "gout.>"},
        ),
        await request(nc, "g.a", b"1"),
        await request(nc, "g.b", b"2", Nats_TTL="never"),
    ]
    # g.a ages out, leaving a marker, which ages out in turn; g.b never expires.
    await wait_for(nc, "G", 3, 1)
    out.append(await stored(nc, "G"))
    out += republished(got)
    return out


def republished(got: list[Msg]) -> list[Any]:
    out = []
    for msg in got:
        headers = dict(msg.headers or {})
        assert headers.pop("Nats-Time-Stamp", "").endswith("Z")
        out.append((msg.subject, headers, msg.data))
    return out


async def republish(nc: Client) -> list[Any]:
    got: list[Msg] = []

    async def collect(msg: Msg) -> None:
        got.append(msg)

    await nc.subscribe("out.>", cb=collect)
    out = [
        await create(nc, "R", subjects=["r.>"], republish={"src": "r.>", "dest": "out.>"}),
        await create(
            nc,
            "H",
            subjects=["h.*"],
            republish={"src": "h.*", "dest": "out.h.{{wildcard(1)}}", "headers_only": True},
        ),
        await request(nc, "r.a", b"one"),
        await request(nc, "r.b", b"two", X_Custom="v"),
        await request(nc, "r.a", b"three"),
        await request(nc, "h.x", b"12345"),
    ]
    for _ in range(100):
        if len(got) == 4:
            break
        await asyncio.sleep(0.05)
    return out + republished(got)


SCENARIOS = [config_and_publish, expiry_and_markers, max_age_markers, republish]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_same_as_nats_server(scenario: Any, tether_url: str, nats_peer_url: str) -> None:
    async def on(url: str) -> list[Any]:
        nc = await nats.connect(url)
        try:
            return list(await scenario(nc))
        finally:
            await cleanup(nc)
            await nc.close()

    results = await asyncio.gather(on(nats_peer_url), on(tether_url), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    theirs, ours = results
    assert ours == theirs
