"""Crash safety under mixed load: ``tether serve`` (SQLite, sync="always") killed with
SIGKILL while four kinds of clients work at once:

* NATS publishers (nats-py, ``js.publish``, one ``Nats-Msg-Id`` each) record every PubAck;
* HTTP producers broadcast to a webhook-broker channel and record every ``201``;
* NATS workers pull from a durable consumer of the published stream and ack each
  message with a reply (``ack_sync``): an ack is *confirmed* when its reply arrived;
* HTTP workers claim jobs of a pull consumer of the channel and set them DELIVERED
  (one ``POST …/job/{id}`` each, or one ``POST …/jobs`` for the batch): a job change is
  confirmed when it was answered 2xx.

Four rounds in five end right after an answer: after a random delay, the kill switch
(``crash_switch.py``, a process of its own) acks with replies, or sets jobs DELIVERED,
and sends SIGKILL the moment the first answer arrives. A server that confirms before its
commit is durable is caught right there. Every fifth round ends at a random moment.

A request that got no answer because the server died is *unknown*: it may or may not
have taken effect, and nothing is asserted about it. After every restart on the same
store:

* every acknowledged publish is stored exactly once, at its sequence, with its content,
  and every ``201`` broadcast exactly once, with its content (no message id twice);
* every job confirmed DELIVERED in the round reads DELIVERED (``GET …/job/{id}``);
* both consumers are then drained: everything pending is fetched (NATS) or claimed
  (HTTP) until the consumer has nothing left. A message whose ack was confirmed, or a
  job confirmed DELIVERED, must never come back, in this round or any later one.

A last kill with no load at the end checks the drains' own acks and job changes.
``--rounds N`` (default 3) sets the number of rounds under load (see conftest.py);
``TETHER_CRASH_SEED`` replays a run's random choices (the seed is printed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tether.testing import RunningServer

# Imported with --import-mode=importlib: the crash tests' shared helpers are a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from crash_support import api, crash_seed, payload_for, read_stream

pytestmark = pytest.mark.slow

STREAM = "MIXED"  # what the NATS publishers write and the NATS workers consume
CONSUMER = "workers"
ACK_WAIT = 2.0  # seconds: messages in flight at a kill come back this soon after
CHANNEL = "mixed"  # the webhook-broker channel: stream WB_mixed
CHANNEL_STREAM = f"WB_{CHANNEL}"
PRODUCER, PRODUCER_TOKEN = "shop", "shop-token"
CHANNEL_TOKEN = "mixed-token"
JOB_CONSUMER, JOB_CONSUMER_TOKEN = "billing", "billing-token"
# Jobs claimed when the server died stay INFLIGHT until connection timeout + 0.25 s +
# rational delay: short here so that the drain after a restart gets them back quickly.
CONFIG = """\
webhook_connection_timeout = 1.0
webhook_rational_delay = 0.0
webhook_max_retry = 1000
"""

PUBLISHERS = 4
BROADCASTERS = 3
NATS_WORKERS = 2
JOB_WORKERS = 2
PULL_BATCH = 64
# The kill switch gives up (the round is then killed at once) when it got nothing to
# answer for this long.
SWITCH_WITHIN = 5.0
SWITCH = Path(__file__).parent / "crash_switch.py"
CLAIM_MAX = 25
REQUEST_TIMEOUT = 3.0
# Each kind must have this many confirmed answers in a round before the kill is armed.
WARM_UP = {"publish": 20, "broadcast": 20, "ack": 20, "job": 10}
# Round n is killed right after an ack's reply, a job change's 2xx, or at a random moment.
TRIGGERS = ("ack", "job", "ack", "job", "")
KILLS = {
    "ack": "right after an ack's reply",
    "job": "right after a job change's 2xx",
    "": "at a random moment",
}

JOB_PATH = f"/channel/{CHANNEL}/consumer/{JOB_CONSUMER}"
JOB_HEADERS = {
    "X-Broker-Channel-Token": CHANNEL_TOKEN,
    "X-Broker-Consumer-Token": JOB_CONSUMER_TOKEN,
}
BROADCAST_HEADERS = {
    "X-Broker-Channel-Token": CHANNEL_TOKEN,
    "X-Broker-Producer-ID": PRODUCER,
    "X-Broker-Producer-Token": PRODUCER_TOKEN,
    "Content-Type": "text/plain",
}


@dataclass
class Ledger:
    """Everything the clients were told, across rounds. Times are ``time.monotonic()``."""

    payloads: dict[str, bytes] = field(default_factory=dict)  # every publish sent
    published: dict[str, int] = field(default_factory=dict)  # msg id -> acknowledged seq
    bodies: dict[str, bytes] = field(default_factory=dict)  # every broadcast sent
    broadcast: set[str] = field(default_factory=set)  # message ids answered 201
    acked: dict[int, float] = field(default_factory=dict)  # seq -> first confirmed ack
    delivered: dict[str, float] = field(default_factory=dict)  # job id -> confirmed
    acked_under_load: int = 0
    delivered_under_load: int = 0
    kills_with_work_in_flight: int = 0
    switch_kills: collections.Counter[str] = field(default_factory=collections.Counter)
    in_flight_at_kills: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)


@dataclass
class Round:
    """One round's load: what was confirmed, and what the kill left without an answer."""

    no: int
    trigger: str  # what the kill follows: "ack", "job" or "" (a random moment)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    killed_at: float = float("inf")
    confirmed: collections.Counter[str] = field(default_factory=collections.Counter)
    # Requests that ended without an answer: (kind, sent, failed, how many, why).
    failures: list[tuple[str, float, float, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # wrong answers
    jobs: list[str] = field(default_factory=list)  # job ids confirmed DELIVERED
    refused: int = 0  # job changes answered 400 (see ``deliver``)

    def confirm(self, kind: str) -> None:
        self.confirmed[kind] += 1

    def no_answer(self, kind: str, started: float, exc: BaseException, count: int = 1) -> None:
        self.failures.append((kind, started, time.monotonic(), count, repr(exc)))

    def settle(self) -> collections.Counter[str]:
        """Once the kill time is known: a request that failed while the server was up is
        an error; one sent before the kill and left without an answer was in flight."""
        unanswered: collections.Counter[str] = collections.Counter()
        for kind, sent, failed, count, why in self.failures:
            if failed < self.killed_at:
                self.errors.append(f"{kind} failed before the kill: {why}")
            elif sent < self.killed_at:
                unanswered[kind] += count
        return unanswered


# -- the NATS side ---------------------------------------------------------------------------


async def connect_nats(url: str) -> Client:
    async def quiet(exc: Exception) -> None:
        pass  # the server is killed on purpose

    return await nats.connect(url, allow_reconnect=False, error_cb=quiet, max_reconnect_attempts=0)


async def close_nats(nc: Client) -> None:
    """Close; a connection the kill cut off leaves its reader and flusher tasks failed
    with ConnectionResetError: take those errors, or asyncio logs them as never
    retrieved."""
    with contextlib.suppress(Exception):
        await nc.close()
    for name in ("_reading_task", "_flusher_task", "_ping_interval_task"):
        task = getattr(nc, name, None)
        if isinstance(task, asyncio.Task) and task.done() and not task.cancelled():
            task.exception()


async def pull(nc: Client, batch: int, expires: float) -> list[Msg]:
    """One pull request on its own inbox: the messages it got, up to ``batch``. It ends
    as soon as nothing more is pending (``no_wait``), or after ``expires`` when nothing
    was."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    out: list[Msg] = []
    try:
        request = {"batch": batch, "expires": int(expires * 1e9), "no_wait": True}
        await nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}",
            json.dumps(request).encode(),
            reply=inbox,
        )
        while len(out) < batch:
            msg = await sub.next_msg(timeout=expires + REQUEST_TIMEOUT)
            if msg.headers and "Status" in msg.headers:
                status = msg.headers["Status"]
                assert status in ("404", "408", "409"), msg.headers
                break
            out.append(msg)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return out


def check_not_acked(ledger: Ledger, msgs: list[Msg], asked_at: float, where: str) -> None:
    """A message whose ack was confirmed before the pull was sent must not come back."""
    for msg in msgs:
        meta = msg.metadata
        seq = meta.sequence.stream
        confirmed = ledger.acked.get(seq)
        if confirmed is not None and confirmed < asked_at:
            ledger.violations.append(
                f"{where}: NATS ack of {STREAM} seq {seq} was confirmed, and it was"
                f" delivered again (delivery {meta.num_delivered})"
            )


async def ack_all(ledger: Ledger, msgs: list[Msg], rnd: Round | None) -> int:
    """``ack_sync`` every message at once; records the confirmed ones. Returns how many
    got no answer."""

    async def ack(msg: Msg) -> bool:
        started = time.monotonic()
        try:
            await msg.ack_sync(timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if rnd is None:
                raise
            rnd.no_answer("ack", started, exc)
            return False
        seq = msg.metadata.sequence.stream
        if seq not in ledger.acked:
            ledger.acked[seq] = time.monotonic()
            ledger.acked_under_load += rnd is not None
        if rnd is not None:
            rnd.confirm("ack")
        return True

    results = await asyncio.gather(*(ack(m) for m in msgs))
    return results.count(False)


async def publisher(
    nc: Client, ledger: Ledger, rnd: Round, rng: random.Random, worker: int
) -> None:
    js = nc.jetstream()
    n = 0
    while not rnd.stop.is_set():
        key = f"r{rnd.no}-p{worker}-{n}"
        n += 1
        ledger.payloads[key] = payload = payload_for(key, rng)
        started = time.monotonic()
        try:
            ack = await js.publish(
                f"mixed.{worker}", payload, timeout=REQUEST_TIMEOUT, headers={"Nats-Msg-Id": key}
            )
        except Exception as exc:
            rnd.no_answer("publish", started, exc)
            return
        if ack.stream != STREAM or ack.duplicate:
            rnd.errors.append(f"publish {key}: unexpected PubAck {ack}")
        ledger.published[key] = ack.seq
        rnd.confirm("publish")


async def nats_worker(nc: Client, ledger: Ledger, rnd: Round) -> None:
    while not rnd.stop.is_set():
        started = time.monotonic()
        try:
            msgs = await pull(nc, PULL_BATCH, expires=0.5)
        except Exception as exc:
            rnd.no_answer("pull", started, exc)
            return
        check_not_acked(ledger, msgs, started, f"round {rnd.no}, under load")
        if await ack_all(ledger, msgs, rnd):
            return


# -- the HTTP side ---------------------------------------------------------------------------


async def broadcaster(
    http: httpx.AsyncClient, ledger: Ledger, rnd: Round, rng: random.Random, worker: int
) -> None:
    n = 0
    while not rnd.stop.is_set():
        mid = f"r{rnd.no}-b{worker}-{n}"
        n += 1
        ledger.bodies[mid] = body = payload_for(mid, rng)
        started = time.monotonic()
        try:
            r = await http.post(
                f"/channel/{CHANNEL}/broadcast",
                headers={**BROADCAST_HEADERS, "X-Broker-Message-ID": mid},
                content=body,
            )
        except httpx.HTTPError as exc:
            rnd.no_answer("broadcast", started, exc)
            return
        if r.status_code != 201:
            rnd.errors.append(f"broadcast {mid}: {r.status_code} {r.text}")
            return
        ledger.broadcast.add(mid)
        rnd.confirm("broadcast")


async def claim(http: httpx.AsyncClient, wait: float) -> tuple[list[str], float]:
    """Claim up to CLAIM_MAX jobs: their ids, and when the claim was sent."""
    started = time.monotonic()
    r = await http.post(
        f"{JOB_PATH}/claim", headers=JOB_HEADERS, json={"Max": CLAIM_MAX, "Wait": wait}
    )
    assert r.status_code == 200, (r.status_code, r.text)
    return [job["ID"] for job in r.json()["Result"]], started


def check_not_delivered(ledger: Ledger, ids: list[str], claimed_at: float, where: str) -> None:
    """A job confirmed DELIVERED before the claim was sent must not be claimed again."""
    for jid in ids:
        confirmed = ledger.delivered.get(jid)
        if confirmed is not None and confirmed < claimed_at:
            ledger.violations.append(f"{where}: job {jid} was confirmed DELIVERED, then claimed")


async def deliver(
    http: httpx.AsyncClient, ledger: Ledger, ids: list[str], bulk: bool, rnd: Round | None
) -> list[str]:
    """Set the jobs DELIVERED; records and returns the confirmed ones."""
    confirmed: list[str] = []

    def record(jid: str) -> None:
        if jid not in ledger.delivered:
            ledger.delivered[jid] = time.monotonic()
            ledger.delivered_under_load += rnd is not None
        confirmed.append(jid)
        if rnd is not None:
            rnd.jobs.append(jid)
            rnd.confirm("job")

    def refused(jid: str, status: int, text: str) -> None:
        # A job claimed under load may time out (INFLIGHT for 1.25 s here) and be taken
        # by the other worker: setting it DELIVERED is then refused (400). Not confirmed.
        if rnd is None or status != 400:
            raise AssertionError(f"job {jid} DELIVERED: {status} {text}")
        rnd.refused += 1

    async def one(jid: str) -> None:
        started = time.monotonic()
        try:
            r = await http.post(
                f"{JOB_PATH}/job/{jid}", headers=JOB_HEADERS, json={"NextState": "DELIVERED"}
            )
        except httpx.HTTPError as exc:
            if rnd is None:
                raise
            rnd.no_answer("job", started, exc)
            return
        if r.status_code == 202:
            record(jid)
        else:
            refused(jid, r.status_code, r.text)

    if not bulk:
        await asyncio.gather(*(one(jid) for jid in ids))
        return confirmed
    started = time.monotonic()
    body = {"Jobs": [{"ID": jid, "NextState": "DELIVERED"} for jid in ids]}
    try:
        r = await http.post(f"{JOB_PATH}/jobs", headers=JOB_HEADERS, json=body)
    except httpx.HTTPError as exc:
        if rnd is None:
            raise
        rnd.no_answer("job", started, exc, len(ids))
        return confirmed
    assert r.status_code == 200, (r.status_code, r.text)
    for item in r.json()["Results"]:
        if item["Status"] == 202:
            record(item["ID"])
        else:
            refused(item["ID"], item["Status"], item["Error"])
    return confirmed


async def job_worker(
    http: httpx.AsyncClient, ledger: Ledger, rnd: Round, rng: random.Random
) -> None:
    while not rnd.stop.is_set():
        started = time.monotonic()
        try:
            ids, claimed_at = await claim(http, wait=0.2)
        except httpx.HTTPError as exc:
            rnd.no_answer("claim", started, exc)
            return
        check_not_delivered(ledger, ids, claimed_at, f"round {rnd.no}, under load")
        if not ids:
            continue
        refused = rnd.refused
        confirmed = await deliver(http, ledger, ids, rng.random() < 0.5, rnd)
        if len(confirmed) + rnd.refused - refused < len(ids):
            return  # some got no answer: the server is gone


# -- rounds ----------------------------------------------------------------------------------


def kill_now(server: RunningServer, rnd: Round) -> None:
    if rnd.killed_at == float("inf"):
        assert server.proc is not None
        rnd.killed_at = time.monotonic()
        server.proc.send_signal(signal.SIGKILL)


def run_switch(server: RunningServer, rnd: Round, bulk: bool) -> dict[str, Any]:
    """Run the kill switch (``crash_switch.py``) for one round; what it reports."""
    assert server.proc is not None
    task = {
        "kind": rnd.trigger,
        "pid": server.proc.pid,
        "host": server.host,
        "port": server.port,
        "http_port": server.http_port,
        "stream": STREAM,
        "consumer": CONSUMER,
        "job_path": JOB_PATH,
        "job_headers": JOB_HEADERS,
        "batch": 16,
        "bulk": bulk,
        "within": SWITCH_WITHIN,
    }
    done = subprocess.run(
        [sys.executable, str(SWITCH), json.dumps(task)],
        capture_output=True,
        timeout=SWITCH_WITHIN + 30,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["error"] is None, report["error"]
    return report


async def load_and_kill(
    server: RunningServer, ledger: Ledger, rnd: Round, rng: random.Random
) -> None:
    """Run every kind of client, then kill the server: right after an answer of the
    round's trigger kind (the kill switch), or at a random moment."""
    nc = await connect_nats(server.url)
    http = httpx.AsyncClient(base_url=server.http_url, timeout=REQUEST_TIMEOUT)
    workers: list[Awaitable[None]] = [
        *(publisher(nc, ledger, rnd, rng, i) for i in range(PUBLISHERS)),
        *(broadcaster(http, ledger, rnd, rng, i) for i in range(BROADCASTERS)),
        *(nats_worker(nc, ledger, rnd) for _ in range(NATS_WORKERS)),
        *(job_worker(http, ledger, rnd, rng) for _ in range(JOB_WORKERS)),
    ]
    tasks = [asyncio.ensure_future(w) for w in workers]
    bulk, delay = rng.random() < 0.5, rng.uniform(0, 0.5)
    report: dict[str, Any] = {}
    try:
        give_up = time.monotonic() + 20
        while any(rnd.confirmed[kind] < n for kind, n in WARM_UP.items()):
            assert not rnd.failures and not rnd.errors, (rnd.failures, rnd.errors)
            assert time.monotonic() < give_up, f"the load did not get going: {rnd.confirmed}"
            await asyncio.sleep(0.01)
        await asyncio.sleep(delay)
        assert not rnd.failures and not rnd.errors, (rnd.failures, rnd.errors)
        if rnd.trigger:
            report = await asyncio.to_thread(run_switch, server, rnd, bulk)
            if report["killed_at"] is not None:
                rnd.killed_at = report["killed_at"]
        kill_now(server, rnd)  # no trigger, or nothing to answer for a while: now
        rnd.stop.set()
        await asyncio.to_thread(server.kill)  # reap it
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        rnd.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.aclose()
        await close_nats(nc)
    unanswered = rnd.settle()
    assert not rnd.errors, rnd.errors
    if report:
        record_switch(ledger, rnd, report)
    if sum(unanswered.values()):
        ledger.kills_with_work_in_flight += 1
    for kind, n in unanswered.items():
        ledger.in_flight_at_kills[kind] += bool(n)


def record_switch(ledger: Ledger, rnd: Round, report: dict[str, Any]) -> None:
    """Add what the kill switch was told to what the other clients were."""
    for seq_text, at in report["acked"].items():
        seq = int(seq_text)
        if seq not in ledger.acked or at < ledger.acked[seq]:
            ledger.acked_under_load += seq not in ledger.acked
            ledger.acked[seq] = at
        rnd.confirmed["ack"] += 1
    for jid, at in report["delivered"].items():
        if jid not in ledger.delivered or at < ledger.delivered[jid]:
            ledger.delivered_under_load += jid not in ledger.delivered
            ledger.delivered[jid] = at
        rnd.confirmed["job"] += 1
        rnd.jobs.append(jid)
    ledger.switch_kills[rnd.trigger] += report["killed_at"] is not None


async def check_streams(nc: Client, ledger: Ledger, where: str) -> None:
    """Every acknowledged publish and 201 broadcast is stored once, with its content."""
    stored = await read_stream(nc, STREAM)
    state = (await api(nc, f"$JS.API.STREAM.INFO.{STREAM}"))["state"]
    assert sorted(stored) == list(range(1, state["last_seq"] + 1)), f"{where}: gaps"
    by_key: dict[str, int] = {}
    for seq, (_, data, key) in stored.items():
        assert key not in by_key, f"{where}: publish {key} stored twice ({by_key[key]}, {seq})"
        by_key[key] = seq
        assert data == ledger.payloads[key], f"{where}: {key} at {seq} has other content"
    for key, seq in ledger.published.items():
        assert by_key.get(key) == seq, f"{where}: acknowledged {key} (seq {seq}) is not there"

    by_id: dict[str, int] = {}
    for seq, (_, data, mid) in (await read_stream(nc, CHANNEL_STREAM)).items():
        assert mid not in by_id, f"{where}: broadcast {mid} stored twice ({by_id[mid]}, {seq})"
        by_id[mid] = seq
        assert data == ledger.bodies[mid], f"{where}: broadcast {mid} has other content"
    lost = sorted(ledger.broadcast - by_id.keys())
    assert not lost, f"{where}: {len(lost)} broadcasts answered 201 are gone: {lost[:5]}"


async def check_jobs_delivered(
    http: httpx.AsyncClient, ledger: Ledger, ids: list[str], where: str
) -> None:
    """``GET …/job/{id}`` of each job confirmed DELIVERED: it must still be."""
    slots = asyncio.Semaphore(16)

    async def check(jid: str) -> None:
        async with slots:
            r = await http.get(f"{JOB_PATH}/job/{jid}", headers=JOB_HEADERS)
        assert r.status_code == 200, (jid, r.status_code, r.text)
        status = r.json()["Status"]
        if status != "DELIVERED":
            ledger.violations.append(f"{where}: job {jid} was confirmed DELIVERED and is {status}")

    await asyncio.gather(*(check(jid) for jid in ids))


async def drain(nc: Client, http: httpx.AsyncClient, ledger: Ledger, where: str) -> None:
    """Fetch and ack everything the NATS consumer has pending, claim and deliver every job
    the HTTP consumer has, until neither has anything left."""

    async def done(stream: str, consumer: str) -> bool:
        info = await api(nc, f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
        return bool(info["num_pending"] == 0 and info["num_ack_pending"] == 0)

    async def nats_side() -> None:
        while not await done(STREAM, CONSUMER):
            asked_at = time.monotonic()
            msgs = await pull(nc, 256, expires=0.5)
            check_not_acked(ledger, msgs, asked_at, where)
            await ack_all(ledger, msgs, None)
            if not msgs:  # the rest is in flight: it comes back after ACK_WAIT
                await asyncio.sleep(0.05)

    async def http_side() -> None:
        # Jobs in flight at the kill are claimable again after their deadline (1.25 s).
        while not await done(CHANNEL_STREAM, JOB_CONSUMER):
            ids, claimed_at = await claim(http, wait=0.5)
            check_not_delivered(ledger, ids, claimed_at, where)
            if ids:
                assert await deliver(http, ledger, ids, True, None) == ids

    await asyncio.wait_for(asyncio.gather(nats_side(), http_side()), 60)


async def restart_and_verify(
    server: RunningServer, ledger: Ledger, jobs: list[str], where: str
) -> None:
    server.start()
    nc = await connect_nats(server.url)
    http = httpx.AsyncClient(base_url=server.http_url, timeout=10)
    try:
        await check_streams(nc, ledger, where)
        await check_jobs_delivered(http, ledger, jobs, where)
        await drain(nc, http, ledger, where)
    finally:
        await http.aclose()
        await close_nats(nc)
    if ledger.violations:
        pytest.fail(
            f"{where}: {len(ledger.violations)} confirmed acks or job changes undone:\n"
            + "\n".join(ledger.violations[:20]),
            pytrace=False,
        )


async def set_up(server: RunningServer) -> None:
    nc = await connect_nats(server.url)
    try:
        await api(
            nc,
            f"$JS.API.STREAM.CREATE.{STREAM}",
            {"name": STREAM, "subjects": ["mixed.>"], "allow_direct": True},
        )
        await api(
            nc,
            f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{CONSUMER}",
            {
                "stream_name": STREAM,
                "config": {
                    "durable_name": CONSUMER,
                    "ack_policy": "explicit",
                    "ack_wait": int(ACK_WAIT * 1e9),
                    "max_ack_pending": -1,
                },
            },
        )
        async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
            for path, form in (
                (f"/producer/{PRODUCER}", {"token": PRODUCER_TOKEN}),
                (f"/channel/{CHANNEL}", {"token": CHANNEL_TOKEN}),
                (JOB_PATH, {"token": JOB_CONSUMER_TOKEN, "type": "pull"}),
            ):
                r = await http.put(path, data=form)
                assert r.status_code == 200, (path, r.status_code, r.text)
        # The channel's stream is an ordinary stream: let the test read it back in batches.
        config = (await api(nc, f"$JS.API.STREAM.INFO.{CHANNEL_STREAM}"))["config"]
        await api(nc, f"$JS.API.STREAM.UPDATE.{CHANNEL_STREAM}", {**config, "allow_direct": True})
    finally:
        await close_nats(nc)


async def test_nothing_confirmed_is_lost_or_undone_by_kill_minus_nine_under_mixed_load(
    tmp_path: Path, crash_rounds: int
) -> None:
    seed = crash_seed()
    print(f"\nTETHER_CRASH_SEED={seed}")
    rng = random.Random(seed)
    config = tmp_path / "tether.toml"
    config.write_text(CONFIG)
    store = tmp_path / "store"
    server = RunningServer(
        store=f"sqlite:{store}", args=["--sync", "always", "--config", str(config)]
    )
    server.start()
    ledger = Ledger()
    started = time.monotonic()
    try:
        await set_up(server)
        for round_no in range(crash_rounds):
            rnd = Round(round_no, TRIGGERS[round_no % len(TRIGGERS)])
            await load_and_kill(server, ledger, rnd, rng)
            where = f"seed {seed}, round {round_no}"
            await restart_and_verify(server, ledger, rnd.jobs, where)
            print(f"round {round_no}: killed {KILLS[rnd.trigger]}; confirmed {dict(rnd.confirmed)}")
        # A last kill, idle: the drains' own acks and job changes were confirmed too.
        server.kill()
        await restart_and_verify(server, ledger, [], f"seed {seed}, after the last round")
    except BaseException:
        print(f"seed {seed}; the server's last log lines:\n{server.stderr[-3000:]}")
        raise
    finally:
        server.cleanup()
    in_flight = ", ".join(f"{kind} {n}" for kind, n in sorted(ledger.in_flight_at_kills.items()))
    print(
        f"{crash_rounds} kill -9 rounds under mixed load in {time.monotonic() - started:.0f} s"
        f" (seed {seed}): {len(ledger.published)} acknowledged publishes,"
        f" {len(ledger.broadcast)} broadcasts answered 201,"
        f" {len(ledger.acked)} confirmed acks ({ledger.acked_under_load} under load),"
        f" {len(ledger.delivered)} confirmed job changes"
        f" ({ledger.delivered_under_load} under load) verified;"
        f" {ledger.kills_with_work_in_flight} kills with work in flight"
        f" (kills by kind of request left unanswered: {in_flight or 'none'}),"
        f" {ledger.switch_kills['ack']} right after an ack's reply,"
        f" {ledger.switch_kills['job']} right after a job change's 2xx;"
        f" 0 lost, 0 duplicated, 0 undone"
    )
    assert ledger.kills_with_work_in_flight > 0
    shutil.rmtree(store, ignore_errors=True)
