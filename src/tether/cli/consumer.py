"""``tether consumer``: list, create, inspect, change and drive consumers, and Tether's
dead letters.

The numbers an operator looks for first are highlighted in ``info``: how far behind
the consumer is (pending), what is out and unacknowledged, what was redelivered, and
how many pulls are waiting.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tether.cli._typer import group
from tether.cli.output import count, emit_json, show, table
from tether.cli.prompts import DefaultsOpt, Question, ask, interactive, named, seconds
from tether.cli.remote import (
    JsonOpt,
    Target,
    fail,
    remote,
    run,
)
from tether.cli.stream import api, load_json_file
from tether.client import Connection, JsMsg, Timeout

consumer_app = group("consumer", "Consumers: ls, add, info, edit, rm, next, pause, resume, dead.")

StreamArg = Annotated[str, typer.Argument(help="Stream name.")]
NameArg = Annotated[str, typer.Argument(help="Consumer name.")]


def _rows(info: dict[str, Any]) -> list[tuple[str, Any]]:
    cfg = info.get("config", {})
    delivered, floor = info.get("delivered", {}), info.get("ack_floor", {})
    pull = not cfg.get("deliver_subject")
    rows: list[tuple[str, Any]] = [
        ("Stream", info.get("stream_name", "")),
        ("Kind", "pull" if pull else f"push to {cfg.get('deliver_subject')}"),
        ("Ack policy", cfg.get("ack_policy", "")),
        ("Ack wait", f"{cfg.get('ack_wait', 0) / 1e9:g}s"),
        ("Max deliver", cfg.get("max_deliver", -1)),
        ("Max ack pending", cfg.get("max_ack_pending", -1)),
        ("Filter", cfg.get("filter_subject") or cfg.get("filter_subjects") or ">"),
        ("Created", info.get("created", "")),
        ("Last delivered", f"stream seq {delivered.get('stream_seq', 0)}"),
        ("Ack floor", f"stream seq {floor.get('stream_seq', 0)}"),
        ("[bold yellow]Pending (lag)[/]", count(info.get("num_pending", 0))),
        ("[bold yellow]Ack pending[/]", count(info.get("num_ack_pending", 0))),
        ("[bold yellow]Redelivered[/]", count(info.get("num_redelivered", 0))),
    ]
    if pull:
        rows.append(("[bold yellow]Waiting pulls[/]", info.get("num_waiting", 0)))
    if info.get("paused"):
        rows.append(("[bold red]Paused[/]", f"{info.get('pause_remaining', 0) / 1e9:.0f}s left"))
    return rows


@remote(consumer_app, "ls")
def ls(
    target: Target,
    stream: StreamArg,
    as_json: JsonOpt = False,
) -> None:
    """List a stream's consumers with their lag."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        infos: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await api(conn, f"CONSUMER.LIST.{stream}", {"offset": offset})
            items = page.get("consumers") or []
            infos.extend(items)
            offset += len(items)
            if not items or offset >= int(page.get("total", 0)):
                return infos

    infos = run(target, work)
    if as_json:
        emit_json(infos)
        return
    table(
        f"Consumers of {stream} ({len(infos)})",
        ["Name", "Kind", "Pending", "Ack pending", "Redelivered", "Waiting"],
        [
            (
                i["name"],
                "push" if i["config"].get("deliver_subject") else "pull",
                count(i.get("num_pending", 0)),
                count(i.get("num_ack_pending", 0)),
                count(i.get("num_redelivered", 0)),
                i.get("num_waiting", 0),
            )
            for i in sorted(infos, key=lambda i: i["name"])
        ],
    )


@remote(consumer_app, "info")
def info(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    as_json: JsonOpt = False,
) -> None:
    """A consumer's configuration and where it stands."""

    async def work(conn: Connection) -> Any:
        return await api(conn, f"CONSUMER.INFO.{stream}.{name}")

    found = run(target, work)
    show(found, as_json, f"Consumer {stream} > {name}", _rows)


