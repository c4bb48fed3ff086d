"""``tether store check|repair|compact``: look after a store with the server stopped."""

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
    typer.Option(
        help="The store: sqlite:DIR (default sqlite:./tether-data)"
        " or postgresql://USER:PASS@HOST/DB (check and repair)."
    ),
]
StoreDirOption = Annotated[str | None, typer.Option(help="Same as --store sqlite:DIR.")]


def _url(store: str | None, store_dir: str | None) -> str:
    return store if store is not None else (f"sqlite:{store_dir}" if store_dir else DEFAULT_STORE)


def _postgres(url: str) -> bool:
    scheme, colon, _ = url.partition(":")
    return bool(colon) and scheme in ("postgres", "postgresql")


def _directory(url: str, *, postgres: bool = False) -> Path:
    scheme, colon, rest = url.partition(":")
    directory = rest[2:] if rest.startswith("//") else rest
    if not (colon and scheme == "sqlite" and directory):
        if _postgres(url):
            from tether.storage.postgres import redact

            typer.echo(
                f"tether store: {redact(url)!r} is a PostgreSQL store: compact works on"
                " SQLite stores only (PostgreSQL's VACUUM gives space back)",
                err=True,
            )
            raise typer.Exit(2)
        also = " or postgresql://USER:PASS@HOST/DB" if postgres else ""
        typer.echo(f"tether store: {url!r} is not a store: expected sqlite:DIR{also}", err=True)
        raise typer.Exit(2)
    return Path(directory).absolute()


@store_app.command(cls=Command)
def check(store: StoreOption = None, store_dir: StoreDirOption = None) -> None:
    """Read the whole store and report damage; change nothing.

    Exit status 0: the store is whole; 1: it is damaged (see the report), or it could
    not be read (a PostgreSQL store that cannot be reached).
    """
    from tether.storage.base import StorageError
    from tether.storage.damage import StoreReport

    url = _url(store, store_dir)
    report: StoreReport
    if _postgres(url):
        from tether.storage.postgres_integrity import check_postgres

        try:
            report = check_postgres(url)
        except StorageError as exc:
            typer.echo(f"tether store check: {exc}", err=True)
            raise typer.Exit(1) from None
    else:
        from tether.storage.integrity import check_store

        report = check_store(_directory(url, postgres=True))
    for line in report.lines():
        typer.echo(line)
    raise typer.Exit(0 if report.ok else 1)


@store_app.command(cls=Command)
def repair(store: StoreOption = None, store_dir: StoreDirOption = None) -> None:
    """Keep what verifies, set the damaged rest aside, report what was lost.

    SQLite: every message that verifies goes into a new database; the damaged files
    are renamed (not deleted). PostgreSQL: the messages that fail verification are
    deleted, in one transaction. Stop the server first.

    Exit status 0: repaired, or nothing to repair; 1: the repair could not be done.
    """
    from tether.storage.base import StorageError
    from tether.storage.damage import RepairReport

    url = _url(store, store_dir)
    report: RepairReport
    try:
        if _postgres(url):
            from tether.storage.postgres_integrity import repair_postgres

            report = repair_postgres(url)
        else:
            from tether.storage.integrity import repair_store

            report = repair_store(_directory(url, postgres=True))
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
        report = compact_store(_directory(_url(store, store_dir)))
    except StorageError as exc:
        typer.echo(f"tether store compact: {exc}", err=True)
        raise typer.Exit(1) from None
    for line in report.lines():
        typer.echo(line)
