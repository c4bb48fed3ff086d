"""How Tether's commands look and fail: help without ``<bool>`` after switches, and usage
errors on one line (``tether: No such option: --x; try 'tether serve -h'``)."""

from __future__ import annotations

from typing import Any, Literal

import typer
from typer.core import TyperCommand, TyperGroup

# Help texts are rich markup: a literal "[section]" is written r"\[section]".
MARKUP: Literal["rich"] = "rich"
CONTEXT = {"help_option_names": ["-h", "--help"]}


def _no_value_for_switches(params: list[Any]) -> list[Any]:
    # Recent typer releases print "<bool>" after every switch (--help, --jetstream).
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Group(TyperGroup):
    """A command group (``typer.Typer(cls=Group)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_value_for_switches(super().get_params(ctx))


class Command(TyperCommand):
    """A command (``@app.command(cls=Command)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_value_for_switches(super().get_params(ctx))


def group(name: str, help: str, **settings: Any) -> typer.Typer:
    """A command group as all of Tether's look: ``-h``, rich help, help when run bare."""
    return typer.Typer(
        name=name,
        help=help,
        cls=Group,
        no_args_is_help=True,
        context_settings=CONTEXT,
        rich_markup_mode=MARKUP,
        **settings,
    )


# click's exception class: typer raises it from its own copy of click in recent releases,
# from click itself in older ones.
ClickError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def report(exc: Exception) -> int:
    """Print a usage error (a ``ClickError``) on one line; returns the exit status."""
    code = int(getattr(exc, "exit_code", 2))
    message = str(getattr(exc, "format_message", exc.__str__)())
    if type(exc).__name__ == "NoArgsIsHelpError":
        # A group run without a command: the message is its help (which typer prints
        # itself when it renders help with rich).
        if message.strip():
            typer.echo(message)
        return code
    line = " ".join(message.split())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        line += f"; try '{ctx.command_path} -h'"
    typer.echo(f"tether: {line}", err=True)
    return code
