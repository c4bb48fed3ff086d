"""nsqlookupd's registration database, kept from what the nodes are seen to have.

nsqlookupd learns of topics and channels from nsqd's ``REGISTER``/``UNREGISTER``
commands, and answers its queries from a database of registrations (a topic, or a
topic's channel) each with the producers that registered it. Its write routes
(``/topic/create``, ``/topic/delete``, ``/channel/create``, ``/channel/delete``) edit
that database only: the nsqd's topics are untouched, and a deleted registration stays
deleted until a producer registers it again (nsqd does when it creates the topic or a
channel of it, or when it reconnects).

No nsqd registers with Tether; the registrations are derived instead from each node's
topics as last seen (this node's at every query, a peer's at every poll): what a node
has now and had not at the last look is its ``REGISTER``, what it had and has no more
its ``UNREGISTER``, and a node that stops answering unregisters everything, as a
disconnected nsqd does. One deliberate difference: nsqlookupd keeps a registration
whose producers have all gone (until ``/topic/delete``); here it goes with its last
producer unless ``/topic/create`` or ``/channel/create`` made it.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable

from tether.protocol.nsq.names import is_ephemeral

TOMBSTONE_LIFETIME = 45.0  # seconds, nsqlookupd's --tombstone-lifetime default

# (topic, channel); the channel is "" for the topic's own registration.
Registration = tuple[str, str]
Node = Hashable  # a producer's identity (Lookupd's NodeView.key)


class Registrations:
    """Registrations and their producers, in the order they were first registered."""

    def __init__(self) -> None:
        self.producers: dict[Registration, set[Node]] = {}
        self._made: set[Registration] = set()  # by /topic/create, /channel/create
        self._seen: dict[Node, set[Registration]] = {}  # each node's, at the last look
        # (topic, node) → when /topic/tombstone was asked (the topic's producer entry)
        self._tombstones: dict[tuple[str, Node], float] = {}

    # -- what the nodes have ------------------------------------------------------------------
    def sync(self, nodes: Iterable[tuple[Node, dict[str, list[str]]]]) -> None:
        """Bring the database up to date with each node's ``{topic: [channels]}``; a node
        left out has gone away."""
        current = dict(nodes)
        for node in [n for n in self._seen if n not in current]:
            for reg in self._seen.pop(node):
                self._unregister(node, reg)
        for node, topics in current.items():
            now: dict[Registration, None] = {}
            for topic, channels in topics.items():
                now[(topic, "")] = None
                for channel in channels:
                    now[(topic, channel)] = None
            before = self._seen.get(node, set())
            for reg in before:
                if reg not in now:
                    self._unregister(node, reg)
            for reg in now:
                if reg not in before:
                    self._register(node, reg)
            self._seen[node] = set(now)

    def _register(self, node: Node, reg: Registration) -> None:
        # nsqd's REGISTER of a channel registers its topic too.
        topic, channel = reg
        if channel:
            self.producers.setdefault(reg, set()).add(node)
        self.producers.setdefault((topic, ""), set()).add(node)

    def _unregister(self, node: Node, reg: Registration) -> None:
        topic, channel = reg
        # A topic's UNREGISTER takes the producer out of the topic's channels as well.
        regs = [reg] if channel else [r for r in self.producers if r[0] == topic]
        for r in regs:
            producers = self.producers.get(r)
            if producers is None:
                continue
            producers.discard(node)
            if not r[1]:
                self._tombstones.pop((topic, node), None)
            if not producers and (r not in self._made or is_ephemeral(r[1] or r[0])):
                del self.producers[r]
                self._made.discard(r)

    # -- nsqlookupd's write routes ---------------------------------------------------------------
    def create_topic(self, topic: str) -> None:
        self.producers.setdefault((topic, ""), set())
        self._made.add((topic, ""))

    def create_channel(self, topic: str, channel: str) -> None:
        for reg in ((topic, channel), (topic, "")):
            self.producers.setdefault(reg, set())
            self._made.add(reg)

    def delete_topic(self, topic: str) -> None:
        """The topic's registration and its channels', with their producers."""
        for reg in [r for r in self.producers if r[0] == topic]:
            del self.producers[reg]
            self._made.discard(reg)
        self._tombstones = {k: t for k, t in self._tombstones.items() if k[0] != topic}

    def delete_channel(self, topic: str, channel: str) -> bool:
        """False: no such registration (nsqlookupd's ``CHANNEL_NOT_FOUND``)."""
        if self.producers.pop((topic, channel), None) is None:
            return False
        self._made.discard((topic, channel))
        return True

    def tombstone(self, topic: str, node: Node) -> None:
        now = time.monotonic()
        self._tombstones = {
            k: t for k, t in self._tombstones.items() if now - t < TOMBSTONE_LIFETIME
        }
        if node in self.producers.get((topic, ""), ()):
            self._tombstones[(topic, node)] = now

    # -- queries --------------------------------------------------------------------------------
    def topics(self, node: Node | None = None) -> list[str]:
        """Every registered topic, or those ``node`` is a producer of."""
        return [
            topic
            for (topic, channel), producers in self.producers.items()
            if not channel and (node is None or node in producers)
        ]

    def channels(self, topic: str) -> list[str]:
        return [c for (t, c) in self.producers if t == topic and c]

    def has_topic(self, topic: str) -> bool:
        return (topic, "") in self.producers

    def topic_producers(self, topic: str) -> set[Node]:
        return self.producers.get((topic, ""), set())

    def tombstoned(self, topic: str, node: Node) -> bool:
        since = self._tombstones.get((topic, node))
        return since is not None and time.monotonic() - since < TOMBSTONE_LIFETIME
