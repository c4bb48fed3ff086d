"""Asking for what the flags left out, as ``nats stream add`` does on a terminal.

A command lists its questions (one per configuration field, with the default shown);
on a terminal without ``--config`` or ``--defaults``, every field no flag gave is asked
for. Elsewhere (a script, a pipe) nothing is asked: the server's defaults apply.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

DefaultsOpt = Annotated[
    bool, typer.Option("--defaults", help="No questions: what no flag gives takes its default.")
]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|y)?")
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "y": 365 * 86400.0}


def seconds(text: str) -> float:
    """``90``, ``1.5s``, ``10m``, ``2h``, ``7d``, ``1y`` (and ``unlimited``) in seconds."""
    text = text.strip().lower()
    if text in ("", "0", "unlimited", "forever", "-1"):
        return 0.0
    match = _DURATION.fullmatch(text)
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
    return float(match.group(1)) * _UNIT[match.group(2) or "s"]


@dataclass(frozen=True)
class Question:
    """One field a command can ask for."""

    key: str
    text: str
    default: Any
    choices: Sequence[str] = ()
    # What the answer becomes (the flag's own type): int, seconds, a list of subjects…
    convert: Callable[[str], Any] = str


def interactive(*, defaults: bool, config: object) -> bool:
    """Whether to ask: on a terminal, unless ``--defaults`` or a ``--config`` file."""
    return not defaults and config is None and sys.stdin.isatty() and sys.stdout.isatty()


def named(name: str | None, kind: str, asking: bool) -> str:
    """The NAME argument, asked for when it is missing on a terminal (else a usage error)."""
    if name is not None:
        return name
    if not asking:
        raise typer.BadParameter(f"a {kind} name is needed", param_hint="NAME")
    return str(typer.prompt(f"{kind.capitalize()} name"))


def ask(questions: Sequence[Question], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with every field that is None asked for on the terminal."""
    answers = dict(given)
    for q in questions:
        if answers.get(q.key) is not None:
            continue
        while True:
            raw = typer.prompt(
                q.text + (f" ({', '.join(q.choices)})" if q.choices else ""),
                default=str(q.default),
                show_default=True,
            )
            if q.choices and raw not in q.choices:
                typer.echo(f"Choose one of: {', '.join(q.choices)}", err=True)
                continue
            try:
                answers[q.key] = q.convert(raw)
            except (ValueError, typer.BadParameter) as exc:
                typer.echo(f"Not valid: {exc}", err=True)
                continue
            break
    return answers


def words(text: str) -> list[str]:
    """Several values on one line, separated by spaces or commas."""
    return [w for w in re.split(r"[\s,]+", text.strip()) if w]


def yes(text: str) -> bool:
    if text.strip().lower() in ("y", "yes", "true", "1"):
        return True
    if text.strip().lower() in ("n", "no", "false", "0"):
        return False
    raise ValueError("answer y or n")
