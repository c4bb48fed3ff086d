"""``tether object``: object stores, laid out as nats-server's clients lay them out.

A store ``B`` is the stream ``OBJ_B``. An object is its chunks on ``$O.B.C.<nuid>`` and one
meta message on ``$O.B.M.<base64url(name)>`` (JSON: name, nuid, size, chunks, a SHA-256
digest), so files put here are read by nats-py, nats.go and the ``nats`` tool, and theirs
by these commands.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tether.cli._typer import group
from tether.cli.kv import all_streams, changes, message_get, run_in, subjects_of
from tether.cli.output import console, count, emit_json, pairs, size, table
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    fail,
    remote,
    run,
)
from tether.cli.stream import api
from tether.client import Connection, NoResponders
from tether.client.nuid import Nuid

object_app = group("object", "Object stores: add, ls, put, get, info, rm, watch.")

BucketArg = Annotated[str, typer.Argument(help="Object store name.")]
NameArg = Annotated[str, typer.Argument(help="Object name.")]
CHUNK = 128 * 1024


def _stream(bucket: str) -> str:
    return f"OBJ_{bucket}"


def _meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _digest(raw: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(raw).decode()


async def _meta(conn: Connection, bucket: str, name: str) -> dict[str, Any]:
    found = await message_get(conn, _stream(bucket), {"last_by_subj": _meta_subject(bucket, name)})
    if found is None:
        raise Failure(f"{bucket}: no object named {name!r}")
    meta: dict[str, Any] = json.loads(found.data)
    if meta.get("deleted"):
        raise Failure(f"{bucket}: no object named {name!r}")
    meta.setdefault("mtime", found.time)
    return meta


def _show_meta(meta: dict[str, Any]) -> None:
    pairs(
        f"Object {meta.get('bucket', '')} > {meta['name']}",
        [
            ("Size", size(int(meta.get("size", 0)))),
            ("Chunks", count(int(meta.get("chunks", 0)))),
            ("Modified", meta.get("mtime", "")),
            ("Digest", meta.get("digest", "")),
            ("Description", meta.get("description") or ""),
        ],
    )


async def _objects(conn: Connection, bucket: str) -> list[dict[str, Any]]:
    """The metadata of every object in ``bucket`` (deleted ones left out), by name."""
    found = await subjects_of(conn, _stream(bucket), f"$O.{bucket}.M.>")
    metas: list[dict[str, Any]] = []
    for subject in sorted(found):
        last = await message_get(conn, _stream(bucket), {"last_by_subj": subject})
        if last is None:
            continue
        meta = json.loads(last.data)
        if not meta.get("deleted"):
            meta.setdefault("mtime", last.time)
            metas.append(meta)
    return sorted(metas, key=lambda m: str(m.get("name")))


@remote(object_app, "add")
def add(
    target: Target,
    bucket: BucketArg,
    max_bytes: Annotated[int, typer.Option("--max-bytes", help="Store size limit.")] = -1,
    storage: Annotated[str, typer.Option("--storage", help="file or memory.")] = "file",
) -> None:
    """Create an object store."""
    config = {
        "name": _stream(bucket),
        "subjects": [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        "max_bytes": max_bytes,
        "storage": storage,
        "discard": "new",
        "num_replicas": 1,
        "allow_rollup_hdrs": True,
        "allow_direct": True,
    }

    async def work(conn: Connection) -> Any:
        return await api(conn, f"STREAM.CREATE.{_stream(bucket)}", config)

    run_in("object store", bucket, target, work)
    typer.echo(f"Object store {bucket} created")


@remote(object_app, "ls")
def ls(
    target: Target,
    bucket: Annotated[str | None, typer.Argument(help="List this store's objects.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List object stores, or the objects in BUCKET."""

    async def stores(conn: Connection) -> list[dict[str, Any]]:
        out = [
            {
                "bucket": i["config"]["name"].removeprefix("OBJ_"),
                "bytes": i["state"].get("bytes", 0),
                "storage": i["config"].get("storage", "file"),
            }
            for i in await all_streams(conn)
            if i["config"]["name"].startswith("OBJ_")
        ]
        return sorted(out, key=lambda v: v["bucket"])

    async def objects(conn: Connection) -> list[dict[str, Any]]:
        assert bucket is not None
        return await _objects(conn, bucket)

    tgt = target
    if bucket is None:
        views = run(tgt, stores)
        if as_json:
            emit_json(views)
            return
        table(
            f"Object stores ({len(views)})",
            ["Store", "Size", "Storage"],
            [(v["bucket"], size(v["bytes"]), v["storage"]) for v in views],
        )
        return
    metas = run_in("object store", bucket, tgt, objects)
    if as_json:
        emit_json(metas)
        return
    table(
        f"Objects in {bucket} ({len(metas)})",
        ["Name", "Size", "Modified"],
        [(m["name"], size(int(m.get("size", 0))), m.get("mtime", "")) for m in metas],
    )


