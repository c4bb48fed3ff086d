"""The NSQ front door: listens for NSQ clients (nsqd's TCP port) and holds its settings."""

from __future__ import annotations

import asyncio
import logging
import time

from tether.engine.broker import Broker
from tether.engine.consumers import ConsumerRegistry
from tether.engine.nsq import NsqService, NsqSettings
from tether.protocol.nsq.parser import Limits
from tether.server.config import ServerConfig
from tether.server.nsq.connection import NsqConnection
from tether.server.nsq.identify import ServerLimits
from tether.server.nsq.tls import nsq_tls

log = logging.getLogger("tether.nsq")

NS = 1_000_000_000


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class NsqServer:
    """Accepts NSQ clients; the model behind them is :class:`NsqService`."""

    def __init__(self, config: ServerConfig, broker: Broker, consumers: ConsumerRegistry) -> None:
        self.config = config
        self.broker = broker
        self.service = NsqService(
            broker,
            consumers,
            NsqSettings(
                msg_timeout_ns=int(config.nsq_msg_timeout * NS),
                max_msg_timeout_ns=int(config.nsq_max_msg_timeout * NS),
                mem_queue_size=config.nsq_mem_queue_size,
            ),
        )
        self.limits = ServerLimits(
            max_rdy_count=config.nsq_max_rdy_count,
            msg_timeout_ms=_ms(config.nsq_msg_timeout),
            max_msg_timeout_ms=_ms(config.nsq_max_msg_timeout),
            heartbeat_interval_ms=_ms(config.nsq_heartbeat_interval),
            max_heartbeat_interval_ms=_ms(config.nsq_max_heartbeat_interval),
            max_output_buffer_size=config.nsq_max_output_buffer_size,
            max_output_buffer_timeout_ms=_ms(config.nsq_max_output_buffer_timeout),
            deflate=config.nsq_deflate,
            max_deflate_level=config.nsq_max_deflate_level,
            snappy=config.nsq_snappy,
            auth_required=config.auth_required,
        )
        self.parser_limits = Limits(
            max_msg_size=config.nsq_max_msg_size,
            max_body_size=config.nsq_max_body_size,
            max_req_timeout_ms=_ms(config.nsq_max_req_timeout),
        )
        self.tls_context = nsq_tls(config)
        self.connections: dict[int, NsqConnection] = {}
        self.total_connections = 0
        self.slow_consumers = 0
        self.started_at = time.time()
        self.port = 0
        self._next_cid = 0
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        await self.service.start()
        loop = asyncio.get_running_loop()
        port = self.config.nsq_port if self.config.nsq_port > 0 else 0
        self._listener = await loop.create_server(
            self._new_connection, self.config.host, port, reuse_address=True, backlog=1024
        )
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections.values()):
            conn.flush_now()
            if conn.transport is not None:
                conn.transport.close()
        deadline = time.monotonic() + 2.0
        while self.connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # bounded wait for the peers to take their last bytes
        for conn in list(self.connections.values()):
            if conn.transport is not None:
                conn.transport.abort()
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        self.service.stop()

    def _new_connection(self) -> NsqConnection:
        self._next_cid += 1
        return NsqConnection(self, self._next_cid)

    def admit(self, conn: NsqConnection) -> bool:
        if len(self.connections) >= self.config.max_connections:
            log.warning("nsq: too many connections (%d)", len(self.connections))
            return False
        self.connections[conn.cid] = conn
        self.total_connections += 1
        return True

    def remove(self, conn: NsqConnection) -> None:
        self.connections.pop(conn.cid, None)
