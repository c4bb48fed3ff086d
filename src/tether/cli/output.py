"""How the remote commands print: rich tables that fit the terminal (colours only on a
TTY, which rich decides), or ``--json`` for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    out = Table(title=title, title_justify="left", expand=False)
    for i, column in enumerate(columns):
        out.add_column(column, justify="right" if i else "left", overflow="fold")
    for row in rows:
        out.add_row(*(_cell(v) for v in row))
    console.print(out)


def pairs(title: str, items: Iterable[tuple[str, Any]]) -> None:
    """A two-column table of labelled values (an info view)."""
    out = Table(title=title, title_justify="left", show_header=False, expand=False)
    out.add_column(style="bold")
    out.add_column(overflow="fold")
    for label, value in items:
        out.add_row(label, _cell(value))
    console.print(out)


def show(
    value: Any, as_json: bool, title: str, rows: Callable[[Any], Iterable[tuple[str, Any]]]
) -> None:
    """An info view: ``value`` as JSON for scripts, else its labelled rows."""
    if as_json:
        emit_json(value)
    else:
        pairs(title, rows(value))


def count(n: int) -> str:
    return f"{n:,}"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)
