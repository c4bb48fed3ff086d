"""``tether pub|sub|req|reply``: send and receive messages, as the ``nats`` tool does.

Bodies may be templates, as in ``nats pub``: ``{{Count}}`` (1, 2, ... per message),
``{{ID}}`` (a unique id), ``{{Time}}`` / ``{{TimeStamp}}`` (RFC 3339 now), ``{{Unix}}``,
``{{UnixNano}}`` and ``{{Random 10 20}}`` (10 to 20 random letters and digits).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import string
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tether.cli._typer import CONTEXT
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    remote,
    run,
)
from tether.client import (
    AckPolicy,
    BadSubscription,
    Connection,
    ConsumerConfig,
    ConsumerNotFound,
    JsMsg,
    Msg,
    NoResponders,
    StreamNotFound,
    Timeout,
)
from tether.client.nuid import Nuid

_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z]+)((?:\s+-?\d+)*)\s*\}\}")
_ALPHABET = string.ascii_letters + string.digits


def render(body: str, count: int, nuid: Nuid | None = None) -> str:
    """``body`` with its ``{{...}}`` placeholders filled in for message number ``count``."""
    if "{{" not in body:
        return body

    def one(match: re.Match[str]) -> str:
        name, args = match.group(1).lower(), [int(a) for a in match.group(2).split()]
        now = datetime.now(UTC)
        if name == "count":
            return str(count)
        if name in ("time", "timestamp"):
            return now.isoformat(timespec="microseconds").replace("+00:00", "Z")
        if name == "unix":
            return str(int(now.timestamp()))
        if name == "unixnano":
            return str(int(now.timestamp() * 1e9))
        if name == "id":
            return (nuid or Nuid()).next()
        if name == "random":
            low = args[0] if args else 8
            high = args[1] if len(args) > 1 else low
            n = random.randint(min(low, high), max(low, high))
            return "".join(random.choices(_ALPHABET, k=max(n, 0)))
        raise typer.BadParameter(f"unknown template function {match.group(1)!r}")

    return _TEMPLATE.sub(one, body)


def parse_headers(values: list[str] | None) -> dict[str, str] | None:
    if not values:
        return None
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition(":")
        if not sep or not key.strip():
            raise typer.BadParameter(f"header {value!r} is not KEY:VALUE")
        out[key.strip()] = rest.strip()
    return out


def read_body(body: str | None) -> str:
    """The body argument, or standard input when it is ``-`` (or absent and piped)."""
    if body == "-" or (body is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    return body or ""


HeaderOpt = Annotated[
    list[str] | None, typer.Option("--header", "-H", help="A header KEY:VALUE (repeatable).")
]
SubjectArg = Annotated[str, typer.Argument(help="Subject.")]
BodyArg = Annotated[
    str | None,
    typer.Argument(help="Body, a template ({{Count}}, {{Random 5 10}} ...); '-' reads stdin."),
]


def pub(
    target: Target,
    subject: SubjectArg,
    body: BodyArg = None,
    count: Annotated[int, typer.Option("--count", help="Messages to publish.", min=1)] = 1,
    sleep: Annotated[float, typer.Option("--sleep", help="Seconds between messages.")] = 0.0,
    header: HeaderOpt = None,
    jetstream: Annotated[
        bool, typer.Option("--jetstream", "-J", help="Wait for each PubAck and print it.")
    ] = False,
    reply_to: Annotated[str | None, typer.Option("--reply", help="A reply subject.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish a message (or --count of them) to SUBJECT."""
    text = read_body(body)
    headers = parse_headers(header)

    async def work(conn: Connection) -> list[dict[str, Any]]:
        js = conn.jetstream()
        nuid = Nuid()
        acks: list[dict[str, Any]] = []
        with _bar(count if count >= 1000 and not jetstream else 0) as advance:
            for i in range(1, count + 1):
                payload = render(text, i, nuid).encode()
                if jetstream:
                    try:
                        ack = await js.publish(subject, payload, headers=headers)
                    except NoResponders:
                        raise Failure(f"no stream captures {subject!r}") from None
                    acks.append({"stream": ack.stream, "seq": ack.seq, "duplicate": ack.duplicate})
                    if not as_json:
                        dup = " (duplicate)" if ack.duplicate else ""
                        typer.echo(f"Stored in {ack.stream} at sequence {ack.seq}{dup}")
                else:
                    await conn.publish(subject, payload, reply=reply_to or "", headers=headers)
                if not i & 255:
                    advance(i)
                if sleep and i < count:
                    await asyncio.sleep(sleep)
        await conn.flush()
        return acks

    acks = run(target, work)
    if as_json:
        sys.stdout.write(json.dumps(acks if jetstream else {"published": count}) + "\n")
    elif not jetstream:
        typer.echo(f"Published {count} message{'s' if count != 1 else ''} to {subject}", err=True)


