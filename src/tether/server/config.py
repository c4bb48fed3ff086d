"""Server settings: one struct, filled from defaults, a TOML file and command-line flags."""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from tether.server.listen import bare_host, split_listen

MiB = 1024 * 1024
LOG_LEVELS = ("debug", "info", "warning", "error")
STORE_FORMS = "'memory', 'sqlite:DIR', 'sqlite://DIR' or 'postgresql://USER:PASS@HOST/DB'"
PORT_RANGE = "0-65535 or -1 (-1 and 0 pick a free port)"


class SeedResource(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A producer or channel that must exist at startup (created or updated)."""

    id: str
    name: str = ""
    token: str = ""


class SeedConsumer(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A consumer that must exist at startup."""

    id: str
    channel: str
    callback: str
    name: str = ""
    token: str = ""
    type: Literal["push", "pull"] = "push"


class WebhookSeed(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """webhook-broker's seed data (``[initial-*]`` sections), also writable in TOML as
    ``[[webhook_seed.channels]]`` tables."""

    producers: list[SeedResource] = msgspec.field(default_factory=list)
    channels: list[SeedResource] = msgspec.field(default_factory=list)
    consumers: list[SeedConsumer] = msgspec.field(default_factory=list)


class SubjectRules(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``allow`` and ``deny`` subjects; deny wins. No ``allow`` list: everything not denied."""

    allow: list[str] | None = None
    deny: list[str] | None = None


class ResponseRules(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``allow_responses``: replies to each request received (``max`` of them, within
    ``expires`` seconds; 0 or less for no bound) may be published."""

    max: int = 1
    expires: float = 120.0


class Permissions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a user may publish to and subscribe to, as nats-server's ``permissions``:
    each side a subject, a list of subjects (allowed) or ``{allow, deny}``. A subscribe
    subject may name a queue group: ``"foo.* workers"``."""

    publish: str | list[str] | SubjectRules | None = None
    subscribe: str | list[str] | SubjectRules | None = None
    allow_responses: bool | ResponseRules = False


class UserEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One of ``users``: a name and password (plain, or a bcrypt hash), or an nkey."""

    user: str | None = None
    password: str | None = None
    nkey: str | None = None  # a user public key (U...): the client signs the INFO nonce
    permissions: Permissions | None = None  # None: default_permissions, else anything


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every setting of ``tether serve``; each has a TOML key of the same name."""

    host: str = "127.0.0.1"  # an IPv6 address bare (::1) or in brackets ([::1])
    port: int = 4222  # -1 or 0 picks a free port
    # nats-server's "host:port" ("[::]:4222", ":4222" or a port): sets host and port
    listen: str | int | None = None
    http_port: int = 8222  # -1 or 0 picks a free port; None-like 0 never disables it
    store: str = "sqlite:./tether-data"
    sync: Literal["always", "os"] = "always"
    # -- PostgreSQL store: active/standby (docs/deployment.md) --------------------------------
    # host:port (or nats://host:port) of every node clients may use, this one and its
    # standbys: sent in INFO connect_urls so clients learn where to reconnect.
    connect_urls: list[str] = msgspec.field(default_factory=list)
    ha_poll_interval: float = 1.0  # seconds between a standby's tries of the leader lock
    # A paused or cut-off active node loses the lock this many seconds after its last
    # heartbeat (idle_session_timeout of its lock session); a crashed one at once.
    ha_session_timeout: float = 10.0
    postgres_keepalive: float = 5.0  # TCP keepalive idle seconds (both sides of each session)
    jetstream: bool = True  # false: no $JS.API, no streams, no store (docs/configuration.md)
    # "API PREFIX=URL[,URL…]": where mirrors and sources with external.api read (docs/sourcing.md)
    js_external_origins: list[str] = msgspec.field(default_factory=list)
    # "API PREFIX=URL[,URL…]": serve $JS.API there as PREFIX, for its mirrors (docs/sourcing.md)
    js_api_exports: list[str] = msgspec.field(default_factory=list)
    # -- JetStream limits: nats-server's jetstream block (docs/configuration.md) ----------------
    # Bytes the streams with storage "memory" / "file" may hold, counted as nats-server
    # counts each (every stream lives in the store); 0: none may be stored; -1: nats-server's
    # default, worked out at start (3/4 of the RAM / of the free disk of the store, its
    # files counted as free; 3/8 of the RAM each for a store in memory).
    max_memory_store: Annotated[int, msgspec.Meta(ge=-1)] = -1
    max_file_store: Annotated[int, msgspec.Meta(ge=-1)] = -1
    # nats-server's jetstream.limits (0: its defaults, no cap)
    js_max_ack_pending: Annotated[int, msgspec.Meta(ge=0)] = 0  # consumers' largest
    js_max_request_batch: Annotated[int, msgspec.Meta(ge=0)] = 0  # pull consumers' max_batch
    js_duplicate_window: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # seconds, streams' largest
    # consumers of a stream without max_consumers; 0: nats-server's 1000, -1: no bound
    js_default_max_consumers: Annotated[int, msgspec.Meta(ge=-1)] = 0
    js_batch_max_inflight_per_stream: Annotated[int, msgspec.Meta(ge=0)] = 0  # 50 / 1000 fast
    js_batch_max_inflight_total: Annotated[int, msgspec.Meta(ge=0)] = 0  # 1000 / 50,000 fast
    js_batch_max_msgs: Annotated[int, msgspec.Meta(ge=0)] = 0  # an atomic batch's; 1000
    js_batch_timeout: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # seconds idle; 10
    lame_duck_duration: float = 120.0  # seconds lame duck mode takes to close every client
    lame_duck_grace_period: float = 10.0  # seconds it waits before closing the first one
    auth_token: str | None = None
    user: str | None = None
    password: str | None = None
    # -- authorization (docs/configuration.md): users, permissions, nkeys, JWT -----------------
    users: list[UserEntry] = msgspec.field(default_factory=list)
    default_permissions: Permissions | None = None  # for users without their own
    no_auth_user: str | None = None  # a client sending no credentials is this user
    # Operator mode: the operator JWT (inline, or a file), account JWTs preloaded into
    # the memory resolver (public key -> JWT), user JWTs (.creds) in CONNECT.
    operator: str | None = None
    resolver: str | None = None  # "MEMORY" (the only resolver Tether has)
    resolver_preload: dict[str, str] = msgspec.field(default_factory=dict)
    # -- TLS (docs/tls.md): nats-server's tls {} block and --tls* flags --------------------
    tls: bool = False  # clients must upgrade to TLS (INFO says tls_required)
    tls_cert: str | None = None  # PEM certificate chain
    tls_key: str | None = None  # PEM private key
    tls_ca: str | None = None  # CAs that sign client certificates (verify)
    tls_verify: bool = False  # require and verify a client certificate
    tls_verify_and_map: bool = False  # ... and the certificate names the user (no password)
    tls_timeout: float = 2.0  # seconds the handshake may take
    tls_handshake_first: bool = False  # TLS from the first byte; INFO inside TLS
    http_tls: bool = False  # the HTTP port serves HTTPS with tls_cert and tls_key
    # -- WebSocket (docs/tls.md): nats-server's websocket {} block -----------------------------
    ws_port: int = 0  # 0: no WebSocket listener; -1 picks a free port
    ws_no_tls: bool = False  # plain ws:// (nats-server insists on saying so)
    ws_tls_cert: str | None = None  # wss:// with this certificate and key
    ws_tls_key: str | None = None
    ws_compression: bool = False  # permessage-deflate when the client offers it
    ws_same_origin: bool = False  # an Origin header must name the request's host
    ws_allowed_origins: list[str] = msgspec.field(default_factory=list)
    ws_handshake_timeout: float = 0.0  # seconds for the upgrade request; 0: no limit
    max_payload: int = MiB
    max_connections: int = 64 * 1024
    max_pending: int = 64 * MiB  # per-connection outbound bytes before "Slow Consumer"
    # Outbound bytes all connections together may hold; over it, the largest backlogs
    # are cut off as slow consumers. 0: no bound but each connection's max_pending.
    max_pending_total: Annotated[int, msgspec.Meta(ge=0)] = 256 * MiB
    max_control_line: int = 4096
    ping_interval: float = 120.0  # seconds between server PINGs
    max_pings_out: int = 2  # unanswered PINGs before "Stale Connection"
    auth_timeout: float = 2.0
    write_deadline: float = 10.0  # seconds a closing slow consumer may take to drain
    server_name: str = ""
    log_level: str = "info"
    log_file: str | None = None  # log here instead of stderr
    log_format: Literal["text", "json"] = "text"  # json: one object a line (cli/logs.py)
    # -- the dashboard (/ui/), /docs and /metrics (docs/operations.md) ----------------------
    ui: bool = True  # serve the dashboard at /ui/ and the API reference at /docs
    ui_read_only: bool = False  # the dashboard shows, never acts (requeue, delete)
    # Basic credentials the dashboard's actions need; without a password they need none
    # unless clients must authenticate (then the dashboard cannot act at all).
    http_admin_user: str = "admin"
    http_admin_password: str | None = None  # plain, or a bcrypt hash ($2a$/$2b$)
    ui_anonymous: Literal["read", "refuse"] = "read"  # without credentials: look, or nothing
    metrics_max_consumers: Annotated[int, msgspec.Meta(ge=0)] = 10_000  # series past it: none
    pid_file: str | None = None  # the process id, written at start, removed at exit
    # -- webhook-broker compatible HTTP API (docs/http-api.md) --------------------------------
    # A webhook-broker INI file: seed data plus [broker], [consumer-connection], [http],
    # [scheduler] and [gateway-auth]; the keys below (TOML or flags) take precedence.
    webhook_broker_config: str | None = None
    webhook_max_retry: int = 5  # failed attempts retried; max_retry + 1 attempts in all
    webhook_retry_backoff: list[float] = msgspec.field(default_factory=lambda: [5.0, 30.0, 60.0])
    webhook_rational_delay: float = 2.0
    webhook_connection_timeout: float = 30.0  # per push delivery
    webhook_token_header: str = "X-Broker-Consumer-Token"
    webhook_user_agent: str = "Webhook Message Broker"
    webhook_concurrency: int = 16  # deliveries in flight per push consumer
    webhook_min_schedule_delay: float = 120.0
    # Key sealing push consumers' tokens at rest; without one the key lives in the store.
    webhook_token_key: str | None = None
    webhook_seed: WebhookSeed = msgspec.field(default_factory=WebhookSeed)
    http_max_body: int = 0  # request body limit; 0 = max_payload + 64 KiB
    http_gateway_secret: str | None = None  # enables X-Broker-Signature HMAC auth
    http_gateway_tolerance: float = 300.0
    http_gateway_exempt: list[str] = msgspec.field(
        default_factory=lambda: ["/_status", "/metrics", "/debug/pprof/", "/healthz"]
    )
    # What one HTTP client may cost (server/http/limits.py; nginx-like defaults).
    http_max_header_bytes: int = 32 * 1024  # request line + headers → 431 past it
    http_max_headers: int = 100  # header lines → 431 past it
    http_header_timeout: float = 60.0  # seconds for the whole request head → 408
    http_body_timeout: float = 60.0  # seconds between two reads of a body → 408
    http_idle_timeout: float = 75.0  # seconds a kept-alive connection may sit idle
    http_max_connections: int = 1024  # connections at once; requests past it get 503
    # -- NSQ: nsqd's TCP protocol V2 (src/tether/engine/nsq/service.py) ---------------------
    nsq_port: int = 4150  # 0 turns the NSQ front door off; -1 picks a free port
    nsq_max_msg_size: int = MiB  # largest message of a PUB, DPUB or MPUB
    nsq_max_body_size: int = 5 * MiB  # largest body of an MPUB, IDENTIFY or AUTH
    nsq_max_rdy_count: int = 2500  # largest RDY a client may send
    nsq_msg_timeout: float = 60.0  # seconds a message waits for FIN before redelivery
    nsq_max_msg_timeout: float = 900.0  # most a client may ask for (msg_timeout, TOUCH)
    nsq_max_req_timeout: float = 3600.0  # longest REQ delay (longer ones are clamped) and DPUB
    nsq_heartbeat_interval: float = 30.0  # seconds between heartbeats unless IDENTIFY says
    nsq_max_heartbeat_interval: float = 60.0  # most a client may ask for
    nsq_max_output_buffer_size: int = 64 * 1024  # most a client may ask for (accepted only)
    nsq_max_output_buffer_timeout: float = 30.0  # most a client may ask for (accepted only)
    nsq_mem_queue_size: int = 10_000  # messages an #ephemeral topic keeps (the oldest go)
    nsq_deflate: bool = True  # offer deflate compression in IDENTIFY
    nsq_max_deflate_level: int = 6
    nsq_snappy: bool = True  # offer snappy compression in IDENTIFY
    # TLS for NSQ clients asking tls_v1 in IDENTIFY (server/nsq/tls.py); default tls_cert/key
    nsq_tls_cert: str | None = None
    nsq_tls_key: str | None = None
    # nsqd's --tls-required: true (TLS for the TCP port, and nsqd's routes on a plain HTTP
    # port answer 403 TLS_REQUIRED) or "tcp-https" (the TCP port only)
    nsq_tls_required: bool | str = False
    nsq_tls_client_auth_policy: str = ""  # "require-verify": a client cert signed by tls_ca
    # nsqd's and nsqlookupd's HTTP APIs are served on http_port (docs/nsq.md)
    nsq_broadcast_address: str = ""  # announced to clients; default: host, else the host name
    # Other nodes' HOST:HTTPPORT: /lookup, /topics, /nodes list their producers too
    nsq_lookupd_peers: list[str] = msgspec.field(default_factory=list)
    nsq_lookupd_poll_interval: float = 5.0  # seconds between polls of each peer (20 % jitter)
    nsq_lookupd_http_port: int = 0  # also serve nsqlookupd's routes alone here (4161); 0: no
    nsq_https_port: int = 0  # nsqd's HTTP API over TLS, nsqd's --https-address; 0: no, -1: free

    @property
    def auth_required(self) -> bool:
        return bool(self.auth_token or self.user or self.users or self.operator)


def load_config(
    path: str | Path | None, overrides: dict[str, Any], warnings: list[str] | None = None
) -> ServerConfig:
    """Defaults, then the file, then flags. The file is TOML (top level or a ``[server]``
    table) or nats-server's format (see tether.server.conf.formats); what a nats-server
    file asks for that Tether ignores is appended to ``warnings`` (logged when ``None``)."""
    values: dict[str, Any] = {}
    nats_conf = None if path is None else _read_nats_conf(path, warnings)
    if nats_conf is not None:
        values.update(nats_conf)
    elif path is not None:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from exc
        section = doc.get("server", doc)
        if not isinstance(section, dict):
            raise ValueError(f"{path}: [server] must be a table")
        values.update({k.replace("-", "_"): v for k, v in section.items()})
    values.update({k: v for k, v in overrides.items() if v is not None})
    _apply_listen(values, overrides)
    ini_path = values.get("webhook_broker_config")
    if isinstance(ini_path, str) and ini_path:
        from tether.server.http.ini_config import load_ini

        # The INI file is the compatibility layer: native keys and flags win over it.
        values = {**load_ini(ini_path), **values}
    try:
        cfg = msgspec.convert(values, ServerConfig)
    except msgspec.ValidationError as exc:
        where = f"{path}: " if path else ""
        raise ValueError(f"{where}invalid configuration: {exc}") from exc
    _check(cfg, path, {k for k, v in overrides.items() if v is not None})
    return cfg


def _read_nats_conf(path: str | Path, warnings: list[str] | None) -> dict[str, Any] | None:
    from tether.server.conf.formats import read_nats_conf

    found: list[str] = []
    values = read_nats_conf(path, ServerConfig.__struct_fields__, found)
    if warnings is None:
        for warning in found:
            logging.getLogger("tether").warning("%s", warning)
    else:
        warnings.extend(found)
    return values


def _apply_listen(values: dict[str, Any], flags: dict[str, Any]) -> None:
    """``listen`` sets host and port (a ``--host`` or ``--port`` flag still wins); a
    host in brackets is kept bare."""
    listen = values.get("listen")
    if listen is not None:
        try:
            if not isinstance(listen, str | int):
                raise ValueError('expected "host:port" or a port')
            host, port = split_listen(listen)
        except ValueError as exc:
            raise ValueError(f"listen = {listen!r}: {exc}") from None
        values["listen"] = None
        if host is not None and flags.get("host") is None:
            values["host"] = host
        if flags.get("port") is None:
            values["port"] = port
    if isinstance(values.get("host"), str):
        values["host"] = bare_host(values["host"])


def _store_problem(url: str) -> str | None:
    # The forms tether.storage.open_store takes.
    scheme, colon, rest = url.partition(":")
    if url == "memory" or (colon and scheme in ("postgres", "postgresql")):
        return None
    if colon and scheme == "sqlite":
        return None if rest.removeprefix("//") else "names no directory"
    return "unknown storage"


def _check(cfg: ServerConfig, path: str | Path | None, flags: set[str]) -> None:
    """Values of the right type that still make no sense, named as the user wrote them:
    ``--port 99999`` for a flag, ``tether.toml: port = 99999`` for a key of the file."""

    def source(key: str) -> str:
        value = getattr(cfg, key)
        if key in flags:
            return f"--{key.replace('_', '-')} {value}"
        return f"{path}: {key} = {value!r}" if path else f"{key} = {value!r}"

    for key in ("port", "http_port", "nsq_port", "nsq_https_port"):
        if not -1 <= getattr(cfg, key) <= 65535:
            raise ValueError(f"{source(key)}: not a port: expected {PORT_RANGE}")
    if cfg.port > 0 and cfg.port == cfg.http_port:
        raise ValueError(
            f"{source('port')} and {source('http_port')}: the NATS and the HTTP port must differ"
        )
    _check_tls(cfg, source)
    if cfg.log_level.lower() not in LOG_LEVELS:
        raise ValueError(
            f"{source('log_level')}: unknown log level: expected one of {', '.join(LOG_LEVELS)}"
        )
    if cfg.ui_anonymous == "refuse" and not cfg.http_admin_password:
        raise ValueError(
            f"{source('ui_anonymous')}: nobody could see the dashboard: set http_admin_password too"
        )
    problem = _store_problem(cfg.store)
    if problem:
        raise ValueError(f"{source('store')}: {problem}: expected {STORE_FORMS}")
    if not 0 < cfg.ha_poll_interval < cfg.ha_session_timeout:
        raise ValueError(
            f"{source('ha_poll_interval')}: expected more than 0 seconds, less than"
            f" ha_session_timeout ({cfg.ha_session_timeout:g})"
        )
    for key in ("js_external_origins", "js_api_exports"):
        for entry in getattr(cfg, key):
            prefix, sep, urls = entry.partition("=")
            if not sep or not prefix.strip() or not urls.strip(", "):
                raise ValueError(f"{source(key)}: {entry!r}: expected 'API PREFIX=URL[,URL…]'")
    if not cfg.postgres_keepalive >= 1:
        raise ValueError(f"{source('postgres_keepalive')}: expected 1 second or more")
    if not cfg.lame_duck_duration > 0:
        raise ValueError(f"{source('lame_duck_duration')}: expected more than 0 seconds")
    if not 0 <= cfg.lame_duck_grace_period < cfg.lame_duck_duration:
        raise ValueError(
            f"{source('lame_duck_grace_period')}: expected 0 or more seconds, "
            f"less than lame_duck_duration ({cfg.lame_duck_duration:g})"
        )


def _check_tls(cfg: ServerConfig, source: Callable[[str], str]) -> None:
    """TLS and WebSocket settings that cannot work, in nats-server's words where it has some."""
    if cfg.tls or cfg.http_tls:
        if not cfg.tls_cert:
            raise ValueError("TLS Server certificate must be present and valid")
        if not cfg.tls_key:
            raise ValueError("TLS Server private key must be present and valid")
    if bool(cfg.nsq_tls_cert) != bool(cfg.nsq_tls_key):
        raise ValueError("nsq_tls_cert and nsq_tls_key go together")
    nsq_cert = (cfg.nsq_tls_cert and cfg.nsq_tls_key) or (cfg.tls_cert and cfg.tls_key)
    if cfg.nsq_tls_required not in (True, False, "tcp-https"):
        raise ValueError(f'{source("nsq_tls_required")}: expected true, false or "tcp-https"')
    for key in ("nsq_tls_required", "nsq_https_port"):
        if getattr(cfg, key) and not nsq_cert:
            raise ValueError(
                f"{source(key)}: needs nsq_tls_cert and nsq_tls_key (or tls_cert and tls_key)"
            )
    if cfg.nsq_tls_client_auth_policy not in ("", "require-verify"):
        raise ValueError(
            f'{source("nsq_tls_client_auth_policy")}: expected "require-verify" or "" '
            '(nsqd\'s "require", a certificate nobody checks, is not offered)'
        )
    if not -1 <= cfg.ws_port <= 65535:
        raise ValueError(f"{source('ws_port')}: not a port: expected {PORT_RANGE}")
    if cfg.ws_port:
        if bool(cfg.ws_tls_cert) != bool(cfg.ws_tls_key):
            raise ValueError(
                "websocket: a TLS certificate needs its key, and a key its certificate"
            )
        if not cfg.ws_no_tls and not cfg.ws_tls_cert:
            raise ValueError("websocket requires TLS configuration (or no_tls: true)")
        if cfg.ws_port > 0 and cfg.ws_port in (cfg.port, cfg.http_port):
            raise ValueError(f"{source('ws_port')}: the WebSocket port must differ from the others")
