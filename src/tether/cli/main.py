"""``tether`` — the broker's command line."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tether.cli._typer import CONTEXT, MARKUP, ClickError, Command, Group, report
from tether.cli.aliases import normalize
from tether.cli.backup import register as register_backup
from tether.cli.bench import bench_app
from tether.cli.consumer import consumer_app
from tether.cli.context import context_app
from tether.cli.dead import dead_app
from tether.cli.jobs import jobs_app
from tether.cli.kv import kv_app
from tether.cli.logs import setup as setup_logs
from tether.cli.messages import register as register_messages
from tether.cli.objects import object_app
from tether.cli.server import server_app
from tether.cli.store import store_app
from tether.cli.stream import stream_app
from tether.version import __version__

app = typer.Typer(
    name="tether",
    help="Tether: a durable message broker with first-class pull consumers.",
    cls=Group,
    add_completion=True,
    context_settings=CONTEXT,
    rich_markup_mode=MARKUP,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


# nats-server's spelling: -v/--version prints the version (its -V is trace, see aliases.py).
VersionFlag = Annotated[
    bool,
    typer.Option(
        "--version", "-v", is_eager=True, callback=_print_version, help="Print the version."
    ),
]


@app.callback()
def _root(version: VersionFlag = False) -> None:
    """Tether: a durable message broker with first-class pull consumers."""


def _setup_logging(level: str, log_file: str | None = None, log_format: str = "text") -> None:
    # nats-server's log line shape, or JSON lines (cli/logs.py); with a log file, as
    # there, the lines go to the file only.
    try:
        setup_logs(level, log_file, log_format)
    except OSError as exc:
        typer.echo(f"tether: log_file {log_file}: cannot open: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None


def _tls_flags(
    tls: bool | None,
    cert: str | None,
    key: str | None,
    ca: str | None,
    verify: bool | None,
) -> dict[str, Any]:
    """nats-server's --tls* flags: any of them replaces the file's whole tls block, and
    a certificate, a key, a CA or --tlsverify turns TLS on unless --tls=false says no."""
    if tls is None and cert is None and key is None and ca is None and verify is None:
        return {}
    on = bool(cert or key or ca or verify) if tls is None else tls
    return {
        "tls": on,
        "tls_cert": cert or "",
        "tls_key": key or "",
        "tls_ca": ca or "",
        "tls_verify": bool(verify) and on,
        "tls_verify_and_map": False,
        "tls_handshake_first": False,
    }


@app.command(cls=Command)
def serve(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option(help="NATS client port, 0-65535 (-1 or 0 picks a free one).")
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(help="HTTP port for /healthz, /varz, 0-65535 (-1 or 0 picks a free one)."),
    ] = None,
    nsq_port: Annotated[
        int | None,
        typer.Option(help="NSQ (nsqd TCP) port, default 4150; 0 turns it off, -1 picks one."),
    ] = None,
    nsq_lookupd_peer: Annotated[
        list[str] | None,
        typer.Option(
            help="Another node's HOST:HTTPPORT, whose NSQ producers /lookup also lists "
            "(repeatable).",
            show_default=False,
        ),
    ] = None,
    nsq_lookupd_http_port: Annotated[
        int | None,
        typer.Option(help="Also serve nsqlookupd's HTTP API alone on this port (4161)."),
    ] = None,
    nsq_https_port: Annotated[
        int | None,
        typer.Option(
            help="Serve nsqd's HTTP API over TLS on this port (4152), with the NSQ "
            "certificate; -1 picks one."
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Storage: sqlite:DIR (default sqlite:./tether-data), memory, or"
            " postgresql://USER:PASS@HOST/DB (pip install 'tether[postgres]')."
        ),
    ] = None,
    store_dir: Annotated[
        str | None, typer.Option(help="Same as --store sqlite:DIR (nats-server's -sd).")
    ] = None,
    sync: Annotated[
        str | None, typer.Option(help="'always' (fsync every group commit) or 'os'.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="Configuration file: TOML, or nats-server's format (.conf)."),
    ] = None,
    auth_token: Annotated[str | None, typer.Option(help="Require this token.")] = None,
    user: Annotated[str | None, typer.Option(help="Require this user.")] = None,
    password: Annotated[str | None, typer.Option(help="Password for --user.")] = None,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="Require TLS of clients (with --tlscert and --tlskey); any --tls* flag "
            "replaces the file's tls block.",
            show_default=False,
        ),
    ] = None,
    tlscert: Annotated[str | None, typer.Option(help="Server certificate file (PEM).")] = None,
    tlskey: Annotated[str | None, typer.Option(help="Private key of the certificate.")] = None,
    tlscacert: Annotated[
        str | None, typer.Option(help="CAs that sign client certificates (PEM).")
    ] = None,
    tlsverify: Annotated[
        bool | None,
        typer.Option(
            "--tlsverify/--no-tlsverify",
            help="Require and verify a client certificate.",
            show_default=False,
        ),
    ] = None,
    max_payload: Annotated[int | None, typer.Option(help="Largest message payload.")] = None,
    max_connections: Annotated[int | None, typer.Option(help="Most client connections.")] = None,
    max_pending: Annotated[
        int | None, typer.Option(help="Outbound bytes per connection before Slow Consumer.")
    ] = None,
    max_pending_total: Annotated[
        int | None,
        typer.Option(help="Outbound bytes of all connections together (0: no bound)."),
    ] = None,
    max_memory_store: Annotated[
        int | None,
        typer.Option(
            help='Bytes the streams with storage "memory" may hold '
            "(-1: nats-server's default, 75 % of the RAM)."
        ),
    ] = None,
    max_file_store: Annotated[
        int | None,
        typer.Option(
            help='Bytes the streams with storage "file" may hold '
            "(-1: nats-server's default, 75 % of the free disk, the store's files "
            "counted as free)."
        ),
    ] = None,
    server_name: Annotated[str | None, typer.Option(help="Server name reported in INFO.")] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info (the default), warning or error.")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(help="text (nats-server's lines, the default) or json.")
    ] = None,
    webhook_broker_config: Annotated[
        Path | None,
        typer.Option(
            help=r"A webhook-broker INI file (seed data, \[broker], \[consumer-connection])."
        ),
    ] = None,
    jetstream: Annotated[
        bool | None,
        typer.Option(
            "--jetstream/--no-jetstream",
            help="JetStream (streams, consumers, the webhook-broker API) is on unless "
            "turned off here or by the file; -js=false is --no-jetstream.",
            show_default=False,
        ),
    ] = None,
    signal_: Annotated[
        str | None,
        typer.Option(
            "--signal",
            help="Signal a running server and exit, as nats-server's -sl: "
            "ldm|term|quit|stop=<pid or pid file>.",
        ),
    ] = None,
    version: VersionFlag = False,
) -> None:
    """Run the broker."""
    if signal_ is not None:
        from tether.cli.signals import send

        try:
            send(signal_)
        except ValueError as exc:
            typer.echo(f"tether: {exc}", err=True)
            raise typer.Exit(1) from None
        return
    from tether.server.app import Tether
    from tether.server.config import load_config

    overrides: dict[str, Any] = {
        "host": host,
        "port": port,
        "http_port": http_port,
        "nsq_port": nsq_port,
        "nsq_lookupd_peers": nsq_lookupd_peer or None,
        "nsq_lookupd_http_port": nsq_lookupd_http_port,
        "nsq_https_port": nsq_https_port,
        "store": store if store is not None else (f"sqlite:{store_dir}" if store_dir else None),
        "sync": sync,
        "auth_token": auth_token,
        "user": user,
        "password": password,
        "max_payload": max_payload,
        "max_connections": max_connections,
        "max_pending": max_pending,
        "max_pending_total": max_pending_total,
        "max_memory_store": max_memory_store,
        "max_file_store": max_file_store,
        "server_name": server_name,
        "log_level": log_level,
        "log_format": log_format,
        "webhook_broker_config": str(webhook_broker_config) if webhook_broker_config else None,
        "jetstream": jetstream,
    }
    overrides.update(_tls_flags(tls, tlscert, tlskey, tlscacert, tlsverify))
    ignored: list[str] = []  # what a nats-server file asks for that Tether ignores
    try:
        cfg = load_config(config, overrides, ignored)
    except (OSError, ValueError) as exc:
        typer.echo(f"tether: {exc}", err=True)
        raise typer.Exit(2) from None
    _setup_logging(cfg.log_level, cfg.log_file, cfg.log_format)
    for warning in ignored:
        logging.getLogger("tether").warning("%s", warning)
    busy = _port_in_use(
        cfg.host,
        {
            "the NATS port, --port": cfg.port,
            "the HTTP port, --http-port": cfg.http_port,
            "the NSQ port, --nsq-port": cfg.nsq_port,
        },
    )
    if busy:
        logging.getLogger("tether").error("cannot start: %s", busy)
        raise typer.Exit(1)
    # Every publish creates a few short-lived container objects that live until their
    # group commit; with CPython's default threshold (700) the collector then runs every
    # few hundred messages and took over a quarter of the loop's time under load.
    gc.set_threshold(50_000, 20, 20)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is optional on some platforms
        runner = asyncio.run
    from tether.storage.base import StorageError

    try:
        broker = Tether(cfg)
    except ValueError as exc:  # settings that cannot work together (authorization)
        typer.echo(f"tether: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        runner(broker.run_until_signalled())
    except (OSError, StorageError) as exc:
        logging.getLogger("tether").error("cannot start: %s", exc)
        raise typer.Exit(1) from None


def _port_in_use(host: str, ports: dict[str, int]) -> str | None:
    """Which of ``ports`` (by name) another process already listens on, told before the
    store is opened and naming the address; ``None`` when all look free (binding for real
    may still fail: the server then reports the system's error)."""
    for name, port in ports.items():
        if port <= 0:
            continue
        try:
            addresses = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError:
            continue
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as sock:
                # The listeners' own options: a port held only by TIME_WAIT sockets is free.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(address)
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        ip = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
                        return f"{ip}:{port} is already in use ({name})"
    return None


@app.command(cls=Command)
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


app.add_typer(store_app, name="store")


app.add_typer(stream_app, name="stream")
app.add_typer(consumer_app, name="consumer")
app.add_typer(server_app, name="server")
app.add_typer(context_app, name="context")
app.add_typer(kv_app, name="kv")
register_messages(app)
app.add_typer(object_app, name="object")
app.add_typer(bench_app, name="bench")
app.add_typer(jobs_app, name="jobs")
register_backup(stream_app)
consumer_app.add_typer(dead_app, name="dead")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    if args[0] == "serve":
        # nats-server's spellings are for launching a server; the other commands keep
        # their own short flags (-n, -s, -f ...).
        args = [args[0], *normalize(args[1:])]
    try:
        code = app(args=args, prog_name="tether", standalone_mode=False)
    except ClickError as exc:
        # One line, as for a bad configuration, not click's usage block.
        sys.exit(report(exc))
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
