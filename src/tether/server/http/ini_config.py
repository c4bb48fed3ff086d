"""Reading a webhook-broker INI configuration into Tether's settings.

Supported: the seed sections (``[initial-channels]``, ``[initial-producers]``,
``[initial-channel-tokens]``, ``[initial-producer-tokens]``, ``[initial-consumers]``
and one ``[<consumerId>]`` section per consumer with ``token``, ``channel`` and
``type``), ``[broker]`` (``max-retry``, ``rational-delay-in-seconds``,
``retry-backoff-delays-in-seconds``), ``[consumer-connection]`` (``token-header-name``,
``user-agent``, ``connection-timeout-in-seconds``), ``[http]`` (``listener``),
``[scheduler]`` (``min-schedule-delay-minutes``) and ``[gateway-auth]``. Other sections
(database, logging, pruning) have no meaning for Tether and are ignored.

As in webhook-broker, a seed consumer whose channel is not seeded, whose callback URL is
not absolute or whose ``type`` is neither empty, ``push`` nor ``pull`` is skipped.
"""

from __future__ import annotations

import configparser
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def _parser(path: str | Path) -> configparser.ConfigParser:
    # Keys are ids (case-sensitive), values may hold ':' and '%'.
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    # Errors read as the TOML file's do: one line, the file's name first.
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file") from None
    except configparser.MissingSectionHeaderError as exc:
        raise ValueError(f"{path}: line {exc.lineno}: a key before any [section]") from None
    except configparser.ParsingError as exc:
        lineno, line = exc.errors[0]
        raise ValueError(f"{path}: line {lineno}: not 'key = value': {line}") from None
    except configparser.Error as exc:
        raise ValueError(f"{path}: not a valid INI file: {' '.join(str(exc).split())}") from None
    return parser


def _section(parser: configparser.ConfigParser, name: str) -> dict[str, str]:
    return dict(parser.items(name)) if parser.has_section(name) else {}


def _number(raw: str, key: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{key}: not a number: {raw!r}")
    return value


def load_ini(path: str | Path) -> dict[str, Any]:
    """The INI file as ``ServerConfig`` values (only the keys it sets); a ``ValueError``
    naming the file if it cannot be read or a value makes no sense."""
    parser = _parser(path)
    try:
        return _values(parser)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _values(parser: configparser.ConfigParser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    broker = _section(parser, "broker")
    if broker.get("max-retry", "").strip():
        out["webhook_max_retry"] = int(_number(broker["max-retry"], "max-retry"))
    if broker.get("rational-delay-in-seconds", "").strip():
        out["webhook_rational_delay"] = _number(
            broker["rational-delay-in-seconds"], "rational-delay-in-seconds"
        )
    if broker.get("retry-backoff-delays-in-seconds", "").strip():
        out["webhook_retry_backoff"] = [
            _number(v, "retry-backoff-delays-in-seconds")
            for v in broker["retry-backoff-delays-in-seconds"].split(",")
            if v.strip()
        ]
    conn = _section(parser, "consumer-connection")
    if conn.get("token-header-name", "").strip():
        out["webhook_token_header"] = conn["token-header-name"].strip()
    if conn.get("user-agent", "").strip():
        out["webhook_user_agent"] = conn["user-agent"].strip()
    if conn.get("connection-timeout-in-seconds", "").strip():
        out["webhook_connection_timeout"] = _number(
            conn["connection-timeout-in-seconds"], "connection-timeout-in-seconds"
        )
    listener = _section(parser, "http").get("listener", "").strip()
    if listener:
        _, _, port = listener.rpartition(":")
        if port.isdigit():
            if int(port) > 65535:
                raise ValueError(f"[http] listener {listener!r}: not a port: expected 0-65535")
            out["http_port"] = int(port)
    sched = _section(parser, "scheduler")
    if sched.get("min-schedule-delay-minutes", "").strip():
        out["webhook_min_schedule_delay"] = 60 * _number(
            sched["min-schedule-delay-minutes"], "min-schedule-delay-minutes"
        )
    auth = _section(parser, "gateway-auth")
    if auth.get("mode", "").strip().lower() == "hmac":
        out["http_gateway_secret"] = auth.get("hmac-shared-secret", "")
        if auth.get("hmac-timestamp-tolerance-seconds", "").strip():
            out["http_gateway_tolerance"] = _number(
                auth["hmac-timestamp-tolerance-seconds"], "hmac-timestamp-tolerance-seconds"
            )
        if auth.get("auth-exempt-paths", "").strip():
            out["http_gateway_exempt"] = [
                p.strip() for p in auth["auth-exempt-paths"].split(",") if p.strip()
            ]
    seed = _seed(parser)
    if any(seed.values()):
        out["webhook_seed"] = seed
    return out


def _resources(parser: configparser.ConfigParser, names: str, tokens: str) -> list[dict[str, str]]:
    token_of = _section(parser, tokens)
    return [
        {"id": rid, "name": name or rid, "token": token_of.get(rid, "")}
        for rid, name in _section(parser, names).items()
    ]


def _seed(parser: configparser.ConfigParser) -> dict[str, list[dict[str, str]]]:
    channels = _resources(parser, "initial-channels", "initial-channel-tokens")
    producers = _resources(parser, "initial-producers", "initial-producer-tokens")
    channel_ids = {c["id"] for c in channels}
    consumers: list[dict[str, str]] = []
    for cid, callback in _section(parser, "initial-consumers").items():
        if not parser.has_section(cid):
            continue
        section = _section(parser, cid)
        kind = section.get("type", "").strip() or "push"
        url = urlsplit(callback.strip())
        if section.get("channel", "") not in channel_ids or kind not in ("push", "pull"):
            continue
        if not url.scheme or not url.netloc:
            continue
        consumers.append(
            {
                "id": cid,
                "name": cid,
                "token": section.get("token", ""),
                "channel": section["channel"],
                "callback": callback.strip(),
                "type": kind,
            }
        )
    return {"producers": producers, "channels": channels, "consumers": consumers}
