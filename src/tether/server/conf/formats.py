"""Which format a configuration file is written in: Tether's TOML or nats-server's.

By extension first (``.conf`` is nats-server's, ``.toml`` is TOML); otherwise by content:
a file TOML reads, with only Tether's keys (or a ``[server]`` table), stays TOML, so
existing files mean what they meant; anything else nats-server's parser reads is a
nats-server file. When neither reads it, the error says what each parser found.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tether.server.conf.mapping import translate
from tether.server.conf.parser import parse_file
from tether.server.conf.values import ConfError, Item

_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def read_nats_conf(
    path: str | Path, tether_keys: Collection[str], warnings: list[str]
) -> dict[str, Any] | None:
    """Tether's settings from ``path`` when it is a nats-server file (its warnings
    appended to ``warnings``), or ``None`` when it is to be read as TOML. A file
    that is refused, or that neither format reads, raises ``ValueError``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return None
    keys = set(tether_keys)
    try:
        doc = parse_file(path) if suffix == ".conf" else _sniff(path, keys)
        if doc is None:
            return None
        result = translate(doc)
        if result.errors:
            raise ValueError("\n".join(result.errors))
    except ValueError as exc:
        if suffix == ".conf" and _is_tether_toml(path, keys):
            raise ValueError(
                f"{exc}\n{path}: this is Tether's TOML format: name it .toml to read it so"
            ) from None
        raise
    warnings.extend(result.warnings)
    return result.values


def _is_tether_toml(path: Path, tether_keys: set[str]) -> bool:
    try:
        toml = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return _tethers(toml, tether_keys)


def _tethers(toml: dict[str, Any], tether_keys: set[str]) -> bool:
    """Whether a TOML document is Tether's: a [server] table, or only Tether's keys."""
    return "server" in toml or {k.replace("-", "_") for k in toml} <= tether_keys


def _sniff(path: Path, tether_keys: set[str]) -> dict[str, Item] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the TOML reader says why it cannot read the file
    try:
        toml = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        try:
            return parse_file(path)
        except ConfError as conf_error:
            raise ValueError(
                f"{path}: neither TOML nor a nats-server configuration file\n"
                f"  as TOML: {_toml_error(path, exc)}\n"
                f"  as a nats-server file: {conf_error}"
            ) from None
    if _tethers(toml, tether_keys):
        return None
    try:
        return parse_file(path)
    except ConfError:
        return None  # TOML with keys Tether does not know: the TOML reader names them


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    m = _TOML_AT.search(message)
    if m is None:
        return f"{path}: {message}"
    return f"{path}:{m.group(1)}:{m.group(2)}: {message[: m.start()]}"
