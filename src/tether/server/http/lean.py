"""The hottest route served in front of Starlette: ``POST /channel/{ch}/broadcast``.

:class:`LeanRoutes` is the ASGI app given to uvicorn. A broadcast is answered straight
from the ASGI scope: the gateway checks (:meth:`GatewayMiddleware.admit`), then the same
:func:`broadcast_message` as the Starlette route, then a response built from raw header
tuples. Skipped are Starlette's error and exception middleware, the router's scan of every
route, the ``Request``/``Response`` objects and a ``send`` wrapper per layer. Every other
request (and any broadcast path the fast match is unsure of) goes to the Starlette app,
whose broadcast route stays as it was. The answers are the same bytes either way
(tests/unit/test_http_lean.py compares them).
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse, Response

from tether.server.http.auth import AsgiApp, GatewayMiddleware, Receive, Scope, Send, new_request_id
from tether.server.http.common import Api
from tether.server.http.messages import broadcast_message

_PREFIX = "/channel/"
_SUFFIX = "/broadcast"


class LeanRoutes:
    """ASGI app: broadcasts served directly, everything else passed to ``app``.

    ``gateway`` must be configured as the gateway middleware inside ``app`` is (it is
    only used for its :meth:`~GatewayMiddleware.admit`)."""

    def __init__(self, app: AsgiApp, api: Api, gateway: GatewayMiddleware) -> None:
        self.app = app
        self.api = api
        self.gateway = gateway

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
        await self.app(scope, receive, send)

    async def _broadcast(self, scope: Scope, receive: Receive, send: Send, cid: str) -> None:
        raw = scope["headers"]
        # The gateway reads the last X-Request-ID, Content-Length and X-Broker-Signature;
        # the handler (like Starlette's Headers.get) the first value of each name.
        last: dict[bytes, bytes] = dict(raw)
        rid = last.get(b"x-request-id", b"")[:128] or new_request_id()
        length = last.get(b"content-length")
        signature = last.get(b"x-broker-signature")
        started = False
        try:
            body = await self.gateway.admit(
                scope,
                receive,
                send,
                rid,
                -1 if length is None or not length.isdigit() else int(length),
                "" if signature is None else signature.decode("latin-1"),
            )
            if body is None:
                return
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
