"""Monitoring endpoints in nats-server's shapes, so tools built for nats-server (the
exporter, the surveyor, ``nats server`` commands) read them unchanged.

``/varz``, ``/connz``, ``/subsz`` (``/subscriptionsz``), ``/jsz``, ``/accountz``,
``/accstatz`` and ``/healthz`` report on this process; ``/routez``, ``/gatewayz`` and
``/leafz`` answer honestly empty (Tether is one server). As on nats-server every answer
is pretty-printed JSON with ``Access-Control-Allow-Origin: *``, a bad query parameter
is a 400 in plain text, times are RFC 3339 UTC, durations in settings are integer
nanoseconds, and ``uptime``/``idle`` read like ``1d2h3m4s``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.engine.broker import Broker
from tether.engine.clock import go_duration
from tether.engine.consumers import ConsumerRegistry
from tether.engine.limits import ServerLimits
from tether.engine.subjects import is_valid_subject, subject_matches
from tether.protocol.numbers import parse_uint
from tether.server.config import ServerConfig
from tether.server.nats.auth.peer_certs import tls_fields
from tether.server.nats.connection import ClientConnection
from tether.server.nats.consumers import ConsumerApi
from tether.server.nats.jetstream import JetStreamApi
from tether.server.nats.requests import API_LEVEL
from tether.server.nats.server import NatsServer
from tether.version import NATS_COMPAT_VERSION, __version__

ACCOUNT = "$G"  # every client is in the global account
SYSTEM_ACCOUNT = "$SYS"
DEFAULT_LIMIT = 1024
NS = 1_000_000_000

_pretty = msgspec.json.Encoder()


class Monitored(Protocol):
    """What the endpoints report on (the process, which passes itself)."""

    config: ServerConfig
    nats: NatsServer
    store_url: str
    http_port: int
    broker: Broker | None
    consumers: ConsumerRegistry | None
    jetstream: JetStreamApi | None
    consumer_api: ConsumerApi | None


class BadQuery(Exception):
    """A query parameter that does not parse: 400 with nats-server's wording."""


def _answer(body: Any, status: int = 200, pretty: bool = True) -> Response:
    raw = _pretty.encode(body)
    return Response(
        msgspec.json.format(raw, indent=2) if pretty else raw,
        status_code=status,
        media_type="application/json",
        headers={"access-control-allow-origin": "*"},
    )


