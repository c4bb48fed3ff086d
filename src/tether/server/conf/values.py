"""What a nats-server configuration file parses into: values that remember where they
were written, the parser's one error type, and nats-server's units (sizes, durations)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Unquoted integer suffixes: a letter alone is decimal, with b / i / ib it is binary.
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}
SIZE_FACTORS: dict[str, int] = {"": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    SIZE_FACTORS[_letter] = _DECIMAL[_letter]
    for _tail in ("b", "i", "ib"):
        SIZE_FACTORS[_letter + _tail] = 1024**_power

# Go's time.ParseDuration units, in seconds.
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)([^\d.]+)")


@dataclass(frozen=True, slots=True)
class Pos:
    """Where something was written: file, line and column (both from 1)."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class ConfError(ValueError):
    """A configuration file that cannot be read, with the place it went wrong."""

    def __init__(self, message: str, pos: Pos | None = None) -> None:
        super().__init__(f"{pos}: {message}" if pos else message)
        self.message = message
        self.pos = pos


Scalar = str | int | float | bool | datetime


@dataclass(eq=False, slots=True)
class Item:
    """One value of the file. In a map, ``pos`` is where its key was written (the place
    a message about the setting should name); in an array, where the value starts.
    ``raw`` is the source text of an unquoted scalar (``2m``, ``1MB``, ``true``), so a
    message can quote what was written; ``used`` marks a key read as a ``$VARIABLE``."""

    value: Scalar | list[Item] | dict[str, Item]
    pos: Pos
    raw: str = ""
    used: bool = False


def to_plain(value: Item | dict[str, Item] | list[Item] | Scalar) -> Any:
    """The values without their positions: dicts, lists and scalars."""
    if isinstance(value, Item):
        value = value.value
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    return value


def parse_duration(text: str) -> float:
    """Seconds in a Go duration such as ``500ms``, ``2m`` or ``1h30m`` (``ValueError`` if
    it is not one; a number needs a unit, except ``0``)."""
    body = text[1:] if text[:1] in "+-" else text
    sign = -1.0 if text.startswith("-") else 1.0
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    at = 0
    while at < len(body):
        m = _DURATION_PART.match(body, at)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        unit = _DURATION_UNITS.get(m.group(2))
        if unit is None:
            raise ValueError(f"unknown unit {m.group(2)!r} in duration {text!r}")
        total += float(m.group(1)) * unit
        at = m.end()
    return sign * total
