"""What watching costs: acked publishes with and without the dashboard and /metrics.

Two loads on Tether alone (nats-server has no dashboard to compare with):

* ``publish``: the raw acked publish load of ``js_publish.py`` (pipelined ``PUB`` frames
  with reply inboxes, at most ``--window`` unacked, PubAcks counted on a raw socket)
  on a fresh ``sqlite`` store (``sync=always``), twice per repeat: ``plain`` (nobody
  watching) and ``watched`` (a headless Chromium with the dashboard's overview open,
  which polls every second, and a scraper reading ``/metrics`` every second), the
  order alternating per repeat. The ratio watched / plain is the number to read
  (target: at least 0.95, a drop of 5 % at most).
* ``scrape``: ``--consumers`` (10,000) durable consumers on one stream holding a few
  messages, then ``--scrapes`` scrapes of ``/metrics``; the server's own time for each
  (``tether_metrics_scrape_seconds``) and the wall time the scraper saw (target: under
  100 ms).

Chromium is Debian's (``/usr/bin/chromium``, or ``$TETHER_CHROMIUM``), driven by
Playwright; without it the ``watched`` runs only scrape ``/metrics``, and say so.

    .venv/bin/python benchmarks/dashboard_overhead.py --quick
    .venv/bin/python benchmarks/dashboard_overhead.py --repeat 3
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # after the sys.path tweak above
from _harness import (
    Cli,
    Meter,
    ServerProcess,
    describe,
    environment,
    finish,
    loadavg,
    settle,
)
from _peers import start_tether
from js_publish import raw_publish, setup_stream

CHROMIUM = os.environ.get("TETHER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HTTP_LINE = re.compile(r"Starting http monitor on (\S+):(\d+)")
SCRAPE_TIME = re.compile(r"^tether_metrics_scrape_seconds (\S+)$", re.M)


def http_url(srv: ServerProcess) -> str:
    found = HTTP_LINE.search(srv.log)
    if found is None:
        raise RuntimeError("no HTTP port in the server's log")
    return f"http://{found.group(1)}:{found.group(2)}"


class Watchers:
    """A browser on the overview and a scraper of /metrics, each once a second, on
    threads of their own until :meth:`stop`."""

    def __init__(self, url: str, browser: bool) -> None:
        self.url = url
        self.stopping = threading.Event()
        self.scrapes = 0
        self.page_updates = 0
        self.browser_error = ""
        self.threads = [threading.Thread(target=self._scrape, daemon=True)]
        if browser:
            self.threads.append(threading.Thread(target=self._browse, daemon=True))
        self.ready = threading.Event()

    def start(self) -> Watchers:
        for t in self.threads:
            t.start()
        if len(self.threads) > 1:
            self.ready.wait(30)  # the page is up before the load starts
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _scrape(self) -> None:
        with httpx.Client() as http:
            while not self.stopping.wait(1.0):
                http.get(self.url + "/metrics").raise_for_status()
                self.scrapes += 1

    def _browse(self) -> None:
        try:
            from playwright.sync_api import sync_playwright

            with sync_playwright() as p:
                chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                try:
                    page = chromium.new_page()
                    page.goto(self.url + "/ui/")
                    page.wait_for_selector('[data-card="Streams"]')
                    self.ready.set()
                    last = ""
                    while not self.stopping.wait(0.5):
                        stamp = page.locator("#main").get_attribute("data-updated") or ""
                        if stamp != last:
                            self.page_updates += 1
                            last = stamp
                finally:
                    chromium.close()
        except Exception as exc:
            self.browser_error = str(exc)
            self.ready.set()


def publish_run(mode: str, args: Any, browser: bool) -> dict[str, Any]:
    opts = vars(args)
    with start_tether(store="sqlite") as srv:
        asyncio.run(setup_stream(srv.url))
        idle = settle(args.wait_idle)
        watchers = Watchers(http_url(srv), browser).start() if mode == "watched" else None
        meter = Meter(srv)
        try:
            res = raw_publish(srv.port, args.messages, opts, args.timeout)
        finally:
            meter.stop()
            if watchers is not None:
                watchers.stop()
    out = {
        "load": "publish",
        "mode": mode,
        "rate": res.rate,
        "acks": res.count,
        "errors": res.errors,
        "server_cpu": meter.server / meter.wall if meter.wall else 0.0,
        "server_us_per_msg": 1e6 * meter.server / res.count if res.count else 0.0,
        "noisy": idle is None,
    }
    if watchers is not None:
        out.update(
            scrapes=watchers.scrapes,
            page_updates=watchers.page_updates,
            browser=browser and not watchers.browser_error,
            browser_error=watchers.browser_error,
        )
    return out


async def make_consumers(url: str, n: int) -> None:
    import nats

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=10)
    try:
        js = nc.jetstream(timeout=60)
        # Its own max_consumers: past nats-server's default of 1000 per stream.
        await js.add_stream(name="MANY", subjects=["many.>"], max_consumers=max(n, 1))
        for i in range(100):
            await js.publish(f"many.{i % 10}", b"x")
        for first in range(0, n, 200):
            await asyncio.gather(
                *(
                    js.add_consumer("MANY", durable_name=f"c{i}", ack_policy="explicit")
                    for i in range(first, min(n, first + 200))
                )
            )
    finally:
        await nc.close()


def scrape_run(args: Any) -> dict[str, Any]:
    with start_tether(store="memory") as srv:
        t0 = time.monotonic()
        asyncio.run(make_consumers(srv.url, args.consumers))
        made = time.monotonic() - t0
        server_ms, wall_ms, size = [], [], 0
        meter = Meter(srv)
        with httpx.Client(timeout=30) as http:
            for _ in range(args.scrapes):
                t = time.perf_counter()
                body = http.get(http_url(srv) + "/metrics").text
                wall_ms.append(1000 * (time.perf_counter() - t))
                found = SCRAPE_TIME.search(body)
                server_ms.append(1000 * float(found.group(1)) if found else float("nan"))
                size = len(body)
        meter.stop()
    return {
        "load": "scrape",
        "consumers": args.consumers,
        "setup_seconds": round(made, 1),
        "bytes": size,
        "server_ms_median": statistics.median(server_ms),
        "server_ms_best": min(server_ms),
        "wall_ms_median": statistics.median(wall_ms),
        "wall_ms_best": min(wall_ms),
        "server_cpu_ms_per_scrape": 1000 * meter.server / args.scrapes,
    }


def main(argv: list[str] | None = None) -> int:
    cli = Cli(
        __doc__,
        servers=("tether",),
        quick={"messages": 50_000, "consumers": 2_000, "scrapes": 5},
        quick_help="50k publishes, 2k consumers, 5 scrapes",
        client_loop=False,
        profile=False,
        wait_idle=10.0,
    )
    p = cli.parser
    p.add_argument("--messages", type=int, default=200_000, help="raw publishes per run (200k)")
    p.add_argument("--size", type=int, default=128, help="payload bytes (128)")
    p.add_argument("--window", type=int, default=10_000, help="max unacked publishes")
    p.add_argument("--batch", type=int, default=1_000, help="PUB frames per write")
    p.add_argument("--drain", type=float, default=30.0, help="max wait for acks after a cap")
    p.add_argument("--consumers", type=int, default=10_000, help="consumers for the scrape")
    p.add_argument("--scrapes", type=int, default=10, help="scrapes of /metrics to time")
    p.add_argument("--no-browser", action="store_true", help="watch with the scraper only")
    p.add_argument("--load", choices=["publish", "scrape", "all"], default="all")
    args = cli.parse(argv)
    browser = not args.no_browser and Path(CHROMIUM).is_file()
    env = environment()
    load0 = loadavg()
    print(f"Dashboard overhead: {describe(env)}; load average {load0}")
    if not browser:
        print("(no Chromium: the watched runs scrape /metrics only)")
    results: list[dict[str, Any]] = []
    if args.load in ("publish", "all"):
        for rep in range(args.repeat):
            order = ("plain", "watched") if rep % 2 == 0 else ("watched", "plain")
            for mode in order:
                r = publish_run(mode, args, browser)
                r["rep"] = rep
                results.append(r)
                extra = (
                    f", {r['scrapes']} scrapes, {r['page_updates']} page updates"
                    if mode == "watched"
                    else ""
                )
                print(
                    f"  publish {mode:8} rep {rep}: {r['rate']:10,.0f} acked msg/s, "
                    f"server {r['server_us_per_msg']:.1f} µs/msg{extra}"
                    f"{' NOISY' if r['noisy'] else ''}"
                )
        plain = [r["rate"] for r in results if r.get("mode") == "plain"]
        watched = [r["rate"] for r in results if r.get("mode") == "watched"]
        ratio_median = statistics.median(watched) / statistics.median(plain)
        ratio_best = max(watched) / max(plain)
        print(
            f"publish: plain median {statistics.median(plain):,.0f}, watched median "
            f"{statistics.median(watched):,.0f} msg/s; ratio watched/plain "
            f"{ratio_median:.3f} (median), {ratio_best:.3f} (best); target >= 0.95"
        )
    if args.load in ("scrape", "all"):
        r = scrape_run(args)
        results.append(r)
        print(
            f"scrape: {r['consumers']:,} consumers, {r['bytes']:,} bytes; server "
            f"{r['server_ms_median']:.1f} ms median ({r['server_ms_best']:.1f} best), "
            f"{r['server_cpu_ms_per_scrape']:.1f} ms of server CPU each, wall "
            f"{r['wall_ms_median']:.1f} ms median; target < 100 ms"
        )
    return finish(
        "dashboard_overhead",
        argv,
        results,
        environment=env,
        loadavg={"start": load0, "end": loadavg()},
    )


if __name__ == "__main__":
    sys.exit(main())
