"""HTTP API throughput: broadcasts, claimed+acked pull jobs and push deliveries.

Three loads against one fresh ``tether serve`` (clients in separate processes, so the
server's single event loop is what is measured):

* ``broadcast``: 8 producers POST ``/channel/{id}/broadcast`` (1 KiB payloads);
  rate = broadcasts answered 201 / wall time.
* ``claim``: a backlog published over NATS, then 8 workers loop on
  ``POST …/claim`` (Max 25) + ``POST …/jobs`` (bulk DELIVERED); rate = jobs acked / time.
* ``push``: a backlog queued for a pull consumer that is then switched to push, with a
  callback on a minimal keep-alive HTTP receiver in its own process; rate = deliveries
  received / time from the switch to the last one.

    .venv/bin/python benchmarks/http_jobs.py              # 20k broadcasts, 50k jobs, 20k pushes
    .venv/bin/python benchmarks/http_jobs.py --quick      # a tenth of that
    .venv/bin/python benchmarks/http_jobs.py --store sqlite --sync os
    .venv/bin/python benchmarks/http_jobs.py --only push --profile push.svg   # py-spy

Each load also reports the server process's CPU time per operation (user + system, from
/proc), which is steadier than rates on a shared machine.

Targets on a 2-core machine: >= 3,000 broadcasts/s, >= 10,000 jobs/s, >= 2,000 pushes/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import httpx
import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import process_cpu_seconds  # after the sys.path tweaks above

from tether.testing import run_server

TARGETS = {"broadcast": 3000.0, "claim": 10000.0, "push": 2000.0}
LOADS = tuple(TARGETS)
CLIENT_PROCS = 2
WORKERS = 8
AUTH_PRODUCER = {
    "X-Broker-Channel-Token": "ct",
    "X-Broker-Producer-ID": "bench",
    "X-Broker-Producer-Token": "pt",
}
AUTH_CONSUMER = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}


# -- client processes ---------------------------------------------------------------------------


def _content_length(head: bytes) -> int:
    """The Content-Length of an HTTP message head (0 without one)."""
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            return int(line[15:])
    return 0


class RawHttp:
    """A tiny keep-alive HTTP/1.1 client (one request in flight per connection): cheap
    enough that the server, not the load generator, is what gets measured."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host

    @classmethod
    async def connect(cls, url: str) -> RawHttp:
        hostport = url.split("//", 1)[1]
        host, port = hostport.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, hostport)

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, bytes]:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = _content_length(head)
        data = await self.reader.readexactly(length) if length else b""
        return status, data

    def close(self) -> None:
        self.writer.close()


