"""nats-server's configuration keys as Tether's settings.

:data:`KEYS` is the one table: for every key nats-server reads (top level and inside
``authorization``, its ``users`` entries and ``jetstream``) it says whether Tether maps it
to a setting, accepts it with a warning (it changes nothing about who may do what), or
refuses to start (it asks for security Tether does not enforce yet, or would send
messages elsewhere). docs/compatibility.md shows the table as :func:`markdown` renders it.
Keys nats-server does not know are refused, as nats-server refuses them, unless the file
only uses them as ``$VARIABLES``.
"""

from __future__ import annotations

from tether.server.conf import readers as r
from tether.server.conf import transports
from tether.server.conf.readers import Key
from tether.server.conf.values import Item


def translate(doc: dict[str, Item]) -> r.Translation:
    """Tether's settings (``ServerConfig`` keys) for a parsed nats-server file."""
    result = r.Translation(_BY_BLOCK)
    result.read("", doc)
    if result.http_host is not None:
        host, item = result.http_host
        if host != result.values.get("host", host):
            result.warn(item, f"http host {host!r} ignored: Tether serves HTTP on the client host")
    return result


def _mapped(block: str, names: str, tether: str, read: r.Reader) -> Key:
    return Key(block, tuple(names.split()), "mapped", tether, read)


def _warn(block: str, names: str, why: str) -> Key:
    return Key(block, tuple(names.split()), "warn", why)


def _refuse(block: str, names: str, why: str) -> Key:
    return Key(block, tuple(names.split()), "refuse", why)


_AUTH = "authorization"
_USER = "authorization.users"
_JS = "jetstream"
_JSL = "jetstream.limits"
_JSB = "jetstream.limits.batch"
_NO_ACCOUNTS = "Tether has one account; there is no system account"
_NO_ENCRYPTION = "encryption at rest is not supported: the store would be written in the clear"
_JS_TUNING = "a tuning knob of nats-server's own store"

