"""``tether store check|repair|compact``: look after a store's files with the server stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli._typer import CONTEXT, MARKUP, Command, Group

store_app = typer.Typer(
    name="store",
    help="Check a store's files for damage, repair a damaged store, give free space back.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    context_settings=CONTEXT,
    rich_markup_mode=MARKUP,
)

DEFAULT_STORE = "sqlite:./tether-data"

StoreOption = Annotated[
    str | None,
    typer.Option(help="The store: sqlite:DIR (default sqlite:./tether-data)."),
]
StoreDirOption = Annotated[str | None, typer.Option(help="Same as --store sqlite:DIR.")]


def _directory(store: str | None, store_dir: str | None) -> Path:
    url = store if store is not None else (f"sqlite:{store_dir}" if store_dir else DEFAULT_STORE)
    scheme, colon, rest = url.partition(":")
    directory = rest[2:] if rest.startswith("//") else rest
    if not (colon and scheme == "sqlite" and directory):
        typer.echo(
            f"tether store: {url!r} is not a store with files: expected sqlite:DIR", err=True
        )
        raise typer.Exit(2)
    return Path(directory).absolute()


@store_app.command(cls=Command)
def check(store: StoreOption = None, store_dir: StoreDirOption = None) -> None:
    """Read the whole store and report damage; change nothing.

    Exit status 0: the store is whole; 1: it is damaged (see the report).
    """
    from tether.storage.integrity import check_store

    report = check_store(_directory(store, store_dir))
    for line in report.lines():
        typer.echo(line)
    raise typer.Exit(0 if report.ok else 1)


@store_app.command(cls=Command)
def repair(store: StoreOption = None, store_dir: StoreDirOption = None) -> None:
    """Keep what verifies, move the damaged files aside, report what was lost.

    Every message that verifies goes into a new database; the damaged files are
    renamed (not deleted). Stop the server first.

    Exit status 0: repaired, or nothing to repair; 1: the repair could not be done.
    """
    from tether.storage.base import StorageError
    from tether.storage.integrity import repair_store

    try:
        report = repair_store(_directory(store, store_dir))
    except StorageError as exc:
        typer.echo(f"tether store repair: {exc}", err=True)
        raise typer.Exit(1) from None
    for line in report.lines():
        typer.echo(line)


@store_app.command(cls=Command)
def compact(store: StoreOption = None, store_dir: StoreDirOption = None) -> None:
    """Give the space of deleted messages back to the file system.

    The server reuses that space for new messages but never shrinks the file. Needs
    free disk space of about the database's size while it runs. Stop the server first.

    Exit status 0: compacted; 1: it could not be done.
    """
    from tether.storage.base import StorageError
    from tether.storage.compaction import compact_store

    try:
        report = compact_store(_directory(store, store_dir))
    except StorageError as exc:
        typer.echo(f"tether store compact: {exc}", err=True)
        raise typer.Exit(1) from None
    for line in report.lines():
        typer.echo(line)
