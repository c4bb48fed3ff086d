"""``tether kv``: key/value buckets, laid out as nats-server's clients lay them out.

A bucket ``B`` is the stream ``KV_B`` capturing ``$KV.B.>``; a key's value is the newest
message on ``$KV.B.<key>``, its revision that message's sequence. Deleting publishes a
marker with ``KV-Operation: DEL`` (``PURGE`` with ``Nats-Rollup: sub`` drops the history
too). Buckets made here are read by nats-py, nats.go and the ``nats`` tool, and theirs by
these commands.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer

from tether.cli._typer import group
from tether.cli.output import count, emit_json, pairs, size, table
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    remote,
    run,
)
from tether.cli.stream import api
from tether.client import (
    BadSubscription,
    Connection,
    Msg,
    NoMessageFound,
    NoResponders,
    NotFound,
    Subscription,
)
from tether.protocol.nats import parse_headers

kv_app = group(
    "kv", "Key/value buckets: add, ls, put, get, del, purge, history, watch, status, rm."
)

BucketArg = Annotated[str, typer.Argument(help="Bucket name.")]
KeyArg = Annotated[str, typer.Argument(help="Key.")]
OPERATION = "KV-Operation"
T = TypeVar("T")


def run_in(kind: str, bucket: str, tgt: Target, work: Callable[[Connection], Awaitable[T]]) -> T:
    """``run``, with a missing stream told as a missing bucket (or object store)."""

    async def guarded(conn: Connection) -> T:
        try:
            return await work(conn)
        except (Failure, NotFound) as exc:
            if "stream not found" in str(exc).lower():
                raise Failure(f"no {kind} named {bucket!r}") from None
            raise

    return run(tgt, guarded)


@dataclass
class Stored:
    """One stored message as STREAM.MSG.GET returns it, decoded."""

    subject: str
    seq: int
    time: str
    headers: dict[str, str]
    data: bytes


def decode_stored(msg: dict[str, Any]) -> Stored:
    raw = base64.b64decode(msg.get("hdrs") or b"")
    headers = {k: v for k, v in parse_headers(raw).items} if raw else {}
    return Stored(
        subject=str(msg.get("subject", "")),
        seq=int(msg.get("seq", 0)),
        time=str(msg.get("time", "")),
        headers=headers,
        data=base64.b64decode(msg.get("data") or b""),
    )


async def message_get(conn: Connection, stream: str, body: dict[str, Any]) -> Stored | None:
    """A stored message (``None`` when there is none); a missing stream is a Failure."""
    try:
        resp = await conn.jetstream().api(f"STREAM.MSG.GET.{stream}", body)
    except NoMessageFound:
        return None
    except NotFound as exc:
        raise Failure(str(exc)) from None
    return decode_stored(resp["message"])


async def subjects_of(conn: Connection, stream: str, pattern: str) -> dict[str, int]:
    """Subjects in ``stream`` matching ``pattern`` with their message counts, every page."""
    found: dict[str, int] = {}
    offset = 0
    while True:
        info = await api(
            conn, f"STREAM.INFO.{stream}", {"subjects_filter": pattern, "offset": offset}
        )
        page = info.get("state", {}).get("subjects") or {}
        found.update(page)
        offset += len(page)
        total = int(info.get("total", 0) or 0)
        if not page or offset >= total:
            return found


async def all_streams(conn: Connection) -> list[dict[str, Any]]:
    """STREAM.LIST, every page."""
    infos: list[dict[str, Any]] = []
    while True:
        page = await api(conn, "STREAM.LIST", {"offset": len(infos)})
        items = page.get("streams") or []
        infos.extend(items)
        if not items or len(infos) >= int(page.get("total", 0)):
            return infos


def _stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _subject(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


def _is_deleted(entry: Stored) -> bool:
    return entry.headers.get(OPERATION) in ("DEL", "PURGE")


def _entry_view(bucket: str, entry: Stored) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bucket": bucket,
        "key": entry.subject.removeprefix(f"$KV.{bucket}."),
        "revision": entry.seq,
        "created": entry.time,
        "operation": entry.headers.get(OPERATION, "PUT"),
    }
    try:
        out["value"] = entry.data.decode()
    except UnicodeDecodeError:
        out["value_base64"] = base64.b64encode(entry.data).decode()
    return out


def _status_view(info: dict[str, Any]) -> dict[str, Any]:
    cfg, state = info["config"], info["state"]
    return {
        "bucket": cfg["name"].removeprefix("KV_"),
        "values": state.get("messages", 0),
        "history": cfg.get("max_msgs_per_subject", 1),
        "ttl_seconds": cfg.get("max_age", 0) / 1e9,
        "max_bytes": cfg.get("max_bytes", -1),
        "max_value_size": cfg.get("max_msg_size", -1),
        "storage": cfg.get("storage", "file"),
        "bytes": state.get("bytes", 0),
        "stream": cfg["name"],
    }


def _show_status(view: dict[str, Any]) -> None:
    pairs(
        f"Bucket {view['bucket']}",
        [
            ("Values", count(view["values"])),
            ("History", view["history"]),
            ("TTL", f"{view['ttl_seconds']:g}s" if view["ttl_seconds"] else "forever"),
            ("Max bytes", view["max_bytes"]),
            ("Storage", view["storage"]),
            ("Size", size(view["bytes"])),
            ("Stream", view["stream"]),
        ],
    )


@remote(kv_app, "add")
def add(
    target: Target,
    bucket: BucketArg,
    history: Annotated[int, typer.Option("--history", help="Values kept per key (1-64).")] = 1,
    ttl: Annotated[float, typer.Option("--ttl", help="Seconds a value lives (0: forever).")] = 0,
    max_bytes: Annotated[int, typer.Option("--max-bytes", help="Bucket size limit.")] = -1,
    storage: Annotated[str, typer.Option("--storage", help="file or memory.")] = "file",
    as_json: JsonOpt = False,
) -> None:
    """Create a bucket."""
    if not 1 <= history <= 64:
        raise typer.BadParameter("--history must be 1 to 64")
    ttl_ns = int(ttl * 1e9)
    window = min(ttl_ns, 120 * 10**9) if ttl_ns else 120 * 10**9
    config = {
        "name": _stream(bucket),
        "subjects": [f"$KV.{bucket}.>"],
        "max_msgs_per_subject": history,
        "max_bytes": max_bytes,
        "max_age": ttl_ns,
        "max_msg_size": -1,
        "storage": storage,
        "discard": "new",
        "num_replicas": 1,
        "duplicate_window": window,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "allow_direct": True,
    }

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.CREATE.{_stream(bucket)}", config)

    view = _status_view(run_in("bucket", bucket, target, work))
    emit_json(view) if as_json else _show_status(view)


@remote(kv_app, "ls")
def ls(
    target: Target,
    bucket: Annotated[str | None, typer.Argument(help="List this bucket's keys.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List buckets, or the keys of BUCKET."""

    async def buckets(conn: Connection) -> list[dict[str, Any]]:
        out = [i for i in await all_streams(conn) if i["config"]["name"].startswith("KV_")]
        return sorted((_status_view(i) for i in out), key=lambda v: v["bucket"])

    async def keys(conn: Connection) -> list[str]:
        assert bucket is not None
        found = await subjects_of(conn, _stream(bucket), f"$KV.{bucket}.>")
        live: list[str] = []
        for subject in sorted(found):
            last = await message_get(conn, _stream(bucket), {"last_by_subj": subject})
            if last is not None and not _is_deleted(last):
                live.append(subject.removeprefix(f"$KV.{bucket}."))
        return live

    tgt = target
    if bucket is None:
        views = run(tgt, buckets)
        if as_json:
            emit_json(views)
            return
        table(
            f"Buckets ({len(views)})",
            ["Bucket", "Values", "History", "TTL", "Size"],
            [
                (
                    v["bucket"],
                    count(v["values"]),
                    v["history"],
                    f"{v['ttl_seconds']:g}s" if v["ttl_seconds"] else "",
                    size(v["bytes"]),
                )
                for v in views
            ],
        )
        return
    names = run_in("bucket", bucket, tgt, keys)
    if as_json:
        emit_json(names)
        return
    for name in names:
        typer.echo(name)


