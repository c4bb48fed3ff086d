"""A consumer's dead letters over NATS: ``$TETHER.API.CONSUMER.DEAD.*``, a Tether extension.

A message a consumer gave up on (``max_deliver`` reached, or ``+TERM``) stays with the
consumer as a dead letter until it is requeued or removed; nats-server forgets such
messages (it only sends an advisory). Three requests, answered with JSON as the
``$JS.API`` requests are (errors as ``{"error": {"code", "err_code", "description"}}``)::

    $TETHER.API.CONSUMER.DEAD.LIST.<stream>.<consumer>     {} or {"offset": N}
        -> {"total", "offset", "limit", "dead": [{"seq", "consumer_seq", "subject",
            "deliveries", "reason", "detail", "time"}]}
    $TETHER.API.CONSUMER.DEAD.REQUEUE.<stream>.<consumer>  {"seq": N} or {} for all
        -> {"requeued": n}   (back in the redelivery queue, delivery count restarted)
    $TETHER.API.CONSUMER.DEAD.DELETE.<stream>.<consumer>   {"seq": N} or {} for all
        -> {"deleted": n}    (forgotten as acknowledged; the message stays in the stream)

A webhook-broker consumer's dead letters are its dead jobs: for those the requeue and
delete requests answer 400 and name the HTTP route to use. On nats-server these
subjects have no responders.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec

from tether.engine import errors
from tether.engine.consumers import Consumer, ConsumerRegistry
from tether.engine.jobs.service import channel_id
from tether.engine.jobs.view import owned_by_http
from tether.server.nats.requests import BodyError, Seq, decode_as
from tether.server.nats.router import Router
from tether.server.nats.subscriptions import InternalSubscription
from tether.storage.base import StorageError

DEAD_PREFIX = "$TETHER.API.CONSUMER.DEAD."
LIST_LIMIT = 1024

_encode = msgspec.json.encode


class DeadRequest(msgspec.Struct, forbid_unknown_fields=True):
    seq: Seq = 0
    offset: Seq = 0


def _time(ns: int) -> str:
    moment = datetime.fromtimestamp(ns // 1_000_000_000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 1_000_000_000:09d}Z"


class DeadLetterApi:
    """Answers the dead-letter requests for every consumer; one internal subscription."""

    def __init__(self, router: Router, registry: ConsumerRegistry) -> None:
        self.router = router
        self.registry = registry
        self._sub: InternalSubscription | None = None

    def start(self) -> None:
        self._sub = self.router.subscribe_internal(DEAD_PREFIX + "*.*.*", self._on_request)

    async def stop(self) -> None:
        if self._sub is not None:
            self.router.unsubscribe_internal(self._sub)
            self._sub = None
        await asyncio.sleep(0)

    def _on_request(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        if not reply:
            return
        operation, stream, name = subject[len(DEAD_PREFIX) :].split(".")
        try:
            body = self.answer(operation, stream, name, payload)
        except errors.ApiError as exc:
            body = {"error": exc.to_dict()}
        consumer = self.registry.find(stream, name)
        if operation == "LIST" or "error" in body or consumer is None:
            self.router.publish(None, reply, "", None, _encode(body))
            return

        def saved(error: StorageError | None) -> None:
            # A change is confirmed only once the consumer's state holding it committed.
            out = body if error is None else {"error": errors.store_failed(str(error)).to_dict()}
            self.router.publish(None, reply, "", None, _encode(out))

        self.registry.after_save(consumer, saved)

    def answer(self, operation: str, stream: str, name: str, payload: bytes) -> dict[str, Any]:
        """The reply body of one request (raises :class:`errors.ApiError`)."""
        try:
            req = decode_as(payload, DeadRequest) if payload.strip() else DeadRequest()
        except BodyError as exc:
            raise errors.invalid_json(str(exc)) from None
        consumer = self.registry.get(stream, name)
        if operation == "LIST":
            return self._list(consumer, req.offset)
        if operation not in ("REQUEUE", "DELETE"):
            raise errors.bad_request(f"unknown dead-letter operation {operation!r}")
        if owned_by_http(consumer.config):
            base = f"/channel/{channel_id(stream)}/consumer/{name}"
            route = (
                "POST …/dlq or …/job/{id}/requeue-dead-job"
                if operation == "REQUEUE"
                else ("DELETE …/dlq or DELETE …/job/{id}")
            )
            raise errors.managed_by_http(f"consumer {name!r}", f"{route} ({base})")
        letters = [d.seq for d in consumer.dead_messages()]
        chosen = [s for s in letters if s == req.seq] if req.seq else letters
        if req.seq and not chosen:
            raise errors.ApiError(404, 10037, f"no dead letter at sequence {req.seq}")
        if operation == "REQUEUE":
            return {"requeued": sum(1 for seq in chosen if consumer.requeue_dead(seq))}
        for seq in chosen:
            consumer.ack(seq)  # an acknowledged dead letter leaves the dead set
        return {"deleted": len(chosen)}

    @staticmethod
    def _list(consumer: Consumer, offset: int) -> dict[str, Any]:
        letters = consumer.dead_messages()
        page = []
        for letter in letters[offset : offset + LIST_LIMIT]:
            meta = consumer.stream.meta(letter.seq)
            page.append(
                {
                    "seq": letter.seq,
                    "consumer_seq": letter.consumer_seq,
                    "subject": meta.subject if meta is not None else None,
                    "deliveries": letter.deliveries,
                    "reason": letter.reason,
                    "detail": letter.detail,
                    "time": _time(letter.ts),
                }
            )
        return {"total": len(letters), "offset": offset, "limit": LIST_LIMIT, "dead": page}
