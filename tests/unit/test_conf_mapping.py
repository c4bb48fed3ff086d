"""nats-server's keys as Tether's settings: what is mapped, warned about or refused,
each message naming file, line and column."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tether.server.conf import ConfError, parse_file, parse_text
from tether.server.conf.mapping import KEYS, translate
from tether.server.conf.readers import Translation
from tether.server.config import ServerConfig

CORPUS = Path(__file__).parent / "conf_corpus"


def tr(text: str, **env: str) -> Translation:
    return translate(parse_text(text, filename="t.conf", environ=env))


def settings(text: str, **env: str) -> dict[str, Any]:
    result = tr(text, **env)
    assert result.errors == []
    assert result.warnings == []
    return result.values


def refused(text: str) -> str:
    result = tr(text)
    assert len(result.errors) == 1, result.errors
    return result.errors[0]


# -- mapped keys -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: 127.0.0.1:4333", {"host": "127.0.0.1", "port": 4333}),
        ("listen: 4333", {"port": 4333}),
        ('listen: "[::1]:4333"', {"host": "::1", "port": 4333}),
        ('listen: ":4333"', {"host": "0.0.0.0", "port": 4333}),
        ("listen: localhost:-1", {"host": "localhost", "port": -1}),
        ("host: 0.0.0.0\nport: 4333", {"host": "0.0.0.0", "port": 4333}),
        ("net: 10.0.0.1", {"host": "10.0.0.1"}),
        ("http: 8333", {"http_port": 8333}),
        ("http_port: -1", {"http_port": -1}),
        ("monitor_port: 8333", {"http_port": 8333}),
        ("server_name: hub-1", {"server_name": "hub-1"}),
        ("max_payload: 512KB", {"max_payload": 524288}),
        ("max_pending: 32MB", {"max_pending": 32 * 1024 * 1024}),
        ("max_control_line: 8KB", {"max_control_line": 8192}),
        ("max_connections: 1k", {"max_connections": 1000}),
        ("max_conn: 0", {"max_connections": 0}),
        ('ping_interval: "30s"', {"ping_interval": 30.0}),
        ("ping_max: 5", {"max_pings_out": 5}),
        ('write_deadline: "500ms"', {"write_deadline": 0.5}),
        ('lame_duck_duration: "45s"', {"lame_duck_duration": 45.0}),
        ('lame_duck_duration: "5s"', {"lame_duck_duration": 5.0}),  # nats-server: 30s or more
        ('lame_duck_grace_period: "5s"', {"lame_duck_grace_period": 5.0}),
        ("debug: true", {"log_level": "debug"}),
        ("trace: on", {"log_level": "debug"}),
        ("debug: false\ntrace: false\nlogtime: true", {}),
        ("log_file: /var/log/tether.log", {"log_file": "/var/log/tether.log"}),
        ("pidfile: tether.pid", {"pid_file": "tether.pid"}),
        # nats-server reads 0 as "the default" for these
        ('max_payload: 0\nmax_pending: 0\nping_max: 0\nping_interval: "0s"', {}),
    ],
)
def test_mapped_keys(text: str, expected: dict[str, Any]) -> None:
    assert settings(text) == expected


def test_option_names_match_in_any_case() -> None:
    assert settings("PORT: 4333\nMax_Payload: 1KB") == {"port": 4333, "max_payload": 1024}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("authorization { token: s3cret }", {"auth_token": "s3cret"}),
        ("authorization { user: app, password: pw }", {"user": "app", "password": "pw"}),
        ("authorization { username: app, pass: pw }", {"user": "app", "password": "pw"}),
        ("authorization { token: t, timeout: 5 }", {"auth_token": "t", "auth_timeout": 5.0}),
        ('authorization { token: t, timeout: "1.5s" }', {"auth_token": "t", "auth_timeout": 1.5}),
        (
            "authorization { users: [ {user: app, password: pw} ] }",
            {"user": "app", "password": "pw"},
        ),
        ("authorization { users: [] }", {}),
        (
            "authorization { user: a, password: $2a$11$W2zko751KUvVy59mUTWmpOdWjpEm5qhcCZRd05GjI }",
            {"user": "a", "password": "$2a$11$W2zko751KUvVy59mUTWmpOdWjpEm5qhcCZRd05GjI"},
        ),
        (
            "authorization {\n  users: [\n    {user: a, password: b}\n    {user: c, password: d}\n  ]\n}",
            {"users": [{"user": "a", "password": "b"}, {"user": "c", "password": "d"}]},
        ),
        (
            "authorization { users: [ {user: a, password: b, permissions: {publish: x}} ] }",
            {"users": [{"user": "a", "password": "b", "permissions": {"publish": ["x"]}}]},
        ),
        (
            "authorization { users: [ {nkey: UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4} ] }",
            {"users": [{"nkey": "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"}]},
        ),
        (
            "authorization {\n  token: t\n  permissions: { publish: x }\n}",
            {"auth_token": "t", "default_permissions": {"publish": ["x"]}},
        ),
        (
            "authorization { users: [ {user: a, password: b, permissions: {\n"
            "  pub: {allow: [a, b], deny: c}\n"
            '  subscribe: ["x.*", "y q1"]\n'
            '  allow_responses: {max: 2, expires: "1m"}\n'
            "} } ] }",
            {
                "users": [
                    {
                        "user": "a",
                        "password": "b",
                        "permissions": {
                            "publish": {"allow": ["a", "b"], "deny": ["c"]},
                            "subscribe": ["x.*", "y q1"],
                            "allow_responses": {"max": 2, "expires": 60.0},
                        },
                    }
                ]
            },
        ),
        ("no_auth_user: app", {"no_auth_user": "app"}),
        (
            'operator: "op.jwt"\nresolver: MEMORY\nresolver_preload: { AABC: "eyJ.x.y" }',
            {"operator": "op.jwt", "resolver": "MEMORY", "resolver_preload": {"AABC": "eyJ.x.y"}},
        ),
        ("T: abc\nauthorization { token: $T }", {"auth_token": "abc"}),
    ],
)
def test_authorization(text: str, expected: dict[str, Any]) -> None:
    assert settings(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("jetstream: enabled", {"jetstream": True}),
        ("jetstream: Disabled", {"jetstream": False}),
        ("jetstream: false", {"jetstream": False}),
        ("jetstream: {}", {"jetstream": True}),
        ("jetstream { enabled: false }", {"jetstream": False}),
        ("jetstream { store_dir: /data/js }", {"jetstream": True, "store": "sqlite:/data/js"}),
        ('jetstream { store: "./js" }', {"jetstream": True, "store": "sqlite:./js"}),
        ('store_dir: "./js"', {"store": "sqlite:./js"}),
        ("jetstream { sync_interval: always }", {"jetstream": True, "sync": "always"}),
    ],
)
def test_jetstream(text: str, expected: dict[str, Any]) -> None:
    assert settings(text) == expected


# -- warnings --------------------------------------------------------------------------


def _minimal(block: str, name: str) -> str:
    if block == "":
        return f"{name}: 1"
    if block == "authorization.users":
        return f"authorization {{ users: [ {{ user: a, {name}: 1 }} ] }}"
    if block == "tls":  # a tls block needs its certificate and key
        return f"tls {{\n  {name}: 1\n  cert_file: c.pem, key_file: k.pem\n}}"
    if block == "websocket.tls":
        return f"websocket {{ tls {{\n  {name}: 1\n  cert_file: c.pem, key_file: k.pem\n}} }}"
    blocks = block.split(".")  # nested maps: jetstream { limits { ... } }
    return " { ".join(blocks) + f" {{\n  {name}: 1\n" + "} " * len(blocks)


WARNED = [(k.block, name) for k in KEYS if k.status == "warn" for name in k.names]
REFUSED = [(k.block, name) for k in KEYS if k.status == "refuse" for name in k.names]


@pytest.mark.parametrize(("block", "name"), WARNED, ids=[f"{b}.{n}" for b, n in WARNED])
def test_every_warned_key_is_reported_once_with_its_line(block: str, name: str) -> None:
    result = tr(_minimal(block, name))
    assert result.errors == []
    line = 1 if block == "" else 2
    col = 1 if block == "" else 3
    assert result.warnings == [
        f"t.conf:{line}:{col}: {block + '.' if block else ''}{name} ignored: "
        + next(k.tether for k in KEYS if k.block == block and name in k.names)
    ]


@pytest.mark.parametrize(("block", "name"), REFUSED, ids=[f"{b}.{n}" for b, n in REFUSED])
def test_every_refused_key_stops_the_start_with_its_line(block: str, name: str) -> None:
    message = refused(_minimal(block, name))
    where = "authorization.users[0]." if block == "authorization.users" else f"{block}."
    assert re.match(
        rf"t\.conf:\d+:\d+: {re.escape((where if block else '') + name)} refused: ", message
    )


def test_warnings_follow_the_file_and_name_each_line() -> None:
    text = (CORPUS / "cluster.conf").read_text().replace("tls {", "tls_was {", 1)
    result = tr(text)
    assert result.warnings == [
        "t.conf:15:1: cluster ignored: Tether runs as a single server",
        "t.conf:23:1: gateway ignored: Tether runs as a single server",
        "t.conf:24:1: leafnodes ignored: leaf node connections are not supported",
        "t.conf:26:1: mqtt ignored: the MQTT listener is not supported",
        "t.conf:5:1: http host 'localhost' ignored: Tether serves HTTP on the client host",
    ]
    assert result.errors == ['t.conf:7:1: unknown field "tls_was"']


def test_the_production_cluster_file_keeps_its_tls_and_websocket() -> None:
    result = translate(parse_file(CORPUS / "cluster.conf"))
    assert result.errors == []
    values = result.values
    assert values["tls"] is True and values["tls_verify"] is True
    assert (values["tls_cert"], values["tls_key"], values["tls_ca"], values["tls_timeout"]) == (
        "./certs/server.pem",
        "./certs/server-key.pem",
        "./certs/ca.pem",
        2.0,
    )
    assert (values["ws_port"], values["ws_no_tls"]) == (8080, True)
    assert values["lame_duck_duration"] == 120.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tls { cert_file: c, key_file: k }", {"tls": True, "tls_cert": "c", "tls_key": "k"}),
        (
            "tls { cert_file: c, key_file: k, handshake_first: true, timeout: 0.5 }",
            {
                "tls": True,
                "tls_cert": "c",
                "tls_key": "k",
                "tls_handshake_first": True,
                "tls_timeout": 0.5,
            },
        ),
        ("https: 8443", {"http_port": 8443, "http_tls": True}),
        (
            "websocket { port: 8080, no_tls: true, compression: true, same_origin: true }",
            {"ws_port": 8080, "ws_no_tls": True, "ws_compression": True, "ws_same_origin": True},
        ),
        (
            'websocket { port: -1, allowed_origins: "https://a.example" }',
            {"ws_port": -1, "ws_allowed_origins": ["https://a.example"]},
        ),
        (
            "websocket { port: 1, tls { cert_file: c, key_file: k } }",
            {"ws_port": 1, "ws_tls_cert": "c", "ws_tls_key": "k"},
        ),
    ],
)
def test_tls_and_websocket(text: str, expected: dict[str, Any]) -> None:
    assert settings(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls { cert_file: c }", "t.conf:1:1: tls: missing 'key_file' in TLS configuration"),
        ("tls { key_file: k }", "t.conf:1:1: tls: missing 'cert_file' in TLS configuration"),
        (
            'tls { cert_file: c, key_file: k, handshake_first: "auto" }',
            "t.conf:1:34: tls.handshake_first: only true or false",
        ),
        (
            "websocket { port: 1, allowed_origins: [ftp://x] }",
            "websocket.allowed_origins: 'ftp://x' is not an http:// or https:// URL",
        ),
    ],
)
def test_tls_and_websocket_errors(text: str, message: str) -> None:
    assert message in refused(text)


def test_a_bare_number_for_a_duration_is_seconds_with_a_warning() -> None:
    result = tr("ping_interval: 45")
    assert result.values == {"ping_interval": 45.0}
    assert result.warnings == [
        't.conf:1:1: ping_interval: a bare number is read as seconds; write a duration ("45s")'
    ]


def test_an_unquoted_2m_is_two_million_seconds_as_in_nats_server() -> None:
    result = tr("write_deadline: 2m")
    assert result.values == {"write_deadline": 2_000_000.0}
    assert result.warnings == [
        "t.conf:1:1: write_deadline: unquoted 2m is the size 2000000, so 2000000 seconds "
        '(as nats-server reads it); write "2m" for a duration'
    ]


@pytest.mark.parametrize(
    ("text", "warning"),
    [
        ("logtime: false", "logtime: false ignored: Tether's log lines always carry the time"),
        ("http: 0", "http: 0 turns monitoring off in nats-server"),
        ('jetstream { sync_interval: "1m" }', "jetstream.sync_interval: a period is ignored"),
        ("listen: 0.0.0.0:4222\nhttp: 127.0.0.1:8222", "http host '127.0.0.1' ignored"),
    ],
)
def test_values_tether_cannot_honour_are_warned_about(text: str, warning: str) -> None:
    result = tr(text)
    assert result.errors == []
    assert len(result.warnings) == 1
    assert warning in result.warnings[0]


def test_same_http_and_client_host_is_not_warned_about() -> None:
    assert tr("listen: 127.0.0.1:4222\nhttp: 127.0.0.1:8222").warnings == []


# -- refusals and errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("accounts { A: { users: [ {user: a, password: b} ] } }", "t.conf:1:1: accounts refused"),
        (
            "tls { cert_file: a.pem, key_file: a.key, pinned_certs: [abc] }",
            "t.conf:1:42: tls.pinned_certs refused: pinned client certificates",
        ),
        ("jetstream { key: s3cret }", "t.conf:1:13: jetstream.key refused: encryption at rest"),
        ("mappings { a: b }", "t.conf:1:1: mappings refused: subject mappings"),
    ],
)
def test_security_the_file_asks_for_is_never_dropped(text: str, message: str) -> None:
    assert message in refused(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot: 4222", 't.conf:1:1: unknown field "prot"'),
        ("authorization { tokn: x }", 't.conf:1:17: unknown field "authorization.tokn"'),
        ("jetstream { stor_dir: x }", 't.conf:1:13: unknown field "jetstream.stor_dir"'),
        (
            "authorization { users: [ {usr: a} ] }",
            "authorization.users[0]: a user entry requires a user",
        ),
        ('port: "4222"', "t.conf:1:1: port: expected an integer, got the string '4222'"),
        ('max_payload: "1MB"', "(write sizes without quotes: 1MB, 64KB)"),
        ("port: 70000", "port: 70000 is not a port"),
        ('listen: "::1:4222"', "listen: could not parse address string '::1:4222'"),
        ('server_name: "a b"', "server_name: a server name cannot contain spaces"),
        ('ping_interval: "2 minutes"', "ping_interval: "),
        ("debug: 1", "debug: expected true or false, got 1"),
        ("max_payload: 4GB", "max_payload: 4294967296 is out of range"),
        ("authorization: token", "authorization: expected a map"),
        ("authorization { user: a, password: b, token: c }", "cannot have a user/pass and a token"),
        ("authorization { token: c, users: [] }", "cannot have a token and a users array"),
        (
            "authorization { users: [ {user: a}, {user: a} ] }",
            'authorization.users[1]: duplicate user "a" detected',
        ),
        ("authorization { users: [ {nkey: nope} ] }", "not a valid public nkey for a user"),
        (
            "authorization { users: [ {user: a, permissions: {publish: {alow: x}}} ] }",
            'unknown field name "alow" parsing subject permissions',
        ),
        (
            'resolver: URL("http://localhost:9090/jwt/v1/accounts/")',
            "resolver refused: only the MEMORY resolver",
        ),
        ("store_dir: a\njetstream { store_dir: b }", "t.conf:2:13: jetstream.store_dir: duplicate"),
        ("jetstream: maybe", "jetstream: expected 'enabled', 'disabled'"),
        ("lame_duck_duration: 60", 'lame_duck_duration: expected a duration such as "2m"'),
        ('lame_duck_grace_period: "-1s"', "lame_duck_grace_period: must not be negative"),
        ("log_file: ''", "log_file: must not be empty"),
    ],
)
def test_wrong_values_name_their_place(text: str, message: str) -> None:
    result = tr(text)
    assert any(message in e for e in result.errors), result.errors


def test_unquoted_ipv6_listen_is_an_array_so_a_parse_error() -> None:
    with pytest.raises(ConfError, match=r"t\.conf:1:14: "):
        tr("listen: [::1]:4222")


def test_a_key_used_only_as_a_variable_is_not_unknown() -> None:
    assert settings("SECRET: x\nauthorization { token: $SECRET }") == {"auth_token": "x"}
    assert tr("UNUSED: x").errors == ['t.conf:1:1: unknown field "UNUSED"']


def test_every_problem_is_listed() -> None:
    result = tr("tls {}\nfoo: 1\nport: x\naccounts {}")
    assert [e.split(":")[1] for e in result.errors] == ["1", "2", "3", "4"]


# -- the table itself ------------------------------------------------------------------


def test_each_name_appears_once_per_block() -> None:
    seen: set[tuple[str, str]] = set()
    for key in KEYS:
        assert key.names and all(n == n.lower() for n in key.names)
        for name in key.names:
            assert (key.block, name) not in seen, name
            seen.add((key.block, name))
        assert (key.read is not None) == (key.status == "mapped"), key.names
        assert key.tether


def test_mapped_keys_set_only_settings_tether_has() -> None:
    fields = set(ServerConfig.__struct_fields__)
    text = (CORPUS / "basic.conf").read_text() + "\nauthorization { user: a, password: b }\n"
    assert set(tr(text).values) <= fields
