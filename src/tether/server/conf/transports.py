"""nats-server's ``tls { }``, ``websocket { }`` and ``https`` keys as Tether's settings.

The keys are rows of the one table (:data:`tether.server.conf.mapping.KEYS` adds
:data:`KEYS`); what Tether's TLS does not do (several certificates, pinned
certificates, certificate stores, OCSP, a certificate naming its user) is refused, since
a server without it would let in clients nats-server keeps out.
"""

from __future__ import annotations

from typing import Any

from tether.server.conf import readers as r
from tether.server.conf.readers import Key, Translation
from tether.server.conf.values import ConfError, Item

TLS = "tls"
WS = "websocket"
WS_TLS = "websocket.tls"
BLOCK_TITLES = {TLS: "`tls { }`", WS: "`websocket { }`", WS_TLS: "`websocket { tls { } }`"}

_CIPHERS = "Python's ssl defaults are used (TLS 1.2 or later, OpenSSL's ciphers and curves)"
_NO_MAP = "the known URLs of a certificate are not checked"


def tls(out: Translation, key: str, item: Item) -> None:
    """``tls { }``: clients must upgrade; cert_file and key_file are required."""
    entries = _map(key, item)
    out.values["tls"] = True
    out.read(TLS, entries)
    _both_files(out, key, item, "tls_cert", "tls_key")


def _both_files(out: Translation, key: str, item: Item, cert: str, pem_key: str) -> None:
    if cert not in out.values:
        raise ConfError(f"{key}: missing 'cert_file' in TLS configuration", item.pos)
    if pem_key not in out.values:
        raise ConfError(f"{key}: missing 'key_file' in TLS configuration", item.pos)


def _map(key: str, item: Item) -> dict[str, Item]:
    value = item.value
    if not isinstance(value, dict):
        raise ConfError(f"{key}: expected a map {{ ... }}", item.pos)
    return value


