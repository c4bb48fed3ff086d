"""This server's JetStream API served on another server, so that its mirrors and sources
can read Tether's streams.

nats-server reaches the streams of another JetStream (a domain, another account)
through subjects of its own account: a mirror with ``external: {api:
"$JS.tether.API"}`` sends ``$JS.tether.API.CONSUMER.CREATE.…`` there and waits for
the messages on the deliver subject it named, answering flow control on ``$JS.FC.…``.
With ``js_api_exports = ["$JS.tether.API=nats://hub:7422"]`` Tether connects to that
server's leaf node port (:mod:`~tether.server.nats.leaf_link`) and carries exactly
that traffic across:

- requests on ``<prefix>.>`` are answered by this server's ``$JS.API.>`` (the reply
  goes back to the asker);
- what a consumer created that way sends to its deliver subject (messages, idle
  heartbeats, flow control requests) is published on the other server;
- ``$JS.FC.>`` published there (flow control answers) comes back here.

Nothing else crosses: this is a JetStream export over a leaf node connection, not a
general leaf node.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging

from tether.client.nuid import next_nuid
from tether.server.nats.leaf_link import LeafLink
from tether.server.nats.router import Router
from tether.server.nats.subscriptions import InternalSubscription

log = logging.getLogger("tether.sourcing")

JS_API = "$JS.API."
FLOW_CONTROL = "$JS.FC.>"
# Requests from the other server waiting for their answers, at most.
MAX_REPLIES = 10_000
# Seconds an answer is waited for (past a pull request's own expiry).
LINGER = 30.0


def _pull_expiry(payload: bytes) -> float:
    """A pull request's ``expires`` in seconds (0 when it has none)."""
    try:
        expires = json.loads(payload).get("expires", 0)
    except (ValueError, AttributeError):
        return 0.0
    return expires / 1e9 if isinstance(expires, int) and expires > 0 else 0.0


def parse_exports(entries: list[str]) -> list[tuple[str, list[str]]]:
    """``PREFIX=URL[,URL…]`` entries as (prefix, urls)."""
    out: list[tuple[str, list[str]]] = []
    for entry in entries:
        prefix, _, urls = entry.partition("=")
        out.append((prefix.strip(), [u.strip() for u in urls.split(",") if u.strip()]))
    return out


class ApiExport:
    """Serves ``$JS.API`` of this server as ``prefix`` on the server at ``urls``."""

    def __init__(self, router: Router, prefix: str, urls: list[str]) -> None:
        self.router = router
        self.prefix = prefix
        self.link = LeafLink(urls, f"tether {prefix}")
        self._inbox = f"_TETHER.EXPORT.{next_nuid()}"
        # One internal subscription per request waiting for its answer (the subject a
        # delivery arrives with is the message's own, not the inbox: the inbox itself
        # must say whose answer it is).
        self._replies: dict[str, InternalSubscription] = {}
        self._tokens = itertools.count(1)
        self._subs: list[InternalSubscription] = []
        self._delivering: dict[str, InternalSubscription] = {}

    def start(self) -> None:
        self.link.subscribe(self.prefix + ".>", self._on_request)
        self.link.subscribe(FLOW_CONTROL, self._on_flow_control)
        self.link.start()

    async def stop(self) -> None:
        await self.link.stop()
        for sub in [*self._subs, *self._delivering.values(), *self._replies.values()]:
            self.router.unsubscribe_internal(sub)
        self._subs.clear()
        self._delivering.clear()
        self._replies.clear()

    # -- from the other server -------------------------------------------------------------------
    def _on_request(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        operation = subject[len(self.prefix) + 1 :]
        if operation.startswith(("CONSUMER.CREATE.", "CONSUMER.DURABLE.CREATE.")):
            self._follow_deliveries(payload)
        inbox = f"{self._inbox}.{next(self._tokens)}" if reply else ""
        if reply:
            self._await_answer(inbox, reply, operation, payload)
        self.router.publish(None, JS_API + operation, inbox, hdr, payload)

    def _on_flow_control(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        self.router.publish(None, subject, reply, hdr, payload)

    def _follow_deliveries(self, payload: bytes) -> None:
        """Carry what goes to the deliver subject of a push consumer created from there."""
        try:
            deliver = json.loads(payload)["config"]["deliver_subject"]
        except (ValueError, KeyError, TypeError):
            return
        if not isinstance(deliver, str) or not deliver or deliver in self._delivering:
            return

        def carry(subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
            self._deliver(deliver, subject, reply, hdr, payload)

        self._delivering[deliver] = self.router.subscribe_internal(deliver, carry)

    def _deliver(
        self, deliver: str, subject: str, reply: str, hdr: bytes | None, payload: bytes
    ) -> None:
        """A delivery is routed by its deliver subject; the subject it was stored under
        rides after ``@`` in the ack reply, as nats-server itself sends JetStream
        deliveries across routes and leaf nodes."""
        if reply.startswith("$JS.ACK.") and subject != deliver:
            reply = f"{reply}@{subject}"
        self._forward(deliver, reply, hdr, payload)

    # -- to the other server ---------------------------------------------------------------------
    def _await_answer(self, inbox: str, reply: str, operation: str, payload: bytes) -> None:
        """Carry the answers to ``inbox`` back to ``reply``: one answer for an API
        request; for a pull request every message and status until it expires."""
        many = operation.startswith("CONSUMER.MSG.NEXT.")

        def answer(subject: str, ack: str, hdr: bytes | None, body: bytes) -> None:
            if ack.startswith("$JS.ACK.") and subject != inbox:
                ack = f"{ack}@{subject}"  # a pulled message keeps its subject (see _deliver)
            self._forward(reply, ack, hdr, body)
            if not many:
                self._forget(inbox)

        self._replies[inbox] = self.router.subscribe_internal(inbox, answer)
        linger = _pull_expiry(payload) + LINGER if many else LINGER
        asyncio.get_running_loop().call_later(linger, self._forget, inbox)
        if len(self._replies) > MAX_REPLIES:
            self._forget(next(iter(self._replies)))

    def _forget(self, inbox: str) -> None:
        sub = self._replies.pop(inbox, None)
        if sub is not None:
            self.router.unsubscribe_internal(sub)

    def _forward(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        if not self.link.publish(subject, reply, hdr, payload):
            log.debug("api export %s: %s not forwarded (not connected)", self.prefix, subject)
