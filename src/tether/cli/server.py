"""``tether server``: what a running server says about itself, and whether it is well.

``info`` combines the INFO line every client gets with the JetStream account info, and
``/varz`` when the monitoring port is given. ``ping`` measures round trips. ``check``
is for scripts and Kubernetes probes: exit 0 healthy, 1 not (JetStream unreachable or a
round trip slower than ``--max-rtt``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from tether.cli._typer import group
from tether.cli.output import emit_json, pairs, size
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    fail,
    remote,
    run,
)
from tether.client import Connection, NoResponders

server_app = group("server", "The server: info, ping, check.")

MonitorOpt = Annotated[
    str | None,
    typer.Option("--monitor", help="Monitoring URL for /varz, e.g. http://127.0.0.1:8222."),
]


async def _jetstream(conn: Connection) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = await conn.jetstream().api("INFO")
    except NoResponders:
        return None
    return info


@remote(server_app, "info")
def info(
    target: Target,
    monitor: MonitorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The server's identity, limits and JetStream usage."""

    async def work(conn: Connection) -> dict[str, Any]:
        return {"info": dict(conn.server_info), "jetstream": await _jetstream(conn)}

    found = run(target, work)
    if monitor:
        import httpx  # only here: it takes a tenth of the CLI's start

        try:
            found["varz"] = httpx.get(monitor.rstrip("/") + "/varz", timeout=5).json()
        except (httpx.HTTPError, ValueError) as exc:
            fail(f"cannot read {monitor}/varz: {exc}")
    if as_json:
        emit_json(found)
        return
    i, js = found["info"], found["jetstream"]
    rows: list[tuple[str, Any]] = [
        ("Server", i.get("server_name", "")),
        ("ID", i.get("server_id", "")),
        ("Version", f"{i.get('version', '')} ({i.get('go', '')})"),
        ("Listening", f"{i.get('host', '')}:{i.get('port', '')}"),
        ("Max payload", size(int(i.get("max_payload", 0)))),
        ("Auth required", bool(i.get("auth_required"))),
        ("TLS required", bool(i.get("tls_required"))),
        ("JetStream", "enabled" if js is not None else "not enabled"),
    ]
    if js is not None:
        rows += [
            ("Streams", js.get("streams", 0)),
            ("Consumers", js.get("consumers", 0)),
            ("Stored", size(int(js.get("storage", 0)))),
            ("In memory", size(int(js.get("memory", 0)))),
        ]
    varz = found.get("varz")
    if varz:
        rows += [
            ("Connections", varz.get("connections", 0)),
            ("Messages in / out", f"{varz.get('in_msgs', 0):,} / {varz.get('out_msgs', 0):,}"),
            ("Slow consumers", varz.get("slow_consumers", 0)),
            ("Uptime", varz.get("uptime", "")),
        ]
    pairs("Server", rows)


async def _rtts(conn: Connection, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await conn.flush()
        out.append(time.perf_counter() - start)
    return out


@remote(server_app, "ping")
def ping(
    target: Target,
    how_many: Annotated[int, typer.Option("--count", "-c", help="Round trips.")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """PING/PONG round trips."""

    async def work(conn: Connection) -> list[float]:
        return await _rtts(conn, max(1, how_many))

    rtts = run(target, work)
    if as_json:
        emit_json({"rtt_seconds": rtts})
        return
    for i, rtt in enumerate(rtts, 1):
        typer.echo(f"pong {i}: {rtt * 1000:.3f} ms")
    typer.echo(
        f"min/avg/max = {min(rtts) * 1000:.3f}/{sum(rtts) / len(rtts) * 1000:.3f}/"
        f"{max(rtts) * 1000:.3f} ms"
    )


@remote(server_app, "check")
def check(
    target: Target,
    max_rtt: Annotated[
        float, typer.Option("--max-rtt", help="Seconds a round trip may take.")
    ] = 1.0,
    jetstream: Annotated[
        bool, typer.Option("--jetstream/--no-jetstream", help="Require JetStream.")
    ] = True,
) -> None:
    """Health for scripts and probes: exit 0 when healthy, 1 (with the reason) when not."""

    async def work(conn: Connection) -> str:
        rtt = (await _rtts(conn, 1))[0]
        if rtt > max_rtt:
            raise Failure(f"CRITICAL: round trip {rtt:.3f}s is over {max_rtt:g}s")
        if jetstream and await _jetstream(conn) is None:
            raise Failure("CRITICAL: JetStream is not available")
        return f"OK: round trip {rtt * 1000:.1f} ms" + (", JetStream ok" if jetstream else "")

    typer.echo(run(target, work))
