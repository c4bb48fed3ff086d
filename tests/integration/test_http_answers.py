"""Answers a newcomer can act on: same status codes as webhook-broker, clearer bodies."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tether.testing import run_server

BROADCAST = {
    "x-broker-channel-token": "ct",
    "x-broker-producer-id": "p",
    "x-broker-producer-token": "pt",
    "content-type": "text/plain",
}
AUTH = {"x-broker-channel-token": "ct", "x-broker-consumer-token": "kt"}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with run_server(store="memory") as srv, httpx.Client(base_url=srv.http_url, timeout=10) as c:
        c.put("/producer/p", data={"token": "pt"}).raise_for_status()
        c.put("/channel/ch", data={"token": "ct"}).raise_for_status()
        yield c


def test_a_pull_consumer_needs_no_callback_url(http: httpx.Client) -> None:
    r = http.put("/channel/ch/consumer/puller", data={"token": "kt", "type": "pull"})
    assert r.status_code == 200 and r.json()["CallbackURL"] == ""
    r = http.put("/channel/ch/consumer/pusher", data={"token": "kt"})
    assert (r.status_code, r.text) == (400, "Bad Request: callbackUrl must be an absolute URL")
    r = http.put("/channel/ch/consumer/bad", data={"type": "pull", "callbackUrl": "nope"})
    assert r.status_code == 400


def test_a_missing_token_is_called_missing(http: httpx.Client) -> None:
    http.put("/channel/ch/consumer/k", data={"token": "kt", "type": "pull"})
    r = http.get("/channel/ch/consumer/k/queued-jobs")
    assert r.status_code == 403
    assert r.text == "channel token is missing: send it in the X-Broker-Channel-Token header"
    r = http.get("/channel/ch/consumer/k/queued-jobs", headers={"x-broker-channel-token": "ct"})
    assert r.status_code == 403
    assert r.text == "consumer token is missing: send it in the X-Broker-Consumer-Token header"
    r = http.get(
        "/channel/ch/consumer/k/queued-jobs", headers={**AUTH, "x-broker-consumer-token": "x"}
    )
    assert (r.status_code, r.text) == (403, "consumer token does not match")
    r = http.post("/channel/ch/broadcast", content=b"x", headers={"x-broker-channel-token": "ct"})
    assert r.status_code == 401  # producer missing: webhook-broker's order is kept


def test_a_refused_transition_names_both_states(http: httpx.Client) -> None:
    http.put("/channel/ch/consumer/k", data={"token": "kt", "type": "pull"})
    http.post("/channel/ch/broadcast", content=b"x", headers=BROADCAST).raise_for_status()
    job = http.get("/channel/ch/consumer/k/queued-jobs", headers=AUTH).json()["Result"][0]["ID"]
    r = http.post(
        f"/channel/ch/consumer/k/job/{job}", json={"NextState": "DELIVERED"}, headers=AUTH
    )
    assert r.status_code == 400
    assert r.text == (
        "invalid transition request: QUEUED -> DELIVERED is not allowed"
        " (allowed: QUEUED -> INFLIGHT)"
    )


def test_delivered_jobs_keep_the_time_they_were_delivered(http: httpx.Client) -> None:
    http.put("/channel/ch/consumer/k", data={"token": "kt", "type": "pull"})
    http.post("/channel/ch/broadcast", content=b"x", headers=BROADCAST).raise_for_status()
    base = "/channel/ch/consumer/k"
    job = http.get(f"{base}/queued-jobs", headers=AUTH).json()["Result"][0]["ID"]
    broadcast_at = http.get(f"{base}/job/{job}", headers=AUTH).json()["StatusChangedAt"]
    time.sleep(0.05)
    http.post(f"{base}/job/{job}", json={"NextState": "INFLIGHT"}, headers=AUTH).raise_for_status()
    http.post(f"{base}/job/{job}", json={"NextState": "DELIVERED"}, headers=AUTH).raise_for_status()
    delivered_at = http.get(f"{base}/job/{job}", headers=AUTH).json()["StatusChangedAt"]
    assert delivered_at > broadcast_at
    time.sleep(0.3)  # the consumer's extras were saved (and pruned) meanwhile
    body = http.get(f"{base}/job/{job}", headers=AUTH).json()
    assert (body["Status"], body["StatusChangedAt"]) == ("DELIVERED", delivered_at)
    rows = http.get("/job-status").json()["ch"]["k"]
    delivered = [row for row in rows if row["status"] == 1002]
    assert delivered == [
        {
            "status": 1002,
            "count": 1,
            "oldestItemTimestamp": delivered_at,
            "newestItemTimestamp": delivered_at,
        }
    ]
