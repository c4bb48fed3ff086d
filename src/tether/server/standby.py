"""What a node over PostgreSQL answers on HTTP about its role (docs/deployment.md).

* ``/healthz``: the process is alive — 200 on every node, with ``"role"`` (``standby``
  or ``active``) when the store is PostgreSQL;
* ``/readyz``: 200 only on the node that serves clients, 503 on a standby, so load
  balancers and Kubernetes readiness probes route to the active node.

A standby opens no client listener (NATS, NSQ, WebSocket): clients given several
server URLs find the active node by trying the next one. Its HTTP port answers the two
endpoints above, and 503 with why to anything else.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["NOT_ACTIVE", "readyz_route", "standby_app"]

NOT_ACTIVE = "This node is a standby: another node is active (see /readyz)"
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _json(body: dict[str, str], status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def readyz_route(role: Callable[[], str | None]) -> Route:
    """``/readyz``: 200 while ``role()`` is ``active`` or None (no standby possible)."""

    async def readyz(request: Request) -> Response:
        now = role()
        if now in (None, "active"):
            return _json({"status": "ok", **({"role": now} if now else {})})
        return _json({"status": "unavailable", "role": str(now)}, 503)

    return Route("/readyz", readyz, methods=["GET", "HEAD"])


def standby_app(role: Callable[[], str | None]) -> Starlette:
    """The HTTP app of a node waiting to become active."""

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok", "role": str(role())})

    async def unavailable(request: Request) -> Response:
        return Response(NOT_ACTIVE, status_code=503, media_type="text/plain")

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET", "HEAD"]),
            readyz_route(role),
            Route("/{path:path}", unavailable, methods=_METHODS),
        ]
    )
