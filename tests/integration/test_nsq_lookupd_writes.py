"""nsqlookupd's write routes on its own port (``nsq_lookupd_http_port``): they edit what
the lookupd reports, never the node's topics, with nsqlookupd's status codes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tether.testing import RunningServer, run_server

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory", args=["--nsq-lookupd-http-port", "-1"]) as srv:
        yield srv


@pytest.fixture
async def lookupd(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    port = int(server.stderr.split("Listening for nsqlookupd queries on 127.0.0.1:")[1].split()[0])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=V1) as http:
        yield http


@pytest.fixture
async def nsqd(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, headers=V1) as http:
        yield http


async def node_topics(nsqd: httpx.AsyncClient) -> dict[str, list[str]]:
    stats = (await nsqd.get("/stats", params={"format": "json"})).json()
    return {t["topic_name"]: [c["channel_name"] for c in t["channels"]] for t in stats["topics"]}


async def test_create_registers_without_a_producer(
    lookupd: httpx.AsyncClient, nsqd: httpx.AsyncClient
) -> None:
    r = await lookupd.post("/topic/create", params={"topic": "made"})
    assert (r.status_code, r.text) == (200, "")
    assert "made" in (await lookupd.get("/topics")).json()["topics"]
    r = await lookupd.get("/lookup", params={"topic": "made"})
    assert (r.status_code, r.json()) == (200, {"channels": [], "producers": []})
    r = await lookupd.post("/channel/create", params={"topic": "made2", "channel": "ch"})
    assert (r.status_code, r.text) == (200, "")
    assert (await lookupd.get("/channels", params={"topic": "made2"})).json() == {
        "channels": ["ch"]
    }
    assert "made2" in (await lookupd.get("/topics")).json()["topics"]
    # The node has neither: only the lookupd's registrations changed.
    topics = await node_topics(nsqd)
    assert "made" not in topics and "made2" not in topics
    nodes = (await lookupd.get("/nodes")).json()["producers"]
    assert all("made" not in n["topics"] for n in nodes)
    # Deleting a channel registration; a second time it is not there.
    r = await lookupd.post("/channel/delete", params={"topic": "made2", "channel": "ch"})
    assert (r.status_code, r.text) == (200, "")
    r = await lookupd.post("/channel/delete", params={"topic": "made2", "channel": "ch"})
    assert (r.status_code, r.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert (await lookupd.get("/channels", params={"topic": "made2"})).json() == {"channels": []}


async def test_delete_hides_a_topic_the_node_still_has(
    server: RunningServer, lookupd: httpx.AsyncClient, nsqd: httpx.AsyncClient
) -> None:
    assert (await nsqd.post("/pub", params={"topic": "real"}, content=b"x")).status_code == 200
    assert (
        await nsqd.post("/channel/create", params={"topic": "real", "channel": "old"})
    ).status_code == 200
    doc = (await lookupd.get("/lookup", params={"topic": "real"})).json()
    assert doc["channels"] == ["old"]
    assert [p["tcp_port"] for p in doc["producers"]] == [server.nsq_port]

    r = await lookupd.post("/topic/delete", params={"topic": "real"})
    assert (r.status_code, r.text) == (200, "")
    r = await lookupd.get("/lookup", params={"topic": "real"})
    assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
    assert "real" not in (await lookupd.get("/topics")).json()["topics"]
    assert (await lookupd.get("/channels", params={"topic": "real"})).json() == {"channels": []}
    nodes = (await lookupd.get("/nodes")).json()["producers"]
    assert all("real" not in n["topics"] for n in nodes)
    # The node's topic and its message are untouched.
    assert (await node_topics(nsqd))["real"] == ["old"]
    # A new channel on the node registers the topic again (nsqd's REGISTER topic channel);
    # the deleted channel registration stays deleted.
    assert (
        await nsqd.post("/channel/create", params={"topic": "real", "channel": "new"})
    ).status_code == 200
    doc = (await lookupd.get("/lookup", params={"topic": "real"})).json()
    assert doc["channels"] == ["new"]
    assert [p["tcp_port"] for p in doc["producers"]] == [server.nsq_port]
    # Deleting an unknown topic is fine, as in nsqlookupd.
    r = await lookupd.post("/topic/delete", params={"topic": "never.there"})
    assert (r.status_code, r.text) == (200, "")


@pytest.mark.parametrize(
    ("path", "params", "code"),
    [
        ("/topic/create", {}, "MISSING_ARG_TOPIC"),
        ("/topic/create", {"topic": ""}, "INVALID_ARG_TOPIC"),
        ("/topic/create", {"topic": "no spaces"}, "INVALID_ARG_TOPIC"),
        ("/topic/create", {"topic": "x" * 65}, "INVALID_ARG_TOPIC"),
        ("/topic/delete", {}, "MISSING_ARG_TOPIC"),
        ("/channel/create", {"channel": "c"}, "MISSING_ARG_TOPIC"),
        ("/channel/create", {"topic": "b@d", "channel": "c"}, "INVALID_ARG_TOPIC"),
        ("/channel/create", {"topic": "t"}, "MISSING_ARG_CHANNEL"),
        ("/channel/create", {"topic": "t", "channel": "c#other"}, "INVALID_ARG_CHANNEL"),
        ("/channel/delete", {"topic": "t"}, "MISSING_ARG_CHANNEL"),
        ("/channel/delete", {"topic": "t", "channel": ""}, "INVALID_ARG_CHANNEL"),
        ("/channel/delete", {"topic": "t!", "channel": "c"}, "INVALID_ARG_TOPIC"),
    ],
)
async def test_bad_arguments_are_nsqlookupd_s_400s(
    lookupd: httpx.AsyncClient, path: str, params: dict[str, str], code: str
) -> None:
    r = await lookupd.post(path, params=params)
    assert (r.status_code, r.json()) == (400, {"message": code})


async def test_other_methods_and_a_malformed_query(lookupd: httpx.AsyncClient) -> None:
    for path in ("/topic/create", "/topic/delete", "/channel/create", "/channel/delete"):
        r = await lookupd.get(path, params={"topic": "t", "channel": "c"})
        assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"}), path
    r = await lookupd.post("/topic/create?topic=%zz")
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_REQUEST"})
    # The pre-1.0 envelope on request, as for the read routes.
    r = await lookupd.post("/topic/create", headers={"Accept": "application/vnd.nsq; version=0.3"})
    assert r.json() == {"status_code": 400, "status_txt": "MISSING_ARG_TOPIC", "data": None}