def _broadcaster(url: str, count: int, tasks: int, done: Synchronized) -> None:  # type: ignore[type-arg]
    async def run() -> None:
        payload = b"x" * 1024

        async def one(n: int) -> None:
            http = await RawHttp.connect(url)
            for _ in range(n):
                status, body = await http.request(
                    "POST", "/channel/bench/broadcast", AUTH_PRODUCER, payload
                )
                if status != 201:
                    raise RuntimeError(f"broadcast: {status} {body!r}")
                with done.get_lock():
                    done.value += 1
            http.close()

        await asyncio.gather(*(one(count // tasks) for _ in range(tasks)))

    asyncio.run(run())


def _claimer(url: str, tasks: int, done: Synchronized) -> None:  # type: ignore[type-arg]
    async def run() -> None:
        base = "/channel/bench/consumer/puller"
        headers = {**AUTH_CONSUMER, "Content-Type": "application/json"}
        claim = json.dumps({"Max": 25, "Wait": 0.5}).encode()

        async def one() -> None:
            http = await RawHttp.connect(url)
            while True:
                status, body = await http.request("POST", f"{base}/claim", headers, claim)
                if status != 200:
                    raise RuntimeError(f"claim: {status} {body!r}")
                jobs = json.loads(body)["Result"]
                if not jobs:
                    break
                acks = {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]}
                status, body = await http.request(
                    "POST", f"{base}/jobs", headers, json.dumps(acks).encode()
                )
                if status != 200:
                    raise RuntimeError(f"ack: {status} {body!r}")
                with done.get_lock():
                    done.value += len(jobs)
            http.close()

        await asyncio.gather(*(one() for _ in range(tasks)))

    asyncio.run(run())


def _receiver(port_out: Synchronized, received: Synchronized) -> None:  # type: ignore[type-arg]
    """A minimal HTTP/1.1 keep-alive endpoint answering 200 to every POST."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                length = _content_length(await reader.readuntil(b"\r\n\r\n"))
                if length:
                    await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                with received.get_lock():
                    received.value += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_out.value = server.sockets[0].getsockname()[1]
        async with server:
            await server.serve_forever()

    asyncio.run(run())


# -- the loads ------------------------------------------------------------------------------------


def _spawn(target: object, args_per_proc: list[tuple[object, ...]]) -> list[mp.Process]:
    procs = [mp.Process(target=target, args=args) for args in args_per_proc]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    return procs


def _join(procs: list[mp.Process]) -> None:
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"client process failed ({p.exitcode})")


def bench_broadcast(url: str, count: int) -> float:
    done = mp.Value("q", 0)
    per = count // CLIENT_PROCS
    tasks = WORKERS // CLIENT_PROCS
    start = time.perf_counter()
    _join(_spawn(_broadcaster, [(url, per, tasks, done)] * CLIENT_PROCS))
    return done.value / (time.perf_counter() - start)


async def _publish(nats_url: str, count: int) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for start in range(0, count, 1000):
            await asyncio.gather(
                *(
                    js.publish("wb.bench", b"j%d" % i)
                    for i in range(start, min(count, start + 1000))
                )
            )
    finally:
        await nc.close()


def bench_claim(url: str, nats_url: str, count: int) -> float:
    with httpx.Client(base_url=url) as http:
        r = http.put(
            "/channel/bench/consumer/puller",
            data={"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"},
        )
        r.raise_for_status()
    asyncio.run(_publish(nats_url, count))
    done = mp.Value("q", 0)
    start = time.perf_counter()
    _join(_spawn(_claimer, [(url, WORKERS // CLIENT_PROCS, done)] * CLIENT_PROCS))
    elapsed = time.perf_counter() - start - 0.5  # the final empty long-poll
    if done.value != count:
        raise RuntimeError(f"claimed {done.value} of {count}")
    return done.value / elapsed


def bench_push(url: str, nats_url: str, count: int) -> float:
    port = mp.Value("i", 0)
    received = mp.Value("q", 0)
    receiver = mp.Process(target=_receiver, args=(port, received), daemon=True)
    receiver.start()
    try:
        while not port.value:
            time.sleep(0.01)
        callback = f"http://127.0.0.1:{port.value}/hook"
        with httpx.Client(base_url=url) as http:
            path = "/channel/bench/consumer/pusher"
            r = http.put(path, data={"token": "kt", "callbackUrl": callback, "type": "pull"})
            r.raise_for_status()
            asyncio.run(_publish(nats_url, count))
            start = time.perf_counter()
            r = http.put(
                path,
                data={"token": "kt", "callbackUrl": callback, "type": "push"},
                headers={"If-Unmodified-Since": r.headers["Last-Modified"]},
            )
            r.raise_for_status()
        deadline = time.monotonic() + 300
        while received.value < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {received.value} of {count} deliveries")
            time.sleep(0.005)
        return count / (time.perf_counter() - start)
    finally:
        receiver.kill()


def _main_thread_cpu_seconds(pid: int) -> float:
    """The CPU time of ``pid``'s main thread (the event loop), without the store's threads."""
    return process_cpu_seconds(pid, thread=pid)


def _py_spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    py_spy = Path(sys.executable).parent / "py-spy"
    # A flame graph for .svg, speedscope for .json, else collapsed stacks (grep-able).
    fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(Path(out).suffix, "raw")
    return subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--output",
            out,
            "--format",
            fmt,
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "memory"])
    parser.add_argument("--sync", default="always", choices=["always", "os"])
    parser.add_argument("--only", action="append", choices=LOADS, help="run only this load")
    parser.add_argument(
        "--profile", metavar="FILE", help="record the server with py-spy (one load: --only)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    loads = args.only or list(LOADS)
    if args.profile and len(loads) != 1:
        parser.error("--profile needs exactly one --only load")
    scale = 10 if args.quick else 1
    counts = {"broadcast": 20_000 // scale, "claim": 50_000 // scale, "push": 20_000 // scale}
    store_dir = tempfile.mkdtemp(prefix="tether-bench-")
    store = "memory" if args.store == "memory" else f"sqlite:{store_dir}"
    conf = Path(store_dir) / "bench.toml"
    conf.write_text("webhook_concurrency = 16\n")
    results: dict[str, float] = {}
    cpu_us: dict[str, float] = {}
    loop_us: dict[str, float] = {}
    with run_server(store=store, args=["--sync", args.sync, "--config", str(conf)]) as srv:
        assert srv.proc is not None
        pid = srv.proc.pid
        with httpx.Client(base_url=srv.http_url) as http:
            http.put("/channel/bench", data={"token": "ct"}).raise_for_status()
            http.put("/producer/bench", data={"token": "pt"}).raise_for_status()
        runs = {
            "broadcast": lambda: bench_broadcast(srv.http_url, counts["broadcast"]),
            "claim": lambda: bench_claim(srv.http_url, srv.url, counts["claim"]),
            "push": lambda: bench_push(srv.http_url, srv.url, counts["push"]),
        }
        for name in loads:
            # The CPU window includes the load's setup (the backlog published over NATS
            # for claim and push): per-operation figures are upper bounds.
            spy = _py_spy(pid, args.profile) if args.profile else None
            before, loop_before = process_cpu_seconds(pid), _main_thread_cpu_seconds(pid)
            results[name] = runs[name]()
            cpu_us[name] = (process_cpu_seconds(pid) - before) / counts[name] * 1e6
            loop_us[name] = (_main_thread_cpu_seconds(pid) - loop_before) / counts[name] * 1e6
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                spy.wait()
    report = {
        "store": store.split(":")[0],
        "sync": args.sync,
        "cpus": os.cpu_count(),
        "host": socket.gethostname(),
        "load1": round(os.getloadavg()[0], 2),
        **{f"{k}_per_s": round(v) for k, v in results.items()},
        **{f"{k}_server_cpu_us": round(v) for k, v in cpu_us.items()},
        **{f"{k}_loop_cpu_us": round(v) for k, v in loop_us.items()},
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"store={report['store']} sync={args.sync} cpus={report['cpus']} load1={report['load1']}")
    for name, rate in results.items():
        target = TARGETS[name]
        verdict = "ok" if rate >= target else "BELOW TARGET"
        print(
            f"{name:>10}: {rate:>9,.0f}/s  (target {target:,.0f}/s, {verdict})"
            f"  server CPU {cpu_us[name]:,.0f} us/op ({loop_us[name]:,.0f} in the event loop)"
        )


if __name__ == "__main__":
    main()
