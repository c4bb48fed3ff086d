"""Push consumers: delivery to a local receiver, retries, dead jobs, requeue, recovery."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tether.testing import RunningServer, run_server

CONFIG = """
webhook_max_retry = 3
webhook_retry_backoff = [0.05, 0.1]
webhook_connection_timeout = 2.0
webhook_rational_delay = 0.1
webhook_concurrency = 1
webhook_user_agent = "Tether Test"
"""


class Receiver:
    """A callback endpoint that records requests and answers ``status``."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status = 500
        self.hold = threading.Event()
        self.hold.set()
        self.delay = 0.0  # seconds to wait before answering the next request
        self.active = 0  # requests being answered now
        self.max_active = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real callback would

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    owner.active += 1
                    owner.max_active = max(owner.max_active, owner.active)
                    delay, owner.delay = owner.delay, 0.0
                owner.hold.wait(10)
                time.sleep(delay)
                with lock:
                    owner.active -= 1
                owner.requests.append((dict(self.headers.items()), body))
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tether.toml"
    path.write_text(CONFIG)
    return path


def wait_until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def setup(http: httpx.Client, callback: str) -> dict[str, str]:
    assert http.put("/channel/orders", data={"token": "ct"}).status_code == 200
    assert http.put("/producer/p1", data={"token": "pt"}).status_code == 200
    r = http.put(
        "/channel/orders/consumer/hook", data={"token": "secret-kt", "callbackUrl": callback}
    )
    assert r.status_code == 200
    return {
        "X-Broker-Channel-Token": "ct",
        "X-Broker-Producer-ID": "p1",
        "X-Broker-Producer-Token": "pt",
    }


