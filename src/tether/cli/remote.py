"""Talking to a running server from the command line: where it is, how to log in, and
how a command's failure becomes one line and an exit code.

The server comes from ``--server``, else ``$TETHER_URL``, else the selected context
(``tether context select NAME``), else ``nats://127.0.0.1:4222``. Contexts are small JSON
files under the user's config directory (``$XDG_CONFIG_HOME/tether/context/``, else
``~/.config/tether/context/``), as ``nats context`` keeps its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer

from tether.client import ClientError, Connection, connect
from tether.client.options import DEFAULT_URL

T = TypeVar("T")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass
class Context:
    """Where a server is and how to log in to it (a saved context, or the flags)."""

    server: str = DEFAULT_URL
    user: str | None = None
    password: str | None = None
    token: str | None = None
    http: str | None = None  # the HTTP API's base URL, for the jobs commands
    description: str = ""


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tether"


def _context_path(name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise Failure(f"invalid context name {name!r}: use 1 to 64 of A-Z a-z 0-9 _ . -")
    return config_dir() / "context" / f"{name}.json"


def _selected_path() -> Path:
    return config_dir() / "context.txt"


def load_context(name: str) -> Context:
    path = _context_path(name)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise Failure(f"no context named {name!r} (tether context ls)") from None
    except (OSError, ValueError) as exc:
        raise Failure(f"context {name!r}: cannot read {path}: {exc}") from None
    known = {f.name for f in fields(Context)}
    if not isinstance(raw, dict):
        raise Failure(f"context {name!r}: {path} is not a JSON object")
    return Context(**{k: v for k, v in raw.items() if k in known})


def save_context(name: str, ctx: Context) -> Path:
    path = _context_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in asdict(ctx).items() if v}, indent=2) + "\n")
    tmp.chmod(0o600)  # may hold a password or token
    tmp.replace(path)
    return path


def context_names() -> list[str]:
    folder = config_dir() / "context"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def selected_context() -> str | None:
    try:
        name = _selected_path().read_text().strip()
    except OSError:
        return None
    return name or None


def select_context(name: str | None) -> None:
    path = _selected_path()
    if name is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(name + "\n")


class Failure(Exception):
    """A command failed for a reason the user can act on: one line, exit code 1."""


# -- the connection options every remote command takes ---------------------------------------
ServerOpt = Annotated[
    str | None,
    typer.Option("--server", "-s", help="NATS URL (default: $TETHER_URL, the context, 4222)."),
]
UserOpt = Annotated[str | None, typer.Option("--user", help="User name.")]
PasswordOpt = Annotated[str | None, typer.Option("--password", help="Password.")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Authentication token.")]
ContextOpt = Annotated[
    str | None, typer.Option("--context", help="Use this saved context for this command.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@dataclass
class Target:
    """The connection flags of one command, resolved against env and contexts."""

    server: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    context: str | None = None

    def resolve(self) -> Context:
        name = self.context or selected_context()
        base = load_context(name) if name else Context()
        env_url = os.environ.get("TETHER_URL")
        if env_url and not self.context:
            base.server = env_url
        if self.server:
            base.server = self.server
        for key in ("user", "password", "token"):
            value = getattr(self, key)
            if value is not None:
                setattr(base, key, value)
        return base


async def open_connection(target: Target) -> Connection:
    ctx = target.resolve()
    try:
        return await connect(
            ctx.server,
            user=ctx.user,
            password=ctx.password,
            token=ctx.token,
            name="tether-cli",
            allow_reconnect=False,
            max_reconnect_attempts=0,
        )
    except (ClientError, OSError) as exc:
        raise Failure(f"cannot connect to {ctx.server}: {describe(exc)}") from None


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def run(target: Target, work: Callable[[Connection], Awaitable[T]]) -> T:
    """Connect, run ``work``, close; any failure becomes one line on stderr and exit 1."""

    async def main() -> T:
        conn = await open_connection(target)
        try:
            return await work(conn)
        finally:
            await conn.close()

    try:
        return asyncio.run(main())
    except Failure as exc:
        fail(str(exc))
    except ClientError as exc:
        fail(describe(exc))
    except (OSError, TimeoutError) as exc:
        fail(describe(exc) if not isinstance(exc, TimeoutError) else "timed out")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def fail(message: str) -> NoReturn:
    typer.echo(f"tether: {message}", err=True)
    raise typer.Exit(1)
