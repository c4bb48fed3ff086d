"""``tether stream add`` and ``consumer add`` on a terminal: what no flag gives is asked
for (through a pseudo-terminal here, as a user types), ``--defaults`` asks nothing, and
without a terminal nothing is asked."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.testing import run_server


class Terminal:
    """A ``tether`` command on a pseudo-terminal: wait for a question, type an answer."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        main, child = pty.openpty()
        self.fd = main
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            stdin=child,
            stdout=child,
            stderr=child,
            env={**env, "TERM": "dumb", "COLUMNS": "100"},
            close_fds=True,
        )
        os.close(child)
        self.seen = ""

    def _read(self, until: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 4096)
        except OSError:  # the child closed the terminal
            return False
        self.seen += chunk.decode(errors="replace")
        return bool(chunk)

    def answer(self, question: str, text: str, within: float = 20.0) -> None:
        until = time.monotonic() + within
        while question not in self.seen:
            assert self._read(until), f"no {question!r} in {self.seen!r}"
        self.seen = self.seen[self.seen.index(question) + len(question) :]
        os.write(self.fd, text.encode() + b"\r")

    def finish(self, within: float = 30.0) -> tuple[int, str]:
        until = time.monotonic() + within
        while self._read(until):
            pass
        code = self.proc.wait(max(0.1, until - time.monotonic()))
        os.close(self.fd)
        return code, self.seen


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_server(store="memory") as srv:
        yield {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "TETHER_URL": srv.url}


def tether(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def test_stream_add_asks_what_the_flags_leave_out(env: dict[str, str]) -> None:
    term = Terminal(["stream", "add", "--storage", "memory"], env)
    term.answer("Stream name", "ORDERS")
    term.answer("Subjects", "orders.> , refunds.*")
    # --storage was given: not asked.
    term.answer("Retention", "bogus")
    term.answer("Choose one of", "workq")
    term.answer("Message count limit", "")  # the default, -1
    term.answer("Total stream size", "1048576")
    term.answer("Message age limit", "2h")
    term.answer("Duplicate tracking window", "")  # 2m
    term.answer("Allow direct gets", "y")
    code, out = term.finish()
    assert code == 0, out
    assert "Storage" not in out.split("Stream ORDERS created")[0]
    config = json.loads(tether(env, "stream", "info", "ORDERS", "--json").stdout)["config"]
    assert config["subjects"] == ["orders.>", "refunds.*"]
    assert config["storage"] == "memory" and config["retention"] == "workqueue"
    assert config["max_msgs"] == -1 and config["max_bytes"] == 1048576
    assert config["max_age"] == 2 * 3600 * 10**9
    assert config["duplicate_window"] == 120 * 10**9
    assert config["allow_direct"] is True


def test_consumer_add_asks_and_defaults_asks_nothing(env: dict[str, str]) -> None:
    assert tether(env, "stream", "add", "JOBS", "--subjects", "jobs.>").returncode == 0
    term = Terminal(["consumer", "add", "JOBS", "--max-pending", "50"], env)
    term.answer("Consumer name", "workers")
    term.answer("Filter subject", "jobs.email")
    term.answer("Acknowledgement policy", "")  # explicit
    term.answer("Start policy", "new")
    term.answer("Delivery target", "")  # pull
    term.answer("Ack wait", "45s")
    term.answer("Maximum deliveries", "5")
    code, out = term.finish()
    assert code == 0, out
    info = json.loads(tether(env, "consumer", "info", "JOBS", "workers", "--json").stdout)
    config = info["config"]
    assert config["filter_subject"] == "jobs.email" and config["ack_policy"] == "explicit"
    assert config["deliver_policy"] == "new" and "deliver_subject" not in config
    assert config["ack_wait"] == 45 * 10**9 and config["max_deliver"] == 5
    assert config["max_ack_pending"] == 50

    # --defaults on a terminal: no question, the server's defaults.
    term = Terminal(["consumer", "add", "JOBS", "plain", "--defaults"], env)
    code, out = term.finish()
    assert code == 0 and "?" not in out and ":" not in out.split("created")[0], out
    term = Terminal(["stream", "add", "QUIET", "--defaults", "--json"], env)
    code, out = term.finish()
    assert code == 0, out
    info = json.loads(tether(env, "stream", "info", "QUIET", "--json").stdout)
    assert info["config"]["subjects"] == ["QUIET"]


def test_no_terminal_no_questions(env: dict[str, str]) -> None:
    done = tether(env, "stream", "add")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "stream name is needed" in done.stderr
    done = tether(env, "stream", "add", "PIPED")
    assert done.returncode == 0, done.stderr
    assert "Subjects" in done.stdout and "PIPED" in done.stdout
