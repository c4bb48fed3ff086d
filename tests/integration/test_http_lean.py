"""The lean broadcast route answers exactly as the Starlette route it stands in front of.

Two servers in this process get the same requests: one through the Starlette app alone
(gateway middleware, router, ``messages.broadcast``), the other through the app uvicorn
serves (:class:`LeanRoutes` first). Every ASGI message sent back must be the same (status,
header names, values and order, body), and the stored messages too.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tether.server.app import Tether
from tether.server.config import ServerConfig
from tether.server.http.auth import signature_header
from tether.server.http.lean import LeanRoutes

SECRET = "gateway-secret"
AUTH = [
    ("X-Broker-Channel-Token", "ct"),
    ("X-Broker-Producer-ID", "prod"),
    ("X-Broker-Producer-Token", "pt"),
]
PATH = "/channel/ch/broadcast"


async def started(**options: Any) -> Tether:
    cfg = ServerConfig(
        port=0,
        http_port=0,
        nsq_port=0,
        store="memory",
        max_payload=4096,
        http_max_body=8192,
        webhook_min_schedule_delay=60.0,
        **options,
    )
    app = Tether(cfg)
    await app.start()
    assert app.webhooks is not None
    await app.webhooks.put_channel("ch", "ch", "ct")
    await app.webhooks.put_producer("prod", "prod", "pt")
    return app


def lean_of(app: Tether) -> LeanRoutes:
    assert app.http is not None
    lean = app.http._app
    assert isinstance(lean, LeanRoutes)
    return lean


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Tether, Tether]]:
    a, b = await started(), await started()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


@pytest.fixture
async def gated_pair() -> AsyncIterator[tuple[Tether, Tether]]:
    a = await started(http_gateway_secret=SECRET)
    b = await started(http_gateway_secret=SECRET)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def call(
    app: Any,
    headers: list[tuple[str, str]],
    body: bytes | list[bytes] = b"",
    *,
    path: str = PATH,
    method: str = "POST",
    sent: list[dict[str, Any]] | None = None,
    query: bytes = b"",
) -> list[dict[str, Any]]:
    chunks = body if isinstance(body, list) else [body]
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    if not any(k == b"content-length" for k, _ in raw):
        raw.append((b"content-length", str(sum(map(len, chunks))).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": raw,
    }
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    if sent is None:
        sent = []
    out = sent

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        out.append(dict(message))

    await app(scope, receive, send)
    return out


def normalized(sent: list[dict[str, Any]], headers: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Generated values differ between servers: X-Request-ID when none was given and
    the message id in Location when none was given."""
    given = {k.lower() for k, _ in headers}
    out = []
    for message in sent:
        message = dict(message)
        if "headers" in message:
            fixed = []
            for k, v in message["headers"]:
                if k == b"x-request-id" and "x-request-id" not in given:
                    assert re.fullmatch(rb"[0-9a-f]{20}", v)
                    v = b"<generated>"
                if k == b"location" and "x-broker-message-id" not in given:
                    assert re.fullmatch(rb"/channel/ch/message/[0-9a-v]{20}", v)
                    v = b"/channel/ch/message/<generated>"
                fixed.append((k, v))
            message["headers"] = fixed
        out.append(message)
    return out


