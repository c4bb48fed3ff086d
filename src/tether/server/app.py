"""Wires storage, engine and front doors into one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from tether.engine.broker import Broker
from tether.engine.clock import LoopClock
from tether.engine.consumers import ConsumerRegistry
from tether.engine.jobs import ServiceSettings, WebhookService
from tether.engine.limits import (
    DEFAULT_MAX_CONSUMERS,
    ServerLimits,
    default_max_memory,
    default_max_storage,
)
from tether.engine.sourcing import SourcingService
from tether.server import banner
from tether.server.config import ServerConfig
from tether.server.http import dashboard, monitor, prometheus, webhook_api
from tether.server.http.auth import AsgiApp, GatewayMiddleware, Receive, Scope, Send
from tether.server.http.common import text
from tether.server.http.limits import HttpLimits
from tether.server.http.listener import HttpListener
from tether.server.listen import show
from tether.server.nats.api_export import ApiExport, parse_exports
from tether.server.nats.consumers import ConsumerApi
from tether.server.nats.dead_letters import DeadLetterApi
from tether.server.nats.jetstream import API_PREFIX, JetStreamApi
from tether.server.nats.remote_origins import RemoteStreams, parse_routes
from tether.server.nats.server import NatsServer
from tether.server.nats.stream_read import StreamReadApi
from tether.server.nsq.http_api import NsqHttp
from tether.server.nsq.http_common import respond
from tether.server.nsq.lookupd import Lookupd
from tether.server.nsq.server import NsqServer
from tether.server.nsq.tls import client_tls as nsq_client_tls
from tether.server.standby import readyz_route, standby_app
from tether.storage import Store, open_store
from tether.storage.postgres import redact

if TYPE_CHECKING:
    from tether.storage.leadership import Leadership

log = logging.getLogger("tether")

JETSTREAM_OFF = (
    "JetStream is disabled (jetstream = false): no streams, so no webhook-broker API either"
)
LAME_DUCK = "The server is shutting down (lame duck mode): the webhook-broker API is closed"
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
STEPPED_DOWN = 3  # exit status of a node that stopped being active (docs/deployment.md)


class Tether:
    """One broker process: the NATS listener, the HTTP listener and (soon) the engine."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        # Shown in /varz and logs: without a PostgreSQL URL's password.
        self.store_url = redact(config.store) if is_postgres(config.store) else config.store
        self.nats = NatsServer(config)
        self.http: HttpListener | None = None
        self.http_port = 0
        self.store: Store | None = None
        self.broker: Broker | None = None
        self.jetstream: JetStreamApi | None = None
        self.sourcing: SourcingService | None = None
        self.api_exports: list[ApiExport] = []
        self.consumers: ConsumerRegistry | None = None
        self.consumer_api: ConsumerApi | None = None
        self.stream_read: StreamReadApi | None = None
        self.dead_letters: DeadLetterApi | None = None
        self.webhooks: WebhookService | None = None
        self.webhook_front: webhook_api.WebhookFront | None = None
        self.nsq: NsqServer | None = None
        self.nsq_port = 0
        self.lookupd: Lookupd | None = None
        self.lookupd_http: HttpListener | None = None
        self.lookupd_http_port = 0
        self.nsq_https: HttpListener | None = None  # nsqd's --https-address
        self.nsq_https_port = 0
        self._stopped = asyncio.Event()
        self._engine_running = False
        # Over PostgreSQL (docs/deployment.md): this node's role, None on other stores.
        self.leadership: Leadership | None = None
        self.role: str | None = None
        self.stepped_down: str | None = None  # why this node stopped being active
        self._request_stop: Callable[[], None] | None = None

    async def start(self) -> None:
        cfg = self.config
        banner.announce(cfg)
        if not await self._become_active(None):
            return
        if cfg.jetstream:
            await self._start_engine()
        await self.nats.start()
        if self.webhook_front is not None:
            web = Starlette(
                routes=[
                    *self._observe_routes(),
                    *monitor.routes(self),
                    readyz_route(lambda: self.role),
                    *self.webhook_front.routes,
                ],
                middleware=[Middleware(self._gateway)],
            )
            # Broadcasts are served ahead of Starlette (same checks, same bytes).
            front: AsgiApp = self.webhook_front.asgi(web, self._gateway(web))
        else:
            front = self._without_engine(JETSTREAM_OFF)
        front = self._nsq_http(front)
        limits = self._http_limits()
        if self.http is not None:  # a former standby's: the same port, the full app now
            self.http.replace_app(front)
        else:
            await self._start_http(front)
        await self._start_lookupd(limits)
        await self._start_nsq_https(limits)
        if cfg.ui:
            log.info("Dashboard on http://%s/ui/", show(cfg.host, self.http_port))
        log.info("Listening for client connections on %s", show(cfg.host, self.nats.port))
        log.info("Server is ready")

    def _http_limits(self) -> HttpLimits:
        cfg = self.config
        return HttpLimits(
            max_header_bytes=cfg.http_max_header_bytes,
            max_headers=cfg.http_max_headers,
            header_timeout=cfg.http_header_timeout,
            body_timeout=cfg.http_body_timeout,
            idle_timeout=cfg.http_idle_timeout,
            max_connections=cfg.http_max_connections,
        )

    async def _start_http(self, front: AsgiApp) -> None:
        cfg = self.config
        https = (
            (cfg.tls_cert, cfg.tls_key) if cfg.http_tls and cfg.tls_cert and cfg.tls_key else None
        )
        self.http = HttpListener(front, cfg.host, cfg.http_port, self._http_limits(), https)
        await self.http.start()
        self.http_port = self.http.port
        scheme = "https" if https is not None else "http"
        log.info("Starting %s monitor on %s", scheme, show(cfg.host, self.http_port))

    async def _become_active(self, stopping: asyncio.Event | None) -> bool:
        """Over PostgreSQL: wait as a standby (HTTP answering /healthz and /readyz, no
        client listener) until this node holds the leader lock. False: ``stopping``
        was set first. Other stores: True at once."""
        cfg = self.config
        if self.leadership is not None or not cfg.jetstream or not is_postgres(cfg.store):
            return True
        from tether.storage.leadership import Leadership

        self.leadership = Leadership(
            cfg.store,
            poll_interval=cfg.ha_poll_interval,
            session_timeout=cfg.ha_session_timeout,
            keepalive=cfg.postgres_keepalive,
            node=self.nats.server_name,
        )
        self.role = "standby"
        await self._start_http(standby_app(lambda: self.role))
        if await self.leadership.acquire(stopping) is None:
            return False
        self.role = "active"
        self.leadership.watch(self._step_down)
        return True

    def _step_down(self, why: str) -> None:
        """This node is not the leader any more: stop serving and exit (a supervisor
        restarts it as a standby)."""
        if self.stepped_down is not None:
            return
        self.stepped_down = why
        self.role = "stopped"
        log.error("Stepping down, this node is not active any more: %s", why)
        if self._request_stop is not None:
            self._request_stop()

    def _fencing(self) -> dict[str, Any]:
        """The PostgreSQL store's fencing settings, once this node is active."""
        lead = self.leadership
        if lead is None or lead.epoch is None:
            return {}
        return {
            "epoch": lead.epoch,
            "on_fenced": lambda fenced: self._step_down(str(fenced)),
            "keepalive": lead.keepalive,
            "writer_options": lead.writer_options,
        }

    async def _start_engine(self) -> None:
        """Storage, the engine and its front doors: JetStream over NATS and the
        webhook-broker HTTP API."""
        cfg = self.config
        self.store = open_store(cfg.store, sync=cfg.sync, **self._fencing())
        await self.store.open()
        self.broker = Broker(self.store, LoopClock())
        broker = self.broker
        broker.set_limits(jetstream_limits(cfg))
        banner.announce_limits(broker.limits)
        async with banner.loading("the store", banner.load_progress(broker.loaded)):
            await broker.load()
        self.consumers = ConsumerRegistry(self.broker)
        self.jetstream = JetStreamApi(self.nats.router, self.broker, self.consumers)
        self.jetstream.server_id = self.nats.server_id
        self.consumer_api = ConsumerApi(self.jetstream, self.consumers, self.nats)
        await self.consumers.load()
        self.jetstream.start()
        self.consumer_api.start()
        routes = parse_routes(cfg.js_external_origins)
        self.sourcing = SourcingService(self.broker, RemoteStreams(routes))
        for prefix, urls in parse_exports(cfg.js_api_exports):
            export = ApiExport(self.nats.router, prefix, urls)
            export.start()
            self.api_exports.append(export)
        self.jetstream.sourcing = self.sourcing
        await self.sourcing.start()
        self.stream_read = StreamReadApi(self.nats.router, self.broker)
        self.stream_read.start()
        self.dead_letters = DeadLetterApi(self.nats.router, self.consumers)
        self.dead_letters.start()
        self.nats.jetstream = True
        self.webhooks = WebhookService(
            self.broker,
            self.consumers,
            self.broker.clock,
            ServiceSettings(webhook_api.job_settings(cfg), cfg.webhook_token_key),
        )
        await self.webhooks.start()
        self.webhook_front = webhook_api.build(self.webhooks, cfg)
        await webhook_api.apply_seed(self.webhooks, cfg.webhook_seed)
        self.webhook_front.start()
        if cfg.nsq_port:
            self.nsq = NsqServer(cfg, self.broker, self.consumers)
            await self.nsq.start()
            self.nsq_port = self.nsq.port
            log.info("Listening for NSQ clients on %s", show(cfg.host, self.nsq_port))
        self._engine_running = True

    def _nsq_http(self, front: AsgiApp) -> AsgiApp:
        """nsqd's and nsqlookupd's HTTP routes in front of the rest (docs/nsq.md)."""
        if self.nsq is None:
            return front
        cfg = self.config
        self.lookupd = Lookupd(
            lambda: nsq_http.node_view(),
            cfg.nsq_lookupd_peers,
            cfg.nsq_lookupd_poll_interval,
            client_tls=nsq_client_tls(cfg),
        )
        nsq_http = NsqHttp(
            front,
            self.nsq,
            self.lookupd,
            lambda: self.http_port,
            self._gateway(front),
            nats_port=lambda: self.nats.port,
            https_port=lambda: self.nsq_https_port,
            over_tls=cfg.http_tls,
        )
        return nsq_http

    async def _start_lookupd(self, limits: HttpLimits) -> None:
        """Peer polling, and nsqlookupd's routes alone on their own port if asked."""
        if self.lookupd is None or self.nsq is None:
            return
        self.lookupd.start()
        cfg = self.config
        if cfg.nsq_lookupd_http_port:
            alone = NsqHttp(
                _not_found, self.nsq, self.lookupd, lambda: self.http_port, lookupd_only=True
            )
            self.lookupd_http = HttpListener(alone, cfg.host, cfg.nsq_lookupd_http_port, limits)
            await self.lookupd_http.start()
            self.lookupd_http_port = self.lookupd_http.port
            log.info(
                "Listening for nsqlookupd queries on %s", show(cfg.host, self.lookupd_http_port)
            )

    async def _start_nsq_https(self, limits: HttpLimits) -> None:
        """nsqd's HTTP API alone over TLS, with the NSQ certificate (nsqd's
        ``--https-address``)."""
        cfg = self.config
        if self.nsq is None or self.lookupd is None or not cfg.nsq_https_port:
            return
        if self.nsq.tls_context is None:  # the configuration check refuses this
            return
        app = NsqHttp(
            _not_found,
            self.nsq,
            self.lookupd,
            lambda: self.http_port,
            self._gateway(_not_found),
            nats_port=lambda: self.nats.port,
            https_port=lambda: self.nsq_https_port,
            nsqd_only=True,
            over_tls=True,
        )
        self.nsq_https = HttpListener(
            app, cfg.host, cfg.nsq_https_port, limits, ssl_context=self.nsq.tls_context
        )
        await self.nsq_https.start()
        self.nsq_https_port = self.nsq_https.port
        log.info("Listening for nsqd's HTTPS API on %s", show(cfg.host, self.nsq_https_port))

    def _gateway(self, app: AsgiApp) -> GatewayMiddleware:
        cfg = self.config
        # The dashboard checks its own credentials (server/http/dashboard.py).
        ui = ["/ui", "/docs"] if cfg.ui else []
        return GatewayMiddleware(
            app,
            max_body=webhook_api.max_body(cfg),
            secret=cfg.http_gateway_secret,
            tolerance=cfg.http_gateway_tolerance,
            # /readyz too: load balancers and readiness probes sign nothing.
            exempt=[*cfg.http_gateway_exempt, *ui, "/readyz"],
        )

    def _observe_routes(self) -> list[BaseRoute]:
        """``/metrics``, and the dashboard and ``/docs`` unless ``ui = false``."""
        found: list[BaseRoute] = [*prometheus.routes(self)]
        if self.config.ui:
            found += dashboard.routes(self)
        return found

    def _without_engine(self, why: str) -> AsgiApp:
        """The HTTP app while the engine is off: the monitoring endpoints, and ``503`` with
        ``why`` for every other path (the webhook-broker API needs the engine)."""

        async def unavailable(request: Request) -> Response:
            return text(503, why)

        return Starlette(
            routes=[
                *self._observe_routes(),
                *monitor.routes(self),
                Route("/{path:path}", unavailable, methods=_METHODS),
            ],
            middleware=[Middleware(self._gateway)],
        )

    async def stop(self) -> None:
        """Shut down: waiting pull requests hear ``409 Server Shutdown`` first (as from
        nats-server, so clients pull again once reconnected), then the clients are closed
        and everything is saved."""
        await self._release_pulls(tell=True)
        await self.nats.stop()
        if self.http is not None:
            await self.http.stop()
        if self.lookupd_http is not None:
            await self.lookupd_http.stop()
        if self.nsq_https is not None:
            await self.nsq_https.stop()
        if self.lookupd is not None:
            await self.lookupd.stop()
        await self._stop_engine()
        if self.broker is not None:
            self.broker.close()
        if self.store is not None:
            await self.store.close()
        if self.leadership is not None:
            await self.leadership.close()  # the lock goes: a standby takes over at once
        self._stopped.set()

    async def _release_pulls(self, *, tell: bool) -> None:
        registry, api = self.consumers, self.consumer_api
        if not self._engine_running or registry is None:
            return
        pulls = [c for c in registry.all() if c.is_pull and c.waiting]
        for consumer in pulls:
            consumer.release_requests(tell=tell)
        if tell and api is not None:
            # A status queued behind a slow read goes out before the connection closes.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 1.0
            while any(api.backlog(c) for c in pulls) and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    async def _stop_engine(self) -> None:
        """Stop the engine's front doors and save every consumer's state (once)."""
        if not self._engine_running:
            return
        self._engine_running = False
        if self.sourcing is not None:
            await self.sourcing.stop()
        for export in self.api_exports:
            await export.stop()
        self.api_exports.clear()
        if self.webhook_front is not None:
            await self.webhook_front.stop()
        if self.webhooks is not None:
            self.webhooks.stop()
        if self.jetstream is not None:
            await self.jetstream.stop()
        if self.consumer_api is not None:
            await self.consumer_api.stop()
        if self.stream_read is not None:
            await self.stream_read.stop()
        if self.dead_letters is not None:
            await self.dead_letters.stop()
        if self.nsq is not None:
            await self.nsq.stop()
        if self.consumers is not None:
            await self.consumers.close()

    async def lame_duck(self) -> None:
        """Lame duck mode, as nats-server's: stop accepting clients, stop JetStream at
        once (waiting pull requests are dropped without a status, ``$JS.API`` requests
        get no reply), tell the clients (INFO ``"ldm": true``), wait the grace period,
        then close them one by one over the rest of ``lame_duck_duration``. The caller
        shuts down when this returns; with no clients it returns at once."""
        cfg = self.config
        log.info("Entering lame duck mode, stop accepting new clients")
        self.nats.stop_accepting()
        if self._engine_running:
            log.info("Initiating JetStream Shutdown...")
            await self._release_pulls(tell=False)
            if self.http is not None:
                self.http.replace_app(self._without_engine(LAME_DUCK))
            await self._stop_engine()
            # nats-server still imports $JS.API.> into the account: requests find a
            # subscriber that never answers, so they time out rather than get a 503.
            self.nats.router.subscribe_internal(API_PREFIX + ">", _no_reply)
            log.info("JetStream Shutdown")
        if not self.nats.connections:
            return
        self.nats.announce_lame_duck()
        await asyncio.sleep(cfg.lame_duck_grace_period)
        log.info("Closing existing clients")
        await self.nats.close_spread(cfg.lame_duck_duration - cfg.lame_duck_grace_period)

    async def run_until_signalled(self) -> None:
        """Serve until a signal, as nats-server: SIGTERM or SIGINT shut down now, SIGUSR2
        enters lame duck mode and shuts down at its end (SIGTERM is then ignored)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        lame_duck: asyncio.Task[None] | None = None

        def on_term() -> None:
            if lame_duck is None:
                stop.set()
            else:
                log.info("Trapped terminated signal: ignored in lame duck mode")

        def on_lame_duck() -> None:
            nonlocal lame_duck
            if lame_duck is None and not stop.is_set():
                lame_duck = asyncio.ensure_future(self.lame_duck())
                lame_duck.add_done_callback(lambda _: stop.set())

        handlers: dict[int, Callable[[], None]] = {signal.SIGTERM: on_term, signal.SIGINT: stop.set}
        usr2 = getattr(signal, "SIGUSR2", None)
        if usr2 is not None:
            handlers[usr2] = on_lame_duck
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        pid_file = _write_pid_file(self.config.pid_file)
        self._request_stop = stop.set
        try:
            if await self._become_active(stop):
                await self.start()
            try:
                await stop.wait()
            finally:
                for sig in handlers:
                    loop.remove_signal_handler(sig)
                if lame_duck is not None:
                    if not lame_duck.done():
                        lame_duck.cancel()  # SIGINT in lame duck mode: shut down now
                    with contextlib.suppress(asyncio.CancelledError):
                        try:
                            await lame_duck
                        except Exception:
                            log.exception("lame duck mode failed")
                log.info("Initiating shutdown")
                await self.stop()
                log.info("Server exiting")
        finally:
            if pid_file is not None:
                pid_file.unlink(missing_ok=True)
        if self.stepped_down is not None:
            raise SystemExit(STEPPED_DOWN)


def is_postgres(store: str) -> bool:
    return store.partition(":")[0] in ("postgres", "postgresql")


def _write_pid_file(name: str | None) -> Path | None:
    """nats-server's pid_file: the process id while the server runs (before anything is
    opened, so a path that cannot be written stops the start)."""
    if not name:
        return None
    path = Path(name)
    path.write_text(str(os.getpid()))  # no newline, as nats-server writes it
    return path


def _no_reply(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
    return None


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """nsqlookupd's answer to a path it does not have."""
    await respond(send, 404, "NOT_FOUND")


