"""``tether consumer dead``: a consumer's dead letters (messages it gave up on after
``max_deliver`` deliveries, or that a client terminated): list, requeue, remove.

Tether keeps them per consumer and serves them on ``$TETHER.API.CONSUMER.DEAD.*`` (see
docs/compatibility.md); nats-server keeps none, and these commands say so.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tether.cli._typer import group
from tether.cli.output import emit_json, table
from tether.cli.remote import (
    Failure,
    JsonOpt,
    Target,
    remote,
    run,
)
from tether.client import ApiError, Connection, NoResponders

dead_app = group("dead", "Dead letters (Tether): ls, requeue, rm.")

PREFIX = "$TETHER.API.CONSUMER.DEAD"
StreamArg = Annotated[str, typer.Argument(help="Stream name.")]
NameArg = Annotated[str, typer.Argument(help="Consumer name.")]
SeqArg = Annotated[int | None, typer.Argument(help="Stream sequence (else all).")]


async def dead_api(conn: Connection, operation: str, stream: str, name: str, body: Any) -> Any:
    js = conn.jetstream()
    try:
        msg = await conn.request(
            f"{PREFIX}.{operation}.{stream}.{name}",
            js_encode(body),
            timeout=js.timeout,
        )
    except NoResponders:
        raise Failure(
            "this server keeps no dead letters (no responders: nats-server drops "
            "messages past max_deliver; Tether keeps them)"
        ) from None
    resp = json.loads(msg.data) if msg.data else {}
    if isinstance(resp, dict) and isinstance(resp.get("error"), dict):
        raise Failure(str(ApiError.from_response(resp["error"])))
    return resp


def js_encode(body: Any) -> bytes:
    return json.dumps(body).encode() if body else b""


@remote(dead_app, "ls")
def ls(
    target: Target,
    stream: StreamArg,
    name: NameArg,
    as_json: JsonOpt = False,
) -> None:
    """List a consumer's dead letters, oldest first."""

    async def work(conn: Connection) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = await dead_api(conn, "LIST", stream, name, {"offset": len(out)})
            out.extend(page.get("dead") or [])
            if not page.get("dead") or len(out) >= int(page.get("total", 0)):
                return out

    letters = run(target, work)
    if as_json:
        emit_json(letters)
        return
    table(
        f"Dead letters of {stream} > {name} ({len(letters)})",
        ["Sequence", "Subject", "Deliveries", "Reason", "Detail", "Died"],
        [
            (
                d["seq"],
                d.get("subject") or "",
                d["deliveries"],
                d["reason"],
                d.get("detail") or "",
                str(d["time"])[:19].replace("T", " "),
            )
            for d in letters
        ],
    )


def _change(operation: str, key: str, verb: str) -> Any:
    def command(
        target: Target,
        stream: StreamArg,
        name: NameArg,
        seq: SeqArg = None,
        as_json: JsonOpt = False,
    ) -> None:
        async def work(conn: Connection) -> Any:
            return await dead_api(conn, operation, stream, name, {"seq": seq} if seq else None)

        result = run(target, work)
        if as_json:
            emit_json(result)
        else:
            n = int(result.get(key, 0))
            typer.echo(f"{verb} {n} dead letter{'s' if n != 1 else ''} of {stream} > {name}")

    return command


requeue = _change("REQUEUE", "requeued", "Requeued")
requeue.__doc__ = "Deliver dead letters again (one, or all), their delivery count restarted."
rm = _change("DELETE", "deleted", "Removed")
rm.__doc__ = "Forget dead letters (one, or all); the messages stay in the stream."
remote(dead_app, "requeue")(requeue)
remote(dead_app, "rm")(rm)