async def _put(conn: Connection, bucket: str, key: str, value: bytes, hdrs: dict[str, str]) -> int:
    try:
        ack = await conn.jetstream().publish(_subject(bucket, key), value, headers=hdrs or None)
    except NoResponders:
        raise Failure(f"no bucket named {bucket!r}") from None
    return ack.seq


@remote(kv_app, "put")
def put(
    target: Target,
    bucket: BucketArg,
    key: KeyArg,
    value: Annotated[str | None, typer.Argument(help="Value ('-' or absent: stdin).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Store a value under KEY."""
    data = (
        sys.stdin.buffer.read()
        if value == "-" or (value is None and not sys.stdin.isatty())
        else (value or "").encode()
    )

    async def work(conn: Connection) -> int:
        return await _put(conn, bucket, key, data, {})

    revision = run_in("bucket", bucket, target, work)
    if as_json:
        emit_json({"bucket": bucket, "key": key, "revision": revision})
    else:
        typer.echo(f"{key} = revision {revision}")


@remote(kv_app, "get")
def get(
    target: Target,
    bucket: BucketArg,
    key: KeyArg,
    revision: Annotated[int | None, typer.Option("--revision", help="An older revision.")] = None,
    raw: Annotated[bool, typer.Option("--raw", "-r", help="Only the value.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """A key's value (its newest, or --revision N)."""

    async def work(conn: Connection) -> Stored:
        body: dict[str, Any] = (
            {"seq": revision} if revision is not None else {"last_by_subj": _subject(bucket, key)}
        )
        found = await message_get(conn, _stream(bucket), body)
        if found is None or found.subject != _subject(bucket, key) or _is_deleted(found):
            raise Failure(f"{bucket}: no key {key!r}")
        return found

    entry = run_in("bucket", bucket, target, work)
    if as_json:
        emit_json(_entry_view(bucket, entry))
    elif raw:
        sys.stdout.buffer.write(entry.data + b"\n")
    else:
        typer.echo(f"{bucket} > {key} revision {entry.seq} created @ {entry.time}")
        typer.echo(entry.data.decode("utf-8", "replace"))


def _marker(operation: str) -> Callable[..., None]:
    purge = operation == "PURGE"

    def command(
        target: Target,
        bucket: BucketArg,
        key: KeyArg,
    ) -> None:
        hdrs = {OPERATION: operation, **({"Nats-Rollup": "sub"} if purge else {})}

        async def work(conn: Connection) -> int:
            return await _put(conn, bucket, key, b"", hdrs)

        run_in("bucket", bucket, target, work)
        typer.echo(f"{key} {'purged' if purge else 'deleted'}")

    command.__doc__ = (
        "Remove KEY and its history." if purge else "Delete KEY (its history is kept)."
    )
    return command


remote(kv_app, "del")(_marker("DEL"))
remote(kv_app, "purge")(_marker("PURGE"))


@remote(kv_app, "history")
def history(
    target: Target,
    bucket: BucketArg,
    key: KeyArg,
    as_json: JsonOpt = False,
) -> None:
    """Every kept revision of KEY, oldest first."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seq = 1
        while True:
            body = {"seq": seq, "next_by_subj": _subject(bucket, key)}
            found = await message_get(conn, _stream(bucket), body)
            if found is None:
                return out
            out.append(_entry_view(bucket, found))
            seq = found.seq + 1

    views = run_in("bucket", bucket, target, work)
    if as_json:
        emit_json(views)
        return
    table(
        f"History of {bucket} > {key}",
        ["Revision", "Operation", "Created", "Value"],
        [(v["revision"], v["operation"], v["created"], v.get("value", "<binary>")) for v in views],
    )


async def changes(sub: Subscription, limit: int) -> AsyncIterator[Msg]:
    """The messages of a watch's subscription: ``limit`` of them (0: until it ends)."""
    seen = 0
    while not limit or seen < limit:
        try:
            msg = await sub.next_msg(timeout=None)
        except BadSubscription:
            return
        seen += 1
        yield msg


@remote(kv_app, "watch")
def watch(
    target: Target,
    bucket: BucketArg,
    key: Annotated[str, typer.Argument(help="Key or wildcard.")] = ">",
    updates: Annotated[int, typer.Option("--count", help="Exit after N updates (0: never).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """Print the current values, then every change as it happens."""

    def show(view: dict[str, Any]) -> None:
        if as_json:
            sys.stdout.write(json.dumps(view) + "\n")
        else:
            value = view.get("value", "<binary>")
            sys.stdout.write(f"[{view['operation']}] {view['key']} @ {view['revision']}: {value}\n")
        sys.stdout.flush()

    async def work(conn: Connection) -> None:
        sub = await conn.subscribe(_subject(bucket, key))
        await conn.flush()
        current = await subjects_of(conn, _stream(bucket), _subject(bucket, key))
        for subject in sorted(current):
            last = await message_get(conn, _stream(bucket), {"last_by_subj": subject})
            if last is not None and not _is_deleted(last):
                show(_entry_view(bucket, last))
        typer.echo(f"Watching {bucket} > {key}", err=True)
        async for msg in changes(sub, updates):
            hdrs = msg.headers or {}
            entry = Stored(msg.subject, 0, "", hdrs, msg.data)
            # The update came as a plain message; its revision is the stored one, unless
            # a newer value was stored meanwhile (then it is left unknown).
            stored = await message_get(conn, _stream(bucket), {"last_by_subj": msg.subject})
            if stored is not None and stored.data == msg.data:
                entry = stored
            view = _entry_view(bucket, entry)
            if not entry.seq:
                view.update(revision=None, created=None)
            show(view)

    run_in("bucket", bucket, target, work)


@remote(kv_app, "status")
def status(
    target: Target,
    bucket: BucketArg,
    as_json: JsonOpt = False,
) -> None:
    """A bucket's settings and size."""

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.INFO.{_stream(bucket)}")

    view = _status_view(run_in("bucket", bucket, target, work))
    emit_json(view) if as_json else _show_status(view)


@remote(kv_app, "rm")
def rm(
    target: Target,
    bucket: BucketArg,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask.")] = False,
) -> None:
    """Delete a bucket and all its keys."""
    if not force and not typer.confirm(f"Delete bucket {bucket} and all its keys?"):
        raise typer.Exit(1)

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.DELETE.{_stream(bucket)}")

    run_in("bucket", bucket, target, work)
    typer.echo(f"Bucket {bucket} deleted")
