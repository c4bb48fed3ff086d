"""Every mirror and source of every stream: started when a stream that has them is
loaded, created or updated, stopped when it goes, and woken by its origins' commits."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from tether.engine.broker import Broker
from tether.engine.sourcing.feed import Feed
from tether.engine.sourcing.origin import LocalOrigin, OriginReader, RemoteOrigins
from tether.engine.streams import Stream
from tether.engine.streams.sourcing import (
    SourceSpec,
    mirror_of,
    parse_source_header,
    source_identity,
    sources_of,
)

log = logging.getLogger("tether.sourcing")

_SOURCE_KEY = b"nats-stream-source"
# Messages read at a time when looking back for where each source stands.
_SCAN_CHUNK = 256


class SourcingService:
    """Runs one :class:`Feed` per mirror or source; answers their stream-info state."""

    def __init__(self, broker: Broker, remote: RemoteOrigins | None = None) -> None:
        self.broker = broker
        self.remote = remote
        self._feeds: dict[str, list[Feed]] = {}
        self._keys: dict[str, bytes] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._local: dict[str, list[LocalOrigin]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        broker.listeners.append(self)

    async def start(self) -> None:
        """Start the feeds of the streams loaded from the store, in the background:
        finding where a source stands may read back through a long stream, which must
        not hold up the server's start."""
        for stream in list(self.broker.streams.values()):
            if stream.config.mirror or stream.config.sources:
                self._spawn(self._reconcile(stream.name))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for name in list(self._feeds):
            await self._stop_feeds(name)

    # -- stream info ----------------------------------------------------------------------------
    def info(self, stream: Stream) -> dict[str, Any]:
        """``mirror`` or ``sources`` of a stream info (empty for a stream without)."""
        feeds = self._feeds.get(stream.name)
        cfg = stream.config
        if cfg.mirror:
            if feeds and feeds[0].mirror:
                return {"mirror": feeds[0].info()}
            return {"mirror": _idle(mirror_of(cfg))}
        if cfg.sources:
            by_name = {feed.iname: feed for feed in feeds or ()}
            out = []
            for spec in sources_of(cfg):
                feed = by_name.get(spec.index_name())
                out.append(feed.info() if feed is not None else _idle(spec))
            return {"sources": out}
        return {}

    # -- broker listener ------------------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        self._spawn(self._reconcile(stream.name))
        self._wake(stream.name)

    def on_stream_deleted(self, stream: Stream) -> None:
        self._spawn(self._reconcile(stream.name))
        self._wake(stream.name)

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        self._wake(stream.name)

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        pass

    def _wake(self, origin: str) -> None:
        for reader in self._local.get(origin, ()):
            reader.more.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- feeds ----------------------------------------------------------------------------------
    async def _reconcile(self, name: str) -> None:
        """Make the running feeds of stream ``name`` match its configuration."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            stream = self.broker.streams.get(name)
            cfg = stream.config if stream is not None else None
            key = (
                msgspec.json.encode([cfg.mirror, cfg.sources, id(stream)])
                if cfg is not None and (cfg.mirror or cfg.sources)
                else b""
            )
            if key == self._keys.get(name, b""):
                return
            kept = await self._stop_feeds(name)
            if stream is None or not key:
                self._keys.pop(name, None)
                return
            self._keys[name] = key
            feeds: list[Feed] = []
            mirror = mirror_of(stream.config)
            if mirror is not None:
                feeds.append(
                    Feed(
                        self.broker,
                        name,
                        mirror,
                        self._reader(mirror),
                        mirror=True,
                        last_seq=stream.last_seq,
                    )
                )
            else:
                specs = sources_of(stream.config)
                wanted = {spec.index_name() for spec in specs}
                progress: dict[str, tuple[int, str]] = {
                    k: v for k, v in kept.items() if k in wanted
                }
                missing = wanted - set(progress)
                if missing:
                    progress.update(await self._scan_progress(stream, missing))
                for spec in specs:
                    last_seq, identity = progress.get(spec.index_name(), (0, ""))
                    feeds.append(
                        Feed(
                            self.broker,
                            name,
                            spec,
                            self._reader(spec),
                            mirror=False,
                            last_seq=last_seq,
                            identity=identity,
                        )
                    )
            if self.broker.streams.get(name) is not stream:
                for feed in feeds:
                    await feed.reader.close()
                self._keys.pop(name, None)
                return
            self._feeds[name] = feeds
            for feed in feeds:
                feed.start()

    async def _stop_feeds(self, name: str) -> dict[str, tuple[int, str]]:
        """Stop the feeds of stream ``name``; where each source stood (by index name),
        and the identity of its origin."""
        feeds = self._feeds.pop(name, [])
        stood: dict[str, tuple[int, str]] = {}
        for feed in feeds:
            await feed.stop()
            stood[feed.iname] = (feed.last_seq, feed.identity)
            if isinstance(feed.reader, LocalOrigin):
                readers = self._local.get(feed.spec.name, [])
                if feed.reader in readers:
                    readers.remove(feed.reader)
        return stood

    def _reader(self, spec: SourceSpec) -> OriginReader:
        if spec.external is not None and self.remote is not None:
            return self.remote.open(spec)
        reader = LocalOrigin(self.broker, spec.name)
        self._local.setdefault(spec.name, []).append(reader)
        return reader

    async def _scan_progress(self, stream: Stream, inames: set[str]) -> dict[str, tuple[int, str]]:
        """Where each source stands, from the stream's own messages: the origin sequence
        (and the origin's identity) in the ``Nats-Stream-Source`` header of the newest
        copy from each source."""
        found: dict[str, tuple[int, str]] = {}
        seq = stream.last_seq
        first = stream.first_seq
        while seq >= first and len(found) < len(inames):
            chunk: list[int] = []
            while seq >= first and len(chunk) < _SCAN_CHUNK:
                if stream.meta(seq) is not None:
                    chunk.append(seq)
                seq -= 1
            if not chunk:
                continue
            chunk.reverse()
            msgs = await self.broker.read_many(stream, chunk)
            for msg in reversed(msgs):
                value = _source_value(msg.headers)
                if value is None:
                    continue
                parsed = parse_source_header(value)
                if parsed is not None and parsed[0] in inames and parsed[0] not in found:
                    found[parsed[0]] = (parsed[1], source_identity(value))
        return found


def _source_value(headers: bytes) -> str | None:
    if not headers:
        return None
    for line in headers.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == _SOURCE_KEY:
            return value.strip().decode(errors="replace")
    return None


def _idle(spec: SourceSpec | None) -> dict[str, Any]:
    """The entry of a mirror or source whose feed is not running (yet)."""
    out: dict[str, Any] = {"name": spec.name if spec else ""}
    if spec is not None and spec.external is not None:
        out["external"] = {"api": spec.external.api, "deliver": spec.external.deliver}
    out["lag"] = 0
    out["active"] = -1
    if spec is not None and spec.filter_subject:
        out["filter_subject"] = spec.filter_subject
    if spec is not None and spec.subject_transforms:
        out["subject_transforms"] = [
            {"src": t.src, "dest": t.dest} for t in spec.subject_transforms
        ]
    return out
