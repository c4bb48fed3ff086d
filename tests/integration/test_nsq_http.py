"""nsqd's HTTP API on Tether's HTTP port: publishing (read back with pynsq's Reader),
``/stats`` in nsqd's JSON shape, topic and channel administration, pause across a
restart, and nsqd's 4xx answers to hostile requests (never a 5xx)."""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import nsq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.testing import RunningServer, run_server

_topics = itertools.count()
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


def topic() -> str:
    return f"http.t{next(_topics)}"


async def wait_until(condition: Callable[[], bool], within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def reader(server: RunningServer, name: str, channel: str, **options: Any) -> nsq.Reader:
    options.setdefault("max_in_flight", 10)
    return nsq.Reader(
        topic=name,
        channel=channel,
        nsqd_tcp_addresses=[f"{server.host}:{server.nsq_port}"],
        lookupd_poll_interval=60,
        **options,
    )


def collect(got: list[bytes]) -> Callable[[nsq.Message], bool]:
    def handler(msg: nsq.Message) -> bool:
        got.append(msg.body)
        return True

    return handler


def binary(bodies: list[bytes]) -> bytes:
    out = struct.pack(">i", len(bodies))
    for body in bodies:
        out += struct.pack(">i", len(body)) + body
    return out


async def stats(server: RunningServer, **params: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        r = await http.get(
            f"{server.http_url}/stats", params={"format": "json", **params}, headers=V1
        )
    assert r.status_code == 200, r.text
    return dict(r.json())


def find(stats_: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in stats_["topics"] if t["topic_name"] == name)


async def test_pub_mpub_and_dpub_reach_a_pynsq_reader(server: RunningServer) -> None:
    name = topic()
    got: list[bytes] = []
    r = reader(server, name, "c", message_handler=collect(got))
    try:
        await wait_until(lambda: bool(r.conns))
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            for body, path, params in [
                (b"one", "/pub", {}),
                (b"two\nthree\n\nfour\n", "/mpub", {}),
                (binary([b"five", b"six\nwith newline"]), "/mpub", {"binary": "true"}),
                (b"later", "/pub", {"defer": "200"}),
                (b"dpub", "/dpub", {"defer": "100"}),
            ]:
                resp = await http.post(path, params={"topic": name, **params}, content=body)
                assert (resp.status_code, resp.text) == (200, "OK")
                assert resp.headers["x-nsq-content-type"] == "nsq; version=1.0"
        await wait_until(lambda: len(got) == 8)
        assert set(got) == {
            b"one",
            b"two",
            b"three",
            b"four",
            b"five",
            b"six\nwith newline",
            b"later",
            b"dpub",
        }
    finally:
        r.close()


async def test_a_publish_answers_once_durable_and_counts(server: RunningServer) -> None:
    name = topic()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for i in range(5):
            r = await http.post("/pub", params={"topic": name}, content=b"m%d" % i)
            assert r.status_code == 200
    t = find(await stats(server), name)
    assert t["message_count"] == 5
    assert t["depth"] == 5  # held for the first channel
    assert t["channels"] == []


async def test_stats_has_nsqd_s_shape(server: RunningServer) -> None:
    name = topic()
    writer = nsq.Writer([f"{server.host}:{server.nsq_port}"])
    await wait_until(lambda: bool(writer.conns))
    answers: list[Any] = []
    for i in range(6):
        writer.pub(name, b"%d" % i, callback=lambda c, d: answers.append(d))
    await wait_until(lambda: len(answers) == 6)
    held: list[nsq.Message] = []

    def handler(msg: nsq.Message) -> None:
        msg.enable_async()
        held.append(msg)

    r = reader(server, name, "watch", message_handler=handler, max_in_flight=2)
    try:
        await wait_until(lambda: len(held) == 2)
        held[0].requeue(backoff=False, delay=60_000)  # deferred
        await wait_until(lambda: len(held) >= 3)
        doc = await stats(server)
        for key in ("version", "health", "start_time", "topics", "producers", "memory"):
            assert key in doc
        t = find(doc, name)
        for key in ("topic_name", "channels", "depth", "backend_depth", "message_count", "paused"):
            assert key in t
        assert t["message_count"] == 6 and t["paused"] is False
        (c,) = t["channels"]
        assert c["channel_name"] == "watch"
        assert c["in_flight_count"] == 2
        assert c["deferred_count"] == 1
        assert c["requeue_count"] == 1
        assert c["message_count"] == 3
        assert c["timeout_count"] == 0
        assert c["depth"] == 3
        assert c["paused"] is False
        assert c["client_count"] == 1
        (client,) = c["clients"]
        for key in (
            "client_id",
            "hostname",
            "version",
            "remote_address",
            "state",
            "ready_count",
            "in_flight_count",
            "message_count",
            "finish_count",
            "requeue_count",
            "connect_ts",
            "user_agent",
        ):
            assert key in client
        assert client["ready_count"] == 2 and client["in_flight_count"] == 2
        assert "pynsq" in client["user_agent"]
        assert any(
            p["topic"] == name and p["count"] == 6
            for prod in doc["producers"]
            for p in prod["pub_counts"]
        )
        # Filters, and the switches nsq_stat and nsqadmin use.
        only = await stats(server, topic=name, channel="nope", include_clients="false")
        assert [x["topic_name"] for x in only["topics"]] == [name]
        assert only["topics"][0]["channels"] == []
        assert "memory" not in await stats(server, include_mem="false")
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{server.http_url}/stats")).text
        assert f"[{name}" in text and "[watch" in text
        for m in held:
            if not m.has_responded():
                m.finish()
    finally:
        r.close()
        for conn in list(writer.conns.values()):
            conn.close()


async def test_topic_and_channel_administration(server: RunningServer) -> None:
    name = topic()
    async with httpx.AsyncClient(base_url=server.http_url, headers=V1) as http:

        async def post(path: str, **params: str) -> httpx.Response:
            return await http.post(path, params=params)

        assert (await post("/channel/create", topic=name, channel="c")).json() == {
            "message": "TOPIC_NOT_FOUND"
        }
        assert (await post("/topic/create", topic=name)).status_code == 200
        assert (await post("/channel/create", topic=name, channel="c")).status_code == 200
        assert (await post("/channel/create", topic=name, channel="d")).status_code == 200
        channels = {c["channel_name"] for c in find(await stats(server), name)["channels"]}
        assert channels == {"c", "d"}
        r = await http.post("/mpub", params={"topic": name}, content=b"1\n2\n3")
        assert r.status_code == 200
        assert (await post("/channel/empty", topic=name, channel="c")).status_code == 200
        by_name = {c["channel_name"]: c for c in find(await stats(server), name)["channels"]}
        assert by_name["c"]["depth"] == 0 and by_name["d"]["depth"] == 3
        assert (await post("/channel/empty", topic=name, channel="x")).status_code == 404
        assert (await post("/channel/delete", topic=name, channel="d")).status_code == 200
        assert (await post("/channel/delete", topic=name, channel="d")).json() == {
            "message": "CHANNEL_NOT_FOUND"
        }
        assert (await post("/topic/pause", topic=name)).status_code == 200
        assert find(await stats(server), name)["paused"] is True
        assert (await post("/topic/unpause", topic=name)).status_code == 200
        assert (await post("/topic/empty", topic=name)).status_code == 200
        assert (await post("/topic/delete", topic=name)).status_code == 200
        assert all(t["topic_name"] != name for t in (await stats(server))["topics"])
        r = await post("/topic/delete", topic=name)
        assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})