def soon(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


CASES: list[tuple[str, list[tuple[str, str]], bytes | list[bytes]]] = [
    ("plain", [*AUTH, ("X-Broker-Message-ID", "m1")], b"hello"),
    ("duplicate", [*AUTH, ("X-Broker-Message-ID", "m1")], b"again"),
    ("generated id", AUTH, b"x" * 1024),
    ("request id echoed", [*AUTH, ("X-Request-ID", "rid-1")], b"x"),
    ("request id, last wins", [*AUTH, ("X-Request-ID", "a"), ("X-Request-ID", "b")], b"x"),
    ("long request id", [*AUTH, ("X-Request-ID", "r" * 300)], b"x"),
    ("empty body", [*AUTH, ("X-Broker-Message-ID", "empty")], b""),
    ("chunked body", [*AUTH, ("X-Broker-Message-ID", "chunks")], [b"ab", b"cd", b"ef"]),
    (
        "content type",
        [*AUTH, ("Content-Type", "application/json"), ("X-Broker-Message-ID", "ct")],
        b"{}",
    ),
    (
        "message id, first wins",
        [*AUTH, ("X-Broker-Message-ID", "first"), ("X-Broker-Message-ID", "second")],
        b"x",
    ),
    ("quoted id", [*AUTH, ("X-Broker-Message-ID", "a b/é?%")], b"x"),
    ("id too long", [*AUTH, ("X-Broker-Message-ID", "i" * 256)], b"x"),
    ("priority", [*AUTH, ("X-Broker-Message-Priority", " -7 "), ("X-Broker-Message-ID", "p")], b""),
    ("priority not a number", [*AUTH, ("X-Broker-Message-Priority", "high")], b"x"),
    ("priority too high", [*AUTH, ("X-Broker-Message-Priority", "1000001")], b"x"),
    (
        "metadata",
        [
            *AUTH,
            ("X-Broker-Metadata-Headers", "X-Trace, x-empty ,,X-Other"),
            ("X-Trace", "t1"),
            ("x-other", "o1"),
            ("X-Trace", "t2"),
            ("X-Broker-Message-ID", "meta"),
        ],
        b"x",
    ),
    ("metadata bad name", [*AUTH, ("X-Broker-Metadata-Headers", "bad name")], b"x"),
    ("metadata reserved", [*AUTH, ("X-Broker-Metadata-Headers", "Content-Type")], b"x"),
    ("payload too large", AUTH, b"x" * 5000),
    ("body too large", AUTH, b"x" * 9000),
    ("content-length too large", [*AUTH, ("Content-Length", "9000")], b"x"),
    ("content-length not digits", [*AUTH, ("Content-Length", "nope")], b"x"),
    ("schedule malformed", [*AUTH, ("X-Broker-Scheduled-For", "tomorrow")], b"x"),
    ("schedule no time", [*AUTH, ("X-Broker-Scheduled-For", "2099-01-01")], b"x"),
    ("schedule too soon", [*AUTH, ("X-Broker-Scheduled-For", soon(5))], b"x"),
    (
        "scheduled",
        [*AUTH, ("X-Broker-Scheduled-For", soon(3600)), ("X-Broker-Message-ID", "later")],
        b"x",
    ),
    (
        "scheduled duplicate",
        [*AUTH, ("X-Broker-Scheduled-For", soon(3600)), ("X-Broker-Message-ID", "later")],
        b"x",
    ),
    ("no channel token", AUTH[1:], b"x"),
    ("wrong channel token", [("X-Broker-Channel-Token", "nope"), *AUTH[1:]], b"x"),
    ("no producer", [AUTH[0]], b"x"),
    ("unknown producer", [AUTH[0], ("X-Broker-Producer-ID", "ghost"), AUTH[2]], b"x"),
    ("wrong producer token", [*AUTH[:2], ("X-Broker-Producer-Token", "nope")], b"x"),
    (
        "first token wins",
        [*AUTH, ("X-Broker-Channel-Token", "nope"), ("X-Broker-Message-ID", "tok")],
        b"x",
    ),
    ("channel missing", AUTH, b"x"),
]


async def test_lean_broadcast_answers_as_starlette(pair: tuple[Tether, Tether]) -> None:
    a, b = pair
    old, new = lean_of(a).app, lean_of(b)
    for name, headers, body in CASES:
        path = "/channel/nope/broadcast" if name == "channel missing" else PATH
        want = normalized(await call(old, headers, body, path=path), headers)
        got = normalized(await call(new, headers, body, path=path), headers)
        assert got == want, name
    # What was stored is the same too.
    for message_id in ("m1", "empty", "chunks", "ct", "first", "a b/é?%", "p", "meta", "tok"):
        views = []
        for app in pair:
            assert app.webhooks is not None
            seq = app.webhooks.message_seq("ch", message_id)
            assert seq is not None, message_id
            view = await app.webhooks.read("ch", seq)
            assert view is not None
            views.append(
                (view.payload, view.content_type, view.producer, view.metadata, view.message_id)
            )
        assert views[0] == views[1], message_id
    for app in pair:
        assert app.webhooks is not None
        scheduled = app.webhooks.registry.scheduled[("ch", "later")]
        assert (scheduled.payload, scheduled.priority) == (b"x", 0)


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/channel/ch/broadcast/", "POST"),  # Starlette's slash redirect
        ("/channel//broadcast", "POST"),
        ("/channel/a/b/broadcast", "POST"),
        ("/channel/ch/broadcast", "GET"),
        ("/channel/ch/broadcast", "PUT"),
        ("/channel/broadcast", "POST"),
        ("/channel/ch/consumer/k/claim", "GET"),
        ("/channel/ch/consumer/k/claim/", "POST"),
        ("/channel/ch/consumer/k/claims", "POST"),
        ("/channel/ch/consumer//claim", "POST"),
        ("/channel/ch/consumers/k/jobs", "POST"),
        ("/channel/ch/consumer/k/job/1-1", "POST"),
    ],
)
async def test_other_paths_are_left_to_starlette(
    pair: tuple[Tether, Tether], path: str, method: str
) -> None:
    a, b = pair
    headers = [*AUTH, ("X-Request-ID", "r")]
    want = await call(lean_of(a).app, headers, b"x", path=path, method=method)
    got = await call(lean_of(b), headers, b"x", path=path, method=method)
    assert got == want
    assert want[0]["status"] != 201