def tls_timeout(out: Translation, key: str, item: Item) -> None:
    value = item.value
    if isinstance(value, str):
        seconds = _duration(key, item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfError(f"{key}: expected seconds or a duration", item.pos)
    if seconds > 0:
        out.values["tls_timeout"] = seconds


def _duration(key: str, item: Item) -> float:
    from tether.server.conf.values import parse_duration

    try:
        return parse_duration(str(item.value))
    except ValueError as exc:
        raise ConfError(f"{key}: {exc}", item.pos) from None


def handshake_first(out: Translation, key: str, item: Item) -> None:
    """``true``/``false``; ``"auto"`` or a delay (a fallback to plain INFO) is refused."""
    value = item.value
    if isinstance(value, bool):
        out.values["tls_handshake_first"] = value
        return
    raise ConfError(
        f"{key}: only true or false: a fallback delay (auto) is not supported yet", item.pos
    )


def https(out: Translation, key: str, item: Item) -> None:
    """``https``/``https_port``: the HTTP port, served over TLS with the tls block's
    certificate."""
    value = item.value
    if isinstance(value, str):
        host, port = _host_port(key, item)
        if host:
            out.http_host = (host, item)
    else:
        port = _port(key, r.integer(key, item), item)
    out.values["http_port"] = port
    out.values["http_tls"] = True


def _port(key: str, value: int, item: Item) -> int:
    if not -1 <= value <= 65535:
        raise ConfError(f"{key}: {value} is not a port", item.pos)
    return value


def _host_port(key: str, item: Item) -> tuple[str, int]:
    address = r.text(key, item)
    host, colon, port = address.rpartition(":")
    if not colon or not port.lstrip("-").isdigit():
        raise ConfError(f"{key}: could not parse address string {address!r}", item.pos)
    return host.strip("[]"), _port(key, int(port), item)


def websocket(out: Translation, key: str, item: Item) -> None:
    entries = _map(key, item)
    out.read(WS, entries)


def ws_port(out: Translation, key: str, item: Item) -> None:
    out.values["ws_port"] = _port(key, r.integer(key, item), item)


def ws_listen(out: Translation, key: str, item: Item) -> None:
    if isinstance(item.value, int) and not isinstance(item.value, bool):
        out.values["ws_port"] = _port(key, item.value, item)
        return
    host, port = _host_port(key, item)
    if host and host != out.values.get("host", host):
        out.warn(item, f"{key}: host {host!r} ignored: Tether serves WebSocket on the client host")
    out.values["ws_port"] = port


def ws_tls(out: Translation, key: str, item: Item) -> None:
    out.read(WS_TLS, _map(key, item), key)
    _both_files(out, key, item, "ws_tls_cert", "ws_tls_key")


def origins(out: Translation, key: str, item: Item) -> None:
    value = item.value
    found: list[Any] = [value] if isinstance(value, str) else value  # type: ignore[assignment]
    if not isinstance(found, list):
        raise ConfError(f"{key}: expected a URL or a list of URLs", item.pos)
    urls: list[str] = []
    for entry in found:
        url = entry if isinstance(entry, str) else r.text(key, entry)
        if not url.startswith(("http://", "https://")):
            raise ConfError(f"{key}: {url!r} is not an http:// or https:// URL", item.pos)
        urls.append(url)
    out.values["ws_allowed_origins"] = urls


def ws_handshake_timeout(out: Translation, key: str, item: Item) -> None:
    value = item.value
    seconds = _duration(key, item) if isinstance(value, str) else float(r.integer(key, item))
    out.values["ws_handshake_timeout"] = max(seconds, 0.0)


def _mapped(block: str, names: str, tether: str, read: r.Reader) -> Key:
    return Key(block, tuple(names.split()), "mapped", tether, read)


def _warn(block: str, names: str, why: str) -> Key:
    return Key(block, tuple(names.split()), "warn", why)


def _refuse(block: str, names: str, why: str) -> Key:
    return Key(block, tuple(names.split()), "refuse", why)


TOP_KEYS: tuple[Key, ...] = (
    _mapped(
        "",
        "tls",
        "`tls = true` and the keys below: clients read a plaintext INFO, then upgrade",
        tls,
    ),
    _mapped(
        "",
        "https https_port",
        "`http_port` with `http_tls = true`: HTTPS with the `tls` block's certificate",
        https,
    ),
    _refuse(
        "",
        "allow_non_tls",
        "TLS is required of every client once configured (no plain-text fallback yet)",
    ),
    _warn("", "ocsp ocsp_cache", "OCSP stapling is not supported"),
    _mapped("", "websocket ws", "the WebSocket listener (keys below)", websocket),
)

KEYS: tuple[Key, ...] = (
    _mapped(TLS, "cert_file", "`tls_cert`", r.setter("tls_cert", r.text)),
    _mapped(TLS, "key_file", "`tls_key`", r.setter("tls_key", r.text)),
    _mapped(TLS, "ca_file", "`tls_ca`: the CAs of client certificates", r.setter("tls_ca", r.text)),
    _mapped(
        TLS, "verify", "`tls_verify`: clients need a certificate", r.setter("tls_verify", r.boolean)
    ),
    _mapped(
        TLS,
        "verify_and_map",
        "`tls_verify_and_map`: verify, and the certificate names the user (its e-mail, DNS "
        "or URI names, else its subject DN) from `users`, with no password",
        r.setter("tls_verify_and_map", r.boolean),
    ),
    _mapped(TLS, "timeout", "`tls_timeout` (seconds or a duration)", tls_timeout),
    _mapped(
        TLS,
        "handshake_first first immediate",
        "`tls_handshake_first` (true or false; a fallback delay is refused)",
        handshake_first,
    ),
    _warn(TLS, "cipher_suites curve_preferences min_version", _CIPHERS),
    _warn(TLS, "insecure", "Tether makes no outgoing TLS connections"),
    _warn(TLS, "connection_rate_limit", "TLS handshakes are not rate-limited"),
    _refuse(TLS, "certs", "one certificate (cert_file, key_file) only"),
    _refuse(TLS, "pinned_certs", "pinned client certificates are not supported yet"),
    _refuse(TLS, "verify_cert_and_check_known_urls", _NO_MAP),
    _refuse(
        TLS,
        "cert_store cert_match_by cert_match cert_match_skip_invalid ca_certs_match",
        "certificate stores are not supported: use cert_file and key_file",
    ),
    _refuse(TLS, "ocsp_peer", "OCSP checks of client certificates are not supported"),
    # -- websocket { } -----------------------------------------------------------------
    _mapped(WS, "port", "`ws_port` (`-1` picks a free port)", ws_port),
    _mapped(WS, "listen", "`ws_port` (the host is the client host)", ws_listen),
    _warn(WS, "host net", "Tether serves WebSocket on the client host"),
    _warn(WS, "advertise", "INFO names the listen address"),
    _mapped(WS, "tls", "`ws_tls_cert` and `ws_tls_key`: `wss://`", ws_tls),
    _mapped(WS, "no_tls", "`ws_no_tls`: plain `ws://`", r.setter("ws_no_tls", r.boolean)),
    _mapped(
        WS,
        "same_origin",
        "`ws_same_origin`: an Origin must be the request's host (else 403)",
        r.setter("ws_same_origin", r.boolean),
    ),
    _mapped(
        WS,
        "allowed_origins allowed_origin allow_origins allow_origin origins origin",
        "`ws_allowed_origins`: the Origins let in (else 403)",
        origins,
    ),
    _mapped(
        WS,
        "handshake_timeout",
        "`ws_handshake_timeout` (seconds or a duration)",
        ws_handshake_timeout,
    ),
    _mapped(
        WS,
        "compression compress",
        "`ws_compression`: permessage-deflate when the client offers it",
        r.setter("ws_compression", r.boolean),
    ),
    _refuse(WS, "authorization authentication", "WebSocket-only credentials are not supported yet"),
    _refuse(WS, "no_auth_user", "WebSocket-only credentials are not supported yet"),
    _warn(
        WS,
        "jwt_cookie user_cookie pass_cookie token_cookie",
        "credentials come from CONNECT only",
    ),
    _warn(WS, "headers", "the 101 reply carries no extra headers"),
    _warn(WS, "ping_interval", "WebSocket clients get the client ping_interval"),
    # -- websocket { tls { } } -------------------------------------------------------------
    _mapped(WS_TLS, "cert_file", "`ws_tls_cert`", r.setter("ws_tls_cert", r.text)),
    _mapped(WS_TLS, "key_file", "`ws_tls_key`", r.setter("ws_tls_key", r.text)),
    _refuse(
        WS_TLS,
        "ca_file verify verify_and_map pinned_certs",
        "client certificates over WebSocket are not supported yet",
    ),
    _warn(WS_TLS, "timeout handshake_first first immediate", "no effect on wss://"),
    _warn(WS_TLS, "cipher_suites curve_preferences min_version insecure", _CIPHERS),
)