@contextmanager
def _bar(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for a long publish (none in a pipe or for a short one)."""
    err = Console(stderr=True)
    progress = Progress(
        TextColumn("publishing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not (total and err.is_terminal),
    )
    task = progress.add_task("publishing", total=total)
    with progress:
        yield lambda done: progress.update(task, completed=done)


def _view(msg: Msg | JsMsg, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "subject": msg.subject}
    if msg.reply and not isinstance(msg, JsMsg):
        out["reply"] = msg.reply
    out["headers"] = msg.headers or {}
    try:
        out["data"] = msg.data.decode()
    except UnicodeDecodeError:
        out["data_base64"] = base64.b64encode(msg.data).decode()
    if isinstance(msg, JsMsg):
        meta = msg.metadata
        out["stream"] = meta.stream
        out["stream_seq"] = meta.stream_seq
        out["delivered"] = meta.num_delivered
    return out


def _printer(raw: bool, headers_only: bool, as_json: bool) -> Callable[[Msg | JsMsg, int], None]:
    def show(msg: Msg | JsMsg, n: int) -> None:
        out = sys.stdout
        if as_json:
            out.write(json.dumps(_view(msg, n)) + "\n")
        elif raw:
            out.buffer.write(msg.data + b"\n")
        else:
            where = ""
            if isinstance(msg, JsMsg):
                meta = msg.metadata
                where = f" (stream {meta.stream} seq {meta.stream_seq})"
            out.write(f'[#{n}] Received on "{msg.subject}"{where}\n')
            for key, value in (msg.headers or {}).items():
                out.write(f"{key}: {value}\n")
            if not headers_only:
                out.write(("\n" if msg.headers else "") + msg.data.decode("utf-8", "replace"))
                out.write("\n\n")
        out.flush()

    return show


def sub(
    target: Target,
    subject: SubjectArg,
    queue: Annotated[str, typer.Option("--queue", help="Join this queue group.")] = "",
    headers_only: Annotated[
        bool, typer.Option("--headers-only", help="Show headers, not bodies.")
    ] = False,
    raw: Annotated[bool, typer.Option("--raw", "-r", help="Only the bodies.")] = False,
    count: Annotated[int, typer.Option("--count", help="Exit after N messages (0: never).")] = 0,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Consume through this JetStream stream.")
    ] = None,
    durable: Annotated[
        str | None, typer.Option("--durable", help="The stream's consumer (created if missing).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """Print messages on SUBJECT as they arrive (Ctrl-C to stop)."""
    if (stream is None) != (durable is None):
        raise typer.BadParameter("--stream and --durable go together")
    show = _printer(raw, headers_only, as_json)

    async def core(conn: Connection) -> None:
        sub = await conn.subscribe(subject, queue, max_msgs=count)
        await conn.flush()
        typer.echo(f"Subscribed to {subject}", err=True)
        n = 0
        while not count or n < count:
            try:
                msg = await sub.next_msg(timeout=None)
            except BadSubscription:
                return
            n += 1
            show(msg, n)

    async def pulled(conn: Connection) -> None:
        assert stream is not None and durable is not None
        js = conn.jetstream()
        try:
            await js.consumer_info(stream, durable)
        except StreamNotFound as exc:
            raise Failure(str(exc)) from None
        except ConsumerNotFound:
            config = ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                filter_subject=None if subject == ">" else subject,
            )
            await js.add_consumer(stream, config)
        psub = await js.pull_subscribe(stream, durable)
        typer.echo(f"Consuming {stream} > {durable}", err=True)
        n = 0
        while not count or n < count:
            want = min(100, count - n) if count else 100
            try:
                msgs = await psub.fetch(want, timeout=5.0)
            except (Timeout, TimeoutError):
                continue
            for msg in msgs:
                n += 1
                show(msg, n)
                await msg.ack_sync()

    run(target, pulled if stream else core)


def req(
    target: Target,
    subject: SubjectArg,
    body: BodyArg = None,
    header: HeaderOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 5.0,
    raw: Annotated[bool, typer.Option("--raw", "-r", help="Only the reply's body.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Send a request and print the reply."""
    payload = render(read_body(body), 1).encode()
    headers = parse_headers(header)

    async def work(conn: Connection) -> tuple[Msg, float]:
        started = time.perf_counter()
        try:
            msg = await conn.request(subject, payload, timeout=timeout, headers=headers)
        except NoResponders:
            raise Failure(f"no responders on {subject!r}") from None
        return msg, time.perf_counter() - started

    reply, rtt = run(target, work)
    if raw or as_json:
        _printer(raw, False, as_json)(reply, 1)
        return
    typer.echo(f"Received with rtt {rtt * 1e3:.1f} ms")
    for key, value in (reply.headers or {}).items():
        typer.echo(f"{key}: {value}")
    typer.echo(("\n" if reply.headers else "") + reply.data.decode("utf-8", "replace"))


def reply(
    target: Target,
    subject: SubjectArg,
    body: BodyArg = None,
    queue: Annotated[str, typer.Option("--queue", help="Queue group.")] = "NATS-RPLY-22",
    count: Annotated[int, typer.Option("--count", help="Exit after N requests (0: never).")] = 0,
    echo: Annotated[bool, typer.Option("--echo", help="Answer with the request's body.")] = False,
    header: HeaderOpt = None,
) -> None:
    """Answer requests on SUBJECT with BODY (a template: {{Count}} is the request number)."""
    text = read_body(body) if not echo else ""
    headers = parse_headers(header)

    async def work(conn: Connection) -> None:
        sub = await conn.subscribe(subject, queue, max_msgs=count)
        await conn.flush()
        typer.echo(f"Answering requests on {subject}", err=True)
        nuid = Nuid()
        n = 0
        while not count or n < count:
            try:
                msg = await sub.next_msg(timeout=None)
            except BadSubscription:
                break
            n += 1
            if msg.reply:
                answer = msg.data if echo else render(text, n, nuid).encode()
                await conn.publish(msg.reply, answer, headers=headers)
            sys.stdout.write(f"[#{n}] {msg.subject}: {msg.data.decode('utf-8', 'replace')}\n")
            sys.stdout.flush()
        await conn.flush()

    run(target, work)


def register(app: typer.Typer) -> None:
    """Add pub, sub, req and reply to the root command."""
    for fn, name in ((pub, "pub"), (sub, "sub"), (req, "req"), (reply, "reply")):
        remote(app, name, context_settings=CONTEXT)(fn)
