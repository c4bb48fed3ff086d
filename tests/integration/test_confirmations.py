"""A confirmation is sent only after its commit: ack replies and HTTP job changes.

The server runs in this process on a SQLite store, so a test can hold the store's
writer (nothing commits until it lets go) or make its commits fail (as a full disk
does) and look at what clients are told meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from tether.engine.jobs.registry import REGISTRY_STREAM
from tether.engine.jobs.view import SavedJobs
from tether.server.app import Tether
from tether.server.config import ServerConfig
from tether.storage.base import StorageError
from tether.storage.sqlite import SqliteStore

AUTH = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
JOBS = "/channel/tasks/consumer/w"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Tether]:
    app = Tether(ServerConfig(port=0, http_port=0, nsq_port=0, store=f"sqlite:{tmp_path}"))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def nc(app: Tether) -> AsyncIterator[Client]:
    assert app.nats is not None
    client = await nats.connect(f"nats://127.0.0.1:{app.nats.port}")
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def http(app: Tether) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.http_port}", timeout=10) as c:
        yield c


def sqlite_store(app: Tether) -> SqliteStore:
    assert isinstance(app.store, SqliteStore)
    return app.store


@contextlib.contextmanager
def held(app: Tether) -> Iterator[None]:
    """Nothing commits inside the block: the writer thread waits."""
    started, release = threading.Event(), threading.Event()

    def block(_conn: object) -> None:
        started.set()
        release.wait(10)

    sqlite_store(app).call_in_writer(block)
    assert started.wait(10)
    try:
        yield
    finally:
        release.set()


@contextlib.contextmanager
def failing(app: Tether, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every commit fails inside the block, as on a full disk."""
    writer = sqlite_store(app)._writer
    real = writer.commit
    full = True

    def commit(batches: Sequence[list[Any]]) -> None:
        if full and any(batches):
            error = sqlite3.OperationalError("database or disk is full")
            raise StorageError("commit failed and was rolled back: " + str(error)) from error
        real(batches)

    monkeypatch.setattr(writer, "commit", commit)
    try:
        yield
    finally:
        full = False


async def delivered(nc: Client, count: int = 1) -> list[Any]:
    js = nc.jetstream()
    await js.add_stream(name="A", subjects=["a"])
    for i in range(count):
        await js.publish("a", b"%d" % i)
    sub = await js.pull_subscribe("a", "w")
    return list(await sub.fetch(count, timeout=5))


async def http_jobs(http: httpx.AsyncClient, nc: Client, count: int) -> None:
    assert (await http.put("/channel/tasks", data={"token": "ct"})).status_code == 200
    kind = {"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"}
    assert (await http.put(JOBS, data=kind)).status_code == 200
    js = nc.jetstream()
    for i in range(count):
        await js.publish("wb.tasks", b"%d" % i)


async def claim(http: httpx.AsyncClient, n: int) -> list[str]:
    r = await http.post(f"{JOBS}/claim", json={"Max": n}, headers=AUTH)
    assert r.status_code == 200, r.text
    return [job["ID"] for job in r.json()["Result"]]


async def not_before_release(app: Tether, request: Any) -> Any:
    """Start ``request`` while the writer is held: it must not be answered before."""
    with held(app):
        task = asyncio.ensure_future(request)
        await asyncio.sleep(0.3)
        assert not task.done(), "answered before the commit"
    return await asyncio.wait_for(task, 5)


