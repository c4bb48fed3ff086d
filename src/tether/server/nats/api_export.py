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
# Reply subjects remembered for requests from the other server.
MAX_REPLIES = 10_000


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
        self._replies: dict[str, str] = {}
        self._tokens = itertools.count(1)
        self._subs: list[InternalSubscription] = []
        self._delivering: dict[str, InternalSubscription] = {}

    def start(self) -> None:
        self._subs.append(self.router.subscribe_internal(self._inbox + ".*", self._on_reply))
        self.link.subscribe(self.prefix + ".>", self._on_request)
        self.link.subscribe(FLOW_CONTROL, self._on_flow_control)
        self.link.start()

    async def stop(self) -> None:
        await self.link.stop()
        for sub in [*self._subs, *self._delivering.values()]:
            self.router.unsubscribe_internal(sub)
        self._subs.clear()
        self._delivering.clear()

    # -- from the other server -------------------------------------------------------------------
    def _on_request(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        operation = subject[len(self.prefix) + 1 :]
        if operation.startswith(("CONSUMER.CREATE.", "CONSUMER.DURABLE.CREATE.")):
            self._follow_deliveries(payload)
        inbox = ""
        if reply:
            token = str(next(self._tokens))
            self._replies[token] = reply
            if len(self._replies) > MAX_REPLIES:
                del self._replies[next(iter(self._replies))]
            inbox = f"{self._inbox}.{token}"
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
    def _on_reply(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        # Kept, not popped: a pull request is answered by many messages on one reply
        # subject (each with its ack reply); the oldest go once there are too many.
        to = self._replies.get(subject.rpartition(".")[2], "")
        if to:
            self._forward(to, reply, hdr, payload)

    def _forward(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        if not self.link.publish(subject, reply, hdr, payload):
            log.debug("api export %s: %s not forwarded (not connected)", self.prefix, subject)