def _config(
    name: str,
    config: Path | None,
    fields: dict[str, Any],
) -> dict[str, Any]:
    body = load_json_file(config, "a consumer configuration") if config else {}
    body.setdefault("durable_name", name)
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A JSON consumer configuration (nats-server's).")
]
FilterOpt = Annotated[str | None, typer.Option("--filter", help="Only this subject.")]
AckOpt = Annotated[str | None, typer.Option("--ack", help="explicit, all or none.")]
DeliverOpt = Annotated[
    str | None, typer.Option("--deliver", help="all, last, new, last_per_subject.")
]
TargetOpt = Annotated[
    str | None, typer.Option("--target", help="Push: the deliver subject (pull when absent).")
]
WaitOpt = Annotated[float | None, typer.Option("--wait", help="Ack wait in seconds.")]
MaxDeliverOpt = Annotated[int | None, typer.Option("--max-deliver", help="Deliveries at most.")]
MaxPendingOpt = Annotated[int | None, typer.Option("--max-pending", help="Max ack pending.")]


def _fields(
    filter_: str | None,
    ack: str | None,
    deliver: str | None,
    deliver_subject: str | None,
    wait: float | None,
    max_deliver: int | None,
    max_pending: int | None,
) -> dict[str, Any]:
    return {
        "filter_subject": filter_,
        "ack_policy": ack,
        "deliver_policy": deliver,
        "deliver_subject": deliver_subject,
        "ack_wait": None if wait is None else int(wait * 1e9),
        "max_deliver": max_deliver,
        "max_ack_pending": max_pending,
    }


def _optional(text: str) -> str | None:
    return text.strip() or None


CONSUMER_QUESTIONS = [
    Question("filter_", "Filter subject (empty for all)", "", convert=_optional),
    Question("ack", "Acknowledgement policy", "explicit", ("explicit", "all", "none")),
    Question("deliver", "Start policy", "all", ("all", "last", "new", "last_per_subject")),
    Question("deliver_subject", "Delivery target (empty for pull)", "", convert=_optional),
    Question("wait", "Ack wait", "30s", convert=seconds),
    Question("max_deliver", "Maximum deliveries (-1: unlimited)", -1, convert=int),
    Question("max_pending", "Maximum acknowledgements pending", 1000, convert=int),
]


