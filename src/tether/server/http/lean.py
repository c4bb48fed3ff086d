"""The hottest routes served in front of Starlette.

:class:`LeanRoutes` is the ASGI app given to uvicorn. A broadcast (``POST
/channel/{ch}/broadcast``) is answered straight from the ASGI scope: the gateway checks
(:meth:`GatewayMiddleware.admit`), then the same :func:`broadcast_message` as the
Starlette route, then a response built from raw header tuples. The pull consumers' ``POST
…/consumer/{c}/claim`` and ``…/jobs`` call their Starlette endpoints directly (after the
same gateway checks). Skipped are Starlette's error and exception middleware, the router's
scan of every route, a ``send`` wrapper per layer and, for broadcasts, the
``Request``/``Response`` objects. Every other request (and any path the fast match is
unsure of) goes to the Starlette app, whose routes stay as they were. The answers are the
same bytes either way (tests/integration/test_http_lean.py compares them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from tether.server.http.auth import (
    AsgiApp,
    GatewayMiddleware,
    Receive,
    Scope,
    Send,
    content_length,
    new_request_id,
    replay_body,
)
from tether.server.http.common import Api
from tether.server.http.messages import broadcast_message

_PREFIX = "/channel/"
_SUFFIX = "/broadcast"

Endpoint = Callable[[Request], Awaitable[Response]]


class LeanRoutes:
    """ASGI app: broadcasts served directly, everything else passed to ``app``.

    ``gateway`` must be configured as the gateway middleware inside ``app`` is (it is
    only used for its :meth:`~GatewayMiddleware.admit`). ``consumer_posts`` maps the last
    segment of ``POST /channel/{channelId}/consumer/{consumerId}/<name>`` routes to their
    Starlette endpoints."""

    def __init__(
        self,
        app: AsgiApp,
        api: Api,
        gateway: GatewayMiddleware,
        consumer_posts: Mapping[str, Endpoint] | None = None,
    ) -> None:
        self.app = app
        self.api = api
        self.gateway = gateway
        self.consumer_posts = dict(consumer_posts or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            # Starlette's route is ^/channel/(?P<channelId>[^/]+)/broadcast$ on the path
            # below root_path; anything less plain is left to it.
            if path.startswith(_PREFIX) and path.endswith(_SUFFIX) and not scope.get("root_path"):
                cid = path[len(_PREFIX) : -len(_SUFFIX)]
                if cid and "/" not in cid:
                    await self._broadcast(scope, receive, send, cid)
                    return
            elif path.startswith(_PREFIX) and not scope.get("root_path"):
                # /channel/{channelId}/consumer/{consumerId}/{name}
                parts = path.split("/")
                if len(parts) == 6 and parts[3] == "consumer" and parts[2] and parts[4]:
                    endpoint = self.consumer_posts.get(parts[5])
                    if endpoint is not None:
                        params = {"channelId": parts[2], "consumerId": parts[4]}
                        await self._call(scope, receive, send, endpoint, params)
                        return
        await self.app(scope, receive, send)

    async def _admit(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[bytes, bytes] | None:
        """The request id and the body, or None if the gateway answered (its ``admit``)."""
        # The gateway reads the last X-Request-ID, Content-Length and X-Broker-Signature.
        last: dict[bytes, bytes] = dict(scope["headers"])
        rid = last.get(b"x-request-id", b"")[:128] or new_request_id()
        length = last.get(b"content-length")
        signature = last.get(b"x-broker-signature")
        body = await self.gateway.admit(
            scope,
            receive,
            send,
            rid,
            -1 if length is None else content_length(length),
            "" if signature is None else signature.decode("latin-1"),
        )
        return None if body is None else (rid, body)

    async def _call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        endpoint: Endpoint,
        params: dict[str, str],
    ) -> None:
        """A Starlette endpoint called as its route would, minus the layers around it."""
        started = False
        try:
            admitted = await self._admit(scope, receive, send)
            if admitted is None:
                return
            rid, body = admitted
            scope["path_params"] = params
            response = await endpoint(Request(scope, replay_body(body, receive)))
            started = True
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [*response.raw_headers, (b"x-request-id", rid)],
                }
            )
            await send({"type": "http.response.body", "body": response.body})
        except Exception:
            if not started:
                await PlainTextResponse("Internal Server Error", status_code=500)(
                    scope, receive, send
                )
            raise

    async def _broadcast(self, scope: Scope, receive: Receive, send: Send, cid: str) -> None:
        started = False
        try:
            admitted = await self._admit(scope, receive, send)
            if admitted is None:
                return
            rid, body = admitted
            # The handler (like Starlette's Headers.get) reads the first value of a name.
            raw = scope["headers"]
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(raw)}
            result = await broadcast_message(self.api, cid, headers, body)
            if isinstance(result, Response):
                start = {
                    "type": "http.response.start",
                    "status": result.status_code,
                    "headers": [*result.raw_headers, (b"x-request-id", rid)],
                }
                reply = {"type": "http.response.body", "body": result.body}
            else:
                start = {
                    "type": "http.response.start",
                    "status": 201,
                    "headers": [
                        (b"location", result.encode("latin-1")),
                        (b"content-length", b"0"),
                        (b"x-request-id", rid),
                    ],
                }
                reply = {"type": "http.response.body", "body": b""}
            started = True
            await send(start)
            await send(reply)
        except Exception:
            # As Starlette's ServerErrorMiddleware (outside the gateway): a plain 500
            # without X-Request-ID if nothing was sent yet, and the error goes on to uvicorn.
            if not started:
                await PlainTextResponse("Internal Server Error", status_code=500)(
                    scope, receive, send
                )
            raise
