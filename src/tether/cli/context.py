"""``tether context``: saved connection settings, as ``nats context`` keeps them."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli._typer import CONTEXT, MARKUP, Command, Group
from tether.cli.output import emit_json, table
from tether.cli.remote import (
    Context,
    Failure,
    JsonOpt,
    context_names,
    fail,
    load_context,
    save_context,
    select_context,
    selected_context,
)
from tether.client.options import DEFAULT_URL

context_app = typer.Typer(
    name="context",
    help="Saved connection settings: add, ls, select, show, rm.",
    cls=Group,
    no_args_is_help=True,
    context_settings=CONTEXT,
    rich_markup_mode=MARKUP,
)

NameArg = Annotated[str, typer.Argument(help="Context name.")]


@context_app.command("add", cls=Command)
def add(
    name: NameArg,
    server: Annotated[str, typer.Option("--server", "-s", help="NATS URL.")] = DEFAULT_URL,
    user: Annotated[str | None, typer.Option("--user", help="User name.")] = None,
    password: Annotated[str | None, typer.Option("--password", help="Password.")] = None,
    token: Annotated[str | None, typer.Option("--token", help="Token.")] = None,
    http: Annotated[
        str | None, typer.Option("--http", help="HTTP API URL (for the jobs commands).")
    ] = None,
    description: Annotated[str, typer.Option("--description", help="What it is for.")] = "",
    select: Annotated[bool, typer.Option("--select", help="Also select it.")] = False,
) -> None:
    """Save a context (overwrites one of the same name)."""
    try:
        path = save_context(name, Context(server, user, password, token, http, description))
        if select:
            select_context(name)
    except (Failure, OSError) as exc:
        fail(str(exc))
    typer.echo(f"Context {name} saved in {path}" + (" and selected" if select else ""))


@context_app.command("ls", cls=Command)
def ls(as_json: JsonOpt = False) -> None:
    """List saved contexts; the selected one is marked."""
    current = selected_context()
    rows = []
    for name in context_names():
        try:
            ctx = load_context(name)
        except Failure as exc:
            rows.append((name, "", "", str(exc)))
            continue
        rows.append(
            (name + (" *" if name == current else ""), ctx.server, ctx.user or "", ctx.description)
        )
    if as_json:
        emit_json({"selected": current, "contexts": [r[0].rstrip(" *") for r in rows]})
        return
    table("Contexts", ["Name", "Server", "User", "Description"], rows)


@context_app.command("select", cls=Command)
def select(
    name: Annotated[str | None, typer.Argument(help="Context name (none: unselect).")] = None,
) -> None:
    """Select the context the other commands use (TETHER_URL and --server still win)."""
    try:
        if name is not None:
            load_context(name)
        select_context(name)
    except (Failure, OSError) as exc:
        fail(str(exc))
    typer.echo(f"Selected context {name}" if name else "No context selected")


@context_app.command("show", cls=Command)
def show(
    name: Annotated[str | None, typer.Argument(help="Context name (default: selected).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a context (the password and token are not printed)."""
    chosen = name or selected_context()
    if chosen is None:
        fail("no context selected (tether context select NAME)")
    try:
        ctx = load_context(chosen)
    except Failure as exc:
        fail(str(exc))
    shown = {
        "name": chosen,
        "server": ctx.server,
        "user": ctx.user,
        "password": "(set)" if ctx.password else None,
        "token": "(set)" if ctx.token else None,
        "http": ctx.http,
        "description": ctx.description,
    }
    if as_json:
        emit_json(shown)
        return
    for key, value in shown.items():
        if value:
            typer.echo(f"{key}: {value}")


@context_app.command("rm", cls=Command)
def rm(name: NameArg) -> None:
    """Delete a saved context."""
    try:
        load_context(name)
        from tether.cli.remote import config_dir

        (config_dir() / "context" / f"{name}.json").unlink()
        if selected_context() == name:
            select_context(None)
    except (Failure, OSError) as exc:
        fail(str(exc))
    typer.echo(f"Context {name} deleted")
