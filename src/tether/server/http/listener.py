"""Runs the HTTP API's ASGI app on uvicorn inside the broker's own event loop.

An HTTPS listener accepts its connections through :class:`TlsPort`, which answers a
plain HTTP request as Go's server does (``400``, see :mod:`tls_port`); uvicorn then
serves no socket of its own, only the protocols handed to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Generator

import uvicorn

from tether.server.http.auth import AsgiApp, Receive, Scope, Send
from tether.server.http.limits import HttpLimits, bounded_protocol
from tether.server.http.tls_port import GREETING_TIMEOUT, TlsPort
from tether.server.listen import listen_socket, show


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The broker owns SIGTERM/SIGINT and stops this listener itself.
        yield


class HttpListener:
    """An HTTP listener sharing the broker's loop; ``port`` is known after :meth:`start`."""

    def __init__(
        self,
        app: AsgiApp,
        host: str,
        port: int,
        limits: HttpLimits | None = None,
        tls: tuple[str, str] | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._app = app
        self._tls = tls  # (certificate, key): HTTPS
        self._ssl_context = ssl_context  # HTTPS with this context (client certificates...)
        self._limits = limits or HttpLimits()
        self._host = host
        self._requested_port = port if port > 0 else 0
        self.port = 0
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._tls_port: TlsPort | None = None

    async def start(self) -> None:
        try:
            sock = listen_socket(self._host, self._requested_port)
        except OSError as exc:
            # The same words whatever raced the CLI's own check for a free port.
            where = show(self._host, self._requested_port)
            raise OSError(
                exc.errno, f"cannot listen for HTTP on {where}: {exc.strerror or exc}"
            ) from None
        self.port = int(sock.getsockname()[1])
        # No X-Forwarded-* rewriting (nothing reads the client address or scheme), no
        # access log; httptools (with Tether's limits, see limits.py) and the broker's loop
        # (uvloop) as everywhere.
        config = uvicorn.Config(
            self._serve,
            interface="asgi3",
            log_level="warning",
            lifespan="off",
            access_log=False,
            loop="none",
            port=self.port,  # only for uvicorn's own start message: the socket is given
            http=bounded_protocol(self._limits),
            proxy_headers=False,
            server_header=False,  # Go's servers (nats-server, nsqd, webhook-broker) send none
            timeout_keep_alive=int(max(1, self._limits.idle_timeout)),
            limit_concurrency=self._limits.max_connections,
            ssl_certfile=self._tls[0] if self._tls else None,
            ssl_keyfile=self._tls[1] if self._tls else None,
        )
        config.load()  # what serve() would do: uvicorn's TLS context, if any, is made here
        context = self._ssl_context or config.ssl
        config.ssl = None  # TLS is the TlsPort's
        self._server = server = _EmbeddedServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[] if context else [sock]))
        while not server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises the startup error
                raise RuntimeError("HTTP listener stopped during startup")
            await asyncio.sleep(0.005)
        if context is not None:

            def protocol() -> asyncio.Protocol:
                # What uvicorn's own create_server would make for a connection.
                made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=server.server_state, app_state=server.lifespan.state
                )
                return made

            # Until its handshake is done a connection gets nats-server's 5 s (the request
            # head then gets header_timeout, as on a plain port).
            self._tls_port = TlsPort(
                sock,
                context,
                protocol,
                timeout=min(GREETING_TIMEOUT, self._limits.header_timeout),
                max_pending=self._limits.max_connections,
            )
            self._tls_port.start()

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def replace_app(self, app: AsgiApp) -> None:
        """Serve ``app`` from now on; requests already running finish with the old one."""
        self._app = app

    async def stop(self) -> None:
        if self._tls_port is not None:
            await self._tls_port.stop()
            self._tls_port = None
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server = None
        self._task = None
