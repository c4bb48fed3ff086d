"""The dashboard at ``/ui/`` (``/`` leads there) and the API reference at ``/docs``.

The dashboard is a small static app (``ui/``: one HTML page, one ES module, one style
sheet; no build step, shipped in the wheel) reading JSON: the monitoring endpoints
(``/varz``, ``/connz``), nsqd's ``/stats`` and the views under ``/ui/api/`` defined
here, which read the engine as ``CONSUMER.INFO`` and ``/jsz`` do. Its actions (requeue
or remove dead letters and dead jobs) go through the same calls as the existing APIs:
:meth:`DeadLetterApi.answer` for a consumer's dead letters, the job views' requeue and
delete for webhook-broker consumers, each confirmed once stored.

Who may act (docs/operations.md): nobody with ``ui_read_only``; with
``http_admin_password``, a caller sending those Basic credentials; without one, anybody
unless clients must authenticate (then nobody: the dashboard cannot tell an operator
from a stranger). Actions are POSTs carrying the page's CSRF token in a header, which a
page of another origin can neither read nor send; a request whose ``Origin`` is another
host is refused as well. With ``ui_anonymous = "refuse"`` the dashboard itself needs
the credentials; with ``"read"`` (the default) it shows counts to anyone, and message
contents only to a caller who may act when authentication is configured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import logging
import secrets
import time
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import bcrypt
import msgspec
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from tether.engine import errors
from tether.engine.broker import Broker
from tether.engine.consumers import Consumer, ConsumerRegistry
from tether.engine.jobs import WebhookService
from tether.engine.jobs.view import DEAD, INFLIGHT, QUEUED, owned_by_http
from tether.engine.streams import Stream
from tether.engine.subjects import is_valid_filter
from tether.protocol.numbers import parse_uint
from tether.server.banner import store_location
from tether.server.config import ServerConfig
from tether.server.http.jobs_api import job_id
from tether.server.nats.dead_letters import DeadLetterApi
from tether.server.nats.server import NatsServer
from tether.version import __version__

log = logging.getLogger("tether.http")

UI_DIR = Path(str(resources.files("tether.server.http") / "ui"))
CSRF_HEADER = "x-tether-csrf"
PAGE_LIMIT = 100
PREVIEW_BYTES = 64 * 1024
NS = 1_000_000_000
ACTIONS = ("requeue", "delete")
CONSUMER_ROWS = 200  # consumers a stream's page lists

_encode = msgspec.json.Encoder()


class Dashboarded(Protocol):
    """What the dashboard reads (the process, which passes itself)."""

    config: ServerConfig
    nats: NatsServer
    broker: Broker | None
    consumers: ConsumerRegistry | None
    dead_letters: DeadLetterApi | None
    webhooks: WebhookService | None
    http_port: int


def _json(body: Any, status: int = 200) -> Response:
    return Response(
        _encode.encode(body),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def _error(status: int, message: str, **headers: str) -> Response:
    return Response(
        _encode.encode({"error": message}),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store", **headers},
    )


class Gate:
    """Credentials, read-only mode and the CSRF token (see the module's docstring)."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.auth_configured = bool(cfg.auth_required or cfg.http_gateway_secret)
        # One token per process: a page reads it from /ui/api/session (same origin only,
        # no CORS header) and sends it back on every POST.
        self.csrf = secrets.token_urlsafe(24)

    def logged_in(self, request: Request) -> bool:
        """The request carries the admin's Basic credentials."""
        password = self.cfg.http_admin_password
        if not password:
            return False
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic" or not value:
            return False
        try:
            user, sep, given = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep or not hmac.compare_digest(user.encode(), self.cfg.http_admin_user.encode()):
            return False
        if password.startswith(("$2a$", "$2b$", "$2y$")):
            try:
                return bcrypt.checkpw(given.encode(), password.encode())
            except ValueError:
                return False
        return hmac.compare_digest(given.encode(), password.encode())

    def action_refusal(self) -> str | None:
        """Why nobody may act, whoever asks; None when credentials may decide."""
        if self.cfg.ui_read_only:
            return "the dashboard is read-only (ui_read_only = true)"
        if self.auth_configured and not self.cfg.http_admin_password:
            return (
                "clients must authenticate, and no http_admin_password is set: "
                "the dashboard cannot act"
            )
        return None

    def may_act(self, request: Request) -> bool:
        if self.action_refusal() is not None:
            return False
        return not self.cfg.http_admin_password or self.logged_in(request)

    def may_read_contents(self, request: Request) -> bool:
        """Message payloads and headers: to anyone only where nothing is protected."""
        return not self.auth_configured or self.logged_in(request)

    def view_refusal(self, request: Request) -> Response | None:
        """``ui_anonymous = "refuse"``: the dashboard itself needs the credentials."""
        if self.cfg.ui_anonymous == "refuse" and not self.logged_in(request):
            return Response(
                "the dashboard needs the admin's credentials",
                status_code=401,
                headers={"www-authenticate": 'Basic realm="tether", charset="UTF-8"'},
            )
        return None

    def check_post(self, request: Request) -> Response | None:
        """The refusal of an action, or None when it may go ahead."""
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host", ""):
            return _error(403, "cross-origin request refused")
        given = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            return _error(403, f"missing or wrong CSRF token (send {CSRF_HEADER})")
        why = self.action_refusal()
        if why is not None:
            return _error(403, why)
        if self.cfg.http_admin_password and not self.logged_in(request):
            log.info("dashboard: %s refused: no or wrong admin credentials", request.url.path)
            # No WWW-Authenticate: the page asks for credentials itself, not the browser.
            return _error(401, "this action needs the admin's credentials")
        return None


# -- reading the engine ---------------------------------------------------------------------------


def _rfc3339(ns: int) -> str | None:
    if not ns:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / NS))