async def test_the_pre_1_0_envelope_on_request(server: RunningServer) -> None:
    name = topic()
    old = {"Accept": "application/vnd.nsq; version=0.3"}
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        r = await http.post("/pub", params={"topic": name}, content=b"x", headers=old)
        assert r.json() == {"status_code": 200, "status_txt": "OK", "data": "OK"}
        r = await http.get("/lookup", params={"topic": name}, headers=old)
        assert r.json()["status_code"] == 200
        assert r.json()["data"]["producers"][0]["tcp_port"] == server.nsq_port
        r = await http.post("/pub", content=b"x", headers=old)
        assert r.status_code == 400
        assert r.json() == {"status_code": 400, "status_txt": "MISSING_ARG_TOPIC", "data": None}
        r = await http.get("/lookup", params={"topic": name}, headers=V1)
        assert "producers" in r.json()  # the bare shape pynsq and go-nsq read


async def test_webhook_broker_routes_beside_nsqd_s(server: RunningServer) -> None:
    """``/channel/create`` is a webhook-broker channel named "create" for GET and PUT,
    nsqd's for POST; ``/channels`` is webhook-broker's list without ``topic``."""
    name = topic()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        r = await http.put("/channel/create", data={"token": "ct"})
        assert r.status_code in (200, 201), r.text
        r = await http.get("/channel/create")
        assert r.status_code == 200 and r.json()["ID"] == "create"
        r = await http.post("/channel/create", params={"topic": name, "channel": "c"})
        assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
        r = await http.get("/channels")
        assert r.status_code == 200 and "Result" in r.json()
        assert "/channel/create" in r.json()["Result"]
        await http.post("/topic/create", params={"topic": name})
        await http.post("/channel/create", params={"topic": name, "channel": "c"})
        r = await http.get("/channels", params={"topic": name})
        assert r.json() == {"channels": ["c"]}
        r = await http.get("/pub")
        assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})


