"""Hostile values at every HTTP route: never a 5xx, never a dropped connection.

Where the schemathesis fuzzing (test_http_schemathesis.py) keeps to what the OpenAPI
document allows, these tests feed what a hostile or careless client sends: unicode
digits (``"²".isdigit()`` is true, ``int("²")`` fails), trailing newlines in ids,
numbers past int64, deep JSON, wrong JSON types, bad cursors and signatures. Each route
template gets every kind of value in every place it takes one; the server must answer
each with a status below 500 and stay up.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.server.http.auth import signature_header
from tether.testing import RunningServer, run_server

DEEP = "[" * 50_000 + "]" * 50_000
HOSTILE_TEXT = [
    "²",
    "٣",
    "1²",
    "²-1",
    "1-²",
    "9" * 400,
    "9" * 5000,
    "-1",
    "+1",
    " 1",
    "1_0",
    "1e9",
    str(2**63),
    str(2**64),
    "a\n",
    "abc%0A",
    "\x00",
    "é",
    "a" * 300,
    "",
    "null",
    "[]",
    "..",
]
HOSTILE_CURSORS = [
    base64.b64encode(text.encode()).decode()
    for text in [
        "²|2020-01-01T00:00:00Z",
        "1|2020-01-01T00:00:00.²Z",
        "9" * 400 + "|2020-01-01T00:00:00Z",
        "1|9999-99-99",
        "1|2020-01-01T00:00:00.999999999999999Z",
        "|",
        "a|b|c",
    ]
] + ["²", "%%%", "=" * 10]
HOSTILE_BODIES = [
    DEEP,
    '{"x":' + DEEP + "}",
    '{"Jobs":' + DEEP + "}",
    "{",
    "null",
    "[]",
    '"str"',
    "1e999",
    '{"Max": true}',
    '{"Max": 1e300}',
    '{"Max": -1}',
    '{"Max": 99999999999999999999999}',
    '{"Wait": "1"}',
    '{"Wait": 1e308}',
    '{"IncrementalTimeout": 99999999999999999999}',
    '{"NextState": 1}',
    '{"NextState": "DELIVERED", "IncrementalTimeout": -5}',
    '{"Jobs": [1, 2]}',
    '{"Jobs": [{"ID": 5}]}',
    '{"Jobs": [{"ID": "²-²", "NextState": "DELIVERED"}]}',
    '{"Jobs": null}',
    "\xff\xfe",
]

CH, PROD, PULL, PUSH = "hc", "hp", "hk", "hpush"
TOKENS = {
    "x-broker-channel-token": "ct",
    "x-broker-producer-id": PROD,
    "x-broker-producer-token": "pt",
    "x-broker-consumer-token": "kt",
}

# Every route template, by method; {c} is the seeded channel, {k} a seeded consumer.
ROUTES = [
    ("GET", "/producers"),
    ("GET", "/producer/{id}"),
    ("PUT", "/producer/{id}"),
    ("GET", "/channels"),
    ("GET", "/channel/{id}"),
    ("PUT", "/channel/{id}"),
    ("GET", "/channel/{c}/consumers"),
    ("GET", "/channel/{c}/consumer/{id}"),
    ("PUT", "/channel/{c}/consumer/{id}"),
    ("DELETE", "/channel/{c}/consumer/{id}"),
    ("POST", "/channel/{c}/broadcast"),
    ("GET", "/channel/{c}/message/{id}"),
    ("GET", "/channel/{c}/messages"),
    ("GET", "/channel/{c}/messages-status"),
    ("GET", "/channel/{c}/scheduled-messages"),
    ("GET", "/channel/{c}/consumer/{k}/queued-jobs"),
    ("GET", "/channel/{c}/consumer/{k}/job/{id}"),
    ("POST", "/channel/{c}/consumer/{k}/job/{id}"),
    ("DELETE", "/channel/{c}/consumer/{k}/job/{id}"),
    ("POST", "/channel/{c}/consumer/{k}/job/{id}/requeue-dead-job"),
    ("POST", "/channel/{c}/consumer/{k}/job/{id}/touch"),
    ("GET", "/channel/{c}/consumer/{k}/dlq"),
    ("POST", "/channel/{c}/consumer/{k}/dlq"),
    ("POST", "/channel/{c}/consumer/{k}/claim"),
    ("POST", "/channel/{c}/consumer/{k}/jobs"),
    ("GET", "/job-status"),
    ("GET", "/dlq-status"),
    ("GET", "/_status"),
    ("GET", "/metrics"),
]
QUERY_KEYS = ["limit", "next", "previous"]
HEADER_KEYS = [
    "x-broker-channel-token",
    "x-broker-consumer-token",
    "x-broker-producer-id",
    "x-broker-producer-token",
    "x-broker-message-priority",
    "x-broker-message-id",
    "x-broker-scheduled-for",
    "if-unmodified-since",
    "x-broker-signature",
]


def _seed(http: httpx.Client) -> None:
    http.put(f"/channel/{CH}", data={"token": "ct"}).raise_for_status()
    http.put(f"/producer/{PROD}", data={"token": "pt"}).raise_for_status()
    http.put(f"/channel/{CH}/consumer/{PULL}", data={"token": "kt", "type": "pull"})
    http.put(
        f"/channel/{CH}/consumer/{PUSH}",
        data={"token": "kt", "callbackUrl": "http://127.0.0.1:9/"},
    )
    for i in range(3):
        http.post(
            f"/channel/{CH}/broadcast",
            content=f"m{i}",
            headers={**TOKENS, "content-type": "text/plain"},
        ).raise_for_status()


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[tuple[RunningServer, httpx.Client]]:
    with run_server(store="memory") as srv, httpx.Client(base_url=srv.http_url, timeout=10) as http:
        _seed(http)
        yield srv, http


def _header_bytes(value: str) -> bytes:
    # As UTF-8 bytes (the server sees them as latin-1); httpx refuses line breaks and
    # NUL in a header, which the raw socket test below sends.
    return value.encode("utf-8", "surrogatepass").translate(None, b"\r\n\x00")


def _path(template: str, value: str, consumer: str) -> str:
    quoted = "".join(
        ch if ch.isalnum() and ch.isascii() else f"%{b:02X}" for ch in value for b in ch.encode()
    )
    return template.format(c=CH, k=consumer, id=quoted or "x")


def _check(http: httpx.Client, method: str, url: str, **kwargs: object) -> None:
    response = http.request(method, url, **kwargs)  # type: ignore[arg-type]
    assert response.status_code < 500, (method, url, kwargs, response.status_code, response.text)


@given(
    route=st.sampled_from(ROUTES),
    value=st.sampled_from(HOSTILE_TEXT) | st.text(max_size=30),
    consumer=st.sampled_from([PULL, PUSH]),
    place=st.sampled_from(["path", "query", "header", "body", "form"]),
    key=st.integers(0, 100),
    # Indices, not the values: hypothesis would print the 100 kB bodies in every report.
    body=st.integers(0, len(HOSTILE_BODIES) - 1),
    cursor=st.integers(0, len(HOSTILE_CURSORS) - 1),
)
@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_route_answers_5xx(
    hostile_server: tuple[RunningServer, httpx.Client],
    route: tuple[str, str],
    value: str,
    consumer: str,
    place: str,
    key: int,
    body: int,
    cursor: int,
) -> None:
    _, http = hostile_server
    method, template = route
    if method == "PUT" and template in ("/channel/{id}", "/producer/{id}") and place != "path":
        return  # keeps the seeded tokens stable
    if method == "DELETE" and "/consumer/{id}" in template:
        return  # keeps the seeded consumers (deleting one is an ordinary 204)
    headers: dict[str, str | bytes] = dict(TOKENS)
    params: dict[str, str] = {}
    content: bytes | None = None
    path = _path(template, value if place == "path" else "1-1", consumer)
    if place == "query":
        params[QUERY_KEYS[key % len(QUERY_KEYS)]] = value if key % 2 else HOSTILE_CURSORS[cursor]
    elif place == "header":
        headers[HEADER_KEYS[key % len(HEADER_KEYS)]] = _header_bytes(value)
    elif place == "body":
        content = HOSTILE_BODIES[body].encode("utf-8", "surrogatepass")
        headers["content-type"] = "application/json"
    elif place == "form":
        field = ["token", "name", "callbackUrl", "type", "requeue"][key % 5]
        content = httpx.QueryParams({field: value}).__str__().encode()
        headers["content-type"] = "application/x-www-form-urlencoded"
    _check(http, method, path, params=params, headers=headers, content=content)


def test_raw_requests_with_control_characters(
    hostile_server: tuple[RunningServer, httpx.Client],
) -> None:
    srv, http = hostile_server
    host, port = srv.http_url.removeprefix("http://").rsplit(":", 1)
    heads = [
        b"GET /channel/hc/consumer/hk/queued-jobs?limit=%C2%B2 HTTP/1.1\r\n",
        b"GET /channel/hc%0A HTTP/1.1\r\n",
        b"PUT /producer/p%0A HTTP/1.1\r\ncontent-type: application/x-www-form-urlencoded\r\n",
        b"GET /channel/hc/consumer/hk/job/1-\xc2\xb2 HTTP/1.1\r\n",
        b"POST /channel/hc/broadcast HTTP/1.1\r\nx-broker-message-priority: \xc2\xb2\r\n",
        b"POST /channel/hc/broadcast HTTP/1.1\r\ncontent-length: \xc2\xb2\r\n",
    ]
    for head in heads:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                head
                + b"host: x\r\nx-broker-channel-token: ct\r\nx-broker-consumer-token: kt\r\n"
                + b"content-length: 0\r\nconnection: close\r\n\r\n"
            )
            answer = sock.recv(64)
        status = int(answer.split(b" ", 2)[1])
        assert status < 500, (head, answer)
    assert http.get("/_status").status_code == 200


def test_ids_with_a_trailing_newline_are_refused(
    hostile_server: tuple[RunningServer, httpx.Client],
) -> None:
    _, http = hostile_server
    assert http.put("/producer/p%0A", data={"token": "x"}).status_code == 400
    assert http.put("/channel/abc%0A", data={"token": "x"}).status_code == 400
    assert http.get("/producer/p%0A").status_code == 404


def test_unicode_digits_in_limits_and_ids(
    hostile_server: tuple[RunningServer, httpx.Client],
) -> None:
    _, http = hostile_server
    base = f"/channel/{CH}/consumer/{PULL}"
    assert http.get(f"{base}/queued-jobs", params={"limit": "²"}, headers=TOKENS).status_code == 400
    assert http.get(f"{base}/job/1-²", headers=TOKENS).status_code == 404
    cursor = base64.b64encode(b"1|2020-01-01T00:00:00.\xc2\xb2Z").decode()
    assert http.get("/channels", params={"next": cursor}).status_code == 200


def test_deep_json_is_a_400(hostile_server: tuple[RunningServer, httpx.Client]) -> None:
    _, http = hostile_server
    base = f"/channel/{CH}/consumer/{PULL}"
    for route in ("jobs", "claim"):
        r = http.post(f"{base}/{route}", content='{"x":' + DEEP + "}", headers=TOKENS)
        assert r.status_code == 400 and "nested too deeply" in r.text


def test_gateway_signature_with_a_huge_timestamp(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text('http_gateway_secret = "s3cret"\n')
    with (
        run_server(store="memory", args=["--config", str(config)]) as srv,
        httpx.Client(base_url=srv.http_url, timeout=10) as http,
    ):
        for header in [
            "t=" + "9" * 400 + ",v1=00",
            "t=²,v1=00",
            "t=-1,v1=00",
            "t=,v1=",
            "garbage",
        ]:
            r = http.get("/channels", headers={"x-broker-signature": header.encode()})
            assert r.status_code in (401, 403), (header, r.status_code, r.text)
        good = signature_header("s3cret", b"", int(time.time()))
        assert http.get("/channels", headers={"x-broker-signature": good}).status_code == 200
