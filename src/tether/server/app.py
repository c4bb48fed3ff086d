"""Wires storage, engine and front doors into one process."""

from __future__ import annotations

import asyncio
import logging
import signal

from starlette.applications import Starlette
from starlette.middleware import Middleware

from tether.engine.broker import Broker
from tether.engine.clock import LoopClock
from tether.engine.consumers import ConsumerRegistry
from tether.engine.jobs import ServiceSettings, WebhookService
from tether.server.config import ServerConfig
from tether.server.http import monitor, webhook_api
from tether.server.http.auth import AsgiApp, GatewayMiddleware
from tether.server.http.limits import HttpLimits
from tether.server.http.listener import HttpListener
from tether.server.nats.consumers import ConsumerApi
from tether.server.nats.jetstream import JetStreamApi
from tether.server.nats.server import NatsServer
from tether.server.nats.stream_read import StreamReadApi
from tether.server.nsq.server import NsqServer
from tether.storage import Store, open_store

log = logging.getLogger("tether")


class Tether:
    """One broker process: the NATS listener, the HTTP listener and (soon) the engine."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store_url = config.store
        self.nats = NatsServer(config)
        self.http: HttpListener | None = None
        self.http_port = 0
        self.store: Store | None = None
        self.broker: Broker | None = None
        self.jetstream: JetStreamApi | None = None
        self.consumers: ConsumerRegistry | None = None
        self.consumer_api: ConsumerApi | None = None
        self.stream_read: StreamReadApi | None = None
        self.webhooks: WebhookService | None = None
        self.webhook_front: webhook_api.WebhookFront | None = None
        self.nsq: NsqServer | None = None
        self.nsq_port = 0
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        self.store = open_store(cfg.store, sync=cfg.sync)
        await self.store.open()
        self.broker = Broker(self.store, LoopClock())
        await self.broker.load()
        self.consumers = ConsumerRegistry(self.broker)
        self.jetstream = JetStreamApi(self.nats.router, self.broker, self.consumers)
        self.consumer_api = ConsumerApi(self.jetstream, self.consumers, self.nats)
        await self.consumers.load()
        self.jetstream.start()
        self.consumer_api.start()
        self.stream_read = StreamReadApi(self.nats.router, self.broker)
        self.stream_read.start()
        self.nats.jetstream = True
        await self.nats.start()
        clock = self.broker.clock
        self.webhooks = WebhookService(
            self.broker,
            self.consumers,
            clock,
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
            log.info("Listening for NSQ clients on %s:%d", cfg.host, self.nsq_port)

        def gateway(app: AsgiApp) -> GatewayMiddleware:
            return GatewayMiddleware(
                app,
                max_body=webhook_api.max_body(cfg),
                secret=cfg.http_gateway_secret,
                tolerance=cfg.http_gateway_tolerance,
                exempt=cfg.http_gateway_exempt,
            )

        web = Starlette(
            routes=[*monitor.routes(self), *self.webhook_front.routes],
            middleware=[Middleware(gateway)],
        )
        # Broadcasts are served ahead of Starlette (same checks, same bytes).
        lean = self.webhook_front.asgi(web, gateway(web))
        limits = HttpLimits(
            max_header_bytes=cfg.http_max_header_bytes,
            max_headers=cfg.http_max_headers,
            header_timeout=cfg.http_header_timeout,
            body_timeout=cfg.http_body_timeout,
            idle_timeout=cfg.http_idle_timeout,
            max_connections=cfg.http_max_connections,
        )
        self.http = HttpListener(lean, cfg.host, cfg.http_port, limits)
        await self.http.start()
        self.http_port = self.http.port
        log.info("Starting http monitor on %s:%d", cfg.host, self.http_port)
        log.info("Listening for client connections on %s:%d", cfg.host, self.nats.port)
        log.info("Server is ready")

    async def stop(self) -> None:
        await self.nats.stop()
        if self.http is not None:
            await self.http.stop()
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
        if self.nsq is not None:
            await self.nsq.stop()
        if self.consumers is not None:
            await self.consumers.close()
        if self.broker is not None:
            self.broker.close()
        if self.store is not None:
            await self.store.close()
        self._stopped.set()

    async def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            log.info("Initiating shutdown")
            await self.stop()
            log.info("Server exiting")
