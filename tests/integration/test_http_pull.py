"""Pull consumers over HTTP, per webhook-broker's spec (seed 001) and its own tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tether.testing import RunningServer, run_server

# In-flight deadline base = connection timeout + 0.25 + rational delay = 0.65 s.
CONFIG = """
webhook_connection_timeout = 0.2
webhook_rational_delay = 0.2
webhook_max_retry = 2
"""
BASE = 0.65


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    conf = tmp_path_factory.mktemp("conf") / "tether.toml"
    conf.write_text(CONFIG)
    with run_server(args=["--config", str(conf)]) as srv:
        yield srv


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=10) as client:
        yield client


@dataclass
class Pull:
    http: httpx.Client
    channel: str
    consumer: str
    producer: str

    @property
    def base(self) -> str:
        return f"/channel/{self.channel}/consumer/{self.consumer}"

    @property
    def auth(self) -> dict[str, str]:
        return {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": f"kt-{self.consumer}"}

    def broadcast(self, payload: str, priority: int = 0) -> None:
        r = self.http.post(
            f"/channel/{self.channel}/broadcast",
            content=payload.encode(),
            headers={
                "X-Broker-Channel-Token": "ct",
                "X-Broker-Producer-ID": self.producer,
                "X-Broker-Producer-Token": "pt",
                "X-Broker-Message-Priority": str(priority),
            },
        )
        assert r.status_code == 201, r.text

    def queued(self, limit: str | None = None) -> list[dict[str, object]]:
        params = {} if limit is None else {"limit": limit}
        r = self.http.get(f"{self.base}/queued-jobs", params=params, headers=self.auth)
        assert r.status_code == 200, r.text
        result: list[dict[str, object]] = r.json()["Result"]
        return result

    def post(self, job: str, state: str, timeout: int | None = None) -> httpx.Response:
        body: dict[str, object] = {"NextState": state}
        if timeout is not None:
            body["IncrementalTimeout"] = timeout
        return self.http.post(f"{self.base}/job/{job}", json=body, headers=self.auth)

    def status(self, job: str) -> str:
        r = self.http.get(f"{self.base}/job/{job}", headers=self.auth)
        assert r.status_code == 200, r.text
        return str(r.json()["Status"])

    def add_consumer(self, consumer: str, kind: str = "pull") -> Pull:
        r = self.http.put(
            f"/channel/{self.channel}/consumer/{consumer}",
            data={"token": f"kt-{consumer}", "callbackUrl": "http://callback.test/", "type": kind},
        )
        assert r.status_code == 200, r.text
        return Pull(self.http, self.channel, consumer, self.producer)


def make_pull(http: httpx.Client) -> Pull:
    ch = f"pl{time.monotonic_ns()}"
    assert http.put(f"/channel/{ch}", data={"token": "ct"}).status_code == 200
    assert http.put(f"/producer/{ch}p", data={"token": "pt"}).status_code == 200
    return Pull(http, ch, "", f"{ch}p").add_consumer("c1")


def job_in(p: Pull, state: str) -> str:
    p.broadcast("payload")
    job = str(p.queued("100")[-1]["ID"])
    steps = {
        "QUEUED": [],
        "INFLIGHT": ["INFLIGHT"],
        "DEAD": ["INFLIGHT", "DEAD"],
        "DELIVERED": ["INFLIGHT", "DELIVERED"],
    }
    for step in steps[state]:
        assert p.post(job, step).status_code == 202
    assert p.status(job) == state
    return job


def test_queued_jobs_limits(http: httpx.Client) -> None:
    p = make_pull(http)
    for i in range(120):
        p.broadcast(f"m{i}")
    assert len(p.queued()) == 25
    assert len(p.queued("10")) == 10
    assert len(p.queued("10000")) == 100
    assert p.queued("0") == []
    for bad in ("-10", "5.33", "invalid"):
        r = http.get(f"{p.base}/queued-jobs", params={"limit": bad}, headers=p.auth)
        assert r.status_code == 400 and r.text == "invalid query parameter"


def test_queued_jobs_priority_then_oldest(http: httpx.Client) -> None:
    p = make_pull(http)
    for i, prio in enumerate([1, 5, 1, 5, 0, 3]):
        p.broadcast(f"m{i}", prio)
    jobs = p.queued()
    assert [j["Message"]["Payload"] for j in jobs] == ["m1", "m3", "m5", "m0", "m2", "m4"]  # type: ignore[index]
    assert [j["Priority"] for j in jobs] == [5, 5, 3, 1, 1, 0]
    first = jobs[0]
    assert set(first) == {"ID", "Priority", "IncrementalTimeout", "Message"}
    assert set(first["Message"]) == {"MessageID", "Payload", "Headers", "ContentType"}  # type: ignore[arg-type]


def test_error_matrix_for_listing_and_job_post(http: httpx.Client) -> None:
    p = make_pull(http)
    job = job_in(p, "QUEUED")
    other = p.add_consumer("c2")
    push = p.add_consumer("pushy", "push")
    other_job = str(other.queued()[0]["ID"]) if other.queued() else None
    p.broadcast("second")
    other_job = str(other.queued()[0]["ID"])
    cases = [
        (f"/channel/missing/consumer/{p.consumer}", p.auth, 404),
        (p.base, {**p.auth, "X-Broker-Channel-Token": "wrong"}, 403),
        (f"/channel/{p.channel}/consumer/nobody", p.auth, 401),
        (p.base, {**p.auth, "X-Broker-Consumer-Token": "wrong"}, 403),
        (push.base, push.auth, 412),
    ]
    for base, headers, code in cases:
        r = http.get(f"{base}/queued-jobs", headers=headers)
        assert r.status_code == code, (base, r.text)
        r = http.post(f"{base}/job/{job}", json={"NextState": "INFLIGHT"}, headers=headers)
        assert r.status_code == code, (base, r.text)
    assert p.post("999-999", "INFLIGHT").status_code == 404
    assert p.post("garbage", "INFLIGHT").status_code == 404
    r = p.post(other_job, "INFLIGHT")
    assert r.status_code == 401
    assert other.status(other_job) == "QUEUED"
    assert http.post(f"{push.base}/claim", json={}, headers=push.auth).status_code == 412


VALID = [
    ("QUEUED", "QUEUED"),
    ("QUEUED", "INFLIGHT"),
    ("INFLIGHT", "INFLIGHT"),
    ("INFLIGHT", "DEAD"),
    ("DEAD", "DEAD"),
    ("DEAD", "INFLIGHT"),
    ("INFLIGHT", "DELIVERED"),
    ("DELIVERED", "DELIVERED"),
]
INVALID = [
    ("QUEUED", "DELIVERED"),
    ("QUEUED", "DEAD"),
    ("INFLIGHT", "QUEUED"),
    ("DEAD", "QUEUED"),
    ("DEAD", "DELIVERED"),
    ("DELIVERED", "QUEUED"),
    ("DELIVERED", "INFLIGHT"),
    ("DELIVERED", "DEAD"),
    ("QUEUED", "UNKNOWN"),
]


def test_state_machine(http: httpx.Client) -> None:
    p = make_pull(http)
    for current, nxt in VALID:
        job = job_in(p, current)
        r = p.post(job, nxt)
        assert (r.status_code, r.text) == (202, ""), (current, nxt)
        assert p.status(job) == nxt
    for current, nxt in INVALID:
        job = job_in(p, current)
        r = p.post(job, nxt)
        assert r.status_code == 400, (current, nxt)
        # webhook-broker's words first, then the move that was refused.
        assert r.text.startswith("invalid transition request: "), r.text
        assert f"{current} -> {nxt or '(none)'} is not allowed" in r.text
        assert p.status(job) == current


def test_incremental_timeout_rules(http: httpx.Client) -> None:
    p = make_pull(http)
    job = job_in(p, "QUEUED")
    for state in ("DELIVERED", "DEAD", "QUEUED"):
        r = p.post(job, state, 10)
        assert (r.status_code, r.text) == (400, "timeout provided with invalid state")
    assert p.post(job, "INFLIGHT", 100).status_code == 202
    assert p.post(job, "INFLIGHT", 10).status_code == 400  # already in flight
    assert p.post(job, "DEAD").status_code == 202
    assert p.status(job) == "DEAD"
    assert p.post(job, "INFLIGHT", 200).status_code == 202
    assert p.post(job, "DEAD").status_code == 202
    r = http.post(f"{p.base}/job/{job}/requeue-dead-job", headers=p.auth)
    assert r.status_code == 202
    [listed] = p.queued()
    assert listed["IncrementalTimeout"] == 200  # stored and sticky
    assert http.post(f"{p.base}/job/{job}/requeue-dead-job", headers=p.auth).status_code == 400


def test_malformed_job_posts_change_nothing(http: httpx.Client) -> None:
    p = make_pull(http)
    job = job_in(p, "QUEUED")
    url = f"{p.base}/job/{job}"
    bodies: list[bytes] = [
        b"{not json",
        b"[]",
        b'"INFLIGHT"',
        b'{"NextState": 5}',
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": -1}',
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": 1.5}',
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": "10"}',
        b'{"NextState": "INFLIGHT", "IncrementalTimeout": 99999999999}',
        b"",
    ]
    for body in bodies:
        r = http.post(url, content=body, headers={**p.auth, "Content-Type": "application/json"})
        assert r.status_code == 400, body
        assert r.headers["content-type"].startswith("text/plain")
    assert p.status(job) == "QUEUED"


def test_timed_pull_flow(http: httpx.Client) -> None:
    """40 messages, two pull consumers; one claims 25 with IncrementalTimeout 1, the
    other still lists 25; after the window the claimed jobs are queued again."""
    p = make_pull(http)
    q = p.add_consumer("c2")
    for i in range(40):
        p.broadcast(f"m{i}")
    claimed = p.queued()
    assert len(claimed) == 25
    for job in claimed:
        assert p.post(str(job["ID"]), "INFLIGHT", 1).status_code == 202
    assert len(q.queued()) == 25
    assert len(p.queued("100")) == 15
    time.sleep(BASE + 1 + 0.6)
    again = p.queued("100")
    assert len(again) == 40
    states = {p.status(str(j["ID"])) for j in claimed}
    assert states == {"QUEUED"}
    info = http.get(f"{p.base}/job/{claimed[0]['ID']}", headers=p.auth).json()
    assert info["Status"] == "QUEUED"


def test_timeouts_past_max_retry_make_the_job_dead(http: httpx.Client) -> None:
    p = make_pull(http)  # max_retry = 2: three attempts
    p.broadcast("doomed")
    for _ in range(3):
        [job] = http.post(f"{p.base}/claim", json={"Max": 1, "Wait": 5}, headers=p.auth).json()[
            "Result"
        ]
        time.sleep(BASE + 0.3)
    assert p.status(str(job["ID"])) == "DEAD"
    dlq = http.get(f"{p.base}/dlq").json()
    assert len(dlq["DeadJobs"]) == 1 and dlq["DeadJobs"][0]["Status"] == "DEAD"
    assert http.get("/dlq-status").json()["consumers"]
    metrics = http.get("/metrics").text
    assert f'dead_job_count{{channel="{p.channel}",consumer="c1"}} 1.0' in metrics
    r = http.post(f"{p.base}/dlq", data={"requeue": "wrong"})
    assert r.status_code == 400
    assert http.post(f"{p.base}/dlq", json={"requeue": "kt-c1"}).status_code == 415
    assert http.post(f"{p.base}/dlq", data={"requeue": "kt-c1"}).status_code == 202
    assert p.status(str(job["ID"])) == "QUEUED"


def test_dead_job_delete(http: httpx.Client) -> None:
    p = make_pull(http)
    dead = job_in(p, "DEAD")
    live = job_in(p, "QUEUED")
    assert http.delete(f"{p.base}/job/{live}", headers=p.auth).status_code == 404
    assert (
        http.delete(
            f"{p.base}/job/{dead}", headers={**p.auth, "X-Broker-Consumer-Token": "x"}
        ).status_code
        == 403
    )
    assert http.delete(f"{p.base}/job/{dead}", headers=p.auth).status_code == 204
    assert http.get(f"{p.base}/job/{dead}", headers=p.auth).status_code == 404
    job_in(p, "DEAD")
    job_in(p, "DEAD")
    r = http.delete(f"{p.base}/dlq", headers=p.auth)
    assert r.status_code == 200 and r.json() == {"deletedCount": 2}


def test_claim_touch_and_bulk(http: httpx.Client) -> None:
    p = make_pull(http)
    for i in range(5):
        p.broadcast(f"m{i}", priority=i % 2)
    r = http.post(f"{p.base}/claim", json={"Max": 3, "IncrementalTimeout": 30}, headers=p.auth)
    jobs = r.json()["Result"]
    assert [j["Message"]["Payload"] for j in jobs] == ["m1", "m3", "m0"]
    assert all(j["IncrementalTimeout"] == 30 and j["Deadline"] for j in jobs)
    assert {p.status(j["ID"]) for j in jobs} == {"INFLIGHT"}
    assert len(p.queued()) == 2
    touched = http.post(
        f"{p.base}/job/{jobs[0]['ID']}/touch", json={"IncrementalTimeout": 60}, headers=p.auth
    )
    assert touched.status_code == 200 and touched.json()["Deadline"] > jobs[0]["Deadline"]
    queued_id = str(p.queued()[0]["ID"])
    assert http.post(f"{p.base}/job/{queued_id}/touch", headers=p.auth).status_code == 400
    body = {
        "Jobs": [
            {"ID": jobs[0]["ID"], "NextState": "DELIVERED"},
            {"ID": jobs[1]["ID"], "NextState": "DEAD"},
            {"ID": jobs[2]["ID"], "NextState": "QUEUED"},
            {"ID": "0-0", "NextState": "DELIVERED"},
        ]
    }
    results = http.post(f"{p.base}/jobs", json=body, headers=p.auth).json()["Results"]
    assert [x["Status"] for x in results] == [202, 202, 400, 404]
    assert [p.status(j["ID"]) for j in jobs] == ["DELIVERED", "DEAD", "INFLIGHT"]
    for bad in ({"Max": -1}, {"Max": 1000}, {"Wait": "x"}, {"Wait": 3600}, [1]):
        assert http.post(f"{p.base}/claim", json=bad, headers=p.auth).status_code == 400
    assert http.post(f"{p.base}/jobs", json={"Jobs": "no"}, headers=p.auth).status_code == 400


def test_claim_long_polls_for_new_jobs(http: httpx.Client, server: RunningServer) -> None:
    import threading

    p = make_pull(http)
    started = time.monotonic()

    def later() -> None:
        time.sleep(0.5)
        with httpx.Client(base_url=server.http_url) as other:
            Pull(other, p.channel, p.consumer, p.producer).broadcast("late")

    threading.Thread(target=later).start()
    r = http.post(f"{p.base}/claim", json={"Max": 5, "Wait": 5}, headers=p.auth)
    waited = time.monotonic() - started
    assert [j["Message"]["Payload"] for j in r.json()["Result"]] == ["late"]
    assert 0.4 < waited < 4
    empty = http.post(f"{p.base}/claim", json={"Max": 5, "Wait": 0.3}, headers=p.auth)
    assert empty.json()["Result"] == []