async def test_gateway_signature(gated_pair: tuple[Tether, Tether]) -> None:
    a, b = gated_pair
    good = [*AUTH, ("X-Request-ID", "r"), ("X-Broker-Message-ID", "signed")]
    cases = [
        ("missing", good, b"x"),
        ("malformed", [*good, ("X-Broker-Signature", "v1=abc")], b"x"),
        ("stale", [*good, ("X-Broker-Signature", signature_header(SECRET, b"x", 1))], b"x"),
        ("wrong", [*good, ("X-Broker-Signature", signature_header("other", b"x"))], b"x"),
        ("good", [*good, ("X-Broker-Signature", signature_header(SECRET, b"x"))], b"x"),
    ]
    for name, headers, body in cases:
        want = await call(lean_of(a).app, headers, body)
        got = await call(lean_of(b), headers, body)
        assert got == want, name
    assert want[0]["status"] == 201


async def test_handler_error_is_a_plain_500(
    pair: tuple[Tether, Tether], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any) -> int:
        raise RuntimeError("boom")

    outcomes = []
    for app, serve in ((pair[0], lean_of(pair[0]).app), (pair[1], lean_of(pair[1]))):
        assert app.webhooks is not None
        monkeypatch.setattr(app.webhooks, "broadcast", broken)
        sent: list[dict[str, Any]] = []
        with pytest.raises(RuntimeError, match="boom"):
            await call(serve, [*AUTH, ("X-Request-ID", "r")], b"x", sent=sent)
        outcomes.append(sent)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0]["status"] == 500
    assert outcomes[0][1]["body"] == b"Internal Server Error"


TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def without_times(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Deadlines differ between the two servers by the time between the calls (and so
    may the body's length): times become ``<t>`` and Content-Length is checked apart."""
    out = []
    length = -1
    for message in sent:
        message = dict(message)
        if message["type"] == "http.response.start":
            headers = []
            for k, v in message["headers"]:
                if k == b"content-length":
                    length = int(v)
                    v = b"<n>"
                headers.append((k, v))
            message["headers"] = headers
        else:
            assert len(message["body"]) == length
            message["body"] = TIME.sub(b"<t>", message["body"])
        out.append(message)
    return out


CONSUMER = [("X-Broker-Channel-Token", "ct"), ("X-Broker-Consumer-Token", "kt")]
BASE = "/channel/ch/consumer/puller"


async def test_lean_claim_and_jobs_answer_as_starlette(pair: tuple[Tether, Tether]) -> None:
    for app in pair:
        assert app.webhooks is not None
        await app.webhooks.put_consumer("ch", "puller", "puller", "kt", "http://x.test/", "pull")
        await app.webhooks.put_consumer("ch", "pusher", "pusher", "kt", "http://x.test/", "push")
        for n in range(6):
            await app.webhooks.broadcast("ch", "prod", b"m%d" % n, "text/plain", 0, f"j{n}", {})
    a, b = pair
    old, new = lean_of(a).app, lean_of(b)
    claimed = await call(old, CONSUMER, b'{"Max": 2}', path=f"{BASE}/claim")
    await call(new, CONSUMER, b'{"Max": 2}', path=f"{BASE}/claim")
    ids = [job["ID"] for job in json.loads(claimed[1]["body"])["Result"]]
    assert len(ids) == 2
    changes = {
        "Jobs": [
            {"ID": ids[0], "NextState": "DELIVERED"},
            {"ID": ids[1], "NextState": "QUEUED"},
            {"ID": ids[1], "NextState": "NOPE"},
            {"ID": "9-9", "NextState": "DELIVERED"},
            {"ID": "junk"},
        ]
    }
    cases: list[tuple[str, str, list[tuple[str, str]], bytes]] = [
        ("claim", "claim", CONSUMER, b'{"Max": 2, "IncrementalTimeout": 30}'),
        ("claim, default Max", "claim", [*CONSUMER, ("X-Request-ID", "r")], b""),
        ("claim, nothing left, waits", "claim", CONSUMER, b'{"Wait": 0.05}'),
        ("claim, Max too big", "claim", CONSUMER, b'{"Max": 1000}'),
        ("claim, bad Wait", "claim", CONSUMER, b'{"Wait": "soon"}'),
        ("claim, malformed", "claim", CONSUMER, b"{"),
        ("claim, not an object", "claim", CONSUMER, b"[]"),
        ("claim, wrong channel token", "claim", [("X-Broker-Channel-Token", "x")], b""),
        ("claim, no consumer token", "claim", CONSUMER[:1], b""),
        ("jobs", "jobs", CONSUMER, json.dumps(changes).encode()),
        ("jobs, empty", "jobs", CONSUMER, b""),
        ("jobs, not a list", "jobs", CONSUMER, b'{"Jobs": 3}'),
        ("jobs, body too large", "jobs", CONSUMER, b" " * 9000),
    ]
    for name, route, headers, body in cases:
        want = without_times(
            normalized(await call(old, headers, body, path=f"{BASE}/{route}"), headers)
        )
        got = without_times(
            normalized(await call(new, headers, body, path=f"{BASE}/{route}"), headers)
        )
        assert got == want, name
    for path in (
        "/channel/ch/consumer/pusher/claim",
        "/channel/ch/consumer/ghost/claim",
        "/channel/nope/consumer/puller/jobs",
    ):
        want = await call(old, [*CONSUMER, ("X-Request-ID", "r")], b"", path=path)
        got = await call(new, [*CONSUMER, ("X-Request-ID", "r")], b"", path=path)
        assert got == want, path
        assert want[0]["status"] in (401, 404, 412)
    # The same job states on both servers.
    headers = [*CONSUMER, ("X-Request-ID", "r")]
    for seq in range(1, 7):
        path = f"{BASE}/job/1-{seq}"
        want = without_times(await call(old, headers, b"", path=path, method="GET"))
        got = without_times(await call(new, headers, b"", path=path, method="GET"))
        assert got == want, path
        assert want[0]["status"] == 200
