"""Monitoring endpoints in nats-server's shape: ``/healthz`` and ``/varz``."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tether.server.config import ServerConfig
from tether.server.nats.server import NatsServer
from tether.version import NATS_COMPAT_VERSION, __version__


class Monitored(Protocol):
    """What the endpoints report on (the process, which passes itself)."""

    config: ServerConfig
    nats: NatsServer
    store_url: str
    http_port: int


def routes(app: Monitored) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def varz(request: Request) -> Response:
        nats = app.nats
        stats = nats.stats()
        cfg = app.config
        body = {
            "server_id": nats.server_id,
            "server_name": nats.server_name,
            "version": NATS_COMPAT_VERSION,
            "tether_version": __version__,
            "proto": 1,
            "host": cfg.host,
            "port": nats.port,
            "http_port": app.http_port,
            "max_connections": cfg.max_connections,
            "max_payload": cfg.max_payload,
            "max_pending": cfg.max_pending,
            "max_control_line": cfg.max_control_line,
            "ping_interval": int(cfg.ping_interval * 1e9),
            "ping_max": cfg.max_pings_out,
            "auth_required": cfg.auth_required,
            "jetstream": {"config": {"store_dir": app.store_url}} if nats.jetstream else {},
            "start": datetime.fromtimestamp(nats.started_at, UTC).isoformat(),
            "now": datetime.now(UTC).isoformat(),
            "uptime": f"{int(time.time() - nats.started_at)}s",
            "pid": os.getpid(),
            **stats,
        }
        return JSONResponse(body)

    return [Route("/healthz", healthz), Route("/varz", varz)]
