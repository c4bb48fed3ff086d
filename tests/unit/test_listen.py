"""Listen addresses (``server/listen.py``) and the settings that use them: ``listen``,
``host``, ``jetstream``, the lame duck durations, and the ``-js=<bool>`` flag."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tether.cli.aliases import normalize
from tether.server.config import load_config
from tether.server.listen import bare_host, listen_socket, show, split_listen


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[::]:4222", ("::", 4222)),
        ("[::1]:-1", ("::1", -1)),
        ("127.0.0.1:4222", ("127.0.0.1", 4222)),
        ("localhost:0", ("localhost", 0)),
        (":4222", ("0.0.0.0", 4222)),  # nats-server's default host
        ("[fe80::1%eth0]:4222", ("fe80::1%eth0", 4222)),
        (4222, (None, 4222)),
        ("-1", (None, -1)),
    ],
)
def test_listen_forms(value: str | int, expected: tuple[str | None, int]) -> None:
    assert split_listen(value) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("::1:4222", "too many colons"),  # nats-server: could not parse address string
        ("127.0.0.1", "missing port"),
        ("[::1]", "missing port"),
        ("[::1:4222", "missing ']'"),
        ("[::1]4222", "could not parse"),
        ("host:port", "bad port"),
        ("", "missing port"),
    ],
)
def test_listen_forms_refused(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        split_listen(value)


def test_hosts_are_kept_bare_and_shown_in_brackets() -> None:
    assert bare_host("[::1]") == "::1"
    assert bare_host("::1") == "::1"
    assert bare_host("localhost") == "localhost"
    assert show("[::1]", 4222) == "[::1]:4222"
    assert show("::", 4222) == "[::]:4222"
    assert show("0.0.0.0", 4222) == "0.0.0.0:4222"


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6(), reason="no IPv6 loopback on this machine")


@needs_ipv6
def test_the_unspecified_ipv6_address_is_dual_stack() -> None:
    with listen_socket("::", 0) as sock:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
    with listen_socket("[::1]", 0) as sock:
        assert sock.getsockname()[0] == "::1"
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


def test_a_name_with_several_addresses_gets_one_socket_ipv4_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def both(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "twofold":
            return real(host, port, *args, **kwargs)
        v6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))
        v4 = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))
        return [v6, v4]

    monkeypatch.setattr(socket, "getaddrinfo", both)
    with listen_socket("twofold", 0) as sock:
        assert sock.family == socket.AF_INET
        assert sock.getsockname()[0] == "127.0.0.1"


def _load(tmp_path: Path, toml: str, **flags: Any) -> Any:
    path = tmp_path / "tether.toml"
    path.write_text(toml)
    return load_config(path, flags)


def test_listen_sets_host_and_port_and_flags_still_win(tmp_path: Path) -> None:
    cfg = _load(tmp_path, 'listen = "[::]:5222"\n')
    assert (cfg.host, cfg.port) == ("::", 5222)
    cfg = _load(tmp_path, 'listen = ":5222"\nhost = "127.0.0.1"\n')
    assert (cfg.host, cfg.port) == ("0.0.0.0", 5222)
    cfg = _load(tmp_path, "listen = 5222\n")
    assert (cfg.host, cfg.port) == ("127.0.0.1", 5222)
    cfg = _load(tmp_path, 'listen = "[::1]:5222"\n', host="10.0.0.1", port=None)
    assert (cfg.host, cfg.port) == ("10.0.0.1", 5222)
    cfg = _load(tmp_path, 'listen = "[::1]:5222"\n', port=6222)
    assert (cfg.host, cfg.port) == ("::1", 6222)
    assert load_config(None, {"host": "[::1]"}).host == "::1"


def test_a_bad_listen_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"listen = '::1:4222': .*too many colons"):
        _load(tmp_path, 'listen = "::1:4222"\n')


def test_jetstream_is_on_unless_turned_off(tmp_path: Path) -> None:
    assert load_config(None, {}).jetstream is True
    assert _load(tmp_path, "jetstream = false\n").jetstream is False
    assert _load(tmp_path, "jetstream = false\n", jetstream=True).jetstream is True


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-js"], ["--jetstream"]),
        (["-js=false"], ["--no-jetstream"]),
        (["--js=0"], ["--no-jetstream"]),
        (["--jetstream=False"], ["--no-jetstream"]),
        (["-js=true"], ["--jetstream"]),
        (["-js=T"], ["--jetstream"]),
        (["-js=maybe"], ["--jetstream=maybe"]),  # click reports it
    ],
)
def test_jetstream_switch_takes_go_booleans(argv: list[str], expected: list[str]) -> None:
    assert normalize(argv) == expected


def test_lame_duck_durations(tmp_path: Path) -> None:
    cfg = load_config(None, {})
    assert (cfg.lame_duck_duration, cfg.lame_duck_grace_period) == (120.0, 10.0)
    # Shorter than nats-server's 30 s minimum is allowed (tests, small deployments).
    cfg = _load(tmp_path, "lame_duck_duration = 3\nlame_duck_grace_period = 0.5\n")
    assert (cfg.lame_duck_duration, cfg.lame_duck_grace_period) == (3.0, 0.5)
    with pytest.raises(ValueError, match=r"lame_duck_grace_period.*less than lame_duck_duration"):
        _load(tmp_path, "lame_duck_duration = 5\nlame_duck_grace_period = 5\n")
    with pytest.raises(ValueError, match=r"lame_duck_duration.*more than 0"):
        _load(tmp_path, "lame_duck_duration = 0\nlame_duck_grace_period = 0\n")
    with pytest.raises(ValueError, match="lame_duck_grace_period"):
        _load(tmp_path, "lame_duck_grace_period = -1\n")
