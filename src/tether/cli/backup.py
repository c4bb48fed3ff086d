"""``tether stream backup DIR`` and ``tether stream restore DIR``: streams, their messages
and their consumers' configurations as plain files, from and onto a running server.

A backup reads each stream up to the last sequence it held when the backup started, so
messages published meanwhile are left out and the copy is consistent per stream.
Against Tether it reads with the bulk read extension; against nats-server with
pipelined ``STREAM.MSG.GET`` requests. The layout is described in docs/cli.md::

    DIR/backup.json                 {"format": "tether-backup", "version": 1, "streams": [...]}
    DIR/<stream>/stream.json        STREAM.INFO at the start (config and state)
    DIR/<stream>/consumers.json     CONSUMER.INFO of every consumer (a list)
    DIR/<stream>/messages.jsonl     one {"seq", "subject", "time_ns", "hdrs", "data"} a line

``hdrs`` and ``data`` are base64; ``hdrs`` is the raw ``NATS/1.0`` block or null.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from itertools import repeat
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tether.cli.output import console, count
from tether.cli.remote import (
    Failure,
    Target,
    remote,
    run,
)
from tether.cli.stream import api
from tether.client import Connection, NoMessageFound, NotSupported, Timeout
from tether.protocol.nats import parse_headers

FORMAT = "tether-backup"
VERSION = 1
_WINDOW = 256  # STREAM.MSG.GET requests in flight when reading from nats-server


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _time_ns(text: str) -> int:
    # RFC 3339 with nanoseconds: Python's parser takes microseconds only.
    match = re.fullmatch(r"(.+?T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not match:
        return 0
    base, frac, zone = match.groups()
    seconds = datetime.fromisoformat(base + (zone if zone != "Z" else "+00:00")).timestamp()
    return int(seconds) * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9])


class Record(msgspec.Struct, gc=False):
    """One line of ``messages.jsonl`` (bytes fields are base64 in JSON, as msgspec writes
    and reads them)."""

    seq: int
    subject: str
    time_ns: int
    hdrs: bytes | None
    data: bytes


# A block's records become its lines in one call (a line per message, JSON by msgspec):
# per-message json.dumps and base64 calls cost more than reading the messages.
_LINES = msgspec.json.Encoder()
_RECORD = msgspec.json.Decoder(Record)


async def _read_tether(
    conn: Connection, stream: str, first: int, last: int
) -> AsyncIterator[list[Record]]:
    # Four blocks asked ahead: the server reads the next ones while this side writes.
    async for block in conn.jetstream().read_blocks(stream, first, last + 1, ahead=4):
        headers: Iterable[bytes | None] = (
            [h or None for h in block.header_list()] if block.header_offsets else repeat(None)
        )
        yield list(
            map(Record, block.seq_list(), block.subject_list(), block.stamp_list(), headers,
                block.data_list())
        )  # fmt: skip


async def _read_gets(
    conn: Connection, stream: str, first: int, last: int
) -> AsyncIterator[list[Record]]:
    js = conn.jetstream(timeout=30)

    async def one(seq: int) -> Record | None:
        try:
            msg = (await js.api(f"STREAM.MSG.GET.{stream}", {"seq": seq}))["message"]
        except NoMessageFound:
            return None  # deleted, or gone by the limits since the backup started
        hdrs = base64.b64decode(msg.get("hdrs") or b"")
        data = base64.b64decode(msg.get("data") or b"")
        return Record(seq, msg["subject"], _time_ns(msg.get("time", "")), hdrs or None, data)

    for lo in range(first, last + 1, _WINDOW):
        found = await asyncio.gather(*(one(s) for s in range(lo, min(lo + _WINDOW, last + 1))))
        yield [record for record in found if record is not None]


async def _consumers(conn: Connection, stream: str) -> list[dict[str, Any]]:
    infos: list[dict[str, Any]] = []
    while True:
        page = await api(conn, f"CONSUMER.LIST.{stream}", {"offset": len(infos)})
        items = page.get("consumers") or []
        infos.extend(items)
        if not items or len(infos) >= int(page.get("total", 0)):
            return sorted(infos, key=lambda i: str(i.get("name")))


async def _stream_names(conn: Connection) -> list[str]:
    names: list[str] = []
    while True:
        page = await api(conn, "STREAM.NAMES", {"offset": len(names)})
        items = page.get("streams") or []
        names.extend(items)
        if not items or len(names) >= int(page.get("total", 0)):
            return sorted(names)


def backup(
    target: Target,
    directory: Annotated[Path, typer.Argument(help="Where to write (created; must be empty).")],
    streams: Annotated[
        list[str] | None, typer.Option("--stream", help="Only this stream (repeatable).")
    ] = None,
) -> None:
    """Save streams, their messages and their consumers' configurations to DIR."""
    if directory.exists() and any(directory.iterdir()):
        raise typer.BadParameter(f"{directory} is not empty")

    async def work(conn: Connection) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        names = streams or await _stream_names(conn)
        infos = {n: await api(conn, f"STREAM.INFO.{n}") for n in names}
        total = sum(int(i["state"].get("messages", 0)) for i in infos.values())
        written: dict[str, int] = {}
        directory.mkdir(parents=True, exist_ok=True)
        with _progress() as bar:
            task = bar.add_task("backup", total=total)
            for name, info in infos.items():
                folder = directory / name
                folder.mkdir()
                (folder / "stream.json").write_text(json.dumps(info, indent=2) + "\n")
                consumers = await _consumers(conn, name)
                (folder / "consumers.json").write_text(json.dumps(consumers, indent=2) + "\n")
                state = info["state"]
                first, last = int(state.get("first_seq", 0)), int(state.get("last_seq", 0))
                n = 0
                with (folder / "messages.jsonl").open("wb") as out:
                    if state.get("messages", 0):
                        reader = _read_tether(conn, name, first, last)
                        try:
                            records = await anext(reader)
                        except NotSupported:
                            reader = _read_gets(conn, name, first, last)
                            records = await anext(reader, [])
                        except StopAsyncIteration:
                            records = []
                        # The file is written by a thread while the next blocks are read.
                        writing: asyncio.Future[int] | None = None
                        while records:
                            lines = _LINES.encode_lines(records)
                            if writing is not None:
                                await writing
                            writing = loop.run_in_executor(None, out.write, lines)
                            n += len(records)
                            bar.advance(task, len(records))
                            records = await anext(reader, [])
                        if writing is not None:
                            await writing
                written[name] = n
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "server": conn.server_info.get("server_name") or conn.server_info.get("server_id"),
            "streams": [
                {
                    "name": n,
                    "messages": written[n],
                    "consumers": len(json.loads((directory / n / "consumers.json").read_text())),
                }
                for n in names
            ],
        }
        (directory / "backup.json").write_text(json.dumps(manifest, indent=2) + "\n")
        return written

    written = run(target, work)
    for name, n in written.items():
        typer.echo(f"{name}: {count(n)} messages")
    typer.echo(f"Backed up {len(written)} streams to {directory}")


