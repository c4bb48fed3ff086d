"""The webhook-broker resources, broadcast and message views against a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import nats
import pytest

from tether.testing import RunningServer, run_server

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    conf = tmp_path_factory.mktemp("conf") / "tether.toml"
    conf.write_text("webhook_min_schedule_delay = 1.0\n")
    with run_server(args=["--config", str(conf)]) as srv:
        yield srv


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=10) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}{time.monotonic_ns()}"


def setup_channel(http: httpx.Client) -> tuple[str, dict[str, str]]:
    ch, prod = unique("ch"), unique("p")
    assert http.put(f"/channel/{ch}", data={"token": "ct"}).status_code == 200
    assert http.put(f"/producer/{prod}", data={"token": "pt"}).status_code == 200
    headers = {
        "X-Broker-Channel-Token": "ct",
        "X-Broker-Producer-ID": prod,
        "X-Broker-Producer-Token": "pt",
    }
    return ch, headers


# -- producers, channels, consumers ---------------------------------------------------------------


def test_put_get_producer_with_conditional_update(http: httpx.Client) -> None:
    pid = unique("prod")
    r = http.put(f"/producer/{pid}", data={"name": "Producer"})
    assert r.status_code == 200
    body = r.json()
    assert body["ID"] == pid and body["Name"] == "Producer"
    token = body["Token"]
    assert len(token) == 12 and token.isalnum()
    last_modified = r.headers["Last-Modified"]
    got = http.get(f"/producer/{pid}")
    assert got.status_code == 200 and got.headers["Last-Modified"] == last_modified
    assert got.json()["Token"] == ""  # not revealed without proof
    assert (
        http.get(f"/producer/{pid}", headers={"X-Broker-Producer-Token": token}).json()["Token"]
        == token
    )
    assert (
        http.get(f"/producer/{pid}", headers={"X-Broker-Producer-Token": "nope"}).json()["Token"]
        == ""
    )
    assert http.put(f"/producer/{pid}", data={"name": "x"}).status_code == 400
    stale = {"If-Unmodified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"}
    assert http.put(f"/producer/{pid}", data={"name": "x"}, headers=stale).status_code == 412
    time.sleep(1.05)  # Last-Modified has one second precision
    ok = http.put(
        f"/producer/{pid}",
        data={"name": "New", "token": "t2"},
        headers={"If-Unmodified-Since": last_modified},
    )
    assert ok.status_code == 200 and ok.json()["Name"] == "New" and ok.json()["Token"] == "t2"
    assert ok.headers["Last-Modified"] != last_modified
    assert http.get("/producer/missing-one").status_code == 404


def test_put_requires_a_form(http: httpx.Client) -> None:
    assert http.put(f"/channel/{unique('c')}", json={"token": "x"}).status_code == 415
    assert http.put(f"/producer/{unique('p')}", content=b"token=x").status_code == 415
    r = http.put("/channel/bad.id", data={"token": "x"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/plain")


def test_channel_and_lists_with_pagination(http: httpx.Client) -> None:
    ids = [unique("pg") for _ in range(30)]
    for cid in ids:
        assert http.put(f"/channel/{cid}", data={"name": cid}).status_code == 200
    body = http.get(f"/channel/{ids[0]}").json()
    assert body["ConsumersURL"] == f"/channel/{ids[0]}/consumers"
    assert body["MessagesURL"] == f"/channel/{ids[0]}/messages"
    assert body["BroadcastURL"] == f"/channel/{ids[0]}/broadcast"
    assert body["MessagesStatusURL"] == f"/channel/{ids[0]}/messages-status"
    seen: list[str] = []
    page = http.get("/channels").json()
    assert page["Links"] is None and len(page["Result"]) == 25 and "previous" not in page["Pages"]
    while True:
        seen += page["Result"]
        if "next" not in page["Pages"]:
            break
        page = http.get(page["Pages"]["next"]).json()
        assert "previous" in page["Pages"]
    assert len(seen) == len(set(seen))
    assert [f"/channel/{i}" for i in reversed(ids)] == [
        s for s in seen if s.startswith("/channel/pg")
    ][:30]


def test_consumer_put_get_delete(http: httpx.Client) -> None:
    ch = unique("cc")
    url = f"/channel/{ch}/consumer/k1"
    assert http.put(url, data={"callbackUrl": "http://example.com/x"}).status_code == 404
    http.put(f"/channel/{ch}", data={"token": "ct"})
    assert http.put(url, data={"callbackUrl": "not-a-url"}).status_code == 400
    assert http.put(url, content=b"", headers=FORM).status_code == 400
    assert (
        http.put(url, data={"callbackUrl": "http://example.com/x", "type": "bogus"}).status_code
        == 400
    )
    r = http.put(url, data={"callbackUrl": "http://example.com/x", "type": ""})
    assert r.status_code == 200
    body = r.json()
    assert body["Type"] == "push" and body["CallbackURL"] == "http://example.com/x"
    assert body["DeadLetterQueueURL"] == f"{url}/dlq"
    lm = r.headers["Last-Modified"]
    assert http.put(url, data={"callbackUrl": "http://example.com/y"}).status_code == 400
    r2 = http.put(
        url,
        data={"callbackUrl": "http://example.com/y", "type": "pull"},
        headers={"If-Unmodified-Since": lm},
    )
    assert r2.status_code == 200 and r2.json()["Type"] == "pull"
    assert http.get(f"/channel/{ch}/consumers").json()["Result"] == [url]
    assert http.delete(url).status_code == 400
    assert (
        http.delete(url, headers={"If-Unmodified-Since": r2.headers["Last-Modified"]}).status_code
        == 204
    )
    assert http.get(url).status_code == 404
    assert http.delete(url, headers={"If-Unmodified-Since": lm}).status_code == 404


# -- broadcast ----------------------------------------------------------------------------------


def test_broadcast_error_order(http: httpx.Client) -> None:
    ch, headers = setup_channel(http)
    post = lambda c, h: http.post(f"/channel/{c}/broadcast", content=b"x", headers=h)  # noqa: E731
    assert post("nochannel", headers).status_code == 404
    assert post(ch, {**headers, "X-Broker-Channel-Token": "bad"}).status_code == 403
    assert post(ch, {**headers, "X-Broker-Producer-ID": "nobody"}).status_code == 401
    r = post(ch, {**headers, "X-Broker-Producer-Token": "bad"})
    assert r.status_code == 403 and r.text == "producer token does not match"
    assert post(ch, {**headers, "X-Broker-Message-Priority": "high"}).status_code == 400
    assert post(ch, {**headers, "X-Broker-Scheduled-For": "tomorrow"}).status_code == 400
    soon = (datetime.now(UTC) + timedelta(seconds=0.2)).isoformat()
    assert post(ch, {**headers, "X-Broker-Scheduled-For": soon}).status_code == 412
    assert http.get(f"/channel/{ch}/messages").json()["Result"] == []


def test_broadcast_and_read_back(http: httpx.Client) -> None:
    ch, headers = setup_channel(http)
    r = http.post(
        f"/channel/{ch}/broadcast",
        content=b'{"a": 1}',
        headers={
            **headers,
            "Content-Type": "application/json",
            "X-Broker-Message-ID": "m-1",
            "X-Broker-Message-Priority": "-7",
            "X-Broker-Metadata-Headers": "X-Trace, X-Empty",
            "X-Trace": "abc",
        },
    )
    assert r.status_code == 201
    assert r.headers["Location"] == f"/channel/{ch}/message/m-1"
    dup = http.post(
        f"/channel/{ch}/broadcast", content=b"y", headers={**headers, "X-Broker-Message-ID": "m-1"}
    )
    assert dup.status_code == 409 and dup.text == "duplicate message id for channel"
    msg = http.get(r.headers["Location"]).json()
    assert msg["ID"] == "m-1"
    assert msg["Payload"] == '{"a": 1}'
    assert msg["ContentType"] == "application/json"
    assert msg["Status"] == "DISPATCHED"
    assert msg["Headers"] == {"X-Trace": "abc"}
    assert msg["Jobs"] == []
    plain = http.post(f"/channel/{ch}/broadcast", content=b"zz", headers=headers)
    assert plain.status_code == 201
    generated = http.get(plain.headers["Location"]).json()
    assert generated["ContentType"] == "application/octet-stream" and len(generated["ID"]) == 20
    listed = http.get(f"/channel/{ch}/messages").json()["Result"]
    assert listed == [plain.headers["Location"], r.headers["Location"]]
    assert http.get(f"/channel/{ch}/messages?status=100").json()["Result"] == []
    status = http.get(f"/channel/{ch}/messages-status").json()
    assert status["counts"]["DISPATCHED"]["Count"] == 2
    assert http.get(f"/channel/{ch}/message/nope").status_code == 404


def test_scheduled_message_is_dispatched_when_due(http: httpx.Client) -> None:
    ch, headers = setup_channel(http)
    due = (datetime.now(UTC) + timedelta(seconds=1.5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    r = http.post(
        f"/channel/{ch}/broadcast",
        content=b"later",
        headers={**headers, "X-Broker-Scheduled-For": due, "X-Broker-Message-ID": "s-1"},
    )
    assert r.status_code == 201 and r.headers["Location"] == f"/channel/{ch}/scheduled-message/s-1"
    sm = http.get(r.headers["Location"]).json()
    assert sm["status"] == "SCHEDULED" and sm["payload"] == "later"
    assert (
        http.get(f"/channel/{ch}/messages-status").json()["counts"]["SCHEDULED_SCHEDULED"]["Count"]
        == 1
    )
    deadline = time.monotonic() + 10
    while http.get(f"/channel/{ch}/message/s-1").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert http.get(r.headers["Location"]).json()["status"] == "DISPATCHED"
    assert http.get(f"/channel/{ch}/scheduled-messages").json()["result"] == [r.headers["Location"]]


# -- one model: HTTP and NATS see the same messages --------------------------------------------------


async def test_http_broadcast_is_readable_over_nats(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        ch = unique("nx")
        await http.put(f"/channel/{ch}", data={"token": "ct"})
        await http.put(f"/producer/{ch}p", data={"token": "pt"})
        headers = {
            "X-Broker-Channel-Token": "ct",
            "X-Broker-Producer-ID": f"{ch}p",
            "X-Broker-Producer-Token": "pt",
        }
        r = await http.post(
            f"/channel/{ch}/broadcast",
            content=b"over-http",
            headers={**headers, "X-Broker-Message-ID": "id-1", "X-Broker-Message-Priority": "4"},
        )
        assert r.status_code == 201
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"wb.{ch}", durable="reader", stream=f"WB_{ch}")
        [msg] = await sub.fetch(1, timeout=5)
        assert msg.data == b"over-http"
        assert msg.headers is not None
        assert msg.headers["Nats-Msg-Id"] == "id-1"
        assert msg.headers["Tether-Priority"] == "4"
        await msg.ack()
    finally:
        await nc.close()


async def test_nats_publish_becomes_jobs_for_http_consumers(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        ch = unique("nj")
        await http.put(f"/channel/{ch}", data={"token": "ct"})
        await http.put(
            f"/channel/{ch}/consumer/pull1",
            data={"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"},
        )
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.publish(
                f"wb.{ch}",
                b"from-nats",
                headers={
                    "Nats-Msg-Id": "nats-1",
                    "Content-Type": "text/plain",
                    "Tether-Priority": "2",
                },
            )
            await js.publish(f"wb.{ch}", b"anonymous")
        finally:
            await nc.close()
        auth = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
        jobs = (await http.get(f"/channel/{ch}/consumer/pull1/queued-jobs", headers=auth)).json()[
            "Result"
        ]
        assert [j["Message"]["Payload"] for j in jobs] == ["from-nats", "anonymous"]
        assert jobs[0]["Priority"] == 2 and jobs[0]["Message"]["ContentType"] == "text/plain"
        assert jobs[0]["Message"]["MessageID"] == "nats-1"
        msg = await http.get(f"/channel/{ch}/message/nats-1")
        assert msg.status_code == 200 and msg.json()["Jobs"][0]["Status"] == "QUEUED"
        other = await http.get(f"/channel/{ch}/message/{jobs[1]['Message']['MessageID']}")
        assert other.status_code == 200 and other.json()["Payload"] == "anonymous"


async def test_http_consumer_is_a_durable_consumer_seen_over_nats(server: RunningServer) -> None:
    """CONSUMER.INFO reports an HTTP consumer, its jobs as pending / ack pending, and
    its lifetime follows the HTTP API's."""
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        ch = unique("ci")
        await http.put(f"/channel/{ch}", data={"token": "ct"})
        base = f"/channel/{ch}/consumer/hook"
        await http.put(base, data={"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"})
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            for i in range(3):
                await js.publish(f"wb.{ch}", b"%d" % i)
            auth = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
            claimed = (await http.post(f"{base}/claim", json={"Max": 1}, headers=auth)).json()
            assert len(claimed["Result"]) == 1
            info = await js.consumer_info(f"WB_{ch}", "hook")
            assert (info.num_pending, info.num_ack_pending) == (2, 1)
            assert info.config.durable_name == "hook"
            assert info.config.max_deliver == 6  # max_retry 5 + the first attempt
            await http.post(
                f"{base}/job/{claimed['Result'][0]['ID']}",
                json={"NextState": "DELIVERED"},
                headers=auth,
            )
            info = await js.consumer_info(f"WB_{ch}", "hook")
            assert (info.num_pending, info.num_ack_pending) == (2, 0)
            assert info.ack_floor.stream_seq == 1
            since = (await http.get(base)).headers["Last-Modified"]
            gone = await http.delete(base, headers={"If-Unmodified-Since": since})
            assert gone.status_code == 204
            with pytest.raises(nats.js.errors.NotFoundError):
                await js.consumer_info(f"WB_{ch}", "hook")
        finally:
            await nc.close()