def _bad(message: str) -> Response:
    return Response(
        message,
        status_code=400,
        media_type="text/plain; charset=utf-8",
        headers={"access-control-allow-origin": "*"},
    )


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _bool(request: Request, name: str) -> bool:
    """Go's ``strconv.ParseBool``, as nats-server reads its flags."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return False
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise BadQuery(
        f"Error decoding boolean for '{name}': strconv.ParseBool: parsing \"{raw}\": invalid syntax"
    )


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = parse_uint(raw)
    if value is None:
        raise BadQuery(
            f"Error decoding int for '{name}': strconv.Atoi: parsing \"{raw}\": invalid syntax"
        )
    return value


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    """Go's ``myUptime``: ``1d2h3m4s``, ``3m4s``, ``4s``."""
    total = int(seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h{minutes}m{secs}s"
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _rtt(ns: int) -> str:
    """nats-server's ``getRTT``: Go duration text, whole microseconds below 1 ms."""
    if 1000 < ns < 1_000_000:
        ns -= ns % 1000
    return go_duration(ns)


def _page(items: list[Any], offset: int, limit: int) -> list[Any]:
    return items[offset : offset + limit] if limit else []


def routes(app: Monitored) -> list[Route]:
    def endpoint(build: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                result = build(request)
            except BadQuery as exc:
                return _bad(str(exc))
            if isinstance(result, Response):
                return result
            return _answer(result)

        return handle

    def base() -> dict[str, Any]:
        return {"server_id": app.nats.server_id, "now": _rfc3339(time.time())}

    # -- /varz ------------------------------------------------------------------------------
    def varz(request: Request) -> dict[str, Any]:
        nats = app.nats
        cfg = app.config
        stats = nats.stats()
        started = nats.started_at
        body: dict[str, Any] = {
            "server_id": nats.server_id,
            "server_name": nats.server_name,
            "version": NATS_COMPAT_VERSION,
            "tether_version": __version__,
            "proto": 1,
            "go": f"tether/{__version__}",
            "host": cfg.host,
            "port": nats.port,
            "max_connections": cfg.max_connections,
            "ping_interval": int(cfg.ping_interval * NS),
            "ping_max": cfg.max_pings_out,
            "http_host": cfg.host,
            # nats-server reports its monitor port under one name or the other.
            "http_port": 0 if cfg.http_tls else app.http_port,
            "http_base_path": "",
            "https_port": app.http_port if cfg.http_tls else 0,
            "auth_timeout": cfg.auth_timeout,
            "max_control_line": cfg.max_control_line,
            "max_payload": cfg.max_payload,
            "max_pending": cfg.max_pending,
            "cluster": {},
            "gateway": {},
            "leaf": {},
            "mqtt": {},
            "websocket": {},
            "jetstream": _varz_jetstream(app) if nats.jetstream else {},
            "tls_timeout": cfg.tls_timeout,
            "write_deadline": int(cfg.write_deadline * NS),
            "start": _rfc3339(started),
            "now": _rfc3339(time.time()),
            "uptime": _duration(time.time() - started),
            "mem": rss_bytes(),
            "cores": os.cpu_count() or 1,
            "gomaxprocs": 1,  # one event loop
            "cpu": _cpu_percent(started),
            "connections": stats["connections"],
            "total_connections": stats["total_connections"],
            "routes": 0,
            "remotes": 0,
            "leafnodes": 0,
            "in_msgs": stats["in_msgs"],
            "out_msgs": stats["out_msgs"],
            "in_bytes": stats["in_bytes"],
            "out_bytes": stats["out_bytes"],
            # Every connection is a client's: no routes, gateways or leaf nodes.
            "in_client_msgs": stats["in_msgs"],
            "in_client_bytes": stats["in_bytes"],
            "out_client_msgs": stats["out_msgs"],
            "out_client_bytes": stats["out_bytes"],
            "slow_consumers": stats["slow_consumers"],
            "slow_consumer_stats": _by_kind(stats["slow_consumers"]),
            "stale_connections": 0,
            "stale_connection_stats": _by_kind(0),
            "stalled_clients": 0,
            "subscriptions": stats["subscriptions"],
            "http_req_stats": {},
            "config_load_time": _rfc3339(started),
            "system_account": SYSTEM_ACCOUNT,
            "pid": os.getpid(),
        }
        if cfg.auth_required:
            body["auth_required"] = True
        if cfg.tls:
            body["tls_required"] = True
            if cfg.tls_verify or cfg.tls_verify_and_map:
                body["tls_verify"] = True
        # Anything the NATS front door counts besides (e.g. outbound buffering).
        for key, value in stats.items():
            body.setdefault(key, value)
        return body

    # -- /connz -----------------------------------------------------------------------------
    sorts: dict[str, Callable[[ClientConnection], Any]] = {
        "cid": lambda c: c.cid,
        "start": lambda c: c.started_at,
        "subs": lambda c: -len(c.subs),
        "pending": lambda c: -c.pending_bytes,
        "msgs_to": lambda c: -c.out_msgs,
        "msgs_from": lambda c: -c.in_msgs,
        "bytes_to": lambda c: -c.out_bytes,
        "bytes_from": lambda c: -c.in_bytes,
        "last": lambda c: -c.last_read,
        "idle": lambda c: c.last_read,
        "uptime": lambda c: c.started_at,
        "rtt": lambda c: -c.rtt_ns,
    }

    def connz(request: Request) -> dict[str, Any] | Response:
        nats = app.nats
        offset = _int(request, "offset", 0)
        limit = _int(request, "limit", DEFAULT_LIMIT)
        cid = _int(request, "cid", 0)
        subs_param = request.query_params.get("subs", "")
        detail = subs_param == "detail"
        subs = detail or _bool(request, "subs")
        auth = _bool(request, "auth")
        state = request.query_params.get("state", "open") or "open"
        if state not in ("open", "closed", "any", "all"):
            raise BadQuery(f"Error decoding connection state: invalid state {state!r}")
        sort = request.query_params.get("sort", "cid") or "cid"
        if sort in ("stop", "reason") and state == "open":
            raise BadQuery(f"Sort by {sort!r} only valid on closed connections")
        if sort not in sorts and sort not in ("stop", "reason"):
            raise BadQuery(f"invalid sorting option: {sort}")
        # Closed connections are not kept: state=closed lists none.
        conns = [] if state == "closed" else list(nats.connections.values())
        if cid:
            conns = [c for c in conns if c.cid == cid]
            offset, limit = 0, 1
        conns.sort(key=sorts.get(sort, sorts["cid"]))
        total = len(conns)
        now = time.time()
        page = [_conn_info(c, now, subs, detail, auth) for c in _page(conns, offset, limit)]
        return {
            **base(),
            "num_connections": len(page),
            "total": total,
            "offset": offset,
            "limit": limit,
            "connections": page,
        }

    # -- /subsz -----------------------------------------------------------------------------
    def subsz(request: Request) -> dict[str, Any]:
        nats = app.nats
        offset = _int(request, "offset", 0)
        limit = _int(request, "limit", DEFAULT_LIMIT)
        show = _bool(request, "subs")
        test = request.query_params.get("test", "")
        if test and not is_valid_subject(test):
            raise BadQuery(f"Bad test subject {test!r}")
        entries = [
            (conn, sub)
            for conn in nats.connections.values()
            for sub in conn.subs.values()
            if not test or subject_matches(sub.subject, test)
        ]
        body: dict[str, Any] = {
            **base(),
            "num_subscriptions": len(nats.router.index),
            "num_cache": 0,
            "num_inserts": 0,
            "num_removes": 0,
            "num_matches": 0,
            "cache_hit_rate": 0,
            "max_fanout": 0,
            "avg_fanout": 0,
            "total": len(entries),
            "offset": offset,
            "limit": limit,
        }
        if show:
            body["subscriptions_list"] = [
                _sub_detail(conn, sub, account=True) for conn, sub in _page(entries, offset, limit)
            ]
        return body

    # -- /jsz -------------------------------------------------------------------------------
    def jsz(request: Request) -> dict[str, Any]:
        offset = _int(request, "offset", 0)
        limit = _int(request, "limit", DEFAULT_LIMIT)
        config = _bool(request, "config")
        consumers = _bool(request, "consumers")
        streams = consumers or _bool(request, "streams")
        acc = request.query_params.get("acc", "")
        accounts = streams or _bool(request, "accounts") or bool(acc)
        _bool(request, "leader-only")
        _bool(request, "raft")
        broker, js = app.broker, app.jetstream
        if not app.nats.jetstream or broker is None or js is None:
            return {**base(), "disabled": True}
        usage = broker.account_usage()
        all_streams = list(broker.streams.values())
        stats = _js_stats(broker, js)
        body: dict[str, Any] = {
            **base(),
            **stats,
            "config": _js_config(app, broker.limits),
            "limits": broker.limits.report(),
            "streams": usage["streams"],
            "consumers": usage["consumers"],
            "messages": sum(s.state.msgs for s in all_streams),
            "bytes": sum(s.state.bytes for s in all_streams),
            "total": 0,
        }
        if accounts and acc in ("", ACCOUNT):
            detail: dict[str, Any] = {"name": ACCOUNT, "id": ACCOUNT, **stats}
            if streams:
                chosen = _page(sorted(all_streams, key=lambda s: s.name), offset, limit)
                detail["stream_detail"] = [
                    _stream_detail(app, stream, config, consumers) for stream in chosen
                ]
            body["account_details"] = [detail]
            body["total"] = len(all_streams) if streams else 1
        return body

    # -- /accountz, /accstatz ---------------------------------------------------------------
    def accountz(request: Request) -> dict[str, Any] | Response:
        acc = request.query_params.get("acc", "")
        if not acc:
            return {**base(), "system_account": SYSTEM_ACCOUNT, "accounts": [ACCOUNT]}
        if acc != ACCOUNT:
            raise BadQuery(f"Account {acc} does not exist")
        nats = app.nats
        return {
            **base(),
            "system_account": SYSTEM_ACCOUNT,
            "account_detail": {
                "account_name": ACCOUNT,
                "update_time": _rfc3339(nats.started_at),
                "expired": False,
                "complete": True,
                "jetstream_enabled": nats.jetstream,
                "leafnode_connections": 0,
                "client_connections": len(nats.connections),
                "subscriptions": len(nats.router.index),
            },
        }

    def accstatz(request: Request) -> dict[str, Any]:
        _bool(request, "unused")
        stats = app.nats.stats()
        return {
            **base(),
            "account_statz": [
                {
                    "acc": ACCOUNT,
                    "name": ACCOUNT,
                    "conns": stats["connections"],
                    "leafnodes": 0,
                    "total_conns": stats["connections"],
                    "num_subscriptions": stats["subscriptions"],
                    "sent": _traffic(stats["out_msgs"], stats["out_bytes"]),
                    "received": _traffic(stats["in_msgs"], stats["in_bytes"]),
                    "slow_consumers": stats["slow_consumers"],
                }
            ],
        }

    # -- /healthz ---------------------------------------------------------------------------
    def healthz(request: Request) -> dict[str, Any] | Response:
        for flag in ("js-enabled-only", "js-server-only", "js-meta-only", "js-enabled", "details"):
            _bool(request, flag)
        stream = request.query_params.get("stream", "")
        account = request.query_params.get("account", "")
        if stream and not account:
            return _answer(
                {
                    "status": "error",
                    "error": '"account" must not be empty when checking stream health',
                },
                400,
                pretty=False,
            )
        if stream:
            broker = app.broker
            if broker is None or stream not in broker.streams:
                return _answer(
                    {
                        "status": "unavailable",
                        "error": f"JetStream stream '{account} > {stream}' could not be found",
                    },
                    503,
                    pretty=False,
                )
        role = getattr(app, "role", None)  # over PostgreSQL: active or standby
        body = {"status": "ok", "role": role} if role else {"status": "ok"}
        return _answer(body, pretty=False)  # compact, as nats-server's

    # -- one server: no routes, gateways or leaf nodes ---------------------------------------
    def routez(request: Request) -> dict[str, Any]:
        if request.query_params.get("subs") != "detail":
            _bool(request, "subs")
        return {
            **base(),
            "server_name": app.nats.server_name,
            "num_routes": 0,
            "routes": [],
        }

    def gatewayz(request: Request) -> dict[str, Any]:
        return {
            **base(),
            "outbound_gateways": {},
            "inbound_gateways": {},
        }

    def leafz(request: Request) -> dict[str, Any]:
        return {**base(), "leafnodes": 0, "leafs": []}

    table: list[tuple[str, Callable[[Request], Any]]] = [
        ("/varz", varz),
        ("/connz", connz),
        ("/subsz", subsz),
        ("/subscriptionsz", subsz),
        ("/jsz", jsz),
        ("/accountz", accountz),
        ("/accstatz", accstatz),
        ("/healthz", healthz),
        ("/routez", routez),
        ("/gatewayz", gatewayz),
        ("/leafz", leafz),
    ]
    return [Route(path, endpoint(build), methods=["GET"]) for path, build in table]


def _by_kind(clients: int) -> dict[str, int]:
    return {"clients": clients, "routes": 0, "gateways": 0, "leafs": 0}


def _traffic(msgs: int, size: int) -> dict[str, Any]:
    zero = {"msgs": 0, "bytes": 0}
    return {"msgs": msgs, "bytes": size, "gateways": zero, "routes": zero, "leafs": zero}


def _conn_info(
    conn: ClientConnection, now: float, subs: bool, detail: bool, auth: bool
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cid": conn.cid,
        "kind": "Client",
        "type": "nats",
        "ip": conn.remote[0],
        "port": conn.remote[1],
        "start": _rfc3339(conn.started_at),
        "last_activity": _rfc3339(conn.last_read),
        "rtt": _rtt(conn.rtt_ns),
        "uptime": _duration(now - conn.started_at),
        "idle": _duration(now - conn.last_read),
        "pending_bytes": conn.pending_bytes,
        "in_msgs": conn.in_msgs,
        "out_msgs": conn.out_msgs,
        "in_bytes": conn.in_bytes,
        "out_bytes": conn.out_bytes,
        "subscriptions": len(conn.subs),
    }
    if conn.name:
        info["name"] = conn.name
    if conn.lang:
        info["lang"] = conn.lang
    if conn.version:
        info["version"] = conn.version
    info.update(tls_fields(getattr(conn, "transport", None), certificates=auth))
    if auth:
        if conn.user:
            info["authorized_user"] = conn.user
        info["name_tag"] = ACCOUNT  # nats-server's tag of the global account
    if detail:
        info["subscriptions_list_detail"] = [_sub_detail(conn, s) for s in conn.subs.values()]
    elif subs:
        info["subscriptions_list"] = [s.subject for s in conn.subs.values()]
    return info


def _sub_detail(conn: ClientConnection, sub: Any, account: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"subject": sub.subject}
    if sub.queue:
        out["qgroup"] = sub.queue
    out.update({"sid": sub.sid, "msgs": sub.delivered, "cid": conn.cid})
    if account:
        out["account"] = out["account_tag"] = ACCOUNT
    if sub.max_msgs:
        out["max"] = sub.max_msgs
    return out


def _js_config(app: Monitored, limits: ServerLimits) -> dict[str, Any]:
    config: dict[str, Any] = {
        # the bounds enforced: the ones set, else nats-server's defaults (engine/limits.py)
        "max_memory": limits.max_memory,
        "max_storage": limits.max_storage,
        "store_dir": app.store_url,
        "sync_interval": 0,
    }
    if app.config.sync == "always":
        config["sync_always"] = True  # every group commit is fsynced
    config["strict"] = True
    return config


def _varz_jetstream(app: Monitored) -> dict[str, Any]:
    broker, js = app.broker, app.jetstream
    if broker is None or js is None:
        return {}
    return {
        "config": _js_config(app, broker.limits),
        "stats": _js_stats(broker, js),
        "limits": broker.limits.report(),
    }


def _js_stats(broker: Broker, js: JetStreamApi) -> dict[str, Any]:
    """JetStream usage of the one account, as /varz and /jsz both show it."""
    usage = broker.account_usage()
    return {
        "memory": usage["memory"],
        "storage": usage["storage"],
        "reserved_memory": usage["reserved_memory"],
        "reserved_storage": usage["reserved_storage"],
        "accounts": 1,
        "ha_assets": 0,
        "api": {"level": API_LEVEL, "total": js.api_total, "errors": js.api_errors},
    }


def _stream_detail(app: Monitored, stream: Any, config: bool, consumers: bool) -> dict[str, Any]:
    js, api, registry = app.jetstream, app.consumer_api, app.consumers
    assert js is not None
    info = js.stream_info(stream)
    detail: dict[str, Any] = {"name": stream.name, "created": info["created"]}
    if config:
        detail["config"] = info["config"]
    detail["state"] = info["state"]
    if consumers and api is not None and registry is not None:
        items: Iterable[Any] = registry.consumers_of(stream.name)
        infos = []
        for consumer in items:
            one = api.info(consumer)
            if not config:
                one.pop("config", None)
            infos.append(one)
        detail["consumer_detail"] = infos
    return detail


def rss_bytes() -> int:
    """The process's resident memory (``/varz`` ``mem``, and ``/metrics``), 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _cpu_percent(started: float) -> float:
    """Average CPU use since start, in percent of one core (nats-server: recent use)."""
    elapsed = max(time.time() - started, 1e-9)
    times = os.times()
    return round(100.0 * (times.user + times.system) / elapsed, 2)
