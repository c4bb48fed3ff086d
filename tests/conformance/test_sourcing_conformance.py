"""Subject transforms, mirrors and sources: the same requests against Tether and
nats-server, compared field by field (stored subjects, partition numbers, the
``Nats-Stream-Source`` header, stream infos, and the errors for bad configurations)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from conformance_support import Peers
from nats.aio.client import Client

pytestmark = pytest.mark.peer

# Times and the cluster block nats-server adds.
_VOLATILE = {"ts", "created", "first_ts", "last_ts", "time", "cluster"}


@pytest.fixture
async def both(peers: Peers) -> AsyncIterator[tuple[Client, Client]]:
    tether = await nats.connect(peers.tether)
    peer = await nats.connect(peers.nats)
    try:
        yield tether, peer
    finally:
        await tether.close()
        await peer.close()


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
            if key == "active" and isinstance(item, int):
                item = "never" if item == -1 else "seen"
            item = normalize(item)
            if key == "sources" and "state" in value and isinstance(item, list):
                # A stream info lists its sources in no particular order.
                item = sorted(item, key=lambda source: json.dumps(source, sort_keys=True))
            out[key] = item
        return out
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def api(nc: Client, subject: str, body: Any = b"") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await nc.request(subject, data, timeout=3)
    return json.loads(reply.data)


async def create(nc: Client, config: dict[str, Any]) -> Any:
    return normalize(await api(nc, f"$JS.API.STREAM.CREATE.{config['name']}", config))


async def stored(nc: Client, stream: str, seq: int) -> dict[str, Any]:
    """A stored message: subject, payload, headers (the source identity, a hash of the
    origin's creation time, shown only by its length)."""
    reply = await api(nc, f"$JS.API.STREAM.MSG.GET.{stream}", {"seq": seq})
    if "error" in reply:
        return reply["error"]  # type: ignore[no-any-return]
    msg = reply["message"]
    headers = base64.b64decode(msg.get("hdrs", "")).decode()
    lines = []
    for line in headers.split("\r\n")[1:]:
        if line.startswith("Nats-Stream-Source: "):
            fields = line.split(" ")
            line = " ".join([*fields[:-1], f"<identity of {len(fields[-1])}>"])
        if line:
            lines.append(line)
    return {
        "subject": msg["subject"],
        "seq": msg["seq"],
        "data": base64.b64decode(msg.get("data", "")).decode(),
        "headers": lines,
    }


async def wait_for(nc: Client, stream: str, count: int, within: float = 10) -> dict[str, Any]:
    for _ in range(int(within / 0.05)):
        info = await api(nc, f"$JS.API.STREAM.INFO.{stream}")
        # Settled: every message there, and each source either placed or failing.
        placed = all("seq" in src or "error" in src for src in info.get("sources") or [])
        if info.get("state", {}).get("messages") == count and placed:
            return info  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    return info  # type: ignore[no-any-return]


async def on_both(both: tuple[Client, Client], scenario: Any) -> tuple[Any, Any]:
    tether, peer = both
    return await scenario(tether), await scenario(peer)


async def test_input_transforms_store_the_same_subjects(both: tuple[Client, Client]) -> None:
    async def scenario(nc: Client) -> Any:
        out = [
            await create(
                nc,
                {
                    "name": "TR",
                    "subjects": ["in.>"],
                    "subject_transform": {
                        "src": "in.*.*",
                        "dest": "out.{{partition(7,1,2)}}.{{wildcard(2)}}.{{split(1,-)}}",
                    },
                },
            ),
            await create(
                nc,
                {
                    "name": "PT",
                    "subjects": ["k.*"],
                    "subject_transform": {"src": "k.*", "dest": "p.{{partition(13,1)}}.$1"},
                },
            ),
            await create(
                nc,
                {
                    "name": "SL",
                    "subjects": ["sl.*"],
                    "subject_transform": {
                        "src": "sl.*",
                        "dest": "{{slicefromleft(1,2)}}.{{SliceFromRight(1,2)}}"
                        ".{{splitfromleft(1,1)}}.{{splitfromright(1,4)}}",
                    },
                },
            ),
        ]
        js = nc.jetstream()
        for subject in ["in.a-b.c", "in.-x--y.z", "in.q.r", "in.only"]:
            await js.publish(subject, b"t")
        for i in range(40):
            await js.publish(f"k.key{i}", b"k")
        for subject in ["sl.12345", "sl.a", "sl.abcdefg"]:
            await js.publish(subject, b"s")
        for stream, count in (("TR", 4), ("PT", 40), ("SL", 3)):
            for seq in range(1, count + 1):
                out.append((await stored(nc, stream, seq))["subject"])
        return out

    ours, theirs = await on_both(both, scenario)
    assert ours == theirs


@pytest.mark.parametrize(
    "transform",
    [
        {"src": "a.*", "dest": "b.{{wildcard(2)}}"},
        {"src": "a", "dest": "b.$1"},
        {"src": "a.*", "dest": "b.{{nope(1)}}"},
        {"src": "a.*", "dest": "b.{{left(1,1)}}"},
        {"src": "a.*", "dest": "b..c"},
        {"src": "a.*", "dest": "b.{{wildcard()}}"},
        {"src": "a.*", "dest": "b.{{wildcard(1,2)}}"},
        {"src": "a.*", "dest": "b.{{split(1)}}"},
        {"src": "a.*", "dest": "b.{{partition(x,1)}}"},
        {"src": "a.*", "dest": "b.{{splitfromleft(1,x)}}"},
        {"src": "a.>", "dest": "b"},
        {"src": "a..b", "dest": "c"},
        {"src": "a.*", "dest": "b.*"},
    ],
)
async def test_bad_transforms_get_the_same_errors(
    both: tuple[Client, Client], transform: dict[str, str]
) -> None:
    async def scenario(nc: Client) -> Any:
        out = [
            await create(nc, {"name": "BAD", "subjects": ["a.>"], "subject_transform": transform})
        ]
        for key in ("sources", "mirror"):
            spec = {"name": "ORIGIN", "subject_transforms": [transform]}
            cfg: dict[str, Any] = {"name": "BADS", key: [spec] if key == "sources" else spec}
            out.append(await create(nc, cfg))
        return out

    ours, theirs = await on_both(both, scenario)
    assert ours == theirs


@pytest.mark.parametrize(
    "config",
    [
        {"name": "E", "subjects": ["e"], "mirror": {"name": "ORIGIN"}},
        {"name": "E", "first_seq": 5, "mirror": {"name": "ORIGIN"}},
        {"name": "E", "mirror": {"name": "ORIGIN"}, "sources": [{"name": "X"}]},
        {"name": "E", "mirror": {"name": "a.b"}},
        {
            "name": "E",
            "mirror": {
                "name": "ORIGIN",
                "filter_subject": "x",
                "subject_transforms": [{"src": "x", "dest": "y"}],
            },
        },
        {
            "name": "E",
            "mirror": {
                "name": "ORIGIN",
                "subject_transforms": [{"src": "x.*", "dest": "y"}, {"src": "x.a", "dest": "z"}],
            },
        },
        {"name": "E", "sources": [{"name": "a*"}]},
        {"name": "E", "sources": [{"name": "X"}, {"name": "X"}]},
        {
            "name": "E",
            "sources": [
                {
                    "name": "X",
                    "filter_subject": "x",
                    "subject_transforms": [{"src": "x", "dest": "y"}],
                }
            ],
        },
        {
            "name": "E",
            "sources": [
                {
                    "name": "X",
                    "subject_transforms": [
                        {"src": "x.>", "dest": "y.>"},
                        {"src": "x.a", "dest": "z"},
                    ],
                }
            ],
        },
        {"name": "E", "sources": [{"name": "X", "external": {"api": "$JS.API", "deliver": ""}}]},
        {
            "name": "E",
            "sources": [{"name": "X", "external": {"api": "$JS.hub.API", "deliver": "a.*"}}],
        },
        {"name": "E", "sources": [{"name": "X", "external": {"api": "a.>", "deliver": ""}}]},
        {"name": "E", "max_msg_size": 10, "sources": [{"name": "ORIGIN"}]},
        {"name": "E", "max_msg_size": 10, "mirror": {"name": "ORIGIN"}},
    ],
)
async def test_bad_mirrors_and_sources_get_the_same_errors(
    both: tuple[Client, Client], config: dict[str, Any]
) -> None:
    async def scenario(nc: Client) -> Any:
        await create(nc, {"name": "ORIGIN", "subjects": ["origin.>"], "max_msg_size": 100})
        return await create(nc, config)

    ours, theirs = await on_both(both, scenario)
    assert "error" in ours
    assert ours == theirs


async def test_sources_and_mirrors_copy_alike(both: tuple[Client, Client]) -> None:
    async def scenario(nc: Client) -> Any:
        js = nc.jetstream()
        out = [await create(nc, {"name": "SRC1", "subjects": ["one.>"]})]
        out.append(await create(nc, {"name": "SRC2", "subjects": ["two.>"]}))
        for i in range(4):
            await js.publish(
                f"one.{i}.x",
                f"m{i}".encode(),
                headers={"Nats-Msg-Id": f"id{i}", "Nats-Expected-Stream": "SRC1", "H": "v"},
            )
        await js.publish("two.a", b"a")
        await js.publish("two.b", b"b")
        await api(nc, "$JS.API.STREAM.MSG.DELETE.SRC1", {"seq": 2})
        out.append(
            await create(
                nc,
                {
                    "name": "AGG",
                    "subjects": ["agg.>"],
                    "sources": [
                        {
                            "name": "SRC1",
                            "opt_start_seq": 2,
                            "subject_transforms": [
                                {"src": "one.*.x", "dest": "agg.{{wildcard(1)}}"}
                            ],
                        },
                        {"name": "SRC2", "filter_subject": "two.b"},
                        {"name": "MISSING"},
                    ],
                },
            )
        )
        out.append(await create(nc, {"name": "MIR", "mirror": {"name": "SRC1"}}))
        out.append(await create(nc, {"name": "MIR2", "mirror": {"name": "MISSING"}}))
        out.append(normalize(await wait_for(nc, "AGG", 3)))
        out.append(normalize(await wait_for(nc, "MIR", 3)))
        # Which copy lands first depends on timing: compare the set.
        copies = [await stored(nc, "AGG", seq) for seq in (1, 2, 3)]
        for copy in copies:
            del copy["seq"]  # the two sources interleave as they please
        out.append(sorted(json.dumps(copy) for copy in copies))
        out.extend([await stored(nc, "MIR", seq) for seq in (1, 2, 3, 4)])
        try:
            await nc.request("MIR", b"x", timeout=1)
            out.append("answered")
        except nats.errors.NoRespondersError:
            out.append("no responders")
        # nats-server notes the missing origin a moment after the create: until then
        # its mirror info has no error.
        for _ in range(200):
            info = await api(nc, "$JS.API.STREAM.INFO.MIR2")
            if "error" in (info.get("mirror") or {}):
                break
            await asyncio.sleep(0.05)
        out.append(normalize({k: info.get(k) for k in ("config", "mirror", "sources")}))
        return out

    ours, theirs = await on_both(both, scenario)
    assert ours == theirs


async def test_a_recreated_origin_is_sourced_again_alike(both: tuple[Client, Client]) -> None:
    async def scenario(nc: Client) -> Any:
        js = nc.jetstream()
        await create(nc, {"name": "RE", "subjects": ["re"]})
        for _ in range(3):
            await js.publish("re", b"first")
        await create(nc, {"name": "RES", "subjects": ["res"], "sources": [{"name": "RE"}]})
        await wait_for(nc, "RES", 3)
        await api(nc, "$JS.API.STREAM.DELETE.RE")
        await create(nc, {"name": "RE", "subjects": ["re"]})
        for _ in range(2):
            await js.publish("re", b"second")
        # nats-server retries a failed source with a growing delay.
        info = normalize(await wait_for(nc, "RES", 5, within=45))
        copies = [await stored(nc, "RES", seq) for seq in range(1, 6)]
        return [info["state"], info["sources"], copies]

    ours, theirs = await on_both(both, scenario)
    assert ours == theirs
