"""Discovery: nsqlookupd's HTTP API, answered by every node about itself and its peers.

nsqlookupd is a separate daemon nsqd processes register with over TCP; here each node
answers nsqlookupd's queries (``/lookup``, ``/topics``, ``/channels``, ``/nodes``,
``/ping``, ``/info``) from what it knows: its own topics and channels, and those of the
peers it was told about (``nsq_lookupd_peers``, ``HOST:HTTPPORT``). It polls each peer's
nsqd ``/info`` and ``/stats`` (so a peer may be a real nsqd too) every
``nsq_lookupd_poll_interval`` seconds with up to 20 % jitter, keeps the last answer, and
leaves out a peer whose last poll failed, until it answers again. Queries never wait for
a peer: they read the cache. A client given any one node's address (pynsq's and
nsqjs's ``lookupd_http_addresses``) so finds the producers of a topic on every node.

The answers come from nsqlookupd's registration database, kept from those views
(:mod:`registrations`), which nsqlookupd's write routes (``/topic/create``,
``/topic/delete``, ``/channel/create``, ``/channel/delete``, ``/topic/tombstone``) edit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from tether.protocol.nsq.names import is_valid_name
from tether.server.nsq.http_common import HttpError, Query
from tether.server.nsq.registrations import Registrations

log = logging.getLogger("tether.nsq")

JITTER = 0.2
LOOKUPD_VERSION = "1.3.0"
_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}


@dataclass(slots=True)
class NodeView:
    """One producer (nsqd) as nsqlookupd describes it, and its topics with their channels."""

    producer: dict[str, Any]
    topics: dict[str, list[str]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return str(self.producer.get("broadcast_address", "")), int(
            self.producer.get("tcp_port", 0)
        )


class _Info(msgspec.Struct):
    broadcast_address: str = ""
    hostname: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    nats_port: int = 0  # a Tether node's NATS port (not in nsqd's answer)


class _ChannelStats(msgspec.Struct):
    channel_name: str = ""


class _TopicStats(msgspec.Struct):
    topic_name: str = ""
    channels: list[_ChannelStats] = msgspec.field(default_factory=list)


class _Stats(msgspec.Struct):
    topics: list[_TopicStats] | None = None


class Lookupd:
    """This node's view for nsqlookupd's queries: itself plus its reachable peers."""

    def __init__(
        self,
        local: Callable[[], NodeView],
        peers: list[str],
        poll_interval: float = 5.0,
        client_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.local = local
        self.peers = [p.strip() for p in peers if p.strip()]
        self.poll_interval = max(0.1, poll_interval)
        self.views: dict[str, NodeView] = {}  # by peer address, only peers that answered
        # A peer's nsqd HTTPS address, once its plain port said 403 TLS_REQUIRED.
        self.https: dict[str, str] = {}
        self.client_tls = client_tls
        self.registrations = Registrations()  # nsqlookupd's, kept from the views
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- polling ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.peers and self._task is None:
            self._task = asyncio.ensure_future(self._poll_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _poll_forever(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.poll_interval), connect=1.0)
        self._session = aiohttp.ClientSession(timeout=timeout)
        while True:
            await self.poll()
            delay = self.poll_interval * (1 + random.uniform(-JITTER, JITTER))
            await asyncio.sleep(delay)

    async def poll(self) -> None:
        """Ask every peer once (at the same time); keep who answered."""
        await asyncio.gather(*(self._poll(peer) for peer in self.peers))

    async def _poll(self, peer: str) -> None:
        session = self._session
        if session is None:
            return
        try:
            info = msgspec.json.decode(await self._get(session, peer, "/info"), type=_Info)
            stats_path = "/stats?format=json&include_clients=false&include_mem=false"
            stats = msgspec.json.decode(await self._get(session, peer, stats_path), type=_Stats)
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, ValueError) as exc:
            self.https.pop(peer, None)  # the next poll starts from the plain port again
            if self.views.pop(peer, None) is not None:
                log.warning("nsq lookupd: peer %s is unreachable (%s); skipped", peer, exc)
            return
        host = peer.split("://", 1)[-1].rsplit(":", 1)[0]
        producer = {
            "remote_address": peer,
            "hostname": info.hostname,
            "broadcast_address": info.broadcast_address or host,
            "tcp_port": info.tcp_port,
            "http_port": info.http_port,
            "version": info.version,
            "nats_port": info.nats_port,
        }
        topics = {t.topic_name: [c.channel_name for c in t.channels] for t in stats.topics or []}
        self.views[peer] = NodeView(producer, topics)

    async def _get(self, session: aiohttp.ClientSession, peer: str, path: str) -> bytes:
        """One of a peer's nsqd routes. As nsqd's own HTTP client does, a plain port's
        ``403`` (nsqd's ``--tls-required``) sends it to the ``https_port`` it names."""
        base = self.https.get(peer) or (peer if "://" in peer else f"http://{peer}")
        tls = self.client_tls if base.startswith("https:") and self.client_tls else True
        async with session.get(f"{base}{path}", headers=_ACCEPT, ssl=tls) as resp:
            body = await resp.read()
            if resp.status == 403 and base.startswith("http:"):
                self.https[peer] = _https_base(base, body)
                return await self._get(session, peer, path)
            resp.raise_for_status()
            return body

    # -- the views ---------------------------------------------------------------------------
    def nodes(self) -> list[NodeView]:
        """This node, then each peer that answered its last poll (one per address); the
        registrations brought up to date with them."""
        out = [self.local()]
        seen = {out[0].key}
        for view in self.views.values():
            if view.key not in seen:
                seen.add(view.key)
                out.append(view)
        self.registrations.sync((view.key, view.topics) for view in out)
        return out

    # -- nsqlookupd's routes -------------------------------------------------------------------
    def lookup(self, query: Query) -> dict[str, Any]:
        topic = _topic(query)
        nodes = self.nodes()
        regs = self.registrations
        if not regs.has_topic(topic):
            raise HttpError(404, "TOPIC_NOT_FOUND")
        producers = regs.topic_producers(topic)
        return {
            "channels": regs.channels(topic),
            "producers": [
                _peer_info(n.producer)
                for n in nodes
                if n.key in producers and not regs.tombstoned(topic, n.key)
            ],
        }

    def tombstone(self, query: Query) -> None:
        """nsqlookupd's ``/topic/tombstone?topic=&node=``: for ``TOMBSTONE_LIFETIME``
        ``/lookup`` leaves that node out of the topic's producers (so consumers stop
        connecting to it before the topic is deleted there); ``/nodes`` shows it."""
        topic = _topic(query)
        node = query.get("node")
        if node is None:
            raise HttpError(400, "MISSING_ARG_NODE")
        for view in self.nodes():
            if _node_name(view) == node and view.key in self.registrations.topic_producers(topic):
                self.registrations.tombstone(topic, view.key)
                log.info("nsq lookupd: tombstone for %s of topic %s", node, topic)

    def topics(self) -> dict[str, Any]:
        self.nodes()
        return {"topics": self.registrations.topics()}

    def channels(self, query: Query) -> dict[str, Any]:
        topic = _topic(query)
        self.nodes()
        return {"channels": self.registrations.channels(topic)}

    def node_list(self) -> dict[str, Any]:
        producers = []
        regs = self.registrations
        for node in self.nodes():
            topics = regs.topics(node.key)
            tombstones = [regs.tombstoned(topic, node.key) for topic in topics]
            producers.append(
                {**_peer_info(node.producer), "tombstones": tombstones, "topics": topics}
            )
        return {"producers": producers}

    # nsqlookupd's write routes: its registrations only, never a node's topics.
    def create_topic(self, query: Query) -> None:
        topic = _valid(_topic(query), "INVALID_ARG_TOPIC")
        self.nodes()
        self.registrations.create_topic(topic)
        log.info("nsq lookupd: adding topic(%s)", topic)

    def delete_topic(self, query: Query) -> None:
        topic = _topic(query)  # not checked, as nsqlookupd's (an invalid one is not there)
        self.nodes()
        self.registrations.delete_topic(topic)
        log.info("nsq lookupd: removing topic(%s) and its channels", topic)

    def create_channel(self, query: Query) -> None:
        topic, channel = _topic_channel(query)
        self.nodes()
        self.registrations.create_channel(topic, channel)
        log.info("nsq lookupd: adding channel(%s) in topic(%s)", channel, topic)

    def delete_channel(self, query: Query) -> None:
        topic, channel = _topic_channel(query)
        self.nodes()
        if not self.registrations.delete_channel(topic, channel):
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        log.info("nsq lookupd: removing channel(%s) from topic(%s)", channel, topic)

    @staticmethod
    def info() -> dict[str, Any]:
        return {"version": LOOKUPD_VERSION}


def _topic(query: Query) -> str:
    topic = query.get("topic")
    if topic is None:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    return topic


class _TlsRequired(msgspec.Struct):
    https_port: int = 0


def _https_base(base: str, body: bytes) -> str:
    """``https://host:https_port`` from a 403's body (ValueError if it names none)."""
    port = msgspec.json.decode(body, type=_TlsRequired).https_port
    if not 0 < port <= 65535:
        raise ValueError(f"403 without an https_port: {body[:100]!r}")
    host = base.split("://", 1)[1].rsplit(":", 1)[0]
    return f"https://{host}:{port}"


def _valid(name: str, code: str) -> str:
    if not is_valid_name(name.encode("utf-8", "surrogateescape")):
        raise HttpError(400, code)
    return name


def _topic_channel(query: Query) -> tuple[str, str]:
    """nsqlookupd's (and nsqd's) ``GetTopicChannelArgs``: checked in this order."""
    topic = _valid(_topic(query), "INVALID_ARG_TOPIC")
    channel = query.get("channel")
    if channel is None:
        raise HttpError(400, "MISSING_ARG_CHANNEL")
    return topic, _valid(channel, "INVALID_ARG_CHANNEL")


def _node_name(view: NodeView) -> str:
    """How nsqlookupd names a producer in ``/topic/tombstone``'s ``node``."""
    producer = view.producer
    return f"{producer.get('broadcast_address', '')}:{producer.get('http_port', 0)}"


def _peer_info(producer: dict[str, Any]) -> dict[str, Any]:
    """nsqlookupd's ``PeerInfo``, plus ``nats_port`` for a Tether node (clients ignore
    fields they do not know; :mod:`tether.client.discovery` reads it)."""
    info = {
        "remote_address": producer.get("remote_address", ""),
        "hostname": producer.get("hostname", ""),
        "broadcast_address": producer.get("broadcast_address", ""),
        "tcp_port": producer.get("tcp_port", 0),
        "http_port": producer.get("http_port", 0),
        "version": producer.get("version", ""),
        "topology_zone": "",
        "topology_region": "",
    }
    if producer.get("nats_port"):
        info["nats_port"] = producer["nats_port"]
    return info
