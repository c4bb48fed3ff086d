"""Talking to a running server from the command line: where it is, how to log in, and
how a command's failure becomes one line and an exit code.

The server comes from ``--server``, else ``$TETHER_URL``, else the selected context
(``tether context select NAME``), else ``nats://127.0.0.1:4222``. Contexts are small JSON
files under the user's config directory (``$XDG_CONFIG_HOME/tether/context/``, else
``~/.config/tether/context/``), as ``nats context`` keeps its own.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, get_type_hints

import typer

from tether.cli._typer import Command
from tether.client import ClientError, Connection, connect
from tether.client.options import DEFAULT_URL

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass
class Context:
    """Where a server is and how to log in to it (a saved context, or the flags)."""

    server: str = DEFAULT_URL
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None  # a .creds file (user JWT and nkey seed)
    nkey: str | None = None  # an nkey seed file
    tlscert: str | None = None
    tlskey: str | None = None
    tlsca: str | None = None
    tlsfirst: bool | None = None
    connect_timeout: float | None = None
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
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
_PANEL = "Connection"


def _opt(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_PANEL)


# name -> (annotation, option): the flags ``nats`` takes for the same things.
_CONNECTION: dict[str, tuple[Any, Any]] = {
    "server": (
        str | None,
        _opt("--server", "-s", help="NATS URL (default: $TETHER_URL, the context, 4222)."),
    ),
    "user": (str | None, _opt("--user", help="User name.")),
    "password": (str | None, _opt("--password", help="Password.")),
    "token": (str | None, _opt("--token", help="Authentication token.")),
    "creds": (
        str | None,
        _opt("--creds", help="User credentials file (.creds: JWT and nkey seed)."),
    ),
    "nkey": (str | None, _opt("--nkey", help="User nkey seed file.")),
    "tlscert": (str | None, _opt("--tlscert", help="TLS client certificate file.")),
    "tlskey": (str | None, _opt("--tlskey", help="TLS client private key file.")),
    "tlsca": (str | None, _opt("--tlsca", help="CA file to verify the server's certificate.")),
    "tlsfirst": (bool, _opt("--tlsfirst", help="TLS handshake before the server's INFO.")),
    "connect_timeout": (
        float | None,
        _opt("--connect-timeout", help="Seconds to wait for the connection (default 5)."),
    ),
    "context": (str | None, _opt("--context", help="Use this saved context for this command.")),
}
DEFAULT_TIMEOUT = 5.0
ContextOpt = Annotated[str | None, _CONNECTION["context"][1]]


@dataclass
class Target:
    """The connection flags of one command, resolved against env and contexts."""

    server: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tlscert: str | None = None
    tlskey: str | None = None
    tlsca: str | None = None
    tlsfirst: bool | None = None
    connect_timeout: float | None = None
    context: str | None = None

    def resolve(self) -> Context:
        name = self.context or selected_context()
        base = load_context(name) if name else Context()
        env_url = os.environ.get("TETHER_URL")
        if env_url and not self.context:
            base.server = env_url
        for f in fields(Context):
            value = getattr(self, f.name, None)
            if value not in (None, "", False):  # a flag not given leaves the context's value
                setattr(base, f.name, value)
        return base


Flags = dict[str, tuple[Any, Any]]  # parameter name -> (annotation, typer.Option)


def flagged(
    app: typer.Typer, name: str, flags: Flags, build: Callable[..., Any], **settings: Any
) -> Callable[[F], F]:
    """Register ``func`` as the command ``name`` of ``app``, with a shared set of flags.

    ``func`` takes, as its first parameter, what ``build`` makes of those flags' values;
    the command typer sees has the function's other parameters and then the flags.
    """

    def register(func: F) -> F:
        hints = get_type_hints(func, include_extras=True)
        own = [
            p.replace(
                annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY
            )
            for p in list(inspect.signature(func).parameters.values())[1:]
        ]
        shared = [
            inspect.Parameter(
                key,
                inspect.Parameter.KEYWORD_ONLY,
                default=False if kind is bool else None,
                annotation=Annotated[kind, opt],
            )
            for key, (kind, opt) in flags.items()
        ]
        params = own + shared

        def command(**kwargs: Any) -> Any:
            built = build(**{key: kwargs.pop(key) for key in flags})
            return func(built, **kwargs)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__name__ = func.__name__
        command.__qualname__ = func.__qualname__
        command.__doc__ = func.__doc__
        command.__module__ = func.__module__
        app.command(name, cls=Command, **settings)(command)
        return func

    return register


def remote(
    app: typer.Typer, name: str, *, without: tuple[str, ...] = (), **settings: Any
) -> Callable[[F], F]:
    """Register ``func(target: Target, ...)`` as the command ``name`` of ``app``, with
    every connection flag but those named in ``without`` (under *Connection* in ``-h``)."""
    flags = {key: flag for key, flag in _CONNECTION.items() if key not in without}
    return flagged(app, name, flags, Target, **settings)


def tls_context(ctx: Context) -> ssl.SSLContext | None:
    """The TLS context the flags ask for; None leaves it to the URL and the server's INFO."""
    if not (ctx.tlsca or ctx.tlscert or ctx.tlskey):
        return None
    if bool(ctx.tlscert) != bool(ctx.tlskey):
        raise Failure("--tlscert and --tlskey go together")
    try:
        tls = ssl.create_default_context(cafile=ctx.tlsca)
        if ctx.tlscert:
            tls.load_cert_chain(ctx.tlscert, ctx.tlskey)
    except (OSError, ssl.SSLError) as exc:
        raise Failure(f"TLS files: {describe(exc)}") from None
    return tls


async def open_connection(target: Target) -> Connection:
    ctx = target.resolve()
    tls = tls_context(ctx)
    try:
        return await connect(
            ctx.server,
            user=ctx.user,
            password=ctx.password,
            token=ctx.token,
            user_credentials=ctx.creds,
            nkeys_seed=ctx.nkey,
            tls=tls,
            tls_handshake_first=bool(ctx.tlsfirst),
            connect_timeout=ctx.connect_timeout or DEFAULT_TIMEOUT,
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
