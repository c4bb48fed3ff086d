"""``tether stream``: list, create, inspect, change, purge and read streams.

Built on :mod:`tether.client`, so every command works against nats-server too.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tether.cli._typer import group
from tether.cli.output import count, emit_json, show, size, table
from tether.cli.prompts import DefaultsOpt, Question, ask, interactive, named, seconds, words, yes
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    fail,
    remote,
    run,
)
from tether.client import Connection, NotFound

stream_app = group(
    "stream", "Streams: list, add, info, edit, rm, purge, view, get, subjects, backup, restore."
)

NameArg = Annotated[str, typer.Argument(help="Stream name.")]


async def api(conn: Connection, operation: str, body: Any = None) -> Any:
    js = conn.jetstream()
    try:
        return await js.api(operation, body)
    except NotFound as exc:
        raise Failure(str(exc)) from None


def load_json_file(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"{path}: not valid JSON: {exc}")
    if not isinstance(doc, dict):
        fail(f"{path}: {what} must be a JSON object")
    return doc


def _state_rows(info: dict[str, Any]) -> list[tuple[str, Any]]:
    cfg, state = info.get("config", {}), info.get("state", {})
    return [
        ("Subjects", cfg.get("subjects") or []),
        ("Retention", cfg.get("retention", "limits")),
        ("Storage", cfg.get("storage", "file")),
        ("Max messages", cfg.get("max_msgs", -1)),
        ("Max bytes", cfg.get("max_bytes", -1)),
        ("Max age", _duration(cfg.get("max_age", 0))),
        ("Duplicate window", _duration(cfg.get("duplicate_window", 0))),
        ("Allow direct", cfg.get("allow_direct", False)),
        ("Created", info.get("created", "")),
        ("Messages", count(state.get("messages", 0))),
        ("Bytes", size(state.get("bytes", 0))),
        ("First sequence", f"{state.get('first_seq', 0)} @ {state.get('first_ts', '')}"),
        ("Last sequence", f"{state.get('last_seq', 0)} @ {state.get('last_ts', '')}"),
        ("Subjects in use", state.get("num_subjects", 0)),
        ("Consumers", state.get("consumer_count", 0)),
    ]


def _duration(ns: int) -> str:
    if not ns:
        return "unlimited"
    seconds = ns / 1e9
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * length:
            return f"{seconds / length:g}{unit}"
    return f"{seconds:g}s"


@remote(stream_app, "ls")
def ls(
    target: Target,
    as_json: JsonOpt = False,
) -> None:
    """List streams with their message counts and sizes."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        infos: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await api(conn, "STREAM.LIST", {"offset": offset})
            items = page.get("streams") or []
            infos.extend(items)
            offset += len(items)
            if not items or offset >= int(page.get("total", 0)):
                return infos

    infos = run(target, work)
    if as_json:
        emit_json(infos)
        return
    table(
        f"Streams ({len(infos)})",
        ["Name", "Subjects", "Messages", "Size", "Consumers", "Last message"],
        [
            (
                i["config"]["name"],
                i["config"].get("subjects") or [],
                count(i["state"].get("messages", 0)),
                size(i["state"].get("bytes", 0)),
                i["state"].get("consumer_count", 0),
                i["state"].get("last_ts", ""),
            )
            for i in sorted(infos, key=lambda i: i["config"]["name"])
        ],
    )


@remote(stream_app, "info")
def info(
    target: Target,
    name: NameArg,
    as_json: JsonOpt = False,
) -> None:
    """A stream's configuration and state."""

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.INFO.{name}")

    found = run(target, work)
    show(found, as_json, f"Stream {name}", _state_rows)


def _config_from_flags(
    name: str,
    config: Path | None,
    subjects: list[str] | None,
    fields: dict[str, Any],
) -> dict[str, Any]:
    body: dict[str, Any] = load_json_file(config, "a stream configuration") if config else {}
    body["name"] = name
    if subjects:
        body["subjects"] = subjects
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


SubjectsOpt = Annotated[
    list[str] | None, typer.Option("--subjects", help="A subject to capture (repeat for more).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A JSON stream configuration (as nats-server's).")
]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="file or memory.")]
RetentionOpt = Annotated[str | None, typer.Option("--retention", help="limits, interest, workq.")]
MaxMsgsOpt = Annotated[int | None, typer.Option("--max-msgs", help="Most messages kept.")]
MaxBytesOpt = Annotated[int | None, typer.Option("--max-bytes", help="Most bytes kept.")]
MaxAgeOpt = Annotated[float | None, typer.Option("--max-age", help="Seconds a message is kept.")]
DupeOpt = Annotated[
    float | None, typer.Option("--dupe-window", help="Seconds Nats-Msg-Id is remembered.")
]
DirectOpt = Annotated[
    bool | None, typer.Option("--allow-direct/--no-allow-direct", help="Direct gets.")
]


