"""``tether jobs``: the webhook-broker HTTP API's channels, consumers and jobs.

The API's address comes from ``--http``, else ``$TETHER_HTTP``, else the context's
``http`` field, else ``http://127.0.0.1:8222``. The channel's and the consumer's tokens
go in the ``X-Broker-Channel-Token`` and ``X-Broker-Consumer-Token`` headers, as the
API asks (see docs/http-api.md).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urljoin

import httpx
import typer

from tether.cli._typer import group
from tether.cli.messages import read_body
from tether.cli.output import emit_json, pairs, table
from tether.cli.remote import F, Failure, Flags, JsonOpt, Target, fail, flagged, tls_context

DEFAULT_HTTP = "http://127.0.0.1:8222"

jobs_app = group(
    "jobs",
    "Webhook-broker jobs over HTTP: producer, channel, broadcast, consumer, ls, claim, done, dead.",
)
producer_app = group("producer", "Producers: ls, add.")
channel_app = group("channel", "Channels: ls, add.")
consumer_app = group("consumer", "A channel's consumers: ls, add.")
dead_app = group("dead", "Dead jobs: ls, requeue.")
jobs_app.add_typer(producer_app, name="producer")
jobs_app.add_typer(channel_app, name="channel")
jobs_app.add_typer(consumer_app, name="consumer")
jobs_app.add_typer(dead_app, name="dead")

_PANEL = "HTTP API"
# The flags of every jobs command: where the API is, how its TLS is checked, the tokens.
_HTTP: Flags = {
    "http": (
        str | None,
        typer.Option(
            "--http",
            help="HTTP API URL (default: $TETHER_HTTP, the context, :8222).",
            rich_help_panel=_PANEL,
        ),
    ),
    "tlsca": (
        str | None,
        typer.Option(
            "--tlsca",
            help="CA file to verify an https:// API (else the context's).",
            rich_help_panel=_PANEL,
        ),
    ),
    "context": (
        str | None,
        typer.Option("--context", help="Use this saved context.", rich_help_panel=_PANEL),
    ),
}
_TOKENS: Flags = {
    "channel_token": (
        str | None,
        typer.Option("--channel-token", help="The channel's token.", rich_help_panel=_PANEL),
    ),
    "consumer_token": (
        str | None,
        typer.Option("--consumer-token", help="The consumer's token.", rich_help_panel=_PANEL),
    ),
}


def http_command(
    app: typer.Typer, name: str, *, tokens: tuple[str, ...], **settings: Any
) -> Callable[[F], F]:
    """Register ``func(api: Api, ...)`` as the command ``name`` of ``app``, with the HTTP
    API flags and the tokens it needs (``"channel"``, ``"consumer"``)."""
    flags = {**{f"{t}_token": _TOKENS[f"{t}_token"] for t in tokens}, **_HTTP}
    return flagged(app, name, flags, Api, **settings)


ChannelArg = Annotated[str, typer.Argument(help="Channel id.")]
ConsumerArg = Annotated[str, typer.Argument(help="Consumer id.")]


class Api:
    """One command's HTTP client: base URL, tokens, and failures as one line."""

    def __init__(
        self,
        http: str | None = None,
        context: str | None = None,
        channel_token: str | None = None,
        consumer_token: str | None = None,
        tlsca: str | None = None,
    ) -> None:
        try:
            saved = Target(context=context, tlsca=tlsca).resolve()
            # https:// with the context's (or --tlsca's) CA and client certificate, if any.
            self.verify: ssl.SSLContext | bool = tls_context(saved) or True
        except Failure as exc:
            fail(str(exc))
        base = http or os.environ.get("TETHER_HTTP") or saved.http
        self.base = (base or DEFAULT_HTTP).rstrip("/")
        self.consumer_token = consumer_token
        self.headers: dict[str, str] = {}
        if channel_token:
            self.headers["X-Broker-Channel-Token"] = channel_token
        if consumer_token:
            self.headers["X-Broker-Consumer-Token"] = consumer_token

    def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        resp = self.send(method, path, json_body=json_body, form=form, params=params)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            fail(f"{method} {path}: the answer is not JSON")

    def send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request; a refusal (4xx/5xx) or no answer is one line and exit 1."""
        url = path if path.startswith("http") else self.base + path
        if form is not None and not form:
            # An empty form is still a form (the API answers 415 to a PUT without one).
            headers = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
            form, content = None, b""
        try:
            resp = httpx.request(
                method,
                url,
                headers={**self.headers, **(headers or {})},
                json=json_body,
                data=form,
                params=params,
                content=content,
                timeout=30,
                verify=self.verify,
            )
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.base}: {str(exc) or type(exc).__name__}")
        if resp.status_code >= 400:
            text = " ".join(resp.text.split())[:200]
            fail(f"{method} {path}: HTTP {resp.status_code}{': ' + text if text else ''}")
        return resp

    def pages(self, path: str) -> list[str]:
        """Every ``Result`` of a paged listing, following ``Pages.next``."""
        out: list[str] = []
        url: str | None = path
        seen: set[str] = set()
        while url and url not in seen:
            seen.add(url)
            page = self.call("GET", url) or {}
            out.extend(page.get("Result") or [])
            nxt = (page.get("Pages") or {}).get("next")
            url = urljoin(self.base + "/", nxt) if nxt else None
        return out


def _listing(api: Api, path: str, title: str, column: str, as_json: bool) -> None:
    names = [u.rsplit("/", 1)[-1] for u in api.pages(path)]
    if as_json:
        emit_json(names)
        return
    table(f"{title} ({len(names)})", [column], [(n,) for n in sorted(names)])


def _made(kind: str, ident: str, made: dict[str, Any], as_json: bool) -> None:
    """A PUT's answer: the resource with its token (shown only this once)."""
    if as_json:
        emit_json(made)
        return
    pairs(f"{kind} {ident}", [("Name", made.get("Name")), ("Token", made.get("Token"))])