# Settings that would stop the restore from writing the backup back as it was; they are
# applied (STREAM.UPDATE) once the messages are in.
_RELAXED = {
    "max_msgs": -1,
    "max_bytes": -1,
    "max_age": 0,
    "max_msgs_per_subject": -1,
    "discard": "old",
    "deny_delete": False,
    "deny_purge": False,
    "sealed": False,
}


def _without_server_metadata(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the ``_nats.*`` metadata a server adds itself (nats-server 2.11+
    records its version and API level there)."""
    out = dict(config)
    meta = {k: v for k, v in (out.get("metadata") or {}).items() if not k.startswith("_nats.")}
    if meta:
        out["metadata"] = meta
    else:
        out.pop("metadata", None)
    return out


def _filler_subject(subjects: list[str]) -> str:
    """A concrete subject the stream captures, for the placeholders of deleted sequences."""
    tokens = (subjects or ["_restore"])[0].split(".")
    return ".".join("_restore_gap" if t in ("*", ">") else t for t in tokens)


def _load(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / "backup.json").read_text())
    except OSError as exc:
        raise Failure(f"{directory}: not a backup ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise Failure(f"{directory}/backup.json: not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Failure(f"{directory}/backup.json: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise Failure(f"{directory}: backup version {manifest.get('version')} is not supported")
    return manifest


def restore(
    target: Target,
    directory: Annotated[Path, typer.Argument(help="A directory written by stream backup.")],
) -> None:
    """Recreate the streams, messages and consumers of a backup (the streams must not exist)."""

    async def work(conn: Connection) -> dict[str, int]:
        manifest = _load(directory)
        names = [s["name"] for s in manifest["streams"]]
        existing = set(await _stream_names(conn))
        clash = [n for n in names if n in existing]
        if clash:
            raise Failure(f"stream {clash[0]} already exists: restore needs them absent")
        total = sum(int(s.get("messages", 0)) for s in manifest["streams"])
        restored: dict[str, int] = {}
        js = conn.jetstream(timeout=30, max_pending_acks=1000)
        with _progress() as bar:
            task = bar.add_task("restore", total=total)
            for name in names:
                folder = directory / name
                try:
                    info = json.loads((folder / "stream.json").read_text())
                    consumers = json.loads((folder / "consumers.json").read_text())
                except (OSError, ValueError) as exc:
                    raise Failure(f"{folder}: {exc}") from None
                config = _without_server_metadata(info["config"])
                config.pop("first_seq", None)
                state = info["state"]
                first_seq = int(state.get("first_seq", 1) or 1)
                relaxed = {**config, **_RELAXED}
                if first_seq > 1:
                    relaxed["first_seq"] = first_seq
                await api(conn, f"STREAM.CREATE.{name}", relaxed)
                filler = _filler_subject(config.get("subjects") or [])
                expected = first_seq
                gaps: list[int] = []
                n = 0
                try:
                    lines = (folder / "messages.jsonl").open("rb")
                except OSError as exc:
                    raise Failure(f"{folder}: {exc.strerror or exc}") from None
                with lines:
                    for number, line in enumerate(lines, 1):
                        try:
                            record = _RECORD.decode(line)
                        except msgspec.DecodeError as exc:
                            raise Failure(f"{folder}/messages.jsonl:{number}: {exc}") from None
                        seq = record.seq
                        while expected < seq:  # a deleted message: a placeholder, deleted below
                            await js.publish_async(filler, b"")
                            gaps.append(expected)
                            expected += 1
                        headers: dict[str, str] | None = None
                        if record.hdrs:
                            headers = {}
                            for key, value in parse_headers(record.hdrs).items:
                                headers.setdefault(key, value)
                        await js.publish_async(record.subject, record.data, headers=headers)
                        expected += 1
                        n += 1
                        if not n % 500:
                            bar.advance(task, 500)
                await js.publish_async_completed(timeout=120)
                if js.publish_async_failures:
                    raise Failure(f"{name}: {js.publish_async_failures} messages were refused")
                for seq in gaps:
                    await api(conn, f"STREAM.MSG.DELETE.{name}", {"seq": seq, "no_erase": True})
                await api(conn, f"STREAM.UPDATE.{name}", config)
                for consumer in consumers:
                    cfg = _without_server_metadata(consumer["config"])
                    cname = cfg.get("durable_name") or cfg.get("name") or consumer["name"]
                    await api(
                        conn,
                        f"CONSUMER.CREATE.{name}.{cname}",
                        {"stream_name": name, "config": cfg},
                    )
                    await _replay_position(conn, name, cname, consumer)
                restored[name] = n
        return restored

    restored = run(target, work)
    for name, n in restored.items():
        typer.echo(f"{name}: {count(n)} messages")
    typer.echo(f"Restored {len(restored)} streams from {directory}")


async def _replay_position(conn: Connection, stream: str, name: str, info: dict[str, Any]) -> None:
    """Bring a restored pull consumer to its backed-up position: fetch what it had been
    delivered and ack what it had acknowledged (the API cannot set a position)."""
    cfg = info["config"]
    if cfg.get("deliver_subject") or cfg.get("ack_policy", "explicit") == "none":
        return
    delivered = int((info.get("delivered") or {}).get("stream_seq", 0))
    floor = int((info.get("ack_floor") or {}).get("stream_seq", 0))
    js = conn.jetstream()
    start = await js.consumer_info(stream, name)
    reached = start.delivered.stream_seq if start.delivered else 0
    if delivered <= reached:
        return
    sub = await js.pull_subscribe(stream, name)
    try:
        while reached < delivered:
            try:
                msgs = await sub.fetch(min(256, max(1, delivered - reached)), timeout=1.0)
            except (Timeout, TimeoutError):
                return
            for msg in msgs:
                reached = msg.metadata.stream_seq
                if reached <= floor:
                    await msg.ack()
                elif reached > delivered:
                    await msg.nak()
        await conn.flush()
    finally:
        await sub.unsubscribe(nak_buffered=True)


def register(app: typer.Typer) -> None:
    """Add backup and restore to ``tether stream``."""
    remote(app, "backup")(backup)
    remote(app, "restore")(restore)