def _fields(
    storage: str | None,
    retention: str | None,
    max_msgs: int | None,
    max_bytes: int | None,
    max_age: float | None,
    dupe_window: float | None,
    allow_direct: bool | None,
) -> dict[str, Any]:
    if retention == "workq":
        retention = "workqueue"
    return {
        "storage": storage,
        "retention": retention,
        "max_msgs": max_msgs,
        "max_bytes": max_bytes,
        "max_age": None if max_age is None else int(max_age * 1e9),
        "duplicate_window": None if dupe_window is None else int(dupe_window * 1e9),
        "allow_direct": allow_direct,
    }


def _stream_questions(name: str) -> list[Question]:
    return [
        Question("subjects", "Subjects", name, convert=words),
        Question("storage", "Storage", "file", ("file", "memory")),
        Question("retention", "Retention", "limits", ("limits", "interest", "workq")),
        Question("max_msgs", "Message count limit", -1, convert=int),
        Question("max_bytes", "Total stream size (bytes)", -1, convert=int),
        Question("max_age", "Message age limit", "unlimited", convert=seconds),
        Question("dupe_window", "Duplicate tracking window", "2m", convert=seconds),
        Question("allow_direct", "Allow direct gets (y/n)", "n", convert=yes),
    ]


@remote(stream_app, "add")
def add(
    target: Target,
    name: Annotated[str | None, typer.Argument(help="Stream name (asked on a terminal).")] = None,
    subjects: SubjectsOpt = None,
    config: ConfigOpt = None,
    storage: StorageOpt = None,
    retention: RetentionOpt = None,
    max_msgs: MaxMsgsOpt = None,
    max_bytes: MaxBytesOpt = None,
    max_age: MaxAgeOpt = None,
    dupe_window: DupeOpt = None,
    allow_direct: DirectOpt = None,
    defaults: DefaultsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a stream: flags, --config FILE.json (nats-server's JSON), or answers to
    questions on a terminal for what the flags leave out (--defaults: no questions)."""
    asking = interactive(defaults=defaults, config=config)
    name = named(name, "stream", asking)
    given: dict[str, Any] = {
        "subjects": subjects,
        "storage": storage,
        "retention": retention,
        "max_msgs": max_msgs,
        "max_bytes": max_bytes,
        "max_age": max_age,
        "dupe_window": dupe_window,
        "allow_direct": allow_direct,
    }
    if asking:
        given = ask(_stream_questions(name), given)
    subjects = given.pop("subjects")
    body = _config_from_flags(name, config, subjects, _fields(**given))
    stream = name

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.CREATE.{stream}", body)

    created = run(target, work)
    show(created, as_json, f"Stream {name} created", _state_rows)


@remote(stream_app, "edit")
def edit(
    target: Target,
    name: NameArg,
    subjects: SubjectsOpt = None,
    config: ConfigOpt = None,
    max_msgs: MaxMsgsOpt = None,
    max_bytes: MaxBytesOpt = None,
    max_age: MaxAgeOpt = None,
    dupe_window: DupeOpt = None,
    allow_direct: DirectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a stream: the given fields over its current configuration."""

    async def work(conn: Connection) -> Any:
        current = (await api(conn, f"STREAM.INFO.{name}"))["config"]
        changes = _config_from_flags(
            name,
            config,
            subjects,
            _fields(None, None, max_msgs, max_bytes, max_age, dupe_window, allow_direct),
        )
        return await api(conn, f"STREAM.UPDATE.{name}", {**current, **changes})

    updated = run(target, work)
    show(updated, as_json, f"Stream {name} updated", _state_rows)


@remote(stream_app, "rm")
def rm(
    target: Target,
    name: NameArg,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask.")] = False,
) -> None:
    """Delete a stream with its messages and consumers."""
    if not force and not typer.confirm(f"Delete stream {name} and all its messages?"):
        raise typer.Exit(1)

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.DELETE.{name}")

    run(target, work)
    typer.echo(f"Stream {name} deleted")


@remote(stream_app, "purge")
def purge(
    target: Target,
    name: NameArg,
    subject: Annotated[str | None, typer.Option("--subject", help="Only this subject.")] = None,
    keep: Annotated[int | None, typer.Option("--keep", help="Keep the newest N.")] = None,
    seq: Annotated[int | None, typer.Option("--seq", help="Remove below this sequence.")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove messages: all, one subject's, all but the newest N, or below a sequence."""
    if keep is not None and seq is not None:
        raise typer.BadParameter("--keep and --seq exclude each other")
    if not force and not typer.confirm(f"Purge messages of stream {name}?"):
        raise typer.Exit(1)
    body = {k: v for k, v in (("filter", subject), ("keep", keep), ("seq", seq)) if v is not None}

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.PURGE.{name}", body or None)

    result = run(target, work)
    if as_json:
        emit_json(result)
        return
    typer.echo(f"Purged {count(int(result.get('purged', 0)))} messages from {name}")


def _message_view(msg: dict[str, Any]) -> dict[str, Any]:
    """A stored message as STREAM.MSG.GET returns it, with its parts decoded."""
    headers: dict[str, str] = {}
    raw_headers = base64.b64decode(msg.get("hdrs") or b"")
    for line in raw_headers.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip()] = value.strip()
    data = base64.b64decode(msg.get("data") or b"")
    return {
        "seq": msg.get("seq"),
        "subject": msg.get("subject"),
        "time": msg.get("time"),
        "headers": headers,
        "data": data.decode("utf-8", "replace"),
        "size": len(data),
    }


def _show_message(view: dict[str, Any]) -> None:
    typer.echo(f"[{view['seq']}] {view['time']} {view['subject']} ({view['size']} bytes)")
    for key, value in view["headers"].items():
        typer.echo(f"  {key}: {value}")
    typer.echo(view["data"])
    typer.echo("")


@remote(stream_app, "get")
def get(
    target: Target,
    name: NameArg,
    seq: Annotated[int | None, typer.Argument(help="Sequence (or --last-for).")] = None,
    last_for: Annotated[
        str | None, typer.Option("--last-for", help="The newest message of this subject.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """One message, by sequence or as the newest of a subject."""
    if (seq is None) == (last_for is None):
        raise typer.BadParameter("give a sequence or --last-for SUBJECT")
    body = {"seq": seq} if seq is not None else {"last_by_subj": last_for}

    async def work(conn: Connection) -> Any:
        return (await api(conn, f"STREAM.MSG.GET.{name}", body))["message"]

    view = _message_view(run(target, work))
    if as_json:
        emit_json(view)
    else:
        _show_message(view)


@remote(stream_app, "view")
def view(
    target: Target,
    name: NameArg,
    start: Annotated[int, typer.Option("--start", help="First sequence.")] = 1,
    limit: Annotated[int, typer.Option("--count", "-n", help="Most messages shown.")] = 10,
    subject: Annotated[str | None, typer.Option("--subject", help="Only this subject.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Page through messages with their headers, oldest first."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seq = max(start, 1)
        while len(out) < limit:
            body: dict[str, Any] = {"seq": seq}
            if subject:
                body["next_by_subj"] = subject
            try:
                msg = (await conn.jetstream().api(f"STREAM.MSG.GET.{name}", body))["message"]
            except NotFound as exc:
                if "stream not found" in str(exc).lower():
                    raise Failure(str(exc)) from None
                return out  # no message at or after seq
            found = _message_view(msg)
            out.append(found)
            seq = int(found["seq"]) + 1
        return out

    views = run(target, work)
    if as_json:
        emit_json(views)
        return
    if not views:
        typer.echo("No messages")
    for one in views:
        _show_message(one)


@remote(stream_app, "subjects")
def subjects(
    target: Target,
    name: NameArg,
    filter_: Annotated[str, typer.Argument(metavar="[FILTER]", help="Subject filter.")] = ">",
    as_json: JsonOpt = False,
) -> None:
    """Subjects in use and how many messages each holds."""

    async def work(conn: Connection) -> dict[str, int]:
        counts: dict[str, int] = {}
        offset = 0
        while True:
            resp = await api(
                conn, f"STREAM.INFO.{name}", {"subjects_filter": filter_, "offset": offset}
            )
            page = resp.get("state", {}).get("subjects") or {}
            counts.update(page)
            offset += len(page)
            if not page or offset >= int(resp.get("total", 0)):
                return counts

    counts = run(target, work)
    if as_json:
        emit_json(counts)
        return
    table(
        f"Subjects of {name} ({len(counts)})",
        ["Subject", "Messages"],
        [(s, count(n)) for s, n in sorted(counts.items())],
    )