# -- status routes, security, bad input ----------------------------------------------------------------


def test_status_routes(http: httpx.Client) -> None:
    status = http.get("/_status").json()
    assert status["AppStatus"] == 3 and "SeedData" in status
    assert isinstance(http.get("/job-status").json(), dict)
    assert "consumers" in http.get("/dlq-status").json()
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and "queued_job_count" in metrics.text
    doc = http.get("/openapi.json").json()
    assert "/channel/{channelId}/consumer/{consumerId}/claim" in doc["paths"]
    assert http.get("/healthz").status_code == 200
    r = http.get("/_status", headers={"X-Request-ID": "req-42"})
    assert r.headers["X-Request-ID"] == "req-42"
    assert http.get("/_status").headers["X-Request-ID"]


def test_bodies_are_size_limited(http: httpx.Client) -> None:
    ch, headers = setup_channel(http)
    big = b"x" * (1024 * 1024 + 70 * 1024)
    r = http.post(f"/channel/{ch}/broadcast", content=big, headers=headers)
    assert r.status_code == 413
    assert http.get(f"/channel/{ch}/messages").json()["Result"] == []


def test_tokens_are_not_stored_in_clear(server: RunningServer, http: httpx.Client) -> None:
    secret = "very-secret-token-123"
    ch = unique("tk")
    http.put(f"/channel/{ch}", data={"token": secret})
    http.put(
        f"/channel/{ch}/consumer/c", data={"token": secret + "k", "callbackUrl": "http://x.test/"}
    )
    store_dir = Path(server.store.removeprefix("sqlite:"))
    for path in store_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()
    assert http.get(f"/channel/{ch}").json()["Token"] == ""
    assert json.dumps(http.get("/_status").json()).count(secret) == 0


