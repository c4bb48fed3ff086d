"""How each mapped nats-server key is read into Tether's settings.

A reader takes the key as the file spells it and its :class:`Item`, and sets values of
``ServerConfig``; a value of the wrong type or out of range is a :class:`ConfError` naming
file, line and column. :class:`Translation` collects the settings, warnings and refusals
of one file while :mod:`tether.server.conf.mapping`'s table says which key is which.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tether.server.conf.values import ConfError, Item, parse_duration

Status = Literal["mapped", "warn", "refuse"]
Reader = Callable[["Translation", str, Item], None]

INT32_MAX = 2**31 - 1
_ENABLED = {"enabled": True, "enable": True, "disabled": False, "disable": False}


@dataclass(frozen=True, slots=True)
class Key:
    """One nats-server key: its spellings (nats-server's first), in which map it sits
    (``""`` is the top level), and what Tether does with it: the settings it sets
    (``mapped``), or why it is ignored (``warn``) or refused (``refuse``)."""

    block: str
    names: tuple[str, ...]
    status: Status
    tether: str
    read: Reader | None = None


@dataclass
class Translation:
    """Tether's settings from one file, and what the file asked for that Tether cannot
    do: ``warnings`` are reported at start, ``errors`` stop it. Each names file:line:col."""

    tables: Mapping[str, Mapping[str, Key]]
    values: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    http_host: tuple[str, Item] | None = None

    def warn(self, item: Item, message: str) -> None:
        self.warnings.append(f"{item.pos}: {message}")

    def refuse(self, item: Item, message: str) -> None:
        self.errors.append(f"{item.pos}: {message}")

    def read(self, block: str, entries: dict[str, Item], where: str = "") -> None:
        """Every key of one map: ``block`` picks the table, ``where`` names the map in
        messages (``authorization.users[1]``)."""
        table = self.tables[block]
        prefix = f"{where or block}." if block else ""
        for key, item in entries.items():
            name = prefix + key
            spec = table.get(key.lower())
            if spec is None:
                if not item.used:
                    self.refuse(item, f'unknown field "{name}"')
                continue
            try:
                if spec.status == "warn":
                    self.warn(item, f"{name} ignored: {spec.tether}")
                elif spec.status == "refuse":
                    self.refuse(item, f"{name} refused: {spec.tether}")
                elif spec.read is not None:
                    spec.read(self, name, item)
            except ConfError as exc:
                self.errors.append(str(exc))


# -- reading values of one type, or saying what was wrong ------------------------------


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value)


def integer(key: str, item: Item) -> int:
    """The value as an integer (a size suffix already applied), or why not."""
    value = item.value
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, str) and value[:1].isdigit():
            hint = " (write sizes without quotes: 1MB, 64KB)"
        raise ConfError(f"{key}: expected an integer, got {_describe(value)}{hint}", item.pos)
    return value


def text(key: str, item: Item, *, empty: bool = False) -> str:
    """The value as a string (not empty unless ``empty``), or why not."""
    value = item.value
    if not isinstance(value, str):
        raise ConfError(f"{key}: expected a string, got {_describe(value)}", item.pos)
    if not value and not empty:
        raise ConfError(f"{key}: must not be empty", item.pos)
    return value


def boolean(key: str, item: Item) -> bool:
    """The value as a boolean (``true``, ``yes``, ``on`` ...), or why not."""
    value = item.value
    if not isinstance(value, bool):
        raise ConfError(f"{key}: expected true or false, got {_describe(value)}", item.pos)
    return value


def _map(key: str, item: Item) -> dict[str, Item]:
    value = item.value
    if not isinstance(value, dict):
        raise ConfError(f"{key}: expected a map {{ ... }}, got {_describe(value)}", item.pos)
    return value


def _port(key: str, value: int, item: Item) -> int:
    if not -1 <= value <= 65535:
        raise ConfError(
            f"{key}: {value} is not a port: expected 0-65535, or -1 for a free port", item.pos
        )
    return value


def _seconds(out: Translation, key: str, item: Item) -> float:
    """A duration: a Go duration string, or (as nats-server reads old files) a bare
    number of seconds, with the same warning nats-server gives."""
    value = item.value
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise ConfError(f"{key}: {exc}", item.pos) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfError(
            f'{key}: expected a duration such as "2m", got {_describe(value)}', item.pos
        )
    if item.raw[-1:].isalpha():
        out.warn(
            item,
            f"{key}: unquoted {item.raw} is the size {value}, so {value} seconds "
            f'(as nats-server reads it); write "{item.raw}" for a duration',
        )
    else:
        out.warn(item, f'{key}: a bare number is read as seconds; write a duration ("{value}s")')
    return float(value)


def _split_host_port(key: str, item: Item) -> tuple[str, int]:
    value = item.value
    if isinstance(value, int) and not isinstance(value, bool):
        return "", _port(key, value, item)
    address = text(key, item)
    host, colon, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        colon = ""  # an IPv6 address must be bracketed: "[::1]:4222"
    if not colon or not port.lstrip("-").isdigit():
        raise ConfError(f"{key}: could not parse address string {address!r}", item.pos)
    return host, _port(key, int(port), item)


# -- readers of mapped keys ------------------------------------------------------------


def setter(target: str, kind: Callable[[str, Item], Any]) -> Reader:
    """Sets ``target`` to the value read as ``kind`` (:func:`text`, :func:`integer` ...)."""

    def read(out: Translation, key: str, item: Item) -> None:
        out.values[target] = kind(key, item)

    return read


def limit(target: str, *, most: int | None = None) -> Reader:
    """A size or count where 0 means "the default", as in nats-server."""

    def read(out: Translation, key: str, item: Item) -> None:
        value = integer(key, item)
        if value < 0 or (most is not None and value > most):
            raise ConfError(f"{key}: {value} is out of range", item.pos)
        if value:
            out.values[target] = value

    return read


def duration(target: str) -> Reader:
    """Sets ``target`` to a duration in seconds; 0 means "the default", as in nats-server."""

    def read(out: Translation, key: str, item: Item) -> None:
        seconds = _seconds(out, key, item)
        if seconds < 0:
            raise ConfError(f"{key}: must not be negative", item.pos)
        if seconds:
            out.values[target] = seconds

    return read


def listen(out: Translation, key: str, item: Item) -> None:
    host, port = _split_host_port(key, item)
    if isinstance(item.value, str):
        out.values["host"] = host or "0.0.0.0"
    out.values["port"] = port


def port_key(out: Translation, key: str, item: Item) -> None:
    out.values["port"] = _port(key, integer(key, item), item)


def http(out: Translation, key: str, item: Item) -> None:
    host, port = _split_host_port(key, item)
    if host:
        out.http_host = (host, item)
    _http_port(out, key, port, item)


def http_port_key(out: Translation, key: str, item: Item) -> None:
    _http_port(out, key, _port(key, integer(key, item), item), item)


def _http_port(out: Translation, key: str, port: int, item: Item) -> None:
    if port == 0:
        out.warn(
            item, f"{key}: 0 turns monitoring off in nats-server; Tether serves HTTP on a free port"
        )
    out.values["http_port"] = port


def server_name(out: Translation, key: str, item: Item) -> None:
    name = text(key, item)
    if " " in name:
        raise ConfError(f"{key}: a server name cannot contain spaces", item.pos)
    out.values["server_name"] = name


def debug(out: Translation, key: str, item: Item) -> None:
    if boolean(key, item):
        out.values["log_level"] = "debug"


def logtime(out: Translation, key: str, item: Item) -> None:
    if not boolean(key, item):
        out.warn(item, f"{key}: false ignored: Tether's log lines always carry the time")


def store_dir(out: Translation, key: str, item: Item) -> None:
    if "store" in out.values:
        raise ConfError(f"{key}: duplicate 'store_dir' configuration", item.pos)
    out.values["store"] = "sqlite:" + text(key, item)


def jetstream(out: Translation, key: str, item: Item) -> None:
    value = item.value
    if isinstance(value, dict):
        out.values["jetstream"] = True  # a map turns it on, unless it says enabled: false
        out.read("jetstream", value)
        return
    if isinstance(value, str) and value.lower() in _ENABLED:
        value = _ENABLED[value.lower()]
    if not isinstance(value, bool):
        raise ConfError(
            f"{key}: expected 'enabled', 'disabled', a boolean or a map, got {_describe(value)}",
            item.pos,
        )
    out.values["jetstream"] = value


def lame_duck(target: str) -> Reader:
    """nats-server takes only duration strings here. (Its 30s minimum for the duration
    is not Tether's: any duration above 0 will do, see docs/compatibility.md.)"""

    def read(out: Translation, key: str, item: Item) -> None:
        if not isinstance(item.value, str):
            raise ConfError(
                f'{key}: expected a duration such as "2m", got {_describe(item.value)}', item.pos
            )
        seconds = _seconds(out, key, item)
        if seconds < 0:
            raise ConfError(f"{key}: must not be negative", item.pos)
        out.values[target] = seconds

    return read


def sync_interval(out: Translation, key: str, item: Item) -> None:
    if isinstance(item.value, str) and item.value.lower() == "always":
        out.values["sync"] = "always"
        return
    _seconds(out, key, item)
    out.warn(
        item,
        f"{key}: a period is ignored: Tether syncs every commit to disk "
        '(its setting sync = "os" leaves flushing to the operating system)',
    )


def secret(target: str) -> Reader:
    def read(out: Translation, key: str, item: Item) -> None:
        out.values[target] = text(key, item, empty=True)  # plain, or a bcrypt hash

    return read


def auth_timeout(out: Translation, key: str, item: Item) -> None:
    value = item.value
    if isinstance(value, str):
        seconds = _seconds(out, key, item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfError(f"{key}: expected seconds or a duration, got {_describe(value)}", item.pos)
    if seconds > 0:
        out.values["auth_timeout"] = seconds


def authorization(out: Translation, key: str, item: Item) -> None:
    """The authorization block: one token, or one user, never both (as nats-server)."""
    entries = _map(key, item)
    names = {k.lower() for k in entries}
    single = bool(names & {"user", "username", "pass", "password"})
    if single and "token" in names:
        raise ConfError(f"{key}: cannot have a user/pass and a token", item.pos)
    if "users" in names and single:
        raise ConfError(f"{key}: cannot have a single user/pass and a users array", item.pos)
    if "users" in names and "token" in names:
        raise ConfError(f"{key}: cannot have a token and a users array", item.pos)
    out.read("authorization", entries)


def users(out: Translation, key: str, item: Item) -> None:
    """A users array: each entry a user and password (plain or bcrypt) or an nkey, with
    its permissions. One user with a password alone is Tether's ``user`` and ``password``."""
    entries = item.value
    if not isinstance(entries, list):
        raise ConfError(f"{key}: expected an array of users, got {_describe(entries)}", item.pos)
    found: list[dict[str, Any]] = []
    names: set[str] = set()
    for n, entry in enumerate(entries):
        where = f"{key}[{n}]"
        fields = _map(where, entry)
        if not {k.lower() for k in fields} & {"user", "username", "nkey"}:
            raise ConfError(f"{where}: a user entry requires a user", entry.pos)
        outer, out.values = out.values, {}
        try:
            out.read("authorization.users", fields, where)
            user = out.values
        finally:
            out.values = outer
        if "nkey" in user and ({"user", "password"} & set(user)):
            raise ConfError(f"{where}: nkey users do not take usernames or passwords", entry.pos)
        name = user.get("user") or user.get("nkey")
        if name in names:
            raise ConfError(f'{where}: duplicate user "{name}" detected', entry.pos)
        names.add(str(name))
        found.append(user)
    if len(found) == 1 and set(found[0]) <= {"user", "password"}:
        out.values.update(found[0])
    elif found:
        out.values["users"] = found


def nkey(out: Translation, key: str, item: Item) -> None:
    value = text(key, item)
    if not (len(value) == 56 and value.startswith("U")):
        raise ConfError(f"{key}: not a valid public nkey for a user", item.pos)
    out.values["nkey"] = value


_PERMISSION_SIDES = {
    "publish": "publish",
    "pub": "publish",
    "import": "publish",
    "subscribe": "subscribe",
    "sub": "subscribe",
    "export": "subscribe",
}


def _subjects(key: str, item: Item) -> list[str]:
    value = item.value
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text(key, entry) for entry in value]
    raise ConfError(
        f"{key}: expected a subject, or an array of subjects, got {_describe(value)}", item.pos
    )


def _side(key: str, item: Item) -> Any:
    value = item.value
    if not isinstance(value, dict):
        return _subjects(key, item)
    rules: dict[str, list[str]] = {}
    for name, entry in value.items():
        if name.lower() not in ("allow", "deny"):
            raise ConfError(
                f'{key}: unknown field name "{name}" parsing subject permissions, '
                "only 'allow' or 'deny' are permitted",
                entry.pos,
            )
        rules[name.lower()] = _subjects(f"{key}.{name}", entry)
    return rules


def _responses(key: str, item: Item) -> Any:
    value = item.value
    if isinstance(value, bool):
        return value
    if not isinstance(value, dict):
        raise ConfError(f"{key}: expected a boolean or a map, got {_describe(value)}", item.pos)
    rules: dict[str, Any] = {}
    for name, entry in value.items():
        lower = name.lower()
        if lower in ("max", "max_msgs", "max_messages", "max_responses"):
            rules["max"] = integer(f"{key}.{name}", entry)
        elif lower in ("expires", "expiration", "ttl"):
            if not isinstance(entry.value, str):
                raise ConfError(f"{key}.{name}: expected a duration string", entry.pos)
            try:
                rules["expires"] = parse_duration(entry.value)
            except ValueError as exc:
                raise ConfError(f"{key}.{name}: {exc}", entry.pos) from None
        else:
            raise ConfError(f'{key}: unknown field "{name}" parsing permissions', entry.pos)
    return rules


def permissions_value(key: str, item: Item) -> dict[str, Any]:
    """nats-server's permissions map as Tether's ``permissions`` setting."""
    perms: dict[str, Any] = {}
    for name, entry in _map(key, item).items():
        lower = name.lower()
        where = f"{key}.{name}"
        if lower in _PERMISSION_SIDES:
            perms[_PERMISSION_SIDES[lower]] = _side(where, entry)
        elif lower in ("allow_responses", "publish_allow_responses"):
            perms["allow_responses"] = _responses(where, entry)
        elif not entry.used:
            raise ConfError(f'{key}: unknown field "{name}" parsing permissions', entry.pos)
    return perms


def permissions(target: str) -> Reader:
    def read(out: Translation, key: str, item: Item) -> None:
        out.values[target] = permissions_value(key, item)

    return read


def operator(out: Translation, key: str, item: Item) -> None:
    """The operator JWT: a file or an inline JWT (an array of one is taken too)."""
    value = item.value
    if isinstance(value, list):
        if len(value) != 1:
            raise ConfError(f"{key}: Tether trusts one operator, got {len(value)}", item.pos)
        item = value[0]
    out.values["operator"] = text(key, item)


def resolver(out: Translation, key: str, item: Item) -> None:
    value = item.value
    if not (isinstance(value, str) and re.fullmatch(r"(?i)MEM|MEMORY", value)):
        raise ConfError(
            f"{key} refused: only the MEMORY resolver (with resolver_preload) is supported",
            item.pos,
        )
    out.values["resolver"] = "MEMORY"


def resolver_preload(out: Translation, key: str, item: Item) -> None:
    out.values["resolver_preload"] = {
        name: text(f"{key}.{name}", entry) for name, entry in _map(key, item).items()
    }


# -- jetstream { } sizes and limits { } ------------------------------------------------

_SIZE_SHIFTS = {"K": 10, "M": 20, "G": 30, "T": 40}


def store_size(target: str) -> Reader:
    """``max_memory_store`` / ``max_file_store``: bytes (a size, or a string such as
    ``"10G"`` with nats-server's K, M, G, T suffixes). 0 allows no such stream at all,
    as in nats-server; a negative size leaves it unset there, at its default (-1,
    worked out at start as when the key is absent: engine/limits.py)."""

    def read(out: Translation, key: str, item: Item) -> None:
        value = item.value
        if isinstance(value, str):
            value = _string_size(key, value, item)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ConfError(f"{key}: must be int64 or string, got {_describe(value)}", item.pos)
        out.values[target] = max(value, -1)

    return read


def _string_size(key: str, value: str, item: Item) -> int:
    if not value:
        return 0
    shift = _SIZE_SHIFTS.get(value[-1])
    if shift is None:
        raise ConfError(f"{key}: sizes defined as strings must end in K, M, G, T", item.pos)
    digits = value[:-1]
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise ConfError(f"{key}: {value!r} is not a size", item.pos)
    return int(digits) << shift


def positive(target: str) -> Reader:
    """A count of the ``limits`` block: only above 0 does it change anything, as in
    nats-server (0 or less keeps the default)."""

    def read(out: Translation, key: str, item: Item) -> None:
        value = integer(key, item)
        if value > 0:
            out.values[target] = value

    return read


def default_consumers(target: str) -> Reader:
    """``default_max_consumers``: above 0 the bound, below 0 none (-1, as nats-server
    reports it), 0 keeps nats-server's default of 1000."""

    def read(out: Translation, key: str, item: Item) -> None:
        value = integer(key, item)
        if value:
            out.values[target] = max(value, -1)

    return read


def go_duration(target: str) -> Reader:
    """A duration of the ``limits`` block: nats-server takes only duration strings
    (``"2m"``); above 0 it sets ``target`` in seconds."""

    def read(out: Translation, key: str, item: Item) -> None:
        if not isinstance(item.value, str):
            raise ConfError(
                f'{key}: expected a duration such as "2m", got {_describe(item.value)}', item.pos
            )
        seconds = _seconds(out, key, item)
        if seconds > 0:
            out.values[target] = seconds

    return read


def jetstream_limits(out: Translation, key: str, item: Item) -> None:
    out.read("jetstream.limits", _map(key, item))


def jetstream_batch_limits(out: Translation, key: str, item: Item) -> None:
    out.read("jetstream.limits.batch", _map(key, item))
