"""``tether context``: saved connection settings, as ``nats context`` keeps them."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Annotated, Any

import typer

from tether.cli._typer import Command, group
from tether.cli.output import emit_json, table
from tether.cli.remote import (
    Context,
    Failure,
    JsonOpt,
    Target,
    context_names,
    fail,
    load_context,
    remote,
    save_context,
    select_context,
    selected_context,
)
from tether.client.options import DEFAULT_URL

context_app = group("context", "Saved connection settings: add, ls, select, show, rm.")

NameArg = Annotated[str, typer.Argument(help="Context name.")]
# What a context keeps of the connection flags (all of them but --context itself).
SAVED = [f.name for f in fields(Target) if f.name not in ("server", "context")]


@remote(context_app, "add", without=("context",))
def add(
    target: Target,
    name: NameArg,
    http: Annotated[
        str | None, typer.Option("--http", help="HTTP API URL (for the jobs commands).")
    ] = None,
    description: Annotated[str, typer.Option("--description", help="What it is for.")] = "",
    select: Annotated[bool, typer.Option("--select", help="Also select it.")] = False,
) -> None:
    """Save a context (overwrites one of the same name): the connection flags given."""
    saved = Context(http=http, description=description)
    for key in SAVED:
        setattr(saved, key, getattr(target, key))
    saved.server = target.server or DEFAULT_URL
    try:
        path = save_context(name, saved)
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
    """Show a context (the password and token are not printed; files are named)."""
    chosen = name or selected_context()
    if chosen is None:
        fail("no context selected (tether context select NAME)")
    try:
        ctx = load_context(chosen)
    except Failure as exc:
        fail(str(exc))
    shown: dict[str, Any] = {"name": chosen, **asdict(ctx)}
    for secret in ("password", "token"):
        shown[secret] = "(set)" if shown[secret] else None
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
