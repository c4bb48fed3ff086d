"""Wires storage, engine and front doors into one process."""

from __future__ import annotations

import asyncio
import logging
import signal

from starlette.applications import Starlette

from tether.engine.broker import Broker
from tether.engine.clock import LoopClock
from tether.server.config import ServerConfig
from tether.server.http import monitor
from tether.server.http.listener import HttpListener
from tether.server.nats.jetstream import JetStreamApi
from tether.server.nats.server import NatsServer
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
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        self.store = open_store(cfg.store, sync=cfg.sync)
        await self.store.open()
        self.broker = Broker(self.store, LoopClock())
        await self.broker.load()
        self.jetstream = JetStreamApi(self.nats.router, self.broker)
        self.jetstream.start()
        self.nats.jetstream = True
        await self.nats.start()
        web = Starlette(routes=monitor.routes(self))
        self.http = HttpListener(web, cfg.host, cfg.http_port)
        await self.http.start()
        self.http_port = self.http.port
        log.info("Starting http monitor on %s:%d", cfg.host, self.http_port)
        log.info("Listening for client connections on %s:%d", cfg.host, self.nats.port)
        log.info("Server is ready")

    async def stop(self) -> None:
        await self.nats.stop()
        if self.http is not None:
            await self.http.stop()
        if self.jetstream is not None:
            await self.jetstream.stop()
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
