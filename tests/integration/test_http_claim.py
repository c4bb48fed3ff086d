"""The atomic claim under contention: every job handed out once, none lost."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import nats

from tether.testing import RunningServer

JOBS = 10_000
WORKERS = 8


async def test_eight_workers_claim_and_ack_ten_thousand_jobs_exactly_once(
    memory_server: RunningServer,
) -> None:
    srv = memory_server
    base = "/channel/tasks/consumer/w"
    auth = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as http:
        assert (await http.put("/channel/tasks", data={"token": "ct"})).status_code == 200
        r = await http.put(
            base, data={"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"}
        )
        assert r.status_code == 200
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            for start in range(0, JOBS, 1000):
                acks = await asyncio.gather(
                    *(js.publish("wb.tasks", b"%d" % i) for i in range(start, start + 1000))
                )
                assert len({a.seq for a in acks}) == 1000
        finally:
            await nc.close()

        in_flight: set[str] = set()
        handed_out: Counter[str] = Counter()
        payloads: Counter[bytes] = Counter()
        double_claims: list[str] = []

        async def worker() -> None:
            async with httpx.AsyncClient(base_url=srv.http_url, timeout=30) as own:
                while True:
                    r = await own.post(f"{base}/claim", json={"Max": 25, "Wait": 0.5}, headers=auth)
                    assert r.status_code == 200, r.text
                    jobs = r.json()["Result"]
                    if not jobs:
                        return
                    for job in jobs:
                        if job["ID"] in in_flight:
                            double_claims.append(job["ID"])
                        in_flight.add(job["ID"])
                        handed_out[job["ID"]] += 1
                        payloads[job["Message"]["Payload"].encode()] += 1
                    body = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}
                    for job in jobs:
                        in_flight.discard(job["ID"])
                    results = (await own.post(f"{base}/jobs", json=body, headers=auth)).json()[
                        "Results"
                    ]
                    assert {x["Status"] for x in results} == {202}

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(WORKERS))), 120)
        assert double_claims == []
        assert len(handed_out) == JOBS
        assert set(handed_out.values()) == {1}
        assert payloads == Counter(b"%d" % i for i in range(JOBS))
        assert (await http.get(f"{base}/queued-jobs", headers=auth)).json()["Result"] == []
        status = (await http.get("/job-status")).json()["tasks"]["w"]
        assert [(row["status"], row["count"]) for row in status] == [(1002, JOBS)]
        # When the deliveries happened (the most recent ones are remembered).
        oldest, newest = status[0]["oldestItemTimestamp"], status[0]["newestItemTimestamp"]
        assert oldest.startswith("20") and newest.startswith("20") and oldest <= newest
