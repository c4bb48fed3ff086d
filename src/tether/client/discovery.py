"""Discovery for a :class:`~tether.client.worker.Worker`: poll nsqlookupd-style ``/lookup``
endpoints, union the producers, connect to each new one.

As the NSQ client guide asks: every address in ``lookupd_http_addresses`` is asked
``/lookup?topic=<topic>`` at once, every ``poll_interval`` seconds plus a random share
of up to ``jitter`` of it (so many workers do not poll in step); the producers of all
answers are united by ``broadcast_address:tcp_port``; each one not seen before is handed
to ``connect``, which returns the pull subscription the worker adds to its sources (the
worker's ``max_in_flight`` is then shared by all of them). An address that does not
answer is skipped until the next round. A Tether node lists itself and the nodes it was
told about (``nsq_lookupd_peers``), each with the extra field ``nats_port``; producers
without one (a real nsqd) are skipped by :func:`jetstream_connector`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

import msgspec

from tether.client.pull import PullSubscription

log = logging.getLogger("tether.client.discovery")


class Producer(NamedTuple):
    """One producer from a ``/lookup`` answer."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    nats_port: int  # Tether's extension; 0 when the answer has none
    hostname: str = ""
    version: str = ""

    @property
    def key(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"


class _Producer(msgspec.Struct):
    broadcast_address: str = ""
    hostname: str = ""
    tcp_port: int = 0
    http_port: int = 0
    nats_port: int = 0
    version: str = ""


class _Lookup(msgspec.Struct):
    producers: list[_Producer] | None = None
    data: _Lookup | None = None  # releases before nsq 1.0 wrapped the answer


Connect = Callable[[Producer], Awaitable[PullSubscription | None]]


async def lookup(address: str, topic: str, request_timeout: float = 2.0) -> list[Producer]:
    """The producers one lookup address lists for ``topic`` (raises on any failure)."""
    url = urlsplit(address if "://" in address else f"http://{address}")
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"not an http address: {address}")
    path = url.path if url.path not in ("", "/") else "/lookup"
    query = f"topic={quote(topic, safe='')}"
    if url.query:
        query = f"{url.query}&{query}"
    host, port = url.hostname, url.port or 80
    request = (
        f"GET {path}?{query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        "Accept: application/vnd.nsq; version=1.0\r\nConnection: close\r\n\r\n"
    ).encode()
    async with asyncio.timeout(request_timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            raw = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
    if status == 404:
        return []  # the topic is not there (yet)
    if status != 200:
        raise OSError(f"{address}: HTTP {status}")
    if any(line.lower().startswith(b"transfer-encoding: chunked") for line in lines[1:]):
        body = _dechunk(body)
    answer = msgspec.json.decode(body, type=_Lookup)
    found = answer.producers if answer.producers is not None else []
    if answer.data is not None and answer.data.producers is not None:
        found = answer.data.producers
    return [
        Producer(p.broadcast_address, p.tcp_port, p.http_port, p.nats_port, p.hostname, p.version)
        for p in found
        if p.broadcast_address
    ]


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


class Discovery:
    """Polls lookup addresses for a topic and connects to new producers."""

    def __init__(
        self,
        lookupd_http_addresses: list[str],
        topic: str,
        connect: Connect,
        *,
        poll_interval: float = 60.0,
        jitter: float = 0.3,
        request_timeout: float = 2.0,
    ) -> None:
        if not lookupd_http_addresses:
            raise ValueError("discovery needs at least one lookup address")
        if not 0 <= jitter <= 1:
            raise ValueError("jitter is a share of poll_interval, between 0 and 1")
        self.addresses = list(lookupd_http_addresses)
        self.topic = topic
        self.connect = connect
        self.poll_interval = poll_interval
        self.jitter = jitter
        self.request_timeout = request_timeout
        self.known: dict[str, Producer] = {}  # every producer handed to connect, by key
        self.failed: dict[str, Exception] = {}  # lookup addresses that failed last round

    async def poll(self) -> list[tuple[Producer, PullSubscription]]:
        """One round: the new producers and their subscriptions (``connect`` may decline
        one by returning None; it is tried again next round)."""
        results = await asyncio.gather(
            *(lookup(a, self.topic, self.request_timeout) for a in self.addresses),
            return_exceptions=True,
        )
        union: dict[str, Producer] = {}
        for address, result in zip(self.addresses, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                self.failed[address] = result
                log.debug("lookup %s failed: %r", address, result)
                continue
            self.failed.pop(address, None)
            for producer in result:
                union.setdefault(producer.key, producer)
        added: list[tuple[Producer, PullSubscription]] = []
        for key, producer in union.items():
            if key in self.known:
                continue
            try:
                sub = await self.connect(producer)
            except Exception as exc:  # the producer is down: try again next round
                log.debug("connecting to %s failed: %r", key, exc)
                continue
            if sub is not None:
                self.known[key] = producer
                added.append((producer, sub))
        return added

    async def run(self, on_new: Callable[[PullSubscription], Any]) -> None:
        """Poll now, then every interval (plus jitter), until cancelled."""
        while True:
            for _, sub in await self.poll():
                on_new(sub)
            delay = self.poll_interval * (1 + random.uniform(0, self.jitter))
            await asyncio.sleep(delay)


def jetstream_connector(
    stream: str, consumer: str, config: Any = None, **connect_options: Any
) -> tuple[Connect, Callable[[], Awaitable[None]]]:
    """A ``connect`` for :class:`Discovery` that opens a NATS connection to each Tether
    producer (``nats://broadcast_address:nats_port``) and pull-subscribes to ``consumer``
    of ``stream`` there (creating it with ``config`` when given); and a ``close`` for the
    connections it opened."""
    from tether.client.connection import Connection, connect

    opened: list[Connection] = []

    async def open_one(producer: Producer) -> PullSubscription | None:
        if not producer.nats_port:
            return None  # not a Tether node: nothing to pull from over NATS
        conn = await connect(
            f"nats://{producer.broadcast_address}:{producer.nats_port}", **connect_options
        )
        try:
            sub = await conn.jetstream().pull_subscribe(stream, consumer, config)
        except Exception:
            await conn.close()
            raise
        opened.append(conn)
        return sub

    async def close() -> None:
        for conn in opened:
            with contextlib.suppress(Exception):
                await conn.close()
        opened.clear()

    return open_one, close