def consumer_row(c: Consumer) -> dict[str, Any]:
    """One consumer as the tables show it (the numbers of CONSUMER.INFO, and dead)."""
    last = max(c.last_delivered_ns, c.last_ack_ns)
    return {
        "stream": c.stream.name,
        "name": c.name,
        "pull": c.is_pull,
        "pending": c.num_pending,
        "ack_pending": c.num_ack_pending,
        "redelivered": c.num_redelivered,
        "dead": len(c.state.dead),
        "waiting": len(c.waiting) if c.is_pull else 0,
        "delivered": c.dseq,
        "acked": c.acked_count,
        "ack_floor": c.ack_floor[1],
        "last_active": _rfc3339(last),
        "paused": c.paused,
        "filter": ", ".join(c.config.filters) if c.config.filters else "",
        "ack_policy": c.config.ack_policy,
        "max_deliver": c.config.max_deliver,
    }


def _stream_row(broker: Broker, registry: ConsumerRegistry | None, name: str) -> dict[str, Any]:
    stream = broker.streams[name]
    st = stream.state
    consumers = registry.consumers_of(name) if registry is not None else []
    return {
        "name": name,
        "subjects": list(stream.config.subjects),
        "retention": stream.config.retention,
        "messages": st.msgs,
        "bytes": st.bytes,
        "first_seq": st.first_seq,
        "last_seq": st.last_seq,
        "first_ts": _rfc3339(st.first_ts),
        "last_ts": _rfc3339(st.last_ts),
        "consumers": len(consumers),
        "lag": sum(c.num_pending for c in consumers),
        "dead": sum(len(c.state.dead) for c in consumers),
    }


def _headers(block: bytes) -> list[tuple[str, str]]:
    """``NATS/1.0`` header lines as pairs (the status line is left out)."""
    out: list[tuple[str, str]] = []
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep:
            out.append((key.strip(), value.strip()))
    return out