@remote(consumer_app, "add")
def add(
    target: Target,
    stream: StreamArg,
    name: Annotated[str | None, typer.Argument(help="Consumer name (asked on a terminal).")] = None,
    config: ConfigOpt = None,
    filter_: FilterOpt = None,
    ack: AckOpt = None,
    deliver: DeliverOpt = None,
    deliver_subject: TargetOpt = None,
    wait: WaitOpt = None,
    max_deliver: MaxDeliverOpt = None,
    max_pending: MaxPendingOpt = None,
    defaults: DefaultsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a durable consumer (pull unless --target gives a deliver subject): flags,
    --config FILE.json, or answers to questions on a terminal (--defaults: none)."""
    asking = interactive(defaults=defaults, config=config)
    name = named(name, "consumer", asking)
    given: dict[str, Any] = {
        "filter_": filter_,
        "ack": ack,
        "deliver": deliver,
        "deliver_subject": deliver_subject,
        "wait": wait,
        "max_deliver": max_deliver,
        "max_pending": max_pending,
    }
    if asking:
        given = ask(CONSUMER_QUESTIONS, given)
    if given["ack"] is None and config is None:
        given["ack"] = "explicit"  # nats' default: pull consumers want acks
    body = _config(name, config, _fields(**given))
    durable = name

    async def work(conn: Connection) -> Any:
        return await api(
            conn,
            f"CONSUMER.CREATE.{stream}.{durable}",
            {"stream_name": stream, "config": body, "action": "create"},
        )

    created = run(target, work)
    show(created, as_json, f"Consumer {stream} > {name} created", _rows)


@remote(consumer_app, "edit")
def edit(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    config: ConfigOpt = None,
    wait: WaitOpt = None,
    max_deliver: MaxDeliverOpt = None,
    max_pending: MaxPendingOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a consumer: the given fields over its current configuration."""

    async def work(conn: Connection) -> Any:
        current = (await api(conn, f"CONSUMER.INFO.{stream}.{name}"))["config"]
        changes = _config(
            name, config, _fields(None, None, None, None, wait, max_deliver, max_pending)
        )
        return await api(
            conn,
            f"CONSUMER.CREATE.{stream}.{name}",
            {"stream_name": stream, "config": {**current, **changes}, "action": "update"},
        )

    updated = run(target, work)
    show(updated, as_json, f"Consumer {stream} > {name} updated", _rows)


@remote(consumer_app, "rm")
def rm(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask.")] = False,
) -> None:
    """Delete a consumer."""
    if not force and not typer.confirm(f"Delete consumer {stream} > {name}?"):
        raise typer.Exit(1)

    async def work(conn: Connection) -> Any:
        return await api(conn, f"CONSUMER.DELETE.{stream}.{name}")

    run(target, work)
    typer.echo(f"Consumer {stream} > {name} deleted")


def _delivery(msg: JsMsg, acked: bool) -> dict[str, Any]:
    meta = msg.metadata
    return {
        "subject": msg.subject,
        "stream_seq": meta.stream_seq,
        "consumer_seq": meta.consumer_seq,
        "delivered": meta.num_delivered,
        "pending": meta.num_pending,
        "headers": dict(msg.headers or {}),
        "data": msg.data.decode("utf-8", "replace"),
        "acked": acked,
    }


@remote(consumer_app, "next")
def next_(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    how_many: Annotated[int, typer.Option("--count", "-n", help="Messages to fetch.")] = 1,
    ack: Annotated[bool, typer.Option("--ack/--no-ack", help="Ack what was received.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Fetch the next messages of a pull consumer, show their delivery metadata, ack them."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        await api(conn, f"CONSUMER.INFO.{stream}.{name}")  # a clear error if it is missing
        sub = await conn.jetstream().pull_subscribe(stream, name)
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < how_many:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msgs = await sub.fetch(how_many - len(out), timeout=left)
            except (TimeoutError, Timeout):
                break
            for msg in msgs:
                if ack:
                    await msg.ack_sync()
                out.append(_delivery(msg, ack))
        await sub.unsubscribe()
        return out

    got = run(target, work)
    if as_json:
        emit_json(got)
        return
    if not got:
        typer.echo(f"No messages within {timeout:g}s")
        raise typer.Exit(1)
    for one in got:
        typer.echo(
            f"[{one['stream_seq']}] {one['subject']} (delivery {one['delivered']},"
            f" {one['pending']} pending{', acked' if one['acked'] else ''})"
        )
        for key, value in one["headers"].items():
            typer.echo(f"  {key}: {value}")
        typer.echo(one["data"])


def _pause(stream: str, name: str, until: str, target: Target) -> dict[str, Any]:
    async def work(conn: Connection) -> Any:
        return await api(conn, f"CONSUMER.PAUSE.{stream}.{name}", {"pause_until": until})

    result: dict[str, Any] = run(target, work)
    return result


@remote(consumer_app, "pause")
def pause(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    seconds: Annotated[float, typer.Argument(help="How long to pause.")],
) -> None:
    """Pause delivery for a number of seconds."""
    from datetime import UTC, datetime, timedelta

    until = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
    result = _pause(stream, name, until, target)
    if not result.get("paused"):
        fail(f"{stream} > {name} was not paused")
    typer.echo(f"Consumer {stream} > {name} paused until {result.get('pause_until', until)}")


@remote(consumer_app, "resume")
def resume(
    target: Target,
    stream: StreamArg,
    name: NameArg,
) -> None:
    """Resume a paused consumer."""
    _pause(stream, name, "0001-01-01T00:00:00Z", target)
    typer.echo(f"Consumer {stream} > {name} resumed")