def jetstream_limits(cfg: ServerConfig) -> ServerLimits:
    """The engine's JetStream limits from the settings (nats-server's jetstream block),
    the sizes left unset (-1) worked out as nats-server works them out: from the RAM
    and from the disk holding the store, once, at start (the store's own files
    counted as free, and the RAM's share halved between the two for a store in
    memory: see engine/limits.py)."""
    ns = 1_000_000_000
    memory_only = cfg.store == "memory"
    max_memory = cfg.max_memory_store
    if max_memory < 0:
        max_memory = default_max_memory(memory_only=memory_only)
    max_storage = cfg.max_file_store
    if max_storage < 0:
        directory = _store_directory(cfg.store)
        files = () if directory is None else _store_files(directory)
        max_storage = default_max_storage(directory, memory_only, files)
    return ServerLimits(
        max_memory=max_memory,
        max_storage=max_storage,
        max_ack_pending=cfg.js_max_ack_pending,
        max_request_batch=cfg.js_max_request_batch,
        duplicate_window_ns=round(cfg.js_duplicate_window * ns),
        # 0: nats-server's default (1000); -1: no bound
        default_max_consumers=cfg.js_default_max_consumers or DEFAULT_MAX_CONSUMERS,
        batch_inflight_per_stream=cfg.js_batch_max_inflight_per_stream,
        batch_inflight_total=cfg.js_batch_max_inflight_total,
        batch_max_msgs=cfg.js_batch_max_msgs,
        batch_timeout_ns=round(cfg.js_batch_timeout * ns),
    )


def _store_files(directory: str) -> list[Path]:
    """The files a ``sqlite:DIR`` store keeps there: its database and its write-ahead
    log (their bytes are the store's to reuse, so they count as available)."""
    from tether.storage.sqlite import DB_FILENAME, WAL_SUFFIX  # a SQLite store's names

    database = Path(directory) / DB_FILENAME
    return [database, database.with_name(DB_FILENAME + WAL_SUFFIX)]


def _store_directory(url: str) -> str | None:
    """The local directory of a ``sqlite:DIR`` store (the forms open_store takes);
    None for a store with none."""
    scheme, _, rest = url.partition(":")
    if scheme != "sqlite":
        return None
    return rest[2:] if rest.startswith("//") else rest
