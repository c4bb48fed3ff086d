"""``load_config`` with a nats-server file: which format a file is read as, and what
the server is told."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tether.server.config import load_config


def test_a_conf_file_sets_tether_settings(tmp_path: Path) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("listen: 127.0.0.1:4333\nmax_payload: 64KB\ncluster { name: c }\n")
    warnings: list[str] = []
    cfg = load_config(path, {}, warnings)
    assert (cfg.host, cfg.port, cfg.max_payload) == ("127.0.0.1", 4333, 65536)
    assert warnings == [f"{path}:3:1: cluster ignored: Tether runs as a single server"]


def test_flags_win_over_the_conf_file(tmp_path: Path) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("port: 4333\nmax_payload: 64KB\n")
    cfg = load_config(path, {"port": 5555, "max_payload": None}, [])
    assert (cfg.port, cfg.max_payload) == (5555, 65536)


def test_a_refused_conf_file_lists_every_refusal(tmp_path: Path) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("port: 4333\ntls { cert_file: x }\nmappings { a: b }\n")
    with pytest.raises(ValueError) as caught:
        load_config(path, {}, [])
    assert str(caught.value).splitlines() == [
        f"{path}:2:1: tls: missing 'key_file' in TLS configuration",
        f"{path}:3:1: mappings refused: subject mappings are not supported yet: "
        "messages would not go where the file says",
    ]


def test_a_malformed_conf_file_is_one_line_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("port: 4333\nauthorization {\n  token: abc\n")
    with pytest.raises(ValueError) as caught:
        load_config(path, {}, [])
    assert str(caught.value) == f"{path}:2:15: this '{{' is never closed"


def test_toml_extension_stays_toml(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("port: 4333\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(path, {}, [])
    path.write_text("port = 4333\n[server]\nport = 4444\n")
    assert load_config(path, {}, []).port == 4444


@pytest.mark.parametrize("name", ["tether.cfg", "server", "config.txt"])
def test_other_names_are_read_by_content(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text('port = 4333\nsync = "os"\n')  # Tether's TOML
    assert (load_config(path, {}, []).port, load_config(path, {}, []).sync) == (4333, "os")
    path.write_text("port: 4333\nauthorization { token: t }\n")  # only nats-server's
    assert (load_config(path, {}, []).port, load_config(path, {}, []).auth_token) == (4333, "t")
    path.write_text('listen = "127.0.0.1:4334"\n')  # both read it: nats-server's keys
    assert load_config(path, {}, []).port == 4334


def test_toml_with_unknown_keys_that_nats_server_cannot_read_stays_toml(tmp_path: Path) -> None:
    path = tmp_path / "tether.cfg"
    path.write_text("[server]\nprot = 4333\n")
    with pytest.raises(ValueError, match="invalid configuration"):
        load_config(path, {}, [])


def test_neither_format_says_what_each_parser_found(tmp_path: Path) -> None:
    path = tmp_path / "tether.cfg"
    path.write_text("port: 4333\nmax_payload = [1,\n")
    with pytest.raises(ValueError) as caught:
        load_config(path, {}, [])
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{path}: neither TOML nor a nats-server configuration file"
    assert lines[1].startswith(f"  as TOML: {path}:1:5: ")
    assert lines[2] == f"  as a nats-server file: {path}:2:15: this '[' is never closed"


def test_warnings_are_logged_when_not_collected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("gateway { name: g }\n")
    with caplog.at_level(logging.WARNING, logger="tether"):
        load_config(path, {})
    assert caplog.messages == [f"{path}:1:1: gateway ignored: Tether runs as a single server"]


def test_tether_toml_named_conf_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "tether.conf"
    path.write_text('port = 4333\nsync = "os"\n')
    with pytest.raises(ValueError) as caught:
        load_config(path, {}, [])
    assert str(caught.value).splitlines() == [
        f'{path}:2:1: unknown field "sync"',
        f"{path}: this is Tether's TOML format: name it .toml to read it so",
    ]
