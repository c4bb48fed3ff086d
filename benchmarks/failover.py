"""Failover time of two Tether nodes over one PostgreSQL database: kill -9 of the active
node -> the first PubAck from the node that took over.

Two ``tether serve`` processes share the database (``--store postgresql://…``, whose
``tether_*`` tables are dropped first, or ``--store postgres``, a throwaway local server);
one is active, the other a standby polling the leader lock every ``--poll-interval``
seconds (the ``ha_poll_interval`` key; 1 s by default, as in tether.toml). A nats-py
client given both URLs publishes to a stream without pause, each publish retried until
acknowledged. Each round kills the active node with SIGKILL, takes the time until the
first PubAck that comes from the other node, restarts the killed one (it comes back as
the standby) and waits for it to say so; the roles swap every round.

    .venv/bin/python benchmarks/failover.py --store postgres             # 20 rounds
    .venv/bin/python benchmarks/failover.py --store postgres --rounds 5 --poll-interval 0.2

The report gives every round's time, then p50, p99 and the worst over the rounds, and one
JSON line (``finish``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _postgres  # after the sys.path tweak above
from _harness import describe, environment, finish, loadavg

from tether.testing import HaNode

TARGET_P99 = 5.0  # seconds


async def _quiet(exc: Exception) -> None:
    return None


async def measure(opts: dict[str, Any], url: str) -> list[float]:
    import nats
    from nats.js.api import StreamConfig

    workdir = Path(tempfile.mkdtemp(prefix="tether-failover-"))
    a = HaNode("a", url, workdir, poll=opts["poll_interval"])
    b = HaNode("b", url, workdir, poll=opts["poll_interval"])
    a.peers, b.peers = [b.port], [a.port]
    times: list[float] = []
    try:
        a.start()
        await a.wait_for("Server is ready", 60)
        b.start()
        await b.wait_for("Standby: another node is active", 60)
        nc = await nats.connect(
            servers=[f"nats://127.0.0.1:{a.port}", f"nats://127.0.0.1:{b.port}"],
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.02,
            connect_timeout=1,
            error_cb=_quiet,  # refused connections while a node is down are expected
        )
        js = nc.jetstream(timeout=2)
        await js.add_stream(StreamConfig(name="FAILOVER", subjects=["failover.>"]))
        acks: list[tuple[float, int]] = []  # (when, the port of the node that acked)
        running = True

        async def publisher() -> None:
            i = 0
            while running:
                try:
                    await js.publish("failover.x", str(i).encode(), timeout=1)
                except Exception:  # reconnecting, no responders, timeouts: retry
                    await asyncio.sleep(0.01)
                    continue
                url_now = nc.connected_url
                acks.append((time.monotonic(), url_now.port if url_now else 0))
                i += 1

        task = asyncio.ensure_future(publisher())
        active, standby = a, b
        for rnd in range(opts["rounds"]):
            await asyncio.sleep(opts["pause"])
            seen = len(acks)
            active.kill()
            killed = time.monotonic()
            deadline = killed + 60
            while time.monotonic() < deadline:
                if any(port == standby.port for _, port in acks[seen:]):
                    break
                await asyncio.sleep(0.005)
            else:
                raise TimeoutError(f"round {rnd + 1}: no PubAck from the new active node")
            first = next(t for t, port in acks[seen:] if port == standby.port)
            times.append(first - killed)
            print(f"  round {rnd + 1:2}: {first - killed:.3f} s", flush=True)
            active.start()
            await active.wait_for("Standby: another node is active", 60)
            active, standby = standby, active
        running = False
        await task
        await nc.close()
    finally:
        a.stop()
        b.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return times


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="postgres", help="postgresql://… or 'postgres'")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--poll-interval", type=float, default=1.0, help="ha_poll_interval (s)")
    p.add_argument("--pause", type=float, default=1.0, help="publishing between rounds (s)")
    args = p.parse_args(argv)
    if not _postgres.is_postgres(args.store):
        p.error("--store: expected postgresql://USER:PASS@HOST/DB or 'postgres'")
    url = _postgres.resolve(args.store)
    _postgres.reset(url)
    env = environment()
    env["postgres"] = _postgres.settings(url)
    load0 = loadavg()
    print(f"Failover: {describe(env)}; load average {load0}; postgres {env['postgres']}")
    print(f"{args.rounds} rounds, ha_poll_interval {args.poll_interval:g} s")
    times = asyncio.run(measure(vars(args), url))
    p50, p99 = statistics.median(times), percentile(times, 99)
    verdict = "met" if p99 <= TARGET_P99 else "MISSED"
    print(
        f"\nkill -9 -> first PubAck on the new active node: p50 {p50:.3f} s, p99 {p99:.3f} s,"
        f" worst {max(times):.3f} s over {len(times)} rounds; target p99 <= {TARGET_P99:g} s:"
        f" {verdict}"
    )
    summary = {"p50": p50, "p99": p99, "max": max(times), "rounds": times}
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return finish(
        "failover",
        argv,
        [],
        environment=env,
        loadavg={"start": load0, "end": loadavg()},
        summary=summary,
    )


if __name__ == "__main__":
    sys.exit(main())
