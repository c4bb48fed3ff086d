"""The NATS front door: listens for clients and holds the core routing state."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import secrets
import string
import time
from collections.abc import Callable
from typing import Any

from tether.protocol.nats.commands import encode_info
from tether.server.config import ServerConfig
from tether.server.listen import bare_host, listen_socket, show
from tether.server.nats.auth.users import Authenticator
from tether.server.nats.connection import ClientConnection
from tether.server.nats.router import Router
from tether.server.nats.tls import UpgradingConnection, client_tls, websocket_tls
from tether.server.nats.websocket import WebSocketClient, WebSocketProtocol, WebSocketSettings
from tether.version import NATS_COMPAT_VERSION, __version__

log = logging.getLogger("tether.nats")

_ID_ALPHABET = string.ascii_uppercase + string.digits


def new_server_id() -> str:
    # Same shape as nats-server's public-key ids: 'N' + 55 base32-ish characters.
    return "N" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(55))


class NatsServer:
    """Accepts NATS client connections and routes their messages."""

    def __init__(self, config: ServerConfig, router: Router | None = None) -> None:
        self.config = config
        self.router = router or Router()
        self.authenticator = Authenticator(config)  # ValueError: settings that cannot work
        self.tls = client_tls(config)  # ValueError: a certificate or key that does not load
        self.ws_tls = websocket_tls(config)
        self.ws_port = 0
        self._ws_listener: asyncio.Server | None = None
        self.server_id = new_server_id()
        self.server_name = config.server_name or self.server_id
        self.host = bare_host(config.host)
        self.jetstream = False
        self.connections: dict[int, ClientConnection] = {}
        self.total_connections = 0
        self.slow_consumers = 0
        # What the clients' transports hold, summed as each was last seen (connection.py
        # keeps it; over_budget measures again before cutting anyone off).
        self.pending_total = 0
        self.started_at = time.time()
        self.port = 0
        self._next_cid = 0
        self._listener: asyncio.Server | None = None
        self._interest_watchers: list[Callable[[str], None]] = []
        self._closed_in_msgs = 0
        self._closed_in_bytes = 0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        port = self.config.port if self.config.port > 0 else 0
        sock = listen_socket(self.host, port)
        try:
            if self.tls is not None and self.config.tls_handshake_first:
                # TLS from the first byte: INFO goes inside it (tls.py has the other way).
                timeout = self.config.tls_timeout
                self._listener = await loop.create_server(
                    self._new_connection,
                    sock=sock,
                    ssl=self.tls,
                    ssl_handshake_timeout=timeout if timeout > 0 else None,
                )
            else:
                self._listener = await loop.create_server(self._new_connection, sock=sock)
        except BaseException:
            sock.close()
            raise
        self.port = int(sock.getsockname()[1])
        if self.config.ws_port:
            await self._start_websocket(loop)

    async def _start_websocket(self, loop: asyncio.AbstractEventLoop) -> None:
        """The WebSocket listener: the same clients, framed (websocket.py)."""
        settings = WebSocketSettings(self.config, self.ws_tls is not None)
        port = self.config.ws_port if self.config.ws_port > 0 else 0
        sock = listen_socket(self.host, port)
        try:
            self._ws_listener = await loop.create_server(
                lambda: WebSocketProtocol(settings, self._new_ws_client),
                sock=sock,
                ssl=self.ws_tls,
            )
        except BaseException:
            sock.close()
            raise
        self.ws_port = int(sock.getsockname()[1])
        scheme = "wss" if self.ws_tls is not None else "ws"
        log.info(
            "Listening for websocket clients on %s://%s", scheme, show(self.host, self.ws_port)
        )

    def _new_ws_client(self) -> ClientConnection:
        self._next_cid += 1
        return WebSocketClient(self, self._next_cid)

    def stop_accepting(self) -> None:
        """Close the listener; connected clients stay (lame duck mode)."""
        if self._listener is not None:
            self._listener.close()
        if self._ws_listener is not None:
            self._ws_listener.close()

    def announce_lame_duck(self) -> None:
        """Tell every client that takes async INFOs that this server is going away: its
        INFO again, with ``"ldm": true`` (nats.py calls its ``lame_duck_mode_cb``)."""
        for conn in list(self.connections.values()):
            if conn.takes_async_info:
                info = self.info_for(conn)
                info["ldm"] = True
                conn.write(encode_info(info))

    async def close_spread(self, span: float) -> None:
        """Close every client (no ``-ERR``), spread over ``span`` seconds as nats-server
        does in lame duck mode: between two closes a random pause in [si/2, si], where
        si is ``span`` over the number of clients, at most one second."""
        conns = sorted(self.connections.values(), key=lambda c: c.cid)
        if not conns:
            return
        si = min((span if span > 0 else 1.0) / len(conns), 1.0)
        # Thousands of clients: a few closes per pause, at the same pace overall.
        batch = max(1, math.ceil(0.001 / si))
        for i, conn in enumerate(conns):
            conn.flush_now()
            conn.close(linger=False)
            if i == len(conns) - 1:
                break
            if (i + 1) % batch == 0:
                await asyncio.sleep(random.uniform(si / 2, si) * batch)

    async def stop(self) -> None:
        """Stop accepting, flush what each client is owed, then close every connection."""
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections.values()):
            conn.flush_now()
            conn.close(linger=False)
        deadline = time.monotonic() + 2.0
        while self.connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # bounded wait for the peers to take their last bytes
        for conn in list(self.connections.values()):
            if conn.transport is not None:
                conn.transport.abort()
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        if self._ws_listener is not None:
            self._ws_listener.close()
            await self._ws_listener.wait_closed()
            self._ws_listener = None

    def _new_connection(self) -> ClientConnection:
        self._next_cid += 1
        if self.tls is not None and not self.config.tls_handshake_first:
            conn = UpgradingConnection(self, self._next_cid)
            conn.tls_context = self.tls
            return conn
        return ClientConnection(self, self._next_cid)

    # -- connection bookkeeping ----------------------------------------------------------
    def admit(self, conn: ClientConnection) -> bool:
        if len(self.connections) >= self.config.max_connections:
            return False
        self.connections[conn.cid] = conn
        self.total_connections += 1
        return True

    def remove(self, conn: ClientConnection) -> None:
        if self.connections.pop(conn.cid, None) is not None:
            self._closed_in_msgs += conn.in_msgs
            self._closed_in_bytes += conn.in_bytes
            self.router.out_msgs += conn.out_msgs
            self.router.out_bytes += conn.out_bytes

    def over_budget(self) -> None:
        """The clients together hold more outbound bytes than ``max_pending_total``.

        Measured again first (a client that drained without writing since may still
        count), then the largest backlogs are cut off as slow consumers, largest first,
        until the rest fits: each client is bounded by ``max_pending``, the process by
        this, and a client that keeps up holds nothing, so it is never the one cut.
        """
        limit = self.config.max_pending_total
        backlogs: list[tuple[int, ClientConnection]] = []
        total = 0
        for conn in self.connections.values():
            held = conn.measure_buffered()
            if held:
                backlogs.append((held, conn))
                total += held
        self.pending_total = total
        if total <= limit:
            return
        backlogs.sort(key=lambda item: item[0], reverse=True)
        why = f"the clients hold more than {limit} bytes pending together"
        for held, conn in backlogs:
            if self.pending_total <= limit:
                break
            conn.cut_off(f"{held} bytes pending; {why}")

    def info_for(self, conn: ClientConnection, *, connect_info: bool = False) -> dict[str, Any]:
        """The INFO a client gets, with nats-server's keys in nats-server's order."""
        info: dict[str, Any] = {
            "server_id": self.server_id,
            "server_name": self.server_name,
            "version": NATS_COMPAT_VERSION,
            "proto": 1,
            "go": f"tether/{__version__}",
            "host": self.host,
            "port": self.port,
            "headers": True,
        }
        if self.config.auth_required and self.config.no_auth_user is None:
            info["auth_required"] = True
        if isinstance(conn, WebSocketClient):
            # The WebSocket listener's address and TLS, as nats-server says them.
            info["port"] = self.ws_port
            if self.ws_tls is not None:
                info["tls_required"] = True
        elif self.tls is not None:
            info["tls_required"] = True
            if self.config.tls_verify or self.config.tls_verify_and_map:
                info["tls_verify"] = True
        info["max_payload"] = self.config.max_payload
        if self.jetstream:
            info["jetstream"] = True
        info["client_id"] = conn.cid
        info["client_ip"] = conn.remote[0]
        if conn.nonce and not connect_info:
            info["nonce"] = conn.nonce
        if self.config.connect_urls:
            # Where clients may reconnect: this node and its standbys (docs/deployment.md).
            info["connect_urls"] = [url.removeprefix("nats://") for url in self.config.connect_urls]
        if connect_info:
            # Sent after the first PONG: the connection is established, in the global account.
            info["connect_info"] = True
            info["remote_account"] = "$G"
        return info

    # -- interest --------------------------------------------------------------------------
    def watch_interest(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(subject)`` whenever a client subscription is added or removed."""
        self._interest_watchers.append(callback)

    def on_interest_change(self, subject: str) -> None:
        for callback in self._interest_watchers:
            callback(subject)

    # -- statistics --------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        in_msgs = self._closed_in_msgs + sum(c.in_msgs for c in self.connections.values())
        in_bytes = self._closed_in_bytes + sum(c.in_bytes for c in self.connections.values())
        return {
            "connections": len(self.connections),
            "total_connections": self.total_connections,
            "in_msgs": in_msgs,
            "in_bytes": in_bytes,
            "out_msgs": self.router.out_msgs + sum(c.out_msgs for c in self.connections.values()),
            "out_bytes": self.router.out_bytes
            + sum(c.out_bytes for c in self.connections.values()),
            "subscriptions": len(self.router.index),
            "slow_consumers": self.slow_consumers,
            # Outbound bytes not yet written to the clients' sockets, all together, and
            # their bound (each client's is max_pending; /connz has each one's).
            "pending_bytes": sum(c.pending_bytes for c in self.connections.values()),
            "max_pending_total": self.config.max_pending_total,
        }