def _form(token: str | None, name: str | None) -> dict[str, str]:
    return {k: v for k, v in (("token", token), ("name", name)) if v}


TokenOpt = Annotated[str | None, typer.Option("--token", help="Its token (else random).")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Display name.")]


def _resource_commands(app: typer.Typer, kind: str, collection: str) -> None:
    """``ls`` and ``add`` of producers or channels: the same routes, the same forms."""
    lower = kind.lower()

    def ls(api: Api, as_json: JsonOpt = False) -> None:
        _listing(api, f"/{collection}", f"{kind}s", kind, as_json)

    def add(
        api: Api,
        ident: str,
        token: TokenOpt = None,
        name: NameOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        made = api.call("PUT", f"/{lower}/{ident}", form=_form(token, name))
        _made(kind, ident, made, as_json)

    # The argument's help names the kind: set here, as annotations are read as text.
    add.__annotations__["ident"] = Annotated[str, typer.Argument(help=f"{kind} id.", metavar=lower)]
    http_command(app, "ls", tokens=(), help=f"List {lower}s.")(ls)
    http_command(app, "add", tokens=(), help=f"Create a {lower} (its token is shown once).")(add)


_resource_commands(producer_app, "Producer", "producers")
_resource_commands(channel_app, "Channel", "channels")


def _metadata_headers(pairs_: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in pairs_:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} is not KEY:VALUE", param_hint="--header")
        headers[key.strip()] = value.strip()
    if headers:
        headers["X-Broker-Metadata-Headers"] = ",".join(headers)
    return headers


@http_command(jobs_app, "broadcast", tokens=("channel",))
def broadcast(
    api: Api,
    channel: ChannelArg,
    body: Annotated[
        str | None, typer.Argument(help="The message (default: standard input, or '-').")
    ] = None,
    producer: Annotated[
        str, typer.Option("--producer", help="Producer id (X-Broker-Producer-ID).")
    ] = "",
    producer_token: Annotated[
        str | None, typer.Option("--producer-token", help="The producer's token.")
    ] = None,
    message_id: Annotated[
        str | None, typer.Option("--id", help="Message id (deduplicated; else generated).")
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", help="Higher is handed out first.")
    ] = None,
    content_type: Annotated[
        str | None, typer.Option("--content-type", help="Default application/octet-stream.")
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", "-H", help="Metadata header KEY:VALUE kept with the message."),
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", help="Deliver at this RFC 3339 time (scheduled).")
    ] = None,
    count_: Annotated[int, typer.Option("--count", help="Send it this many times.")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Broadcast a message to a channel: a job for every consumer of the channel."""
    if count_ < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--count")
    if message_id and count_ > 1:
        raise typer.BadParameter("one --id names one message", param_hint="--count")
    payload = read_body(body).encode()
    headers = {"X-Broker-Producer-ID": producer, **_metadata_headers(header or [])}
    optional = {
        "X-Broker-Producer-Token": producer_token,
        "X-Broker-Message-ID": message_id,
        "X-Broker-Message-Priority": None if priority is None else str(priority),
        "Content-Type": content_type,
        "X-Broker-Scheduled-For": at,
    }
    headers.update({k: v for k, v in optional.items() if v is not None})
    locations = [
        api.send(
            "POST", f"/channel/{channel}/broadcast", content=payload, headers=headers
        ).headers.get("location", "")
        for _ in range(count_)
    ]
    if as_json:
        emit_json({"channel": channel, "messages": locations})
        return
    for location in locations:
        kind = "Scheduled" if "/scheduled-message/" in location else "Broadcast"
        typer.echo(f"{kind} {location.rsplit('/', 1)[-1]} to {channel} ({len(payload)} bytes)")


@http_command(consumer_app, "ls", tokens=())
def consumer_ls(
    api: Api,
    channel: ChannelArg,
    as_json: JsonOpt = False,
) -> None:
    """List a channel's consumers with their type."""
    infos = [api.call("GET", url) for url in api.pages(f"/channel/{channel}/consumers")]
    if as_json:
        emit_json(infos)
        return
    table(
        f"Consumers of {channel} ({len(infos)})",
        ["Consumer", "Type", "Callback"],
        [(i["ID"], i.get("Type") or "push", i.get("CallbackURL", "")) for i in infos],
    )


@http_command(consumer_app, "add", tokens=())
def consumer_add(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    token: Annotated[str | None, typer.Option("--token", help="Its token (else random).")] = None,
    kind: Annotated[str, typer.Option("--type", help="pull or push.")] = "pull",
    callback: Annotated[str | None, typer.Option("--callback", help="Push: URL to call.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a consumer of CHANNEL (pull by default)."""
    form = {"type": kind}
    if token:
        form["token"] = token
    if callback:
        form["callbackUrl"] = callback
    made = api.call("PUT", f"/channel/{channel}/consumer/{consumer}", form=form)
    if as_json:
        emit_json(made)
        return
    pairs(
        f"Consumer {channel} > {consumer}",
        [("Type", made.get("Type")), ("Token", made.get("Token"))],
    )


def _job_rows(jobs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows = []
    for job in jobs:
        msg = job.get("Message") or {}
        payload = str(msg.get("Payload", ""))
        rows.append(
            (
                job.get("ID"),
                job.get("State", ""),
                msg.get("MessageID", ""),
                payload if len(payload) <= 40 else payload[:39] + "…",
                job.get("Deadline", ""),
            )
        )
    return rows


def _jobs_table(title: str, jobs: list[dict[str, Any]]) -> None:
    table(title, ["Job", "State", "Message", "Payload", "Deadline"], _job_rows(jobs))


@http_command(jobs_app, "ls", tokens=("channel", "consumer"))
def jobs_ls(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    state: Annotated[str, typer.Option("--state", help="queued or dead.")] = "queued",
    limit: Annotated[int, typer.Option("--limit", help="Most jobs shown (queued).")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """A pull consumer's jobs: queued (oldest first) or dead."""
    if state not in ("queued", "dead"):
        raise typer.BadParameter("--state is queued or dead")
    base = f"/channel/{channel}/consumer/{consumer}"
    if state == "queued":
        jobs = (api.call("GET", f"{base}/queued-jobs", params={"limit": limit}) or {}).get(
            "Result"
        ) or []
        for job in jobs:
            job.setdefault("State", "QUEUED")
    else:
        jobs = _dead(api, base)
    if as_json:
        emit_json(jobs)
        return
    _jobs_table(f"{state.capitalize()} jobs of {channel} > {consumer} ({len(jobs)})", jobs)


def _dead(api: Api, base: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    url: str | None = f"{base}/dlq"
    seen: set[str] = set()
    while url and url not in seen:
        seen.add(url)
        page = api.call("GET", url) or {}
        for job in page.get("DeadJobs") or []:
            # webhook-broker's dead-letter shape names the job only in its requeue URL.
            requeue = str(job.get("JobRequeueURL", ""))
            job.setdefault("ID", requeue.removesuffix("/requeue-dead-job").rsplit("/", 1)[-1])
            job.setdefault("State", job.get("Status", "DEAD"))
            message_id = str(job.get("MessageURL", "")).rsplit("/", 1)[-1]
            job.setdefault("Message", {"MessageID": message_id})
            out.append(job)
        nxt = (page.get("Pages") or {}).get("next")
        url = urljoin(api.base + "/", nxt) if nxt else None
    return out


@http_command(jobs_app, "claim", tokens=("channel", "consumer"))
def claim(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    max_jobs: Annotated[int, typer.Option("--max", help="Most jobs (1-100).")] = 1,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for jobs.")] = 0,
    timeout: Annotated[
        int, typer.Option("--timeout", help="Seconds added to each job's in-flight time.")
    ] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Claim queued jobs: they become INFLIGHT until done or their deadline."""
    body: dict[str, Any] = {"Max": max_jobs, "Wait": wait}
    if timeout:
        body["IncrementalTimeout"] = timeout
    got = api.call("POST", f"/channel/{channel}/consumer/{consumer}/claim", json_body=body)
    jobs = (got or {}).get("Result") or []
    for job in jobs:
        job.setdefault("State", "INFLIGHT")
    if as_json:
        emit_json(jobs)
        return
    _jobs_table(f"Claimed {len(jobs)}", jobs)


@http_command(jobs_app, "done", tokens=("channel", "consumer"))
def done(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    job: Annotated[str, typer.Argument(help="Job id.")],
    state: Annotated[
        str, typer.Option("--state", help="DELIVERED, DEAD or QUEUED (retry).")
    ] = "DELIVERED",
) -> None:
    """Settle an in-flight job."""
    api.call(
        "POST",
        f"/channel/{channel}/consumer/{consumer}/job/{job}",
        json_body={"NextState": state.upper()},
    )
    typer.echo(f"Job {job}: {state.upper()}")


@http_command(dead_app, "ls", tokens=("channel", "consumer"))
def dead_ls(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    as_json: JsonOpt = False,
) -> None:
    """A consumer's dead jobs."""
    jobs = _dead(api, f"/channel/{channel}/consumer/{consumer}")
    if as_json:
        emit_json(jobs)
        return
    _jobs_table(f"Dead jobs of {channel} > {consumer} ({len(jobs)})", jobs)


@http_command(dead_app, "requeue", tokens=("channel", "consumer"))
def dead_requeue(
    api: Api,
    channel: ChannelArg,
    consumer: ConsumerArg,
    job: Annotated[str | None, typer.Argument(help="Only this job (else all).")] = None,
) -> None:
    """Put dead jobs back in the queue (one, or all of them)."""
    base = f"/channel/{channel}/consumer/{consumer}"
    if job:
        api.call("POST", f"{base}/job/{job}/requeue-dead-job")
        typer.echo(f"Job {job} requeued")
        return
    if not api.consumer_token:
        raise typer.BadParameter("requeueing all dead jobs needs --consumer-token")
    api.call("POST", f"{base}/dlq", form={"requeue": api.consumer_token})
    typer.echo(f"Dead jobs of {channel} > {consumer} requeued")