async def answer(nc: Client, ack_subject: str) -> Any:
    """The raw answer to an ``+ACK`` sent with a reply subject."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(ack_subject, b"+ACK", reply=inbox)
    try:
        return await sub.next_msg(timeout=5)
    finally:
        await sub.unsubscribe()


# -- an ack with a reply -------------------------------------------------------------------


async def test_an_ack_with_a_reply_is_answered_once_its_state_is_committed(
    app: Tether, nc: Client
) -> None:
    [msg] = await delivered(nc)
    await not_before_release(app, msg.ack_sync(timeout=5))
    info = await nc.jetstream().consumer_info("A", "w")
    assert info.ack_floor.stream_seq == 1


async def test_acks_without_a_reply_do_not_wait(app: Tether, nc: Client) -> None:
    msgs = await delivered(nc, 3)
    with held(app):
        for msg in msgs:
            await msg.ack()
        await nc.flush()
        info = await nc.jetstream().consumer_info("A", "w")  # answered at once
        assert info.num_ack_pending == 0


async def test_an_ack_that_cannot_be_stored_is_an_error_then_works_once_it_can(
    app: Tether, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    msgs = await delivered(nc, 2)
    with failing(app, monkeypatch):
        with pytest.raises(NoRespondersError):  # nats-py's answer to a 503 status
            await msgs[0].ack_sync(timeout=5)
        raw = await answer(nc, msgs[1].reply)
        assert raw.headers is not None and raw.headers.get("Status") == "503"
        assert "ack not stored: database or disk is full" in raw.headers.get("Description", "")
        assert raw.data == b""
    # Room again: the same acks are confirmed (the state is saved again).
    await msgs[0].ack_sync(timeout=5)
    reply = await answer(nc, msgs[1].reply)
    assert not reply.headers and reply.data == b""


# -- HTTP job changes ----------------------------------------------------------------------------


async def test_http_job_changes_are_answered_once_committed(
    app: Tether, nc: Client, http: httpx.AsyncClient
) -> None:
    await http_jobs(http, nc, 3)
    ids = await not_before_release(app, claim(http, 3))
    assert len(ids) == 3
    single = f"{JOBS}/job/{ids[0]}"
    r = await not_before_release(
        app, http.post(single, json={"NextState": "DELIVERED"}, headers=AUTH)
    )
    assert r.status_code == 202
    bulk = {"Jobs": [{"ID": i, "NextState": "DELIVERED"} for i in ids[1:]]}
    r = await not_before_release(app, http.post(f"{JOBS}/jobs", json=bulk, headers=AUTH))
    assert r.status_code == 200
    assert [x["Status"] for x in r.json()["Results"]] == [202, 202]


def stored_timeouts(app: Tether) -> dict[int, int]:
    """The IncrementalTimeouts the store holds for the jobs of ``w`` (read from disk)."""
    path = sqlite_store(app).path
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT state FROM consumers WHERE stream = ? AND name = ?",
            (REGISTRY_STREAM, "k/tasks/w"),
        ).fetchone()
    finally:
        conn.close()
    extras = msgspec.msgpack.decode(row[0], type=SavedJobs).extras
    return {extras[i]: extras[i + 1] for i in range(0, len(extras), 3) if extras[i + 1]}


async def test_a_sticky_timeout_is_stored_before_its_2xx(
    app: Tether, nc: Client, http: httpx.AsyncClient
) -> None:
    await http_jobs(http, nc, 2)
    r = await http.post(f"{JOBS}/claim", json={"Max": 1, "IncrementalTimeout": 77}, headers=AUTH)
    [job] = r.json()["Result"]
    seq = int(job["ID"].split("-")[1])
    assert stored_timeouts(app) == {seq: 77}  # no later commit needed: it is on disk
    r = await http.post(
        f"{JOBS}/job/{job['ID']}/touch", json={"IncrementalTimeout": 99}, headers=AUTH
    )
    assert r.status_code == 200
    assert stored_timeouts(app) == {seq: 99}


async def test_what_could_not_be_stored_is_stored_once_it_can(
    app: Tether, nc: Client, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await http_jobs(http, nc, 2)
    with failing(app, monkeypatch):
        r = await http.post(
            f"{JOBS}/claim", json={"Max": 1, "IncrementalTimeout": 55}, headers=AUTH
        )
        assert r.status_code == 503
    # Nobody asks again: the job extras and the consumer's state are saved all the same.
    for _ in range(40):
        await asyncio.sleep(0.1)
        if stored_timeouts(app):
            break
    assert list(stored_timeouts(app).values()) == [55]


async def test_an_http_job_change_that_cannot_be_stored_is_a_503(
    app: Tether, nc: Client, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await http_jobs(http, nc, 4)
    ids = await claim(http, 2)
    single = f"{JOBS}/job/{ids[0]}"
    bulk = {"Jobs": [{"ID": ids[1], "NextState": "DELIVERED"}]}
    with failing(app, monkeypatch):
        for r in (
            await http.post(single, json={"NextState": "DELIVERED"}, headers=AUTH),
            await http.post(f"{JOBS}/jobs", json=bulk, headers=AUTH),
            await http.post(f"{JOBS}/claim", json={"Max": 2}, headers=AUTH),
        ):
            assert r.status_code == 503, r.text
            assert "could not be stored (database or disk is full)" in r.text
    # Room again: the changes are stored (retrying a change already made is a 202 too).
    r = await http.post(single, json={"NextState": "DELIVERED"}, headers=AUTH)
    assert r.status_code == 202
    r = await http.post(f"{JOBS}/jobs", json=bulk, headers=AUTH)
    assert r.status_code == 200
