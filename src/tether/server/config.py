"""Server settings: one struct, filled from defaults, a TOML file and command-line flags."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

MiB = 1024 * 1024


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every setting of ``tether serve``; each has a TOML key of the same name."""

    host: str = "127.0.0.1"
    port: int = 4222  # -1 or 0 picks a free port
    http_port: int = 8222  # -1 or 0 picks a free port; None-like 0 never disables it
    store: str = "sqlite:./tether-data"
    sync: Literal["always", "os"] = "always"
    auth_token: str | None = None
    user: str | None = None
    password: str | None = None
    max_payload: int = MiB
    max_connections: int = 64 * 1024
    max_pending: int = 64 * MiB  # per-connection outbound bytes before "Slow Consumer"
    max_control_line: int = 4096
    ping_interval: float = 120.0  # seconds between server PINGs
    max_pings_out: int = 2  # unanswered PINGs before "Stale Connection"
    auth_timeout: float = 2.0
    write_deadline: float = 10.0  # seconds a closing slow consumer may take to drain
    server_name: str = ""
    log_level: str = "info"

    @property
    def auth_required(self) -> bool:
        return bool(self.auth_token or self.user)


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> ServerConfig:
    """Defaults, then the TOML file (top level or a ``[server]`` table), then flags."""
    values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        section = doc.get("server", doc)
        if not isinstance(section, dict):
            raise ValueError(f"{path}: [server] must be a table")
        values.update({k.replace("-", "_"): v for k, v in section.items()})
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return msgspec.convert(values, ServerConfig)
    except msgspec.ValidationError as exc:
        where = f"{path}: " if path else ""
        raise ValueError(f"{where}invalid configuration: {exc}") from exc