@remote(object_app, "put")
def put(
    target: Target,
    bucket: BucketArg,
    file: Annotated[Path, typer.Argument(help="The file to store.")],
    name: Annotated[
        str | None, typer.Option("--name", help="Object name (default: file's).")
    ] = None,
    description: Annotated[str | None, typer.Option("--description", help="A note.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Store FILE (in 128 KiB chunks, with a progress bar on a terminal)."""
    try:
        total = file.stat().st_size
        handle = file.open("rb")
    except OSError as exc:
        fail(f"{file}: cannot read: {exc.strerror or exc}")
    object_name = name or file.name

    async def work(conn: Connection) -> dict[str, Any]:
        js = conn.jetstream(max_pending_acks=64)
        nuid = Nuid().next()
        chunk_subject = f"$O.{bucket}.C.{nuid}"
        try:
            await api(conn, f"STREAM.INFO.{_stream(bucket)}")
        except Failure:
            raise Failure(f"no object store named {bucket!r}") from None
        sha = hashlib.sha256()
        chunks = 0
        sent = 0
        with handle, _progress() as bar:
            task = bar.add_task(f"put {object_name}", total=total)
            while piece := handle.read(CHUNK):
                sha.update(piece)
                await js.publish_async(chunk_subject, piece)
                chunks += 1
                sent += len(piece)
                bar.update(task, completed=sent)
            await js.publish_async_completed(timeout=60)
        meta: dict[str, Any] = {
            "name": object_name,
            "description": description,
            "bucket": bucket,
            "nuid": nuid,
            "size": sent,
            "mtime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "chunks": chunks,
            "digest": _digest(sha.digest()),
            "options": {"max_chunk_size": CHUNK},
        }
        previous: dict[str, Any] | None
        try:
            previous = await _meta(conn, bucket, object_name)
        except Failure:
            previous = None
        try:
            await js.publish(
                _meta_subject(bucket, object_name),
                json.dumps({k: v for k, v in meta.items() if v is not None}).encode(),
                headers={"Nats-Rollup": "sub"},
            )
        except NoResponders:
            raise Failure(f"no object store named {bucket!r}") from None
        if previous and previous.get("nuid") and previous["nuid"] != nuid:
            await api(
                conn,
                f"STREAM.PURGE.{_stream(bucket)}",
                {"filter": f"$O.{bucket}.C.{previous['nuid']}"},
            )
        return meta

    meta = run_in("object store", bucket, target, work)
    if as_json:
        emit_json(meta)
    else:
        typer.echo(
            f"Stored {object_name} in {bucket}: {size(meta['size'])}, {meta['chunks']} chunks"
        )


@remote(object_app, "get")
def get(
    target: Target,
    bucket: BucketArg,
    name: NameArg,
    output: Annotated[
        Path | None, typer.Option("--output", "-O", help="Write here (default: stdout).")
    ] = None,
) -> None:
    """Fetch an object (to --output FILE or stdout), checking its digest."""

    async def work(conn: Connection) -> int:
        meta = await _meta(conn, bucket, name)
        subject = f"$O.{bucket}.C.{meta['nuid']}"
        sha = hashlib.sha256()
        got = 0
        sink = output.open("wb") if output else sys.stdout.buffer
        try:
            with _progress() as bar:
                task = bar.add_task(f"get {name}", total=int(meta.get("size", 0)))
                seq = 1
                for _ in range(int(meta.get("chunks", 0))):
                    found = await message_get(
                        conn, _stream(bucket), {"seq": seq, "next_by_subj": subject}
                    )
                    if found is None:
                        raise Failure(f"{bucket} > {name}: a chunk is missing")
                    sha.update(found.data)
                    sink.write(found.data)
                    got += len(found.data)
                    seq = found.seq + 1
                    bar.update(task, completed=got)
        finally:
            if output:
                sink.close()
            else:
                sink.flush()
        if meta.get("digest") and _digest(sha.digest()) != meta["digest"]:
            raise Failure(f"{bucket} > {name}: digest mismatch, the object is damaged")
        return got

    got = run_in("object store", bucket, target, work)
    if output:
        typer.echo(f"Wrote {size(got)} to {output}", err=True)


@remote(object_app, "info")
def info(
    target: Target,
    bucket: BucketArg,
    name: NameArg,
    as_json: JsonOpt = False,
) -> None:
    """An object's size, chunks, digest and time."""

    async def work(conn: Connection) -> dict[str, Any]:
        return await _meta(conn, bucket, name)

    meta = run_in("object store", bucket, target, work)
    emit_json(meta) if as_json else _show_meta(meta)


@remote(object_app, "rm")
def rm(
    target: Target,
    bucket: BucketArg,
    name: Annotated[str | None, typer.Argument(help="Only this object.")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Do not ask.")] = False,
) -> None:
    """Delete one object, or (without NAME) the whole store."""
    what = f"object {name} from {bucket}" if name else f"object store {bucket} and its objects"
    if not force and not typer.confirm(f"Delete {what}?"):
        raise typer.Exit(1)

    async def work(conn: Connection) -> None:
        if name is None:
            await api(conn, f"STREAM.DELETE.{_stream(bucket)}")
            return
        meta = await _meta(conn, bucket, name)
        tomb = {**meta, "deleted": True, "size": 0, "chunks": 0, "digest": ""}
        await conn.jetstream().publish(
            _meta_subject(bucket, name), json.dumps(tomb).encode(), headers={"Nats-Rollup": "sub"}
        )
        await api(
            conn, f"STREAM.PURGE.{_stream(bucket)}", {"filter": f"$O.{bucket}.C.{meta['nuid']}"}
        )

    run_in("object store", bucket, target, work)
    typer.echo(f"Deleted {what}")


@remote(object_app, "watch")
def watch(
    target: Target,
    bucket: BucketArg,
    updates: Annotated[int, typer.Option("--count", help="Exit after N changes (0: never).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """Print the objects in BUCKET, then every object put or deleted as it happens."""

    def show(meta: dict[str, Any]) -> None:
        operation = "DEL" if meta.get("deleted") else "PUT"
        if as_json:
            sys.stdout.write(json.dumps({"operation": operation, **meta}) + "\n")
        elif operation == "DEL":
            sys.stdout.write(f"[DEL] {bucket} > {meta.get('name')}\n")
        else:
            sys.stdout.write(
                f"[PUT] {bucket} > {meta.get('name')}: {size(int(meta.get('size', 0)))}, "
                f"{count(int(meta.get('chunks', 0)))} chunks, {meta.get('mtime', '')}\n"
            )
        sys.stdout.flush()

    async def work(conn: Connection) -> None:
        # Subscribed before reading what is there, so no change falls in between.
        sub = await conn.subscribe(f"$O.{bucket}.M.>")
        await conn.flush()
        for meta in await _objects(conn, bucket):
            show(meta)
        typer.echo(f"Watching object store {bucket}", err=True)
        async for msg in changes(sub, updates):
            try:
                meta = json.loads(msg.data)
            except ValueError:
                continue  # not object metadata: nothing a client of the store wrote
            if not isinstance(meta, dict):
                continue
            meta.setdefault("mtime", datetime.now(UTC).isoformat())
            show(meta)

    run_in("object store", bucket, target, work)