KEYS: tuple[Key, ...] = (
    # -- listeners ---------------------------------------------------------------------
    _mapped("", "listen", '`host` and `port` (`"host:port"` or a port)', r.listen),
    _mapped("", "host net", "`host`", r.setter("host", r.text)),
    _mapped("", "port", "`port` (`-1` picks a free port)", r.port_key),
    _mapped("", "http", '`http_port` (`"host:port"` or a port; HTTP is served on `host`)', r.http),
    _mapped("", "http_port monitor_port", "`http_port`", r.http_port_key),
    _warn("", "http_base_path", "Tether's HTTP paths have no prefix"),
    _warn("", "client_advertise", "INFO always names the listen address"),
    _mapped("", "server_name", "`server_name`", r.server_name),
    # -- limits ------------------------------------------------------------------------
    _mapped("", "max_payload", "`max_payload`", r.limit("max_payload", most=r.INT32_MAX)),
    _mapped("", "max_pending", "`max_pending`", r.limit("max_pending")),
    _mapped(
        "", "max_control_line", "`max_control_line`", r.limit("max_control_line", most=r.INT32_MAX)
    ),
    _mapped(
        "",
        "max_connections max_conn",
        "`max_connections` (`0` refuses every client, as in nats-server)",
        r.setter("max_connections", r.integer),
    ),
    _mapped("", "ping_interval", "`ping_interval` (a duration)", r.duration("ping_interval")),
    _mapped("", "ping_max", "`max_pings_out`", r.limit("max_pings_out")),
    _mapped("", "write_deadline", "`write_deadline` (a duration)", r.duration("write_deadline")),
    _warn("", "write_timeout", "a slow consumer is always closed"),
    _warn("", "max_subscriptions max_subs", "subscriptions per connection are not limited"),
    _warn("", "max_sub_tokens max_subscription_tokens", "subject tokens are not limited"),
    _warn("", "max_closed_clients", "closed connections are not kept for /connz"),
    _warn("", "no_header_support", "headers are always supported"),
    _warn("", "disable_sublist_cache no_sublist_cache", "Tether has no such cache"),
    _warn("", "no_fast_producer_stall", "a fast producer is never stalled"),
    _mapped(
        "",
        "lame_duck_duration",
        "`lame_duck_duration` (a duration)",
        r.lame_duck("lame_duck_duration"),
    ),
    _mapped(
        "",
        "lame_duck_grace_period",
        "`lame_duck_grace_period` (a duration)",
        r.lame_duck("lame_duck_grace_period"),
    ),
    # -- security ----------------------------------------------------------------------
    _mapped(
        "",
        "authorization",
        "`auth_token`, `user` and `password`, or `users`; `default_permissions` and "
        "`auth_timeout` (keys below)",
        r.authorization,
    ),
    _refuse("", "accounts", "accounts are not supported yet: all clients would share one account"),
    _mapped(
        "",
        "no_auth_user",
        "`no_auth_user`: a client without credentials is that user",
        r.setter("no_auth_user", r.text),
    ),
    _mapped(
        "",
        "operator operators root roots root_operator root_operators",
        "`operator`: the operator JWT (a file, or inline); one operator",
        r.operator,
    ),
    _mapped(
        "",
        "resolver account_resolver accounts_resolver",
        "`resolver`: `MEMORY` only (a URL or a resolver map is refused)",
        r.resolver,
    ),
    _mapped(
        "",
        "resolver_preload",
        "`resolver_preload`: account public key to account JWT (one account, and the "
        "operator's system account)",
        r.resolver_preload,
    ),
    _refuse("", "trusted trusted_keys", "trusted keys without an operator JWT are not supported"),
    _refuse("", "resolver_tls resolver_pinned_accounts", "only the MEMORY resolver is supported"),
    _refuse("", "default_sentinel", "auth callout is not supported yet"),
    _refuse("", "proxies", "trusted proxies are not supported yet"),
    _refuse(
        "",
        "proxy_protocol",
        "the PROXY protocol is not supported: clients' addresses would be lost",
    ),
    _warn("", "system_account system", _NO_ACCOUNTS),
    _warn("", "no_system_account no_system no_sys_acc", _NO_ACCOUNTS),
    _refuse(
        "",
        "mappings maps",
        "subject mappings are not supported yet: messages would not go where the file says",
    ),
    # -- JetStream ---------------------------------------------------------------------
    _mapped(
        "",
        "jetstream",
        "`jetstream`: `enabled`, `disabled`, a boolean, or a map (keys below) that turns it "
        "on; without the key Tether keeps JetStream on",
        r.jetstream,
    ),
    _mapped("", "store_dir storedir", '`store = "sqlite:DIR"`', r.store_dir),
    _warn("", "default_js_domain", "JetStream domains are not supported"),
    # -- other servers and protocols ---------------------------------------------------
    _warn("", "cluster", "Tether runs as a single server"),
    _warn("", "gateway", "Tether runs as a single server"),
    _warn("", "leaf leafnodes", "leaf node connections are not supported"),
    _warn("", "mqtt", "the MQTT listener is not supported"),
    _warn("", "connect_error_reports reconnect_error_reports", "Tether runs as a single server"),
    _warn("", "server_tags", "Tether runs as a single server"),
    _warn("", "server_metadata", "not reported"),
    _warn("", "feature_flags", "nats-server's own switches"),
    # -- logging and process -----------------------------------------------------------
    _mapped("", "debug", '`log_level = "debug"` when true', r.debug),
    _mapped("", "trace trace_verbose trace_headers", '`log_level = "debug"` when true', r.debug),
    _mapped(
        "",
        "logtime",
        "Tether's log lines always carry the time; `false` is warned about",
        r.logtime,
    ),
    _warn("", "logtime_utc", "log times are local"),
    _mapped("", "log_file logfile", "`log_file`", r.setter("log_file", r.text)),
    _warn("", "log_size_limit logfile_size_limit log_max_num logfile_max_num", "no log rotation"),
    _warn("", "syslog remote_syslog", "logs go to stderr or `log_file`"),
    _warn("", "max_traced_msg_len", "messages are not traced"),
    _mapped("", "pid_file pidfile", "`pid_file`", r.setter("pid_file", r.text)),
    _warn("", "ports_file_dir", "no ports file is written"),
    _warn("", "prof_port prof_block_rate", "there is no Go profiler"),
    # -- authorization { } -------------------------------------------------------------
    _mapped(_AUTH, "user username", "`user`", r.setter("user", r.text)),
    _mapped(_AUTH, "password pass", "`password` (plain, or a bcrypt hash)", r.secret("password")),
    _mapped(_AUTH, "token", "`auth_token` (plain, or a bcrypt hash)", r.secret("auth_token")),
    _mapped(_AUTH, "timeout", "`auth_timeout` (seconds or a duration)", r.auth_timeout),
    _mapped(
        _AUTH,
        "users",
        "`users` (`user` and `password` when it holds one user without permissions)",
        r.users,
    ),
    _mapped(
        _AUTH,
        "permissions default_permissions default_permission",
        "`default_permissions` (for users without their own)",
        r.permissions("default_permissions"),
    ),
    _refuse(_AUTH, "auth_callout auth_hook", "auth callout is not supported yet"),
    _refuse(_AUTH, "proxy_required", "trusted proxies are not supported yet"),
    # -- authorization { users [ { } ] } -----------------------------------------------
    _mapped(_USER, "user username", "`user`", r.setter("user", r.text)),
    _mapped(_USER, "password pass", "`password` (plain, or a bcrypt hash)", r.secret("password")),
    _mapped(_USER, "nkey", "`nkey`: a user public key; the client signs a nonce", r.nkey),
    _mapped(
        _USER,
        "permissions permission authorization",
        "`permissions`: `publish`, `subscribe` (a subject, a list, or `allow`/`deny`), "
        "`allow_responses`",
        r.permissions("permissions"),
    ),
    _refuse(
        _USER,
        "allowed_connection_types connection_types clients",
        "connection types are not checked yet",
    ),
    _refuse(_USER, "proxy_required", "trusted proxies are not supported yet"),
    # -- jetstream { } -----------------------------------------------------------------
    _mapped(_JS, "store_dir store storedir", '`store = "sqlite:DIR"`', r.store_dir),
    _mapped(_JS, "enabled enable", "`jetstream`", r.setter("jetstream", r.boolean)),
    _mapped(
        _JS,
        "sync_interval sync",
        '`sync = "always"` for `always`; a period is warned about (Tether syncs every commit)',
        r.sync_interval,
    ),
    _mapped(
        _JS,
        "max_memory_store max_mem_store max_mem",
        "`max_memory_store`: bytes the streams with `storage: memory` may hold, counted as "
        "nats-server counts memory (they live in the store like every stream); a negative "
        "size is the default, as when the key is absent: 75 % of the RAM as nats-server "
        "(with `--store memory`, 3/8: file streams live in RAM too)",
        r.store_size("max_memory_store"),
    ),
    _mapped(
        _JS,
        "max_file_store max_file",
        "`max_file_store`: bytes the streams with `storage: file` may hold, counted as "
        "nats-server counts its files; a negative size is the default, as when the key is "
        "absent: 75 % of the free disk where the store lives, as nats-server, with the "
        "store's own files counted as free (3/8 of the RAM with `--store memory`)",
        r.store_size("max_file_store"),
    ),
    _warn(_JS, "domain", "JetStream domains are not supported: the API stays on $JS.API"),
    _refuse(_JS, "key ek encryption_key", _NO_ENCRYPTION),
    _refuse(_JS, "prev_key prev_ek prev_encryption_key", _NO_ENCRYPTION),
    _refuse(_JS, "cipher", _NO_ENCRYPTION),
    _refuse(_JS, "tpm", _NO_ENCRYPTION),
    _warn(_JS, "strict", "Tether's JetStream API is always strict"),
    _mapped(_JS, "limits", "the keys below", r.jetstream_limits),
    _warn(_JS, "unique_tag max_outstanding_catchup", "Tether runs as a single server"),
    _warn(
        _JS,
        "max_buffered_size max_buffered_msgs request_queue_limit info_queue_limit "
        "max_concurrent_io extension_hint",
        _JS_TUNING,
    ),
    _warn(
        _JS, "meta_compact meta_compact_size meta_compact_sync", "Tether runs as a single server"
    ),
    # -- jetstream { limits { } } -------------------------------------------------------
    _mapped(
        _JSL,
        "max_ack_pending",
        "`js_max_ack_pending`: a consumer's largest `max_ack_pending` (10121), and the "
        "default's cap",
        r.positive("js_max_ack_pending"),
    ),
    _warn(_JSL, "max_ha_assets", "Tether runs as a single server: nothing is replicated"),
    _mapped(
        _JSL,
        "max_request_batch",
        "`js_max_request_batch`: a pull consumer's largest `max_batch` (10125), and its default",
        r.positive("js_max_request_batch"),
    ),
    _mapped(
        _JSL,
        "duplicate_window",
        "`js_duplicate_window` (a duration): a stream's largest `duplicate_window`, and the "
        "default's cap",
        r.go_duration("js_duplicate_window"),
    ),
    _mapped(
        _JSL,
        "default_max_consumers",
        "`js_default_max_consumers`: consumers of a stream without `max_consumers` (10026); "
        "0 keeps nats-server's default of 1000, a negative count lifts the bound",
        r.default_consumers("js_default_max_consumers"),
    ),
    _mapped(_JSL, "batch", "the keys below", r.jetstream_batch_limits),
    # -- jetstream { limits { batch { } } } ----------------------------------------------
    _mapped(
        _JSB,
        "max_inflight_per_stream",
        "`js_batch_max_inflight_per_stream`: open atomic and fast-ingest batches of a stream",
        r.positive("js_batch_max_inflight_per_stream"),
    ),
    _mapped(
        _JSB,
        "max_inflight_total",
        "`js_batch_max_inflight_total`: open atomic and fast-ingest batches of the server",
        r.positive("js_batch_max_inflight_total"),
    ),
    _mapped(
        _JSB,
        "max_msgs",
        "`js_batch_max_msgs`: messages of an atomic batch",
        r.positive("js_batch_max_msgs"),
    ),
    _mapped(
        _JSB,
        "timeout",
        "`js_batch_timeout` (a duration): idle time that abandons a batch",
        r.go_duration("js_batch_timeout"),
    ),
    # -- tls { }, https, websocket { } (conf/transports.py) ----------------------------
    *transports.TOP_KEYS,
    *transports.KEYS,
)

_BY_BLOCK: dict[str, dict[str, Key]] = {}
for _key in KEYS:
    for _name in _key.names:
        _BY_BLOCK.setdefault(_key.block, {})[_name] = _key

_BLOCK_TITLES = {
    "": "Top level",
    _AUTH: "`authorization { }`",
    _USER: "`authorization { users: [ { } ] }`",
    _JS: "`jetstream { }`",
    _JSL: "`jetstream { limits { } }`",
    _JSB: "`jetstream { limits { batch { } } }`",
    **transports.BLOCK_TITLES,
}
_STATUS_WORDS = {"mapped": "mapped to", "warn": "warned, ignored:", "refuse": "**refused**:"}


def markdown() -> str:
    """The table as docs/compatibility.md shows it: one row per key and its aliases."""
    lines: list[str] = []
    for block, title in _BLOCK_TITLES.items():
        lines += ["", f"{title}:", "", "| key | Tether |", "|---|---|"]
        for key in KEYS:
            if key.block == block:
                names = ", ".join(f"`{name}`" for name in key.names)
                lines.append(f"| {names} | {_STATUS_WORDS[key.status]} {key.tether} |")
    return "\n".join(lines[1:]) + "\n"