def _payload(data: bytes) -> dict[str, Any]:
    """Text when it decodes (JSON pretty-printed by the page), else hex, both capped."""
    shown = data[:PREVIEW_BYTES]
    out: dict[str, Any] = {"size": len(data), "truncated": len(data) > PREVIEW_BYTES}
    try:
        text: str | None = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and any(ch < " " and ch not in "\t\n\r" for ch in text):
        text = None  # control bytes: binary, shown as hex
    out["text"] = text
    out["hex"] = shown[:4096].hex()
    return out


def _newest(stream: Stream, filters: tuple[str, ...], limit: int) -> list[int]:
    """The last ``limit`` sequences matching ``filters``, oldest first: read from a
    window at the end of the stream, widened until it holds enough (the page refreshes
    every second; a stream of millions must not be walked whole each time)."""
    first, last = stream.state.first_seq, stream.state.last_seq
    span = limit
    while True:
        start = max(first, last - span + 1)
        seqs = list(stream.seqs_matching(start, filters))
        if len(seqs) >= limit or start <= first:
            return seqs[-limit:]
        span *= 4


def routes(app: Dashboarded) -> list[BaseRoute]:
    cfg = app.config
    gate = Gate(cfg)
    started = time.time()

    def engine(request: Request) -> tuple[Broker, ConsumerRegistry] | Response:
        """The broker and its consumers, for a view this request may see; else the
        response that refuses it."""
        refused = gate.view_refusal(request)
        if refused is not None:
            return refused
        if app.broker is None or app.consumers is None:
            return _error(503, "JetStream is off: no streams")
        return app.broker, app.consumers

    def action_refusal(request: Request) -> Response | None:
        """Why a POST of a dead-letter action is refused, or None."""
        if request.path_params["action"] not in ACTIONS:
            return _error(404, "expected …/dead/requeue or …/dead/delete")
        return gate.check_post(request)

    # -- pages ------------------------------------------------------------------------------
    async def root(request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=302)

    async def page(request: Request) -> Response:
        refused = gate.view_refusal(request)
        if refused is not None:
            return refused
        return FileResponse(UI_DIR / "index.html", headers={"cache-control": "no-store"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        path = UI_DIR / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return Response("not found", status_code=404)
        return FileResponse(path, headers={"cache-control": "no-cache"})

    # -- views ------------------------------------------------------------------------------
    async def session(request: Request) -> Response:
        refused = gate.view_refusal(request)
        if refused is not None:
            return refused
        return _json(
            {
                "csrf": gate.csrf,
                "read_only": cfg.ui_read_only,
                "may_act": gate.may_act(request),
                "refusal": gate.action_refusal(),
                "needs_login": bool(cfg.http_admin_password) and not gate.logged_in(request),
                "logged_in": gate.logged_in(request),
                "user": cfg.http_admin_user if cfg.http_admin_password else "",
                "contents": gate.may_read_contents(request),
            }
        )

    async def login(request: Request) -> Response:
        """Check the credentials the page was given (POST, with the CSRF token)."""
        if not hmac.compare_digest(
            request.headers.get(CSRF_HEADER, "").encode(), gate.csrf.encode()
        ):
            return _error(403, f"missing or wrong CSRF token (send {CSRF_HEADER})")
        if not gate.logged_in(request):
            log.info("dashboard: login refused")
            return _error(401, "wrong user or password")
        return _json({"logged_in": True})

    async def overview(request: Request) -> Response:
        refused = gate.view_refusal(request)
        if refused is not None:
            return refused
        nats = app.nats
        stats = nats.stats()
        body: dict[str, Any] = {
            "version": __version__,
            "server_id": nats.server_id,
            "server_name": nats.server_name,
            "started": _rfc3339(int(nats.started_at * NS)),
            "uptime_seconds": round(time.time() - nats.started_at, 1),
            "store": store_location(cfg.store) if cfg.jetstream else "none",
            "sync": cfg.sync,
            "now": time.time(),
            "connections": stats["connections"],
            "in_msgs": stats["in_msgs"],
            "out_msgs": stats["out_msgs"],
            "in_bytes": stats["in_bytes"],
            "out_bytes": stats["out_bytes"],
            "slow_consumers": stats["slow_consumers"],
            "jetstream": app.broker is not None,
            "webhooks": app.webhooks is not None,
            "nsq": cfg.nsq_port != 0 and app.broker is not None,
            "dashboard_started": started,
        }
        broker, registry = app.broker, app.consumers
        if broker is not None and registry is not None:
            streams = list(broker.streams.values())
            consumers = registry.all()
            body.update(
                {
                    "streams": len(streams),
                    "messages": sum(s.state.msgs for s in streams),
                    "bytes": sum(s.state.bytes for s in streams),
                    "stored_total": sum(s.state.last_seq for s in streams),
                    "consumers": len(consumers),
                    "lag": sum(c.num_pending for c in consumers),
                    "ack_pending": sum(c.num_ack_pending for c in consumers),
                    "dead": sum(len(c.state.dead) for c in consumers),
                    "delivered_total": sum(c.dseq for c in consumers),
                    # What an operator asks first: who is furthest behind, what is dead.
                    "behind": [
                        consumer_row(c)
                        for c in heapq.nlargest(
                            10, consumers, key=lambda c: (c.num_pending, len(c.state.dead))
                        )
                        if c.num_pending or c.state.dead
                    ],
                }
            )
        return _json(body)

    async def streams(request: Request) -> Response:
        found = engine(request)
        if isinstance(found, Response):
            return found
        broker, registry = found
        return _json(
            {"streams": [_stream_row(broker, registry, n) for n in sorted(broker.streams)]}
        )

    async def stream(request: Request) -> Response:
        found = engine(request)
        if isinstance(found, Response):
            return found
        broker, registry = found
        name = request.path_params["stream"]
        if name not in broker.streams:
            return _error(404, f"no stream {name!r}")
        body = _stream_row(broker, registry, name)
        body["config"] = msgspec.to_builtins(broker.streams[name].config)
        # The furthest behind first; a page of thousands of rows helps nobody.
        listed = heapq.nsmallest(
            CONSUMER_ROWS, registry.consumers_of(name), key=lambda c: (-c.num_pending, c.name)
        )
        body["consumer_list"] = [consumer_row(c) for c in listed]
        return _json(body)

    async def messages(request: Request) -> Response:
        """A page of a stream's messages: from ``start`` (default: the newest page),
        those on ``subject`` (wildcards allowed) if given."""
        found = engine(request)
        if isinstance(found, Response):
            return found
        broker, _ = found
        name = request.path_params["stream"]
        target = broker.streams.get(name)
        if target is None:
            return _error(404, f"no stream {name!r}")
        if not gate.may_read_contents(request):
            return _error(401, "message contents need the admin's credentials")
        q = request.query_params
        limit = parse_uint(q.get("limit", "")) or 25
        limit = min(limit, PAGE_LIMIT)
        subject = q.get("subject", "")
        if subject and not is_valid_filter(subject):
            return _error(400, f"not a subject filter: {subject!r}")
        filters = (subject,) if subject else ()
        start = parse_uint(q.get("start", "")) if q.get("start") else None
        if q.get("start") and start is None:
            return _error(400, "start: expected a stream sequence")
        if start is None:
            seqs = _newest(target, filters, limit)
        else:
            seqs = []
            for seq in target.seqs_matching(max(start, 1), filters):
                seqs.append(seq)
                if len(seqs) >= limit:
                    break
        stored = await broker.read_many(target, seqs)
        out = [
            {
                "seq": m.seq,
                "subject": m.subject,
                "time": _rfc3339(m.ts),
                "headers": _headers(m.headers) if m.headers else [],
                "payload": _payload(m.data),
            }
            for m in stored
        ]
        return _json(
            {
                "stream": name,
                "first_seq": target.state.first_seq,
                "last_seq": target.state.last_seq,
                "limit": limit,
                "messages": out,
            }
        )

    async def consumer(request: Request) -> Response:
        found = engine(request)
        if isinstance(found, Response):
            return found
        _, registry = found
        c = registry.find(request.path_params["stream"], request.path_params["consumer"])
        if c is None:
            return _error(404, "no such consumer")
        body = consumer_row(c)
        body["config"] = c.config.to_dict()
        letters = []
        for letter in c.dead_messages()[:PAGE_LIMIT]:
            meta = c.stream.meta(letter.seq)
            letters.append(
                {
                    "seq": letter.seq,
                    "subject": meta.subject if meta is not None else None,
                    "deliveries": letter.deliveries,
                    "reason": letter.reason,
                    "detail": letter.detail,
                    "time": _rfc3339(letter.ts),
                }
            )
        body["dead_letters"] = letters
        body["http_owned"] = owned_by_http(c.config)
        return _json(body)

    async def dead_action(request: Request) -> Response:
        """Requeue or remove one dead letter (``{"seq": N}``) or all (``{}``), as
        ``$TETHER.API.CONSUMER.DEAD.REQUEUE|DELETE`` does."""
        refused = action_refusal(request)
        if refused is not None:
            return refused
        dead = app.dead_letters
        if dead is None:
            return _error(503, "JetStream is off: no consumers")
        operation = "REQUEUE" if request.path_params["action"] == "requeue" else "DELETE"
        stream, name = request.path_params["stream"], request.path_params["consumer"]
        try:
            result = dead.answer(operation, stream, name, await request.body())
            consumer = dead.registry.find(stream, name)
            if consumer is not None:
                await dead.registry.saved(consumer)  # 2xx once the change is stored
        except errors.ApiError as exc:
            return _error(exc.code, exc.description)
        log.info(
            "dashboard: %s dead letters of %s > %s: %s", operation.lower(), stream, name, result
        )
        return _json(result)

    # -- webhook-broker ---------------------------------------------------------------------
    async def jobs(request: Request) -> Response:
        refused = gate.view_refusal(request)
        if refused is not None:
            return refused
        service = app.webhooks
        if service is None:
            return _error(503, "JetStream is off: no webhook-broker API")
        reg = service.registry
        channels = []
        for cid in sorted(reg.channels):
            ch = reg.channels[cid]
            rows = []
            for k in service.consumers_of(cid):
                view = service.views.get((cid, k.id))
                counts = view.counts() if view is not None else {QUEUED: 0, INFLIGHT: 0, DEAD: 0}
                dead = view.dead()[:PAGE_LIMIT] if view is not None else []
                rows.append(
                    {
                        "id": k.id,
                        "name": k.name,
                        "type": k.type,
                        "callback": k.callback,
                        "queued": counts[QUEUED],
                        "inflight": counts[INFLIGHT],
                        "dead": counts[DEAD],
                        "delivered": view.delivered_count() if view is not None else 0,
                        "dead_jobs": [
                            {
                                "id": job_id(k, j.seq),
                                "seq": j.seq,
                                "retries": j.retries,
                                "changed": _rfc3339(j.changed),
                            }
                            for j in dead
                        ],
                    }
                )
            channels.append({"id": cid, "name": ch.name, "consumers": rows})
        return _json({"channels": channels})

    async def job_action(request: Request) -> Response:
        """Requeue or delete one dead job (``{"job": "<id>"}``) or all (``{}``): the
        job views' calls behind ``…/requeue-dead-job``, ``DELETE …/job/{id}`` and
        ``…/dlq``, answered once stored."""
        refused = action_refusal(request)
        if refused is not None:
            return refused
        service = app.webhooks
        if service is None:
            return _error(503, "JetStream is off: no webhook-broker API")
        cid, kid = request.path_params["channel"], request.path_params["consumer"]
        k = service.registry.consumers.get((cid, kid))
        if k is None or (cid, kid) not in service.views:
            return _error(404, "no such consumer")
        try:
            body = msgspec.json.decode(await request.body() or b"{}", type=dict[str, str])
        except msgspec.DecodeError:  # malformed JSON, or not a map of strings
            return _error(400, 'expected {"job": "<id>"} or {}')
        view = service.jobs(k)
        requeue = request.path_params["action"] == "requeue"
        job = body.get("job", "")
        if job:
            seq = next((j.seq for j in view.dead() if job_id(k, j.seq) == job), None)
            if seq is None:
                return _error(404, f"no dead job {job!r}")
            done = int(view.requeue_dead(seq) if requeue else view.delete_dead(seq))
        else:
            done = view.requeue_all_dead() if requeue else view.delete_all_dead()
        error = await service.committed(k)
        if error is not None:
            return _error(503, f"the change could not be stored ({error}): retry it")
        log.info(
            "dashboard: %s %d dead jobs of %s/%s",
            "requeued" if requeue else "deleted",
            done,
            cid,
            kid,
        )
        return _json({"requeued" if requeue else "deleted": done})

    base = "/ui/api/streams/{stream}/consumers/{consumer}"
    return [
        Route("/", root, methods=["GET"]),
        Route("/ui", root, methods=["GET"]),
        Route("/ui/", page, methods=["GET"]),
        Route("/ui/static/{name}", asset, methods=["GET"]),
        Route("/ui/api/session", session, methods=["GET"]),
        Route("/ui/api/login", login, methods=["POST"]),
        Route("/ui/api/overview", overview, methods=["GET"]),
        Route("/ui/api/streams", streams, methods=["GET"]),
        Route("/ui/api/streams/{stream}", stream, methods=["GET"]),
        Route("/ui/api/streams/{stream}/messages", messages, methods=["GET"]),
        Route(base, consumer, methods=["GET"]),
        Route(base + "/dead/{action:str}", dead_action, methods=["POST"]),
        Route("/ui/api/jobs", jobs, methods=["GET"]),
        Route("/ui/api/jobs/{channel}/{consumer}/dead/{action:str}", job_action, methods=["POST"]),
        *docs_routes(),
    ]


# -- /docs ----------------------------------------------------------------------------------------

_DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Tether HTTP API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/ui/static/docs.js"></script>
</body>
</html>
"""


def _swagger_dir() -> Path | None:
    """Swagger UI's files as the swagger-ui-bundle package ships them (no CDN): its
    ``vendor/swagger-ui-<version>`` directory, the newest if there are several."""
    try:
        vendor = Path(str(resources.files("swagger_ui_bundle") / "vendor"))
    except ModuleNotFoundError:
        return None
    found = sorted(p for p in vendor.glob("swagger-ui-*") if (p / "swagger-ui-bundle.js").is_file())
    return found[-1] if found else None


def docs_routes() -> list[BaseRoute]:
    swagger = _swagger_dir()
    digest = hashlib.sha256(_DOCS_PAGE.encode()).hexdigest()[:16]

    async def docs(request: Request) -> Response:
        if swagger is None:
            return Response(
                "the API reference needs the swagger-ui-bundle package", status_code=503
            )
        return Response(_DOCS_PAGE, media_type="text/html", headers={"etag": digest})

    async def docs_asset(request: Request) -> Response:
        name = request.path_params["name"]
        if swagger is None or name not in ("swagger-ui.css", "swagger-ui-bundle.js"):
            return Response("not found", status_code=404)
        return FileResponse(swagger / name, headers={"cache-control": "max-age=86400"})

    return [
        Route("/docs", docs, methods=["GET"]),
        Route("/docs/static/{name}", docs_asset, methods=["GET"]),
    ]