async def test_ping_and_info(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        r = await http.get("/ping")
        assert (r.status_code, r.text) == (200, "OK")
        info = (await http.get("/info")).json()
        assert info["tcp_port"] == server.nsq_port
        assert info["http_port"] == server.http_port
        assert info["broadcast_address"] == server.host
        for key in ("version", "hostname", "start_time", "max_heartbeat_interval"):
            assert key in info


async def test_config_options_as_nsqd_answers_them(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        r = await http.get("/config/max_rdy_count")
        assert (r.status_code, r.json()) == (200, 2500)
        assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"
        assert (await http.get("/config/msg_timeout")).json() == 60_000_000_000  # ns
        assert (await http.get("/config/nsqlookupd_tcp_addresses")).json() == []
        assert (await http.get("/config/tcp_address")).json().endswith(f":{server.nsq_port}")
        r = await http.get("/config/no_such_option")
        assert (r.status_code, r.json()) == (400, {"message": "INVALID_OPTION"})
        # log_level is the option nsqd changes at run time: applied, and read back.
        r = await http.put("/config/log_level", content=b"debug")
        assert (r.status_code, r.json()) == (200, "debug")
        assert (await http.get("/config/log_level")).json() == "debug"
        r = await http.put("/config/log_level", content=b"info")
        assert (await http.get("/config/log_level")).json() == "info"
        r = await http.put("/config/log_level", content=b"loud")
        assert (r.status_code, r.json()) == (400, {"message": "INVALID_VALUE"})
        r = await http.put("/config/log_level", content=b"")
        assert (r.status_code, r.json()) == (413, {"message": "INVALID_VALUE"})
        # Nothing registers this node with an nsqlookupd over TCP: refused, not ignored.
        r = await http.put("/config/nsqlookupd_tcp_addresses", content=b'["127.0.0.1:4160"]')
        assert (r.status_code, r.json()) == (400, {"message": "INVALID_OPTION"})
        r = await http.post("/config/log_level", content=b"debug")
        assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert (await http.get("/config/max_rdy_count", headers=V1)).json() == 2500


async def test_debug_routes_are_not_found(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for method, path in [
            ("GET", "/debug/pprof/"),
            ("GET", "/debug/pprof/heap"),
            ("POST", "/debug/freememory"),
            ("PUT", "/debug/setblockrate?rate=1"),
        ]:
            r = await http.request(method, path)
            assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"}), path


async def test_pause_survives_a_restart() -> None:
    with run_server() as srv:
        name = topic()
        base = srv.http_url
        async with httpx.AsyncClient(base_url=base) as http:
            await http.post("/topic/create", params={"topic": name})
            await http.post("/channel/create", params={"topic": name, "channel": "c"})
            await http.post("/channel/create", params={"topic": name, "channel": "d"})
            r = await http.post("/channel/pause", params={"topic": name, "channel": "c"})
            assert r.status_code == 200
            r = await http.post("/topic/pause", params={"topic": name})
            assert r.status_code == 200
            await http.post("/mpub", params={"topic": name}, content=b"a\nb")
        srv.restart()
        t = find(await stats(srv), name)
        assert t["paused"] is True
        assert {c["channel_name"]: c["paused"] for c in t["channels"]} == {"c": True, "d": False}
        got = {"c": [], "d": []}  # type: dict[str, list[bytes]]
        readers = [reader(srv, name, ch, message_handler=collect(got[ch])) for ch in got]
        try:
            await wait_until(lambda: all(r.conns for r in readers))
            await asyncio.sleep(0.5)
            assert got == {"c": [], "d": []}  # the topic is paused
            async with httpx.AsyncClient(base_url=srv.http_url) as http:
                await http.post("/topic/unpause", params={"topic": name})
                await wait_until(lambda: len(got["d"]) == 2)
                await asyncio.sleep(0.3)
                assert got["c"] == []  # the channel itself still is
                await http.post("/channel/unpause", params={"topic": name, "channel": "c"})
                await wait_until(lambda: len(got["c"]) == 2)
        finally:
            for r in readers:
                r.close()


# -- hostile requests: nsqd's 4xx, never a 5xx ----------------------------------------------------

_NAMES = st.one_of(
    st.sampled_from(["ok", "a" * 64, "a" * 65, "", "bad name", "x#ephemeral", "x#other", "é"]),
    st.text(max_size=70),
)
_PATHS = st.sampled_from(
    [
        "/pub",
        "/mpub",
        "/dpub",
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/topic/unpause",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
    ]
)


@st.composite
def _mpub_binary(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(-2, 6))
    out = struct.pack(">i", count)
    for _ in range(draw(st.integers(0, 6))):
        body = draw(st.binary(max_size=20))
        size = draw(st.one_of(st.just(len(body)), st.integers(-3, 40)))
        out += struct.pack(">i", size) + body
    return out + draw(st.binary(max_size=6))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=_PATHS,
    topic_=st.one_of(st.none(), _NAMES),
    channel=st.one_of(st.none(), _NAMES),
    defer=st.one_of(st.none(), st.sampled_from(["0", "-1", "10", "x", "99999999999", "1e3", ""])),
    binary_flag=st.one_of(st.none(), st.sampled_from(["true", "1", "false", "yes", ""])),
    body=st.one_of(st.binary(max_size=64), _mpub_binary()),
    raw_query=st.sampled_from(["", "&a=%zz", "&b;c=1", "&topic"]),
)
def test_hostile_requests_get_4xx(
    server: RunningServer,
    path: str,
    topic_: str | None,
    channel: str | None,
    defer: str | None,
    binary_flag: str | None,
    body: bytes,
    raw_query: str,
) -> None:
    params: dict[str, str] = {}
    if topic_ is not None:
        params["topic"] = topic_
    if channel is not None:
        params["channel"] = channel
    if defer is not None:
        params["defer"] = defer
    if binary_flag is not None:
        params["binary"] = binary_flag
    query = str(httpx.QueryParams(params)) + raw_query
    r = httpx.post(f"{server.http_url}{path}?{query}", content=body)
    assert r.status_code < 500, (path, query, r.status_code, r.text)
    if r.status_code != 200:
        assert r.status_code in (400, 404, 413), (str(r.request.url), r.text)
        assert set(r.json()) == {"message"}


def test_oversize_bodies(server: RunningServer) -> None:
    big = b"x" * (1024 * 1024 + 1)
    r = httpx.post(f"{server.http_url}/pub?topic=big", content=big)
    assert (r.status_code, r.json()) == (413, {"message": "MSG_TOO_BIG"})
    r = httpx.post(f"{server.http_url}/mpub?topic=big", content=big)
    assert (r.status_code, r.json()) == (413, {"message": "MSG_TOO_BIG"})
    r = httpx.post(f"{server.http_url}/mpub?topic=big", content=b"y\n" * (3 * 1024 * 1024))
    assert (r.status_code, r.json()) == (413, {"message": "BODY_TOO_BIG"})

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is met while reading
        for _ in range(12):
            yield (b"z" * 1023 + b"\n") * 512

    r = httpx.post(f"{server.http_url}/mpub?topic=big", content=chunks())
    assert (r.status_code, r.json()) == (413, {"message": "BODY_TOO_BIG"})
    r = httpx.post(f"{server.http_url}/mpub?topic=big&binary=true", content=b"\0\0\0\2")
    assert (r.status_code, r.json()) == (413, {"message": "BAD_MESSAGE"})
    r = httpx.post(f"{server.http_url}/mpub?topic=big&binary=true", content=b"\0\0")
    assert (r.status_code, r.json()) == (413, {"message": "BAD_BODY"})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/lookup", "/channels", "/stats", "/topics", "/nodes", "/info"]),
    query=st.one_of(
        st.sampled_from(["topic", "topic=", "topic=%zz", "topic=a;b", "format=json&topic=%ff"]),
        st.text(max_size=40).map(lambda t: str(httpx.QueryParams({"topic": t}))),
    ),
)
def test_hostile_queries_to_the_read_routes(server: RunningServer, path: str, query: str) -> None:
    r = httpx.get(f"{server.http_url}{path}?{query}")
    assert r.status_code < 500, (path, query, r.status_code, r.text)


def test_writes_need_the_server_s_credentials_when_it_requires_them() -> None:
    with run_server(store="memory", args=["--auth-token", "s3cret"]) as srv:
        url = f"{srv.http_url}/pub?topic=guarded"
        r = httpx.post(url, content=b"x")
        assert (r.status_code, r.json()) == (401, {"message": "UNAUTHORIZED"})
        r = httpx.post(url, content=b"x", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = httpx.post(url, content=b"x", headers={"Authorization": "Bearer s3cret"})
        assert (r.status_code, r.text) == (200, "OK")
        assert httpx.get(f"{srv.http_url}/ping").text == "OK"  # reads stay open


def test_an_answered_publish_survives_a_kill() -> None:
    """``OK`` comes after the commit is durable: SIGKILL right after loses nothing."""
    with run_server() as srv:
        name = topic()
        bodies = b"\n".join(b"m%d" % i for i in range(100))
        r = httpx.post(f"{srv.http_url}/mpub", params={"topic": name}, content=bodies)
        assert r.status_code == 200
        r = httpx.post(
            f"{srv.http_url}/pub", params={"topic": name, "defer": "60000"}, content=b"d"
        )
        assert r.status_code == 200
        srv.kill()
        srv.start()
        doc = httpx.get(f"{srv.http_url}/stats", params={"format": "json"}).json()
        (t,) = [t for t in doc["topics"] if t["topic_name"] == name]
        assert t["depth"] == 100


def test_past_the_size_bound_pub_answers_503_pub_failed() -> None:
    """Topics are streams: past the server's bound for them (``max_file_store``, by
    default 3/4 of the free disk) ``/pub`` and ``/mpub`` answer nsqd's 503
    ``PUB_FAILED``, where nsqd itself would take the message."""
    with run_server(store="memory", args=["--max-file-store", "250"]) as srv:
        url = f"{srv.http_url}/pub"
        # Each message counts 100 + its subject + 30 bytes: the second crosses 250.
        for _ in range(2):
            r = httpx.post(url, params={"topic": "bounded"}, content=b"x" * 100)
            assert (r.status_code, r.text) == (200, "OK")
        r = httpx.post(url, params={"topic": "bounded"}, content=b"x")
        assert (r.status_code, r.json()) == (503, {"message": "PUB_FAILED"})
        r = httpx.post(f"{srv.http_url}/mpub", params={"topic": "other"}, content=b"a\nb")
        assert (r.status_code, r.json()) == (503, {"message": "PUB_FAILED"})
        # A deferred publish is kept (durably) and waits for room rather than being lost.
        r = httpx.post(url, params={"topic": "bounded", "defer": "100"}, content=b"later")
        assert (r.status_code, r.text) == (200, "OK")
        time.sleep(1.5)  # due, refused, tried again each second
        assert depth(srv, "bounded") == 2
        assert httpx.post(f"{srv.http_url}/topic/empty", params={"topic": "bounded"}).is_success
        deadline = time.monotonic() + 5
        while depth(srv, "bounded") != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert depth(srv, "bounded") == 1


def depth(srv: RunningServer, topic: str) -> int:
    doc = httpx.get(f"{srv.http_url}/stats", params={"format": "json"}).json()
    (t,) = [t for t in doc["topics"] if t["topic_name"] == topic]
    return int(t["depth"])
