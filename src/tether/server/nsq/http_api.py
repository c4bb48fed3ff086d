"""nsqd's HTTP API on Tether's HTTP port, and nsqlookupd's beside it.

:class:`NsqHttp` is an ASGI app placed in front of the rest of the HTTP API: a request
whose method and exact path are one of nsqd's or nsqlookupd's routes is answered here
(with nsqd's status codes, error codes and JSON shapes, see :mod:`http_common`);
everything else goes on unchanged. Two paths are shared with webhook-broker's API and
told apart by method or query: ``POST /channel/create`` (and ``delete``, ``empty``,
``pause``, ``unpause``) is nsqd's while ``GET``/``PUT /channel/{id}`` stay
webhook-broker's (a channel named ``create``), and ``GET /channels`` is nsqlookupd's
only with a ``topic`` argument (webhook-broker's channel list has none).

Publishes (``/pub``, ``/mpub``, ``/dpub``) answer once the commit holding them is
durable, as the TCP ``PUB`` does; a deferred one once its record is.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import msgspec

from tether.engine import errors as api_errors
from tether.engine.nsq import Channel, NsqService, Topic
from tether.protocol.nsq.names import is_valid_name
from tether.server.http.auth import AsgiApp, GatewayMiddleware, Receive, Scope, Send
from tether.server.nsq.connection import NsqConnection
from tether.server.nsq.http_common import (
    NSQ_CONTENT_TYPE,
    HttpError,
    Query,
    header,
    read_body,
    respond,
    wants_envelope,
)
from tether.server.nsq.identify import NSQD_VERSION
from tether.server.nsq.lookupd import Lookupd, NodeView
from tether.server.nsq.server import NsqServer
from tether.server.nsq.tls import TLS_REQUIRED, tls_required
from tether.storage.base import StorageError

log = logging.getLogger("tether.nsq")

MS = 1_000_000
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
# nsqd's client states, as /stats reports them.
_STATE_SUBSCRIBED, _STATE_CLOSING = 3, 4


def broadcast_address(configured: str, host: str) -> str:
    """What producers are announced as: the setting, else the listening address when it
    is a specific one, else the host name (nsqd's default)."""
    if configured:
        return configured
    if host not in _WILDCARD_HOSTS:
        return host.strip("[]")
    return socket.gethostname()


class _Durable:
    """A broker ``PubAckSink`` for one HTTP publish: a future for its outcome."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def pub_failed(self, stream: str, replies: list[str], error: api_errors.ApiError) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class NsqHttp:
    """ASGI app: nsqd's and nsqlookupd's routes; every other request goes to ``app``."""

    def __init__(
        self,
        app: AsgiApp,
        nsq: NsqServer,
        lookupd: Lookupd,
        http_port: Callable[[], int],
        gateway: GatewayMiddleware | None = None,
        *,
        nats_port: Callable[[], int] | None = None,
        https_port: Callable[[], int] | None = None,
        lookupd_only: bool = False,
        nsqd_only: bool = False,
        over_tls: bool = False,
    ) -> None:
        self.app = app
        self.lookupd_only = lookupd_only
        self.nsq = nsq
        self.service: NsqService = nsq.service
        self.config = nsq.config
        self.lookupd = lookupd
        self.http_port = http_port
        self.nats_port = nats_port or (lambda: 0)
        self.https_port = https_port or (lambda: 0)
        self.gateway = gateway
        self.broadcast_address = broadcast_address(
            self.config.nsq_broadcast_address, self.config.host
        )
        self.hostname = socket.gethostname()
        self._nsqd_paths: set[str] = set()  # answered 403 TLS_REQUIRED here (see below)
        # path → (method, handler, the path is only nsq's: other methods get 405)
        lookup: dict[str, tuple[str, Any, bool]] = {
            "/lookup": ("GET", self._lookup, True),
            "/topics": ("GET", self._topics, True),
            "/channels": ("GET", self._channels, False),
            "/nodes": ("GET", self._nodes, True),
            "/ping": ("GET", self._ping, True),
            "/topic/tombstone": ("POST", self._tombstone, True),
        }
        if lookupd_only:
            # nsqlookupd's write routes: on the HTTP port these paths are nsqd's.
            lookup["/info"] = ("GET", self._lookupd_info, True)
            lookup["/channels"] = ("GET", self._channels, True)
            lookup["/topic/create"] = ("POST", self._registry_write, True)
            lookup["/topic/delete"] = ("POST", self._registry_write, True)
            lookup["/channel/create"] = ("POST", self._registry_write, True)
            lookup["/channel/delete"] = ("POST", self._registry_write, True)
            self.routes = lookup
            return
        nsqd: dict[str, tuple[str, Any, bool]] = {
            "/info": ("GET", self._info, True),
            "/pub": ("POST", self._pub, True),
            "/mpub": ("POST", self._mpub, True),
            "/dpub": ("POST", self._dpub, True),
            "/stats": ("GET", self._stats, True),
            "/topic/create": ("POST", self._topic_create, True),
            "/topic/delete": ("POST", self._topic_delete, True),
            "/topic/empty": ("POST", self._topic_empty, True),
            "/topic/pause": ("POST", self._topic_pause, True),
            "/topic/unpause": ("POST", self._topic_pause, True),
            "/channel/create": ("POST", self._channel_create, False),
            "/channel/delete": ("POST", self._channel_delete, False),
            "/channel/empty": ("POST", self._channel_empty, False),
            "/channel/pause": ("POST", self._channel_pause, False),
            "/channel/unpause": ("POST", self._channel_pause, False),
        }
        if nsqd_only:  # nsqd's --https-address port: nsqd's routes alone, as nsqd has them
            nsqd = {"/ping": lookup["/ping"], **nsqd}
            self.routes = {path: (method, h, True) for path, (method, h, _) in nsqd.items()}
        else:
            self.routes = {**lookup, **nsqd}
        # nsqd's --tls-required on a plain HTTP port: nsqd answers every request there
        # 403 TLS_REQUIRED, /ping included (its ServeHTTP refuses before routing), so
        # all of nsqd's routes do here; nsqlookupd's and the rest of the port stay open.
        if tls_required(self.config) == TLS_REQUIRED and not over_tls:
            self._nsqd_paths = {"/ping", *nsqd}
            if not self.config.nsq_https_port:
                log.warning(
                    "nsq_tls_required: nsqd's routes on the plain HTTP port answer 403 "
                    'TLS_REQUIRED and no nsq_https_port serves them ("tcp-https" would '
                    "leave them open)"
                )

    # -- dispatch -------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            path = scope["path"]
            route = self.routes.get(path)
            if self._nsqd_paths and (
                path.startswith(("/config/", "/debug/"))
                or (
                    path in self._nsqd_paths
                    and (scope["method"] == "POST" or bool(route and route[2]))
                )
            ):  # (webhook-broker's GET /channel/create is not nsqd's)
                await self._tls_required(send)
                return
            if route is not None:
                method, handler, only_nsq = route
                given = scope["method"]
                if given == method or (given == "HEAD" and method == "GET"):
                    shared_list = path == "/channels" and not only_nsq
                    if shared_list and not _names_topic(scope["query_string"]):
                        await self.app(scope, receive, send)  # webhook-broker's GET /channels
                        return
                    await self._serve(scope, receive, send, handler)
                    return
                if only_nsq:
                    envelope = wants_envelope(scope)
                    await respond(send, 405, "METHOD_NOT_ALLOWED", envelope=envelope)
                    return
            elif not self.lookupd_only and path.startswith(("/config/", "/debug/")):
                await self._nsqd_prefixed(scope, receive, send, path)
                return
        await self.app(scope, receive, send)

    async def _tls_required(self, send: Send) -> None:
        """nsqd's answer on its plain HTTP port under ``--tls-required``, sent as it is
        whatever the client accepts; nsqd's HTTP clients retry on ``https_port``."""
        # nsqd's own format string, spaces included (not a JSON encoder's output).
        body = b'{"message": "TLS_REQUIRED", "https_port": %d}' % self.https_port()
        headers = [
            NSQ_CONTENT_TYPE,
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _nsqd_prefixed(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """nsqd's ``/config/:opt`` (GET, PUT) and ``/debug/...`` (Go's profiler and
        memory controls, which a Python process does not have: ``404 NOT_FOUND``)."""
        method = scope["method"]
        if path.startswith("/debug/"):
            await respond(send, 404, "NOT_FOUND", envelope=wants_envelope(scope))
            return
        if method in ("GET", "HEAD"):
            await self._serve(scope, receive, send, self._config_get)
        elif method == "PUT":
            await self._serve(scope, receive, send, self._config_put)
        else:
            await respond(send, 405, "METHOD_NOT_ALLOWED", envelope=wants_envelope(scope))

    async def _serve(self, scope: Scope, receive: Receive, send: Send, handler: Any) -> None:
        envelope = wants_envelope(scope)
        try:
            query = Query(scope["query_string"])
            result = await handler(scope, receive, query)
        except HttpError as exc:
            await respond(send, exc.status, exc.code, envelope=envelope)
            return
        except Exception:
            log.exception("nsq http: %s %s failed", scope["method"], scope["path"])
            await respond(send, 500, "INTERNAL_ERROR", envelope=envelope)
            return
        plain = handler == self._ping or (
            handler == self._stats and isinstance(result, str) and not envelope
        )
        await respond(send, 200, result, envelope=envelope, plain=plain)

    # -- checks -----------------------------------------------------------------------------------------
    async def _body(self, scope: Scope, receive: Receive, limit: int, too_big: str) -> bytes:
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise HttpError(413, too_big)
        body = await read_body(scope, receive, limit)
        if body is None:
            raise HttpError(413, too_big)
        self._check_access(scope, body)
        return body

    def _check_access(self, scope: Scope, body: bytes) -> None:
        """What every write needs: the gateway's signature when one is configured, and
        the server's credentials when it requires them (``Authorization: Bearer
        <token>`` or Basic ``user:password``; nsqd's HTTP API has no auth of its own)."""
        gateway = self.gateway
        if gateway is not None:
            signature = (header(scope, b"x-broker-signature") or b"").decode("latin-1")
            refusal = gateway.verify(str(scope["path"]), signature, body)
            if refusal is not None:
                raise HttpError(refusal[0], "UNAUTHORIZED" if refusal[0] == 401 else "FORBIDDEN")
        cfg = self.config
        if not cfg.auth_required:
            return
        given = (header(scope, b"authorization") or b"").decode("latin-1")
        scheme, _, secret = given.partition(" ")
        secret = secret.strip()
        if scheme.lower() == "bearer" and cfg.auth_token:
            if hmac.compare_digest(secret.encode(), cfg.auth_token.encode()):
                return
        elif scheme.lower() == "basic" and cfg.user:
            import base64
            import binascii

            try:
                pair = base64.b64decode(secret, validate=True)
            except (binascii.Error, ValueError):
                pair = b""
            expected = f"{cfg.user}:{cfg.password or ''}".encode()
            if hmac.compare_digest(pair, expected):
                return
        raise HttpError(401, "UNAUTHORIZED")

    @staticmethod
    def _topic_name(query: Query) -> str:
        topic = query.get("topic")
        if topic is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic.encode("utf-8", "surrogateescape")):
            raise HttpError(400, "INVALID_TOPIC")
        return topic

    def _existing_topic(self, query: Query) -> Topic:
        name = self._topic_name(query)
        topic = self.service.topics.get(name)
        if topic is None or topic.stream_name not in self.service.broker.streams:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return topic

    def _channel_name(self, query: Query) -> str:
        channel = query.get("channel")
        if channel is None:
            raise HttpError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel.encode("utf-8", "surrogateescape")):
            raise HttpError(400, "INVALID_CHANNEL")
        return channel

    def _existing_channel(self, query: Query) -> tuple[Topic, Channel]:
        topic = self._existing_topic(query)
        name = self._channel_name(query)
        channel = topic.channels.get(name)
        if channel is None:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return topic, channel

    # -- publishing -------------------------------------------------------------------------------------
    def _defer_ms(self, raw: str) -> int:
        text = raw[1:] if raw[:1] in "+-" else raw
        if not text.isdigit() or not text.isascii() or len(text) > 19:
            raise HttpError(400, "INVALID_DEFER")
        value = -int(text) if raw.startswith("-") else int(text)
        if value < 0 or value > self.nsq.parser_limits.max_req_timeout_ms:
            raise HttpError(400, "INVALID_DEFER")
        return value

    async def _publish(self, topic: str, bodies: list[bytes]) -> None:
        if not bodies:
            return
        try:
            stream = await self.service.topic_stream(topic)
            sink = _Durable()
            replies = [""] * (len(bodies) - 1) + ["1"]
            self.service.broker.publish_many(
                stream, self.service.topics[topic].subject, bodies, replies, sink
            )
            await sink.done
        except (api_errors.ApiError, StorageError) as exc:
            log.error("nsq http: publish to %s failed: %s", topic, exc)
            raise HttpError(503, "PUB_FAILED") from None

    async def _pub(self, scope: Scope, receive: Receive, query: Query) -> str:
        limits = self.nsq.parser_limits
        body = await self._body(scope, receive, limits.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        topic = self._topic_name(query)
        defer = query.get("defer")
        delay = 0 if defer is None else self._defer_ms(defer)
        if delay:
            await self._defer(topic, body, delay)
        else:
            await self._publish(topic, [body])
        return "OK"

    async def _dpub(self, scope: Scope, receive: Receive, query: Query) -> str:
        """``/pub`` with a ``defer`` it must have (a Tether addition, after TCP ``DPUB``)."""
        if "defer" not in query and "topic" in query:
            self._topic_name(query)
            raise HttpError(400, "MISSING_ARG_DEFER")
        return await self._pub(scope, receive, query)

    async def _defer(self, topic: str, body: bytes, delay_ms: int) -> None:
        try:
            await self.service.defer(topic, body, delay_ms * MS)
        except StorageError as exc:
            log.error("nsq http: deferred publish to %s failed: %s", topic, exc)
            raise HttpError(503, "PUB_FAILED") from None

    async def _mpub(self, scope: Scope, receive: Receive, query: Query) -> str:
        limits = self.nsq.parser_limits
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        topic = self._topic_name(query)
        body = await self._body(scope, receive, limits.max_body_size, "BODY_TOO_BIG")
        binary = query.get("binary")
        if binary is not None and binary not in ("false", "0"):
            bodies = split_binary(body, limits.max_msg_size, limits.max_body_size)
        else:
            bodies = []
            for line in body.split(b"\n"):
                if not line:
                    continue  # empty lines are skipped, as nsqd does
                if len(line) > limits.max_msg_size:
                    raise HttpError(413, "MSG_TOO_BIG")
                bodies.append(line)
        await self._publish(topic, bodies)
        return "OK"

    # -- topics and channels ---------------------------------------------------------------------------------
    async def _admin(self, scope: Scope, receive: Receive) -> None:
        await self._body(scope, receive, self.nsq.parser_limits.max_msg_size, "BODY_TOO_BIG")

    async def _topic_create(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic = self._topic_name(query)
        try:
            await self.service.topic_stream(topic)
        except (api_errors.ApiError, StorageError) as exc:
            log.error("nsq http: creating topic %s failed: %s", topic, exc)
            raise HttpError(500, "INTERNAL_ERROR") from None

    async def _topic_delete(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic = self._existing_topic(query)
        await self.service.delete_topic(topic.name)

    async def _topic_empty(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic = self._existing_topic(query)
        await self.service.empty_topic(topic.name)

    async def _topic_pause(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic = self._existing_topic(query)
        await self.service.pause_topic(topic.name, not scope["path"].endswith("unpause"))

    async def _channel_create(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic = self._existing_topic(query)
        channel = self._channel_name(query)
        await self.service.create_channel(topic.name, channel)

    async def _channel_delete(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic, channel = self._existing_channel(query)
        await self.service.delete_channel(topic.name, channel.name)

    async def _channel_empty(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        _, channel = self._existing_channel(query)
        channel.empty()
        try:
            await self.service.consumers.saved(channel.consumer)  # 200 once it is stored
        except api_errors.ApiError as exc:
            log.error("nsq http: emptying channel %s failed: %s", channel.name, exc)
            raise HttpError(500, "INTERNAL_ERROR") from None

    async def _channel_pause(self, scope: Scope, receive: Receive, query: Query) -> None:
        await self._admin(scope, receive)
        topic, channel = self._existing_channel(query)
        paused = not scope["path"].endswith("unpause")
        await self.service.pause_channel(topic.name, channel.name, paused)

    # -- about the node -------------------------------------------------------------------------------------
    async def _ping(self, scope: Scope, receive: Receive, query: Query) -> str:
        return "OK"

    async def _info(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        cfg = self.config
        return {
            "version": NSQD_VERSION,
            "broadcast_address": self.broadcast_address,
            "hostname": self.hostname,
            "http_port": self.http_port(),
            "tcp_port": self.nsq.port,
            "start_time": int(self.nsq.started_at),
            "max_heartbeat_interval": int(cfg.nsq_max_heartbeat_interval * 1e9),
            "max_output_buffer_size": cfg.nsq_max_output_buffer_size,
            "max_output_buffer_timeout": int(cfg.nsq_max_output_buffer_timeout * 1e9),
            "max_deflate_level": cfg.nsq_max_deflate_level,
            "topology_zone": "",
            "topology_region": "",
            "nats_port": self.nats_port(),  # Tether's: where the same node speaks NATS
            # Tether's: nsqd's HTTPS port (nsqd tells it only in its 403 TLS_REQUIRED)
            "https_port": self.https_port(),
        }

    async def _lookupd_info(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        return self.lookupd.info()

    def node_view(self) -> NodeView:
        """This node as nsqlookupd would list it (the lookupd's ``local``)."""
        producer = {
            "remote_address": f"{self.broadcast_address}:{self.http_port()}",
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.nsq.port,
            "http_port": self.http_port(),
            "version": NSQD_VERSION,
            "nats_port": self.nats_port(),
        }
        topics = {
            name: list(topic.channels)
            for name, topic in self.service.topics.items()
            if topic.stream_name in self.service.broker.streams
        }
        return NodeView(producer, topics)

    async def _tombstone(self, scope: Scope, receive: Receive, query: Query) -> None:
        self._check_access(scope, b"")
        self.lookupd.tombstone(query)

    async def _registry_write(self, scope: Scope, receive: Receive, query: Query) -> None:
        """nsqlookupd's ``/topic/create|delete`` and ``/channel/create|delete``: its
        registrations, not this node's topics (see :mod:`registrations`)."""
        self._check_access(scope, b"")
        lookupd = self.lookupd
        write = {
            "/topic/create": lookupd.create_topic,
            "/topic/delete": lookupd.delete_topic,
            "/channel/create": lookupd.create_channel,
            "/channel/delete": lookupd.delete_channel,
        }[scope["path"]]
        write(query)

    # -- /config/:opt ---------------------------------------------------------------------------------
    def _options(self) -> dict[str, Any]:
        """nsqd's options by their config names, with this server's values (durations in
        nanoseconds, as Go encodes them)."""
        cfg = self.config
        ns = 1_000_000_000
        return {
            "log_level": _nsqd_level(),
            "tcp_address": f"{cfg.host}:{self.nsq.port}",
            "http_address": f"{cfg.host}:{self.http_port()}",
            "https_address": f"{cfg.host}:{self.https_port()}" if self.https_port() else "",
            "broadcast_address": self.broadcast_address,
            "broadcast_tcp_port": self.nsq.port,
            "broadcast_http_port": self.http_port(),
            "nsqlookupd_tcp_addresses": [],  # no nsqlookupd registers this node over TCP
            "mem_queue_size": cfg.nsq_mem_queue_size,
            "max_msg_size": cfg.nsq_max_msg_size,
            "max_body_size": cfg.nsq_max_body_size,
            "max_rdy_count": cfg.nsq_max_rdy_count,
            "msg_timeout": int(cfg.nsq_msg_timeout * ns),
            "max_msg_timeout": int(cfg.nsq_max_msg_timeout * ns),
            "max_req_timeout": int(cfg.nsq_max_req_timeout * ns),
            "max_heartbeat_interval": int(cfg.nsq_max_heartbeat_interval * ns),
            "max_output_buffer_size": cfg.nsq_max_output_buffer_size,
            "max_output_buffer_timeout": int(cfg.nsq_max_output_buffer_timeout * ns),
            "deflate": cfg.nsq_deflate,
            "max_deflate_level": cfg.nsq_max_deflate_level,
            "snappy": cfg.nsq_snappy,
            "tls_cert": cfg.nsq_tls_cert or cfg.tls_cert or "",
            "tls_key": cfg.nsq_tls_key or cfg.tls_key or "",
            "tls_root_ca_file": cfg.tls_ca or "",
            "tls_client_auth_policy": cfg.nsq_tls_client_auth_policy,
            "tls_required": tls_required(cfg),  # nsqd's 0, 1 (tcp-https) or 2
        }

    async def _config_get(self, scope: Scope, receive: Receive, query: Query) -> Any:
        options = self._options()
        name = scope["path"].removeprefix("/config/")
        if name not in options:
            raise HttpError(400, "INVALID_OPTION")
        value = options[name]
        # JSON like every other value (a bare string would be sent as text).
        return msgspec.json.encode(value) if isinstance(value, str) else value

    async def _config_put(self, scope: Scope, receive: Receive, query: Query) -> Any:
        """nsqd changes two options at run time: ``log_level`` is applied here;
        ``nsqlookupd_tcp_addresses`` is refused (this node registers with no nsqlookupd;
        peers are ``nsq_lookupd_peers``)."""
        name = scope["path"].removeprefix("/config/")
        limit = self.config.nsq_max_msg_size
        body = await read_body(scope, receive, limit + 1)
        if body is None or len(body) > limit or not body:
            raise HttpError(413, "INVALID_VALUE")
        self._check_access(scope, body)
        if name != "log_level":
            raise HttpError(400, "INVALID_OPTION")
        level = _LEVELS.get(body.decode("latin-1").strip().lower())
        if level is None:
            raise HttpError(400, "INVALID_VALUE")
        logging.getLogger().setLevel(level)
        log.warning("nsq http: log level set to %s", logging.getLevelName(level).lower())
        return msgspec.json.encode(_nsqd_level())

    async def _lookup(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        return self.lookupd.lookup(query)

    async def _topics(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        return self.lookupd.topics()

    async def _channels(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        return self.lookupd.channels(query)

    async def _nodes(self, scope: Scope, receive: Receive, query: Query) -> dict[str, Any]:
        return self.lookupd.node_list()

    # -- stats ------------------------------------------------------------------------------------------------
    async def _stats(self, scope: Scope, receive: Receive, query: Query) -> Any:
        topic_filter = query.get("topic") or ""
        channel_filter = query.get("channel") or ""
        include_clients = _flag(query.get("include_clients"))
        include_mem = _flag(query.get("include_mem"))
        topics = [
            self._topic_stats(topic, channel_filter, include_clients)
            for name, topic in sorted(self.service.topics.items())
            if (not topic_filter or name == topic_filter)
            and topic.stream_name in self.service.broker.streams
        ]
        producers = [_client_stats(c, None) for c in self.nsq.connections.values() if c.pub_counts]
        stats: dict[str, Any] = {
            "version": NSQD_VERSION,
            "health": "OK",
            "start_time": int(self.nsq.started_at),
            "topics": topics,
            "producers": producers if include_clients else [],
        }
        if include_mem:
            stats["memory"] = _memory()
        if query.get("format") == "json":
            return stats
        return _stats_text(stats, time.time() - self.nsq.started_at)

    def _topic_stats(self, topic: Topic, channel_filter: str, clients: bool) -> dict[str, Any]:
        stream = self.service.broker.streams.get(topic.stream_name)
        channels = [
            _channel_stats(channel, clients)
            for name, channel in sorted(topic.channels.items())
            if not channel_filter or name == channel_filter
        ]
        depth = 0
        if not topic.channels and stream is not None:
            depth = stream.state.msgs  # held for the topic's first channel
        return {
            "topic_name": topic.name,
            "channels": channels,
            "depth": depth,
            "backend_depth": 0 if topic.ephemeral else depth,
            "message_count": topic.message_count,
            "message_bytes": topic.message_bytes,
            "paused": topic.paused,
            "e2e_processing_latency": {"count": 0, "percentiles": None},
        }


# nsqd's log levels (lg.ParseLogLevel) and Python's.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def _nsqd_level() -> str:
    level = logging.getLogger().getEffectiveLevel()
    for name, value in _LEVELS.items():
        if level <= value:
            return name
    return "fatal"


def _names_topic(query: bytes) -> bool:
    """Whether a query string has a ``topic`` argument (nsqlookupd's ``/channels``)."""
    return any(part.split(b"=", 1)[0] == b"topic" for part in query.split(b"&"))


def _flag(raw: str | None) -> bool:
    """nsqd's boolean arguments: true/1 and false/0; anything else (or none) is true."""
    return raw not in ("false", "0")


def split_binary(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """A binary ``/mpub`` body: ``[count uint32]`` then ``[size uint32][bytes]`` per
    message, all big-endian; nsqd's 413 codes for what is wrong with it."""
    if len(body) < 4:
        raise HttpError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">i", body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HttpError(413, "BAD_BODY")
    out: list[bytes] = []
    at = 4
    for _ in range(count):
        if at + 4 > len(body):
            raise HttpError(413, "BAD_MESSAGE")
        (size,) = struct.unpack_from(">i", body, at)
        at += 4
        if size <= 0 or size > max_msg_size or at + size > len(body):
            raise HttpError(413, "BAD_MESSAGE")
        out.append(body[at : at + size])
        at += size
    return out


def _channel_stats(channel: Channel, clients: bool) -> dict[str, Any]:
    depth, in_flight, deferred = channel.counts()
    return {
        "channel_name": channel.name,
        "depth": depth,
        "backend_depth": 0 if channel.ephemeral else depth,
        "in_flight_count": in_flight,
        "deferred_count": deferred,
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(channel.members),
        "clients": [
            _client_stats(m.sink, m) for m in channel.members if isinstance(m.sink, NsqConnection)
        ]
        if clients
        else [],
        "paused": channel.paused,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
    }


def _client_stats(conn: Any, member: Any) -> dict[str, Any]:
    if not isinstance(conn, NsqConnection):
        return {}
    settings = conn.settings
    state = _STATE_CLOSING if conn.state == 2 else _STATE_SUBSCRIBED
    return {
        "client_id": settings.client_id,
        "hostname": settings.hostname,
        "version": "V2",
        "remote_address": f"{conn.remote[0]}:{conn.remote[1]}",
        "state": state,
        "ready_count": member.rdy if member is not None else 0,
        "in_flight_count": len(member.in_flight) if member is not None else 0,
        "message_count": member.message_count if member is not None else 0,
        "finish_count": member.finish_count if member is not None else 0,
        "requeue_count": member.requeue_count if member is not None else 0,
        "connect_ts": int(conn.connected_at),
        "sample_rate": settings.sample_rate,
        "deflate": settings.deflate_level > 0,
        "snappy": settings.snappy,
        "user_agent": settings.user_agent,
        "authed": conn.server.limits.auth_required and conn.authed,
        "auth_identity": "",
        "auth_identity_url": "",
        "pub_counts": [{"topic": t, "count": n} for t, n in conn.pub_counts.items()],
        "tls": False,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
        "topology_region": "",
        "topology_zone": "",
    }


def _memory() -> dict[str, int]:
    """nsqd reports Go's heap; the closest here: the resident set and the collector."""
    import gc

    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    return {
        "heap_objects": 0,
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": rss,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


def _stats_text(stats: dict[str, Any], uptime: float) -> str:
    """``/stats`` without ``format=json``: nsqd's text layout."""
    lines = [
        f"nsqd v{stats['version']} (tether)",
        f"start_time {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(stats['start_time']))}",
        f"uptime {uptime:.3f}s",
        "",
        f"Health: {stats['health']}",
    ]
    if not stats["topics"]:
        lines += ["", "Topics: None"]
    else:
        lines += ["", "Topics:"]
    for t in stats["topics"]:
        mark = "*P " if t["paused"] else "   "
        lines.append(
            f"{mark}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: "
            f"{t['backend_depth']:<5} msgs: {t['message_count']:<8} e2e%: "
        )
        for c in t["channels"]:
            mark = "   *P " if c["paused"] else "      "
            lines.append(
                f"{mark}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: "
                f"{c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} def: "
                f"{c['deferred_count']:<4} re-q: {c['requeue_count']:<5} timeout: "
                f"{c['timeout_count']:<5} msgs: {c['message_count']:<8} e2e%: "
            )
            for client in c["clients"]:
                lines.append(
                    f"        [V2 {client['client_id']}] state: {client['state']} "
                    f"inflt: {client['in_flight_count']} rdy: {client['ready_count']} "
                    f"fin: {client['finish_count']} re-q: {client['requeue_count']} "
                    f"msgs: {client['message_count']}"
                )
    if not stats["producers"]:
        lines += ["", "Producers: None"]
    else:
        lines += ["", "Producers:"]
        for p in stats["producers"]:
            lines.append(f"   [V2 {p['client_id']}] {p['remote_address']}")
    return "\n".join(lines) + "\n"
