"""``tether stream backup`` and ``restore`` throughput, as an operator runs them.

Fills a stream with ``--messages`` messages of ``--size`` bytes (SDK ``publish_async``),
then times ``python -m tether stream backup DIR`` (a subprocess, as typed), and
``stream restore DIR`` onto a second, empty server of the same kind. Against Tether the
backup reads with the bulk read extension; against nats-server (``--peer-messages``,
fewer by default: it has no bulk read, so the CLI pipelines ``STREAM.MSG.GET``) the same
command reads one message per request. Rates are messages per wall second of the whole
command (start-up, connection and the files included).

    .venv/bin/python benchmarks/cli_backup.py                 # 1M x 128 B on Tether
    .venv/bin/python benchmarks/cli_backup.py --quick         # 100k
    .venv/bin/python benchmarks/cli_backup.py --profile /tmp/backup.prof
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Cli, describe, environment, fill_stream, finish, loadavg, start_server

TARGET = 200_000  # backup messages per second


def timed_cli(args: list[str], url: str, python_args: list[str], timeout: float) -> float:
    """Run one ``tether`` command against ``url``; returns its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *python_args, "-m", "tether", *args, "--server", url],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"tether {' '.join(args)}: {done.stderr.strip()}")
    return took


def measure(kind: str, messages: int, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tether-backup-bench-"))
    profile = ["-m", "cProfile", "-o", args.profile] if args.profile and kind == "tether" else []
    result: dict[str, Any] = {"server": kind, "messages": messages, "size": args.size}
    try:
        with start_server(kind, args, store=args.store, jetstream=True) as srv:
            result["fill_rate"] = round(asyncio.run(fill_stream(srv.url, messages, args.size)))
            load = loadavg()
            took = timed_cli(["stream", "backup", str(work / "b")], srv.url, profile, args.timeout)
            result |= {"backup_s": round(took, 2), "backup_rate": round(messages / took)}
            result["load_before"] = load
        size = sum(f.stat().st_size for f in (work / "b").rglob("*") if f.is_file())
        result["backup_mib"] = round(size / (1 << 20), 1)
        with start_server(kind, args, store=args.store, jetstream=True) as srv:
            took = timed_cli(["stream", "restore", str(work / "b")], srv.url, [], args.timeout)
            result |= {"restore_s": round(took, 2), "restore_rate": round(messages / took)}
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result["error"] = str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    cli = Cli(
        __doc__ or "",
        servers=("tether", "nats-server"),
        quick={"messages": 100_000, "peer_messages": 20_000},
        quick_help="100k messages (20k on nats-server)",
        timeout=600.0,
        wait_idle=None,
        repeat=False,
        client_loop=False,
        profile=False,
    )
    p = cli.parser
    p.add_argument("--messages", type=int, default=1_000_000, help="messages on Tether")
    p.add_argument("--peer-messages", type=int, default=100_000, help="messages on nats-server")
    p.add_argument("--size", type=int, default=128, help="payload bytes")
    p.add_argument("--store", default="sqlite", help="Tether's store: sqlite or memory")
    p.add_argument("--profile", default="", help="cProfile output of the Tether backup command")
    args = cli.parse(argv)
    env = environment()
    print(describe(env))
    results = []
    for kind in args.servers:
        n = args.messages if kind == "tether" else args.peer_messages
        r = measure(kind, n, args)
        results.append(r)
        if "error" in r:
            print(f"{kind}: FAILED {r['error']}")
            continue
        print(
            f"{kind:<12} {n:>9,} msgs  fill {r['fill_rate']:>8,}/s  "
            f"backup {r['backup_rate']:>8,}/s ({r['backup_s']} s, {r['backup_mib']} MiB)  "
            f"restore {r['restore_rate']:>8,}/s ({r['restore_s']} s)  load {r['load_before']}"
        )
    tether = next((r for r in results if r["server"] == "tether" and "error" not in r), None)
    if tether:
        verdict = "met" if tether["backup_rate"] >= TARGET else "NOT met"
        if tether["messages"] < 1_000_000:
            verdict += " (a short run: the command's start-up weighs on its rate)"
        print(f"target backup >= {TARGET:,} msg/s on Tether (1M messages): {verdict}")
    return finish("cli_backup", argv, results, env=json.loads(json.dumps(env)))


if __name__ == "__main__":
    raise SystemExit(main())
