"""The webhook-broker compatible HTTP API: route table, status routes, seeding, wiring.

``build(...)`` returns the routes to mount on the server's Starlette app and the
objects that run beside them (the push delivery workers). See docs/http-api.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from tether.engine.jobs import WebhookService
from tether.engine.jobs.registry import Consumer, random_token, valid_id, verify_token
from tether.engine.jobs.view import NS, JobSettings
from tether.server.config import ServerConfig, WebhookSeed
from tether.server.http import jobs_api, messages, resources
from tether.server.http.auth import AsgiApp, GatewayMiddleware
from tether.server.http.common import Api, ApiSettings, json
from tether.server.http.lean import LeanRoutes
from tether.server.http.metrics import dlq_status, job_status
from tether.server.http.openapi import openapi_document
from tether.server.webhooks.worker import PushDelivery, PushSettings

# webhook-broker's stopTimeout is the connection timeout plus 250 ms.
STOP_MARGIN = 0.25


def job_settings(cfg: ServerConfig) -> JobSettings:
    base = cfg.webhook_connection_timeout + STOP_MARGIN + cfg.webhook_rational_delay
    return JobSettings(
        max_retry=max(cfg.webhook_max_retry, 0),
        inflight_base_ns=int(base * NS),
        backoff_ns=[int(d * NS) for d in cfg.webhook_retry_backoff if d >= 0],
    )


def max_body(cfg: ServerConfig) -> int:
    return cfg.http_max_body or cfg.max_payload + 64 * 1024


@dataclass(slots=True)
class WebhookFront:
    """What the server keeps of the HTTP API: its routes, context and push workers."""

    api: Api
    push: PushDelivery
    routes: list[BaseRoute]
    seed: WebhookSeed

    def start(self) -> None:
        self.push.start()

    async def stop(self) -> None:
        await self.push.stop()

    def asgi(self, app: AsgiApp, gateway: GatewayMiddleware) -> LeanRoutes:
        """The app to serve: ``app`` (the Starlette app with these routes) behind the
        lean routes (broadcast, claim, bulk job changes); ``gateway`` configured as the
        one inside ``app``."""
        base = "/channel/{channelId}/consumer/{consumerId}/"
        posts = {
            route.path[len(base) :]: route.endpoint
            for route in self.routes
            if isinstance(route, Route)
            and route.path in (f"{base}claim", f"{base}jobs")
            and route.methods == {"POST"}
        }
        return LeanRoutes(app, self.api, gateway, posts)


def build(service: WebhookService, cfg: ServerConfig) -> WebhookFront:
    api = Api(
        service,
        ApiSettings(
            token_header=cfg.webhook_token_header,
            min_schedule_delay=cfg.webhook_min_schedule_delay,
            max_payload=cfg.max_payload,
        ),
    )
    push = PushDelivery(
        service,
        PushSettings(
            connection_timeout=cfg.webhook_connection_timeout,
            token_header=cfg.webhook_token_header,
            user_agent=cfg.webhook_user_agent,
            concurrency=cfg.webhook_concurrency,
        ),
    )

    def on_ready(consumer: Consumer) -> None:
        if consumer.type == "push":
            push.wake(consumer)
        else:
            api.wake((consumer.channel, consumer.id))

    service.on_ready = on_ready
    service.on_consumer = push.on_consumer
    seed = cfg.webhook_seed

    async def status(request: Request) -> Response:
        return json({"SeedData": seed_data(seed), "AppStatus": 3})

    async def jobs_status(request: Request) -> Response:
        return json(job_status(service))

    async def dead_status(request: Request) -> Response:
        return json(dlq_status(service))

    document = openapi_document()

    async def openapi(request: Request) -> Response:
        return json(document)

    routes: list[BaseRoute] = [
        Route("/_status", status, methods=["GET"]),
        Route("/job-status", jobs_status, methods=["GET"]),
        Route("/dlq-status", dead_status, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *resources.routes(api),
        *messages.routes(api),
        *jobs_api.routes(api),
    ]
    return WebhookFront(api, push, routes, seed)


def seed_data(seed: WebhookSeed) -> dict[str, Any]:
    """``/_status``'s SeedData with every token blanked (they are secrets)."""
    raw = msgspec.json.encode(seed)

    def stakeholder(r: Any) -> dict[str, Any]:
        return {"ID": r.id, "Name": r.name or r.id, "Token": ""}

    return {
        "DataHash": hashlib.sha256(raw).hexdigest(),
        "Producers": [stakeholder(p) for p in seed.producers],
        "Channels": [stakeholder(c) for c in seed.channels],
        "Consumers": [
            {**stakeholder(k), "CallbackURL": k.callback, "Channel": k.channel, "Type": k.type}
            for k in seed.consumers
        ],
    }


async def apply_seed(service: WebhookService, seed: WebhookSeed) -> None:
    """Create what the seed names; update what differs from it (tokens only when given)."""
    reg = service.registry
    for p in seed.producers:
        if not valid_id(p.id):
            continue
        old = reg.producers.get(p.id)
        name = p.name or p.id
        if (
            old is None
            or old.name != name
            or (p.token and not verify_token(p.token, old.token_hash))
        ):
            token = p.token or random_token()
            if old is not None and not p.token:
                continue  # only the name differs and no token to set: keep the old token
            await service.put_producer(p.id, name, token)
    for c in seed.channels:
        if not valid_id(c.id):
            continue
        old_c = reg.channels.get(c.id)
        name = c.name or c.id
        if (
            old_c is None
            or old_c.name != name
            or (c.token and not verify_token(c.token, old_c.token_hash))
        ):
            if old_c is not None and not c.token:
                continue
            await service.put_channel(c.id, name, c.token or random_token())
    for k in seed.consumers:
        if not valid_id(k.id) or k.channel not in reg.channels:
            continue
        old_k = reg.consumers.get((k.channel, k.id))
        name = k.name or k.id
        same = old_k is not None and (
            old_k.name == name
            and old_k.callback == k.callback
            and old_k.type == k.type
            and (not k.token or verify_token(k.token, old_k.token_hash))
        )
        if same:
            continue
        # Without a seeded token an existing push consumer keeps its (sealed) one.
        token = (
            k.token or (reg.consumer_token(old_k) if old_k is not None else "") or random_token()
        )
        await service.put_consumer(k.channel, k.id, name, token, k.callback, k.type)
