"""Stream compression: acked publish rate and bytes on disk, ``compression: "s2"`` vs ``"none"``.

For each setting, one after the other (the order alternates between repeats): a fresh
``tether serve --store sqlite:<tmp>``, a file stream ``ORDERS`` (``orders.>``) with that
compression, and one raw-socket connection publishing pipelined ``PUB orders.x``
frames with reply inboxes, at most ``--window`` unacknowledged, each payload a JSON
order of about ``--size`` bytes (each a little different, as real ones are). Then the
server is stopped (SQLite checkpoints its log into the database as it closes) and the
store's files are measured.

    .venv/bin/python benchmarks/stream_compression.py              # 100k x ~1 kB, 3 repeats
    .venv/bin/python benchmarks/stream_compression.py --quick      # 20k, 1 repeat
    .venv/bin/python benchmarks/stream_compression.py --store postgres   # on PostgreSQL

With ``--store postgres`` (a throwaway server) or ``--store postgresql://…`` (a database
whose ``tether_*`` tables are dropped before each run) Tether runs on PostgreSQL, and
the bytes on disk are ``pg_total_relation_size`` of ``tether_messages`` (with its
TOAST table and index) once the server has stopped.

The report: per run the rate (PubAcks / first send -> last PubAck), the server's CPU
per message, and the bytes of the store's files; then medians, and the ratios s2 /
none; then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _postgres
from _harness import BenchError, Meter, emit, loadavg, run_async, settle
from _peers import start_tether
from js_publish import AckCounter, subscribed

STREAM = "ORDERS"
CODECS = ("none", "s2")


def payloads(n: int, size: int) -> list[bytes]:
    """``n`` JSON orders of about ``size`` bytes."""
    out = []
    for i in range(n):
        items: list[dict[str, Any]] = []
        length = 50  # the rest of the document, about
        while length < size:
            k = len(items)
            items.append({"sku": f"sku-{(i * 7 + k) % 997:04d}", "qty": k + 1, "state": "new"})
            length += len(json.dumps(items[-1])) + 2
        out.append(json.dumps({"order": i, "customer": f"c-{i % 113}", "items": items}).encode())
    return out


async def create_stream(url: str, codec: str) -> None:
    import nats
    from nats.js.api import StoreCompression, StreamConfig

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=10)
    try:
        await nc.jetstream(timeout=30).add_stream(
            StreamConfig(name=STREAM, subjects=["orders.>"], compression=StoreCompression(codec))
        )
    finally:
        await nc.close()


def publish(port: int, docs: list[bytes], window: int, batch: int, stall: float) -> float:
    """Publish every doc, acked; the seconds from the first send to the last PubAck."""
    frames = [
        b"".join(
            b"PUB orders.x _INBOX.bench.%d %d\r\n%s\r\n" % (i, len(d), d)
            for i, d in enumerate(docs[first : first + batch], first)
        )
        for first in range(0, len(docs), batch)
    ]
    counter = AckCounter()
    conn = subscribed(port, b"_INBOX.bench.*", counter.on_msg, stall)
    sent = nxt = 0
    t0 = t_last = time.monotonic()
    deadline = t0 + 600
    try:
        while True:
            done = counter.acks + counter.errors
            if not conn.out:
                if nxt < len(frames) and sent + batch - done <= window:
                    conn.send(frames[nxt])
                    sent += min(batch, len(docs) - nxt * batch)
                    nxt += 1
                elif done >= sent and nxt >= len(frames):
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"deadline: {done:,} PubAcks of {sent:,}")
            conn.pump()
            if counter.acks + counter.errors > done:
                t_last = conn.last_data
    finally:
        conn.close()
    if counter.errors:
        raise BenchError(f"{counter.errors:,} failed publishes, first: {counter.first_error}")
    return t_last - t0


def store_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("tether.db*"))


def table_bytes(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_total_relation_size('tether_messages')").fetchone()
    return int(row[0]) if row else 0


def run_one(codec: str, docs: list[bytes], opts: argparse.Namespace, rep: int) -> dict[str, Any]:
    idle = settle(opts.wait_idle)
    load = loadavg()[0]
    url = ""
    if _postgres.is_postgres(opts.store):
        url = _postgres.resolve(opts.store)
        _postgres.reset(url)
    with start_tether(store=url or "sqlite") as srv:
        run_async(create_stream(srv.url, codec))
        meter = Meter(srv)
        seconds = publish(srv.port, docs, opts.window, opts.batch, opts.stall)
        meter.stop()
        store = Path(srv.workdir) / "store"
        srv.stop()  # the log is checkpointed into the database as the store closes
        on_disk = table_bytes(url) if url else store_bytes(store)
    rate = len(docs) / seconds
    row = {
        "codec": codec,
        "rep": rep,
        "rate": rate,
        "server_us_per_msg": meter.server / len(docs) * 1e6,
        "other_cpu": meter.other(0.0) / meter.wall,
        "disk_bytes": on_disk,
        "loadavg": load,
        "noisy": idle is None,
    }
    print(
        f"  [{rep + 1}] {codec:<5} {rate:>9,.0f} msg/s  server {row['server_us_per_msg']:.1f} us/msg"
        f"  on disk {on_disk / 1e6:7.2f} MB  (load avg {load:.2f}"
        f"{' NOISY' if idle is None else ''})",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024, help="payload bytes, about")
    p.add_argument("--window", type=int, default=10_000, help="max unacked publishes")
    p.add_argument("--batch", type=int, default=500, help="PUB frames per write")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--stall", type=float, default=30.0, help="max wait for any reply (s)")
    p.add_argument("--wait-idle", type=float, default=10.0, help="wait up to N s for idle")
    p.add_argument("--quick", action="store_true", help="20k messages, 1 repeat")
    p.add_argument("--store", default="sqlite", help="sqlite, postgres or postgresql://...")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.messages, opts.repeat = 20_000, 1
    docs = payloads(opts.messages, opts.size)
    plain = sum(map(len, docs))
    print(
        f"stream compression: {opts.messages:,} payloads of {plain / opts.messages:,.0f} B"
        f" ({plain / 1e6:.1f} MB), window {opts.window:,}",
        flush=True,
    )
    rows = []
    for rep in range(opts.repeat):
        for codec in CODECS[::-1] if rep % 2 else CODECS:
            try:
                rows.append(run_one(codec, docs, opts, rep))
            except BenchError as exc:
                print(f"  [{rep + 1}] {codec}: {exc}", file=sys.stderr)
                return 1
    summary: dict[str, Any] = {}
    for codec in CODECS:
        mine = [r for r in rows if r["codec"] == codec]
        summary[codec] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("rate", "server_us_per_msg", "disk_bytes")
        }
    s2, none = summary["s2"], summary["none"]
    print(f"{'':6}{'rate (median)':>16}{'server us/msg':>16}{'on disk':>12}")
    for codec in CODECS:
        s = summary[codec]
        print(
            f"{codec:<6}{s['rate']:>12,.0f} /s{s['server_us_per_msg']:>16.1f}"
            f"{s['disk_bytes'] / 1e6:>9.2f} MB"
        )
    print(
        f"s2/none rate {s2['rate'] / none['rate']:.2f}x, server CPU per message"
        f" {s2['server_us_per_msg'] / none['server_us_per_msg']:.2f}x, bytes on disk"
        f" {s2['disk_bytes'] / none['disk_bytes']:.2f}x (payloads alone: {plain / 1e6:.1f} MB)"
    )
    emit("stream_compression", argv, payload_bytes=plain, summary=summary, runs=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