def test_hmac_gateway_auth(tmp_path: Path) -> None:
    from tether.server.http.auth import signature_header

    conf = tmp_path / "t.toml"
    conf.write_text('http_gateway_secret = "s3cret"\nhttp_gateway_tolerance = 60.0\n')
    with (
        run_server(store="memory", args=["--config", str(conf)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        assert http.get("/_status").status_code == 200  # exempt
        assert http.get("/channels").status_code == 401
        assert http.get("/channels", headers={"X-Broker-Signature": "garbage"}).status_code == 401
        body = b"token=abc"
        good = signature_header("s3cret", body)
        r = http.put("/channel/h1", content=body, headers={**FORM, "X-Broker-Signature": good})
        assert r.status_code == 200
        wrong = signature_header("other", body)
        assert (
            http.put(
                "/channel/h2", content=body, headers={**FORM, "X-Broker-Signature": wrong}
            ).status_code
            == 403
        )
        stale = signature_header("s3cret", body, stamp=int(time.time()) - 3600)
        assert (
            http.put(
                "/channel/h2", content=body, headers={**FORM, "X-Broker-Signature": stale}
            ).status_code
            == 403
        )


INI = """
[broker]
max-retry=2
rational-delay-in-seconds=1
retry-backoff-delays-in-seconds=1,2
[consumer-connection]
token-header-name=X-Custom-Token
user-agent=Compat Agent
connection-timeout-in-seconds=3
[initial-channels]
seed-channel=Seed Channel
[initial-channel-tokens]
seed-channel=seed-channel-token
[initial-producers]
seed-producer=Seed Producer
[initial-producer-tokens]
seed-producer=seed-producer-token
[initial-consumers]
seed-puller=http://sample-endpoint/webhook-receiver
seed-bad=http://sample-endpoint/other
seed-pusher=http://127.0.0.1:9/hook
[seed-puller]
token=seed-consumer-token
channel=seed-channel
type=pull
[seed-bad]
token=x
channel=seed-channel
type=sideways
[seed-pusher]
channel=seed-channel
"""


def test_webhook_broker_ini_config(tmp_path: Path) -> None:
    ini = tmp_path / "webhook-broker.cfg"
    ini.write_text(INI)
    with (
        run_server(store="memory", args=["--webhook-broker-config", str(ini)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        channel = http.get(
            "/channel/seed-channel", headers={"X-Broker-Channel-Token": "seed-channel-token"}
        ).json()
        assert channel["Name"] == "Seed Channel" and channel["Token"] == "seed-channel-token"
        assert http.get("/producer/seed-producer").json()["Name"] == "Seed Producer"
        assert http.get("/channel/seed-channel/consumer/seed-puller").json()["Type"] == "pull"
        assert http.get("/channel/seed-channel/consumer/seed-pusher").json()["Type"] == "push"
        assert http.get("/channel/seed-channel/consumer/seed-bad").status_code == 404
        r = http.post(
            "/channel/seed-channel/broadcast",
            content=b"seeded",
            headers={
                "X-Broker-Channel-Token": "seed-channel-token",
                "X-Broker-Producer-ID": "seed-producer",
                "X-Broker-Producer-Token": "seed-producer-token",
            },
        )
        assert r.status_code == 201
        auth = {
            "X-Broker-Channel-Token": "seed-channel-token",
            "X-Broker-Consumer-Token": "seed-consumer-token",
        }
        jobs = http.get(
            "/channel/seed-channel/consumer/seed-puller/queued-jobs", headers=auth
        ).json()["Result"]
        assert [j["Message"]["Payload"] for j in jobs] == ["seeded"]
        seed = http.get("/_status").json()["SeedData"]
        assert {c["ID"] for c in seed["Consumers"]} == {"seed-puller", "seed-pusher"}
        assert all(
            c["Token"] == "" for c in seed["Consumers"] + seed["Channels"] + seed["Producers"]
        )


def test_past_the_size_bound_a_broadcast_answers_503() -> None:
    """Channels are streams: past the server's bound for them (``max_file_store``, by
    default 3/4 of the free disk) a broadcast is refused with 503 and the reason."""
    with (
        run_server(store="memory", args=["--max-file-store", "250"]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        ch, headers = setup_channel(http)
        url = f"/channel/{ch}/broadcast"
        headers["Content-Type"] = "application/json"
        r = http.post(url, headers=headers, content=b'{"n": 1}')
        assert r.status_code == 201
        # The message that crosses the bound is stored, the next ones are refused.
        answers = [http.post(url, headers=headers, content=b"x" * 300) for _ in range(3)]
        refused = [r for r in answers if r.status_code != 201]
        assert refused and len(answers) - len(refused) <= 1
        for r in refused:
            assert (r.status_code, r.text) == (503, "insufficient resources")