def test_failing_receiver_gets_max_retry_plus_one_attempts(
    receiver: Receiver, config: Path
) -> None:
    with (
        run_server(store="memory", args=["--config", str(config)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        headers = setup(http, receiver.url)
        r = http.post(
            "/channel/orders/broadcast",
            content=b'{"n": 1}',
            headers={
                **headers,
                "Content-Type": "application/json",
                "X-Broker-Message-ID": "msg-1",
                "X-Broker-Message-Priority": "3",
                "X-Broker-Metadata-Headers": "X-Trace",
                "X-Trace": "t-1",
            },
        )
        assert r.status_code == 201
        wait_until(lambda: http.get("/dlq-status").json()["consumers"] != [])
        time.sleep(0.3)  # nothing more arrives once dead
        assert len(receiver.requests) == 4
        sent, body = receiver.requests[0]
        assert body == b'{"n": 1}'
        assert sent["Content-Type"] == "application/json"
        assert sent["X-Broker-Message-Priority"] == "3"
        assert sent["X-Broker-Channel-ID"] == "orders"
        assert sent["X-Broker-Consumer-ID"] == "hook"
        assert sent["X-Broker-Consumer-Token"] == "secret-kt"
        assert sent["User-Agent"] == "Tether Test"
        assert sent["X-Broker-Message-ID"] == "msg-1"
        assert sent["X-Trace"] == "t-1"
        assert sent["X-Broker-Metadata-Headers"] == "X-Trace"
        assert sent["X-Request-ID"]
        dlq = http.get("/channel/orders/consumer/hook/dlq").json()["DeadJobs"]
        assert len(dlq) == 1
        assert http.get("/channel/orders/message/msg-1").json()["Jobs"][0]["Status"] == "DEAD"
        receiver.status = 200
        assert (
            http.post(
                "/channel/orders/consumer/hook/dlq", data={"requeue": "secret-kt"}
            ).status_code
            == 202
        )
        wait_until(lambda: len(receiver.requests) == 5)
        wait_until(
            lambda: (
                http.get("/channel/orders/message/msg-1").json()["Jobs"][0]["Status"] == "DELIVERED"
            )
        )
        time.sleep(0.2)
        assert len(receiver.requests) == 5
        assert "tether_webhook_deliveries_ok_total 1.0" in http.get("/metrics").text


def test_deliveries_follow_priority_order(receiver: Receiver, config: Path) -> None:
    receiver.status = 200
    with (
        run_server(store="memory", args=["--config", str(config)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        headers = setup(http, receiver.url)
        receiver.hold.clear()  # the first delivery blocks: the rest queue up behind it
        http.post("/channel/orders/broadcast", content=b"first", headers=headers)
        wait_until(lambda: http.get("/job-status").json().get("orders", {}).get("hook") is not None)
        for payload, prio in ((b"low", 1), (b"high", 9), (b"mid", 5), (b"high2", 9)):
            http.post(
                "/channel/orders/broadcast",
                content=payload,
                headers={**headers, "X-Broker-Message-Priority": str(prio)},
            )
        receiver.hold.set()
        wait_until(lambda: len(receiver.requests) == 5)
        assert [b for _, b in receiver.requests] == [b"first", b"high", b"high2", b"mid", b"low"]


def test_in_flight_delivery_is_recovered_after_a_crash(
    receiver: Receiver, config: Path, tmp_path: Path
) -> None:
    receiver.status = 200
    receiver.hold.clear()
    srv = RunningServer(store=f"sqlite:{tmp_path / 'data'}", args=["--config", str(config)])
    srv.start()
    try:
        with httpx.Client(base_url=srv.http_url) as http:
            headers = setup(http, receiver.url)
            http.post(
                "/channel/orders/broadcast",
                content=b"survivor",
                headers={**headers, "X-Broker-Message-ID": "m"},
            )
            wait_until(
                lambda: (
                    http.get("/channel/orders/message/m").json()["Jobs"][0]["Status"] == "INFLIGHT"
                )
            )
            time.sleep(0.1)  # the in-flight state is committed
        srv.kill()
        receiver.hold.set()
        srv.start()
        with httpx.Client(base_url=srv.http_url) as http:
            wait_until(
                lambda: (
                    http.get("/channel/orders/message/m").json()["Jobs"][0]["Status"] == "DELIVERED"
                )
            )
        assert [b for _, b in receiver.requests][-1] == b"survivor"
    finally:
        srv.cleanup()


def test_deliveries_run_concurrently_up_to_the_limit(receiver: Receiver, tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(CONFIG.replace("webhook_concurrency = 1", "webhook_concurrency = 3"))
    receiver.status = 200
    receiver.hold.clear()  # every delivery blocks until released
    with (
        run_server(store="memory", args=["--config", str(config)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        headers = setup(http, receiver.url)
        for n in range(8):
            r = http.post(
                "/channel/orders/broadcast",
                content=b"m%d" % n,
                headers={**headers, "X-Broker-Message-ID": f"m{n}"},
            )
            assert r.status_code == 201
        wait_until(lambda: receiver.active == 3)
        time.sleep(0.3)  # room for a fourth delivery, were the limit not kept
        assert receiver.active == 3
        statuses = [
            http.get(f"/channel/orders/message/m{n}").json()["Jobs"][0]["Status"] for n in range(8)
        ]
        assert sorted(statuses) == ["INFLIGHT"] * 3 + ["QUEUED"] * 5
        receiver.hold.set()
        wait_until(lambda: len(receiver.requests) == 8)
        assert receiver.max_active == 3
        assert sorted(b for _, b in receiver.requests) == [b"m%d" % n for n in range(8)]
        ids = {h["X-Request-ID"] for h, _ in receiver.requests}
        assert len(ids) == 8 and all(len(i) == 20 for i in ids)


def test_a_request_slower_than_the_connection_timeout_is_a_failed_attempt(
    receiver: Receiver, config: Path
) -> None:
    receiver.status = 200
    receiver.delay = 3.0  # the first answer comes after the 2 s connection timeout
    with (
        run_server(store="memory", args=["--config", str(config)]) as srv,
        httpx.Client(base_url=srv.http_url) as http,
    ):
        headers = setup(http, receiver.url)
        r = http.post(
            "/channel/orders/broadcast",
            content=b"slow",
            headers={**headers, "X-Broker-Message-ID": "slow-1"},
        )
        assert r.status_code == 201
        wait_until(
            lambda: (
                http.get("/channel/orders/message/slow-1").json()["Jobs"][0]["Status"]
                == "DELIVERED"
            ),
            within=15,
        )
        metrics = http.get("/metrics").text
        assert "tether_webhook_deliveries_failed_total 1.0" in metrics
        assert "tether_webhook_deliveries_ok_total 1.0" in metrics
        # The timed-out attempt and its retry both reached the receiver.
        wait_until(lambda: len(receiver.requests) == 2)
        assert [b for _, b in receiver.requests] == [b"slow", b"slow"]
