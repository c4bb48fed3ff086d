"""The broker: the one facade front doors use to reach streams and their messages.

It applies the engine's decisions to storage through group commit: every change made
in one loop tick is committed together and a publish is acknowledged only once its
commit is durable. Listeners hear about committed messages and stream changes, which
is how consumers learn about new work and front doors about subjects to capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from tether.engine import errors
from tether.engine.clock import Clock, Timer
from tether.engine.limits import ServerLimits
from tether.engine.streams import StreamListener, counters
from tether.engine.streams import schedules as sched
from tether.engine.streams.batches import (
    BATCH_ID,
    MAX_HEADERS_LEN,
    AtomicBatches,
    Batch,
    BatchLimits,
    batch_fields,
)
from tether.engine.streams.config import (
    StreamConfig,
    check_create,
    check_update,
    decode_config,
    decode_stored_config,
    encode_config,
    normalize,
)
from tether.engine.streams.expiry import MARKER_REASON, NS, marker_headers, with_ttl
from tether.engine.streams.republisher import Republisher
from tether.engine.streams.sourcing import input_transform
from tether.engine.streams.stream import (
    EXPECTED_LAST_MSG_ID,
    EXPECTED_LAST_SEQ,
    EXPECTED_LAST_SUBJ_SEQ,
    EXPECTED_LAST_SUBJ_SEQ_SUBJECT,
    EXPECTED_STREAM,
    MSG_ID,
    MSG_TTL,
    PRIORITY,
    PRIORITY_RANGE,
    ROLLUP,
    BytesHeld,
    Stream,
    message_ttl,
    parse_priority,
)
from tether.engine.subjects import filters_overlap
from tether.storage.base import (
    CorruptMessage,
    MessageColumns,
    MessageMeta,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
    subject_size,
)

log = logging.getLogger("tether.broker")


@dataclass(slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False
    # An atomic batch's commit: its id and how many messages it stored.
    batch: str = ""
    count: int = 0
    # A counter's new total.
    val: str = ""
    # A batch message staged for its commit (answered with an empty reply).
    staged: bool = False


AckCallback = Callable[[PubAck | errors.ApiError], None]


class PubAckSink(Protocol):
    """Who answers publishers that gave a reply subject (the NATS front door).

    The broker hands over a whole run of publishes at once: ``replies[i]`` (possibly
    empty: nobody to answer) was stored at ``first_seq + i``. Handing over runs rather
    than one callback per message keeps the publish path free of per-message closures
    and lets the sink format and route every PubAck of a commit in one go.
    """

    def pub_acked(self, stream: str, first_seq: int, replies: list[str], duplicate: bool) -> None:
        """The run is durable (or, with ``duplicate``, its original is)."""

    def pub_failed(self, stream: str, replies: list[str], error: errors.ApiError) -> None:
        """The publishes were refused, or the commit holding them failed."""


# A publisher waiting for a commit: (callback, stream, seq, None, duplicate) for one
# publish with a callback, or (sink, stream, first seq, replies, duplicate) for a run.
_Waiter = tuple[Any, str, int, list[str] | None, bool]


class _Tick:
    """What one group commit carries besides the writes: who to tell when it lands."""

    __slots__ = ("appended", "atomic", "first_seq", "merged", "waiters")

    def __init__(self) -> None:
        # (stream, first seq, last seq, msg id): a run of appends, newest last; a msg id
        # only on single publishes (a run carries no headers, hence no Nats-Msg-Id).
        self.appended: list[tuple[Stream, int, int, str]] = []
        # The PubAcks are built only when the commit lands, so a publish allocates no
        # closure of its own.
        self.waiters: list[_Waiter] = []
        # The first sequence this commit holds, per stream (commits are in seq order).
        self.first_seq: dict[str, int] = {}
        # The replies of the last waiter when this tick built that list by merging runs
        # (see Broker._ran), so that later runs extend it in place.
        self.merged: list[str] | None = None
        # Atomic batches in this commit, (stream, first seq, last seq): refused whole.
        self.atomic: list[tuple[str, int, int]] = []


@dataclass(slots=True)
class LoadProgress:
    """How far :meth:`Broker.load` has come, for progress lines while a store loads."""

    streams_total: int = 0
    streams: int = 0
    messages: int = 0
    current: str = ""  # the stream being read now


class Broker:
    """Streams and their messages, persisted through a :class:`Store`."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.streams: dict[str, Stream] = {}
        self.listeners: list[StreamListener] = []
        self._ticks: dict[int, _Tick] = {}
        self._last_fut: asyncio.Future[None] | None = None
        self._last_tick: _Tick | None = None
        self._expiry_timer: Timer | None = None
        self._expiry_at = 0
        self.loaded = LoadProgress()
        self.batches = AtomicBatches(clock)
        # The server's JetStream limits (engine/limits.py); set by whoever runs the server.
        self.limits = ServerLimits()
        # The bytes the streams of each storage kind hold, kept as they change (_room).
        self._held = {"file": BytesHeld(), "memory": BytesHeld()}
        # The one timer heap for delayed work (stream schedules, HTTP scheduled messages).
        self.timetable = sched.Timetable(clock)
        self._counters: dict[str, counters.CounterValues] = {}
        self._schedules: dict[tuple[str, str], sched.Schedule] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self._producing = False  # storing what a schedule produced
        # Sends what streams with ``republish`` store, once durable (a front door
        # sets its sink).
        self.republisher = Republisher()
        self.listeners.append(self.republisher)
        # The message a delete marker being stored stands for (its republished
        # Nats-Last-Sequence, as nats-server reports it).
        self._marker_for = 0
        store.on_refused(self._take_back)

    def set_limits(self, limits: ServerLimits) -> None:
        """The server's JetStream limits, atomic batches' included (0: nats-server's)."""
        self.limits = limits
        batch = BatchLimits()
        self.batches.limits = BatchLimits(
            max_size=limits.batch_max_msgs or batch.max_size,
            inflight_per_stream=limits.batch_inflight_per_stream or batch.inflight_per_stream,
            inflight_total=limits.batch_inflight_total or batch.inflight_total,
            timeout_ns=limits.batch_timeout_ns or batch.timeout_ns,
        )

    # -- startup ---------------------------------------------------------------------------
    async def load(self) -> None:
        """Rebuild every stream's index from storage (after a restart or a crash)."""
        now = self.clock.now()
        records = await self.store.load_streams()
        self.loaded.streams_total = len(records)  # the same object: progress lines read it
        for record in records:
            config = decode_stored_config(record.config)
            if record.compression != config.compression:
                # Stored before the store kept the setting: from now on it applies it.
                self.store.put_stream(
                    StreamRecord(record.name, record.config, record.created_ns, config.compression)
                )
            stream = Stream(config, record.created_ns)
            self.loaded.current = record.name
            index = await self.store.load_index(record.name, stream.sizing)
            stream.load(index, await self.store.load_last_seq(record.name))
            await self._restore_dedup(stream, index, now)
            await self._restore_ttls(stream, index)
            self.streams[stream.name] = stream
            self._count(stream)
            self.loaded.streams += 1
            self.loaded.messages += len(index)
        self.loaded.current = ""
        for stream in self.streams.values():
            await self._load_features(stream)
        for stream in self.streams.values():
            # A failed commit may have left messages the limits had already evicted.
            removed = stream.enforce_limits()
            if removed:
                self._delete_seqs(stream, removed)
            self._expire(stream)
        self._schedule_expiry()

    async def _load_features(self, stream: Stream) -> None:
        """Counter totals and live schedules, from what the store holds."""
        cfg = stream.config
        if cfg.allow_msg_counter:
            values = self._counters[stream.name] = counters.CounterValues()
            seq = stream.first_seq
            while seq <= stream.last_seq:
                msgs = await self.store.read_range(stream.name, seq, 1000)
                if not msgs:
                    break
                for msg in msgs:
                    values.set(msg.seq, counters.read_value(msg.data))
                    raw = _header_fields(msg.headers).get(counters.SOURCES)
                    if raw is not None:
                        values.sources[msg.seq] = counters.read_sources(raw)
                seq = msgs[-1].seq + 1
        if cfg.allow_msg_schedules:
            await self._load_schedules(stream)

    async def _load_schedules(self, stream: Stream) -> None:
        """Every schedule is the last message of its subject; when it fires next is
        what the last message it produced says (see ``schedules``)."""
        lasts = sorted(stream.last_by_subject(s) for s in stream.subjects_state(">"))
        found: list[sched.Schedule] = []
        for i in range(0, len(lasts), 1000):
            for msg in await self.store.read_many(stream.name, lasts[i : i + 1000]):
                fields = _header_fields(msg.headers) if msg.headers else {}
                if not fields.get(sched.SCHEDULE):
                    continue
                try:
                    schedule = sched.check_publish(
                        msg.subject,
                        stream.config.subjects,
                        True,
                        True,
                        fields,
                        lambda _v: True,
                    )
                except errors.ApiError:
                    continue
                if schedule is not None:
                    schedule.stream = stream.name
                    schedule.seq = msg.seq
                    schedule.due_ns = schedule.pattern.first_due(msg.ts)
                    found.append(schedule)
        for schedule in found:
            if schedule.pattern.kind != "at":
                nxt = await self._last_produced(stream, schedule)
                if nxt:
                    schedule.due_ns = nxt
            self._arm_schedule(schedule)

    async def _last_produced(self, stream: Stream, schedule: sched.Schedule) -> int:
        """The next fire the newest message ``schedule`` produced recorded, or 0."""
        seqs = [s for s in stream.seqs_matching(schedule.seq + 1, (schedule.target,))]
        while seqs:
            chunk, seqs = seqs[-64:], seqs[:-64]
            for msg in reversed(await self.store.read_many(stream.name, chunk)):
                fields = _header_fields(msg.headers) if msg.headers else {}
                if fields.get(sched.SCHEDULER) == schedule.subject.encode():
                    return sched.next_from_produced(fields) or 0
        return 0

    async def _restore_dedup(self, stream: Stream, index: list[MessageMeta], now: int) -> None:
        cutoff = now - stream.config.duplicate_window
        recent = [m.seq for m in index if m.ts >= cutoff]
        if index and not recent:
            recent = [index[-1].seq]  # for Nats-Expected-Last-Msg-Id
        for i in range(0, len(recent), 1000):
            for msg in await self.store.read_many(stream.name, recent[i : i + 1000]):
                msg_id = _header_fields(msg.headers).get(MSG_ID) if msg.headers else None
                if msg_id:
                    stream.remember_msg_id(msg_id.decode(errors="replace"), msg.seq, msg.ts)

    async def _restore_ttls(self, stream: Stream, index: list[MessageMeta]) -> None:
        """Per-message TTLs and delete markers are in the stored headers: read them back."""
        if not stream.config.allow_msg_ttl or not index:
            return
        for i in range(0, len(index), 10_000):
            part = index[i : i + 10_000]
            try:
                cols = await self.store.read_columns(
                    stream.name, part[0].seq, part[-1].seq, len(part)
                )
                found = list(zip(cols.seqs, cols.headers, cols.stamps, strict=True))
            except CorruptMessage:
                # One message at a time, so that a damaged one (reported when it is
                # read, repaired by `tether store repair`) costs no other its TTL.
                found = await self._readable(stream, part)
            for seq, block, ts in found:
                if block and MSG_TTL in block:
                    self._track_headers(stream, seq, ts, block, False)

    async def _readable(
        self, stream: Stream, metas: list[MessageMeta]
    ) -> list[tuple[int, bytes, int]]:
        out: list[tuple[int, bytes, int]] = []
        for meta in metas:
            try:
                msg = await self.store.read(stream.name, meta.seq)
            except CorruptMessage as exc:
                log.warning("stream %s: %s; its TTL, if any, is not applied", stream.name, exc)
                continue
            if msg is not None:
                out.append((msg.seq, msg.headers, msg.ts))
        return out

    # -- stream management ------------------------------------------------------------------
    def _notify_changed(self, stream: Stream) -> None:
        for listener in self.listeners:
            listener.on_stream_changed(stream)

    async def create_stream(self, name: str, body: bytes) -> tuple[Stream, bool]:
        """STREAM.CREATE: returns (stream, created); identical re-create succeeds.

        The checks run in nats-server's order, so the first error reported is the same.
        """
        config = decode_config(body)
        check_create(name, config)
        if self.limits.sized and _names_storage(body):
            # nats-server reserves the request's max_bytes before it checks the rest;
            # a request naming no storage is only checked once defaults are filled.
            self._reserve(config, config.max_bytes)
        normalize(config, self._config_of, self.limits.duplicate_window_ns)
        if config.num_replicas > 1:
            raise errors.replicas_not_supported()
        existing = self.streams.get(config.name)
        if existing is not None:
            if encode_config(existing.config) == encode_config(config):
                return existing, False
            raise errors.stream_name_exists()
        self._reserve(config, config.max_bytes)
        self._check_overlap(config, None)
        stream = Stream(config, self.clock.now())
        stream.start_empty()
        self.streams[config.name] = stream
        self._count(stream)
        try:
            await self._durable(
                self.store.put_stream(
                    StreamRecord(
                        config.name, encode_config(config), stream.created_ns, config.compression
                    )
                )
            )
        except errors.ApiError:
            if self.streams.get(config.name) is stream:
                del self.streams[config.name]
                self._uncount(stream)
            raise
        log.debug("stream %s created (subjects %s)", stream.name, ", ".join(config.subjects))
        self._notify_changed(stream)
        if config.max_age:
            # A timer pending for a long TTL must not hold up this stream's max_age.
            self._schedule_expiry()
        return stream, True

    async def update_stream(self, name: str, body: bytes) -> Stream:
        """STREAM.UPDATE, with nats-server's checks in its order."""
        config = normalize(decode_config(body), self._config_of, self.limits.duplicate_window_ns)
        if config.name != name:
            raise errors.stream_name_mismatch()
        stream = self.get_stream(name)
        check_update(stream.config, config)
        self._check_overlap(config, stream)
        # Only a raised max_bytes reserves more (0 when it stays or shrinks).
        self._reserve(config, max(0, max(config.max_bytes, 0) - max(stream.config.max_bytes, 0)))
        stream.config = config
        removed = stream.enforce_limits()
        if removed:
            self._delete_seqs(stream, removed)
        await self._durable(
            self.store.put_stream(
                StreamRecord(
                    config.name, encode_config(config), stream.created_ns, config.compression
                )
            )
        )
        log.debug("stream %s updated", name)
        self._notify_changed(stream)
        self._schedule_expiry()
        return stream

    def _check_overlap(self, config: StreamConfig, own: Stream | None) -> None:
        for other in self.streams.values():
            if other is own or other.name == config.name:
                continue
            for a in config.subjects:
                for b in other.config.subjects:
                    if filters_overlap(a, b):
                        raise errors.subjects_overlap()

    def _reserve(self, config: StreamConfig, add: int) -> None:
        """nats-server's server check of a stream's ``max_bytes`` (10028 / 10047): ``add``
        bytes on top of what every stream of its storage reserves, itself included."""
        if self.limits.sized:
            self.limits.check_reservation(config.storage, add, self.reserved(config.storage))

    def reserved(self, storage: str) -> int:
        """The ``max_bytes`` the streams with ``storage`` reserve."""
        return sum(
            s.config.max_bytes
            for s in self.streams.values()
            if s.config.storage == storage and s.config.max_bytes > 0
        )

    def used(self, storage: str) -> int:
        """The bytes the streams with ``storage`` hold, as nats-server counts them."""
        return self._held[storage].bytes

    def _count(self, stream: Stream) -> None:
        """``stream`` joins the streams of its storage: its bytes count with theirs."""
        held = self._held[stream.config.storage]
        held.bytes += stream.state.bytes
        stream.held = held

    def _uncount(self, stream: Stream) -> None:
        """``stream`` is gone: its bytes no longer count, nor what it still removes."""
        stream.held.bytes -= stream.state.bytes
        stream.held = BytesHeld(stream.state.bytes)

    def _room(self, stream: Stream) -> int | None:
        """How many bytes the server's bound for ``stream``'s storage leaves to it (the
        other streams' bytes taken off; below 0 when they hold more), or None when
        there is no bound. The bytes of each storage are kept as they change, so this
        is exact and costs the same with one stream or thousands."""
        bound = self.limits.bound(stream.config.storage)
        if bound < 0:
            return None
        return bound - (stream.held.bytes - stream.state.bytes)

    def _fits(self, stream: Stream, room: int | None, sizes: list[int]) -> bool:
        """Whether every message of a run of ``sizes`` bytes passes the full-store
        check of :meth:`_check_full` (the last one is checked before it is stored, so
        its own size does not count), given ``room`` from :meth:`_room`."""
        return room is None or stream.state.bytes + sum(sizes) - sizes[-1] <= room

    def _check_full(self, stream: Stream) -> None:
        """nats-server's ``limitsExceeded``: 10023 once the streams of ``stream``'s
        storage hold more than the server's bound."""
        room = self._room(stream)
        if room is not None and stream.state.bytes > room:
            raise errors.insufficient_resources()

    def _config_of(self, name: str) -> StreamConfig | None:
        stream = self.streams.get(name)
        return stream.config if stream is not None else None

    def get_stream(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            raise errors.stream_not_found()
        return stream

    async def delete_stream(self, name: str) -> None:
        stream = self.get_stream(name)
        del self.streams[name]
        self._uncount(stream)
        self.batches.drop_stream(name)
        self._counters.pop(name, None)
        for listener in self.listeners:
            listener.on_stream_deleted(stream)
        await self._durable(self.store.delete_stream(name))
        log.debug("stream %s deleted", name)

    async def purge_stream(self, name: str, filter_: str, seq: int, keep: int) -> int:
        """STREAM.PURGE: everything, or what ``filter_`` matches, below ``seq`` or but ``keep``."""
        if seq and keep:
            raise errors.bad_request()
        stream = self.get_stream(name)
        if stream.config.sealed:
            raise errors.stream_sealed()
        if stream.config.deny_purge:
            raise errors.purge_not_permitted()
        last = stream.last_seq
        removed = stream.purge(filter_, seq, keep)
        if removed:
            self._delete_seqs(stream, removed)
        if stream.last_seq > last:
            # Numbering moved forward: storage keeps the high-water mark of every append,
            # so store a placeholder at the new last sequence and delete it at once.
            mark = StoredMessage(stream.last_seq, name, b"", b"", self.clock.now())
            self.store.append(name, mark)
            self.store.delete_range(name, mark.seq, mark.seq)
        await self._durable(self.store.flush())
        return len(removed)

    async def delete_message(self, name: str, seq: int) -> None:
        """STREAM.MSG.DELETE, with nats-server's errors for each kind of missing seq."""
        stream = self.get_stream(name)
        if stream.config.sealed:
            raise errors.stream_sealed()
        if stream.config.deny_delete:
            raise errors.delete_not_permitted()
        if seq > stream.last_seq:
            raise errors.msg_delete_failed("stream store EOF")
        if seq <= 0 or seq < stream.first_seq:
            raise errors.msg_delete_failed("no message found")
        if stream.remove(seq) is None:
            raise errors.sequence_not_found(seq)
        self._delete_seqs(stream, [seq])
        await self._durable(self.store.flush())

    def _delete_seqs(self, stream: Stream, seqs: list[int]) -> asyncio.Future[None]:
        if len(seqs) > 1 and seqs[-1] - seqs[0] + 1 == len(seqs):
            fut = self.store.delete_range(stream.name, seqs[0], seqs[-1])
        else:
            fut = self.store.delete_messages(stream.name, seqs)
        for listener in self.listeners:
            listener.on_messages_removed(stream, seqs)
        return fut

    def remove_messages(self, stream: Stream, seqs: list[int]) -> None:
        """Retention (interest, workqueue): drop acked messages, in the current commit."""
        removed = stream.remove_many(sorted(seqs))
        if removed:
            self._delete_seqs(stream, removed)

    async def _durable(self, fut: asyncio.Future[None]) -> None:
        try:
            await fut
        except StorageError as exc:
            raise _storage_failed(exc) from None

    # -- publishing ---------------------------------------------------------------------------
    def publish(
        self,
        stream: Stream,
        subject: str,
        headers: bytes | None,
        payload: bytes,
        on_durable: Callable[[PubAck | errors.ApiError], None] | None,
    ) -> None:
        """Store one message captured by ``stream``.

        ``on_durable`` gets the PubAck once the commit holding the message is durable,
        or the error (an immediate rejection, or the commit failing). A duplicate
        (``Nats-Msg-Id`` inside the window) is acknowledged with the original seq.
        """
        if stream.config.subject_transform:
            subject = _stored_subject(stream.config, subject)
        self._publish_one(stream, subject, headers, payload, on_durable, None)

    def publish_reply(
        self,
        stream: Stream,
        subject: str,
        headers: bytes | None,
        payload: bytes,
        sink: PubAckSink,
        reply: str,
    ) -> None:
        """:meth:`publish`, answered through ``sink`` for ``reply`` instead of a callback."""
        if stream.config.subject_transform:
            subject = _stored_subject(stream.config, subject)
        self._publish_one(stream, subject, headers, payload, sink, [reply])

    def publish_many(
        self,
        stream: Stream,
        subject: str,
        payloads: list[bytes],
        replies: list[str],
        sink: PubAckSink | None,
    ) -> None:
        """Store a run of messages without headers to one subject, in order.

        The outcome is that of :meth:`publish_reply` called for each message in turn
        (same sequences, refusals, evictions and PubAcks); only the work is shared:
        one clock read, one group-commit lookup and one waiter for the whole run.
        ``replies[i]`` answers ``payloads[i]`` ("" when nobody asked); ``sink`` None
        means nobody is answered (a ``no_ack`` stream).
        """
        if stream.config.subject_transform:
            subject = _stored_subject(stream.config, subject)
        if stream.config.allow_msg_counter:
            # Each is refused for its missing Nats-Incr, as one publish would be.
            for payload, reply in zip(payloads, replies, strict=True):
                self._publish_one(stream, subject, None, payload, sink, [reply] if reply else None)
            return
        cfg = stream.config
        name = stream.name
        if not payloads:
            return
        if cfg.republish and not cfg.sealed:
            # Each message is republished with its own headers: one at a time.
            for payload, reply in zip(payloads, replies, strict=True):
                target = sink if reply else None
                self._publish_one(stream, subject, None, payload, target, [reply])
            return
        if cfg.sealed:
            if sink is not None:
                asked = [reply for reply in replies if reply]
                if asked:
                    sink.pub_failed(name, asked, errors.stream_sealed())
            return
        now = self.clock.now()
        limit = cfg.max_msg_size
        discard_new = cfg.discard == "new"
        plain = stream.sizing.plain
        overhead = subject_size(subject) + plain
        room = self._room(stream)  # None unless the server bounds this storage
        sizes = [overhead + len(payload) for payload in payloads]
        if limit < 0 and not discard_new and not stream.evicts and self._fits(stream, room, sizes):
            # Nothing can refuse or evict any of them: index the run in one go.
            first = stream.append_run(subject, sizes, now)
            store_append = self.store.append
            seq = first
            for payload in payloads:
                store_append(name, StoredMessage(seq, subject, b"", payload, now, 0))
                seq += 1
            self._ran(stream, first, seq - 1, sink, replies)
            return
        append = stream.append
        store_append = self.store.append
        accepted: list[str] = []
        first = 0
        seq = 0
        for payload, reply in zip(payloads, replies, strict=True):
            plen = len(payload)
            size = overhead + plen
            # The checks of :meth:`_publish_one` that apply without headers, in its order.
            if (limit >= 0 and plen > limit) or discard_new or room is not None:
                try:
                    stream.check_size(0, plen)
                    if room is not None and stream.state.bytes > room:
                        raise errors.insufficient_resources()
                    stream.check_limits_for_new(subject, size, False)
                except errors.ApiError as exc:
                    if reply and sink is not None:
                        sink.pub_failed(name, [reply], exc)
                    continue
            seq = stream.last_seq + 1
            if not first:
                first = seq
            removed = append(MessageMeta(seq, subject, size, now, 0, plain), "")
            store_append(name, StoredMessage(seq, subject, b"", payload, now, 0))
            if removed:
                self._delete_seqs(stream, removed)
            accepted.append(reply)
        if accepted:
            self._ran(stream, first, seq, sink, accepted)

    def publish_mixed(
        self,
        stream: Stream,
        subjects: list[str],
        payloads: list[bytes],
        replies: list[str],
        sink: PubAckSink | None,
    ) -> None:
        """:meth:`publish_many` for a run whose messages each have their own subject
        (``subjects[i]`` for ``payloads[i]``): the same outcome as publishing them one
        by one. A stream without limits that could refuse or evict (the server's bound
        included, unless the whole run fits under it) indexes the run in one go; any
        other takes it a subject run at a time."""
        cfg = stream.config
        if (
            cfg.sealed
            or cfg.max_msg_size >= 0
            or cfg.discard == "new"
            or stream.evicts
            or cfg.allow_msg_counter
            or cfg.republish
        ):
            self._publish_subject_runs(stream, subjects, payloads, replies, sink)
            return
        if not payloads:
            return
        stored = subjects
        if cfg.subject_transform:
            stored = [_stored_subject(cfg, subject) for subject in subjects]
        plain = stream.sizing.plain
        sizes = [subject_size(s) + plain + len(p) for s, p in zip(stored, payloads, strict=True)]
        if not self._fits(stream, self._room(stream), sizes):
            self._publish_subject_runs(stream, subjects, payloads, replies, sink)
            return
        subjects = stored
        now = self.clock.now()
        first = stream.append_mixed(subjects, sizes, now)
        store_append = self.store.append
        name = stream.name
        seq = first
        for subject, payload in zip(subjects, payloads, strict=True):
            store_append(name, StoredMessage(seq, subject, b"", payload, now, 0))
            seq += 1
        self._ran(stream, first, seq - 1, sink, replies)

    def _publish_subject_runs(
        self,
        stream: Stream,
        subjects: list[str],
        payloads: list[bytes],
        replies: list[str],
        sink: PubAckSink | None,
    ) -> None:
        """:meth:`publish_mixed` a run of one subject at a time (:meth:`publish_many`)."""
        start = 0
        n = len(subjects)
        for i in range(1, n + 1):
            if i == n or subjects[i] != subjects[start]:
                self.publish_many(
                    stream, subjects[start], payloads[start:i], replies[start:i], sink
                )
                start = i

    def publish_headered(
        self,
        stream: Stream,
        subject: str,
        headers: list[bytes],
        payloads: list[bytes],
        replies: list[str],
        sink: PubAckSink | None,
        start: int = 0,
    ) -> int:
        """Store a run of messages with headers to one subject, from ``start`` on, in
        order, while their headers need nothing beyond a TTL and a msg id; returns the
        index of the first message not handled (``len(payloads)`` when all were).

        The outcome is that of :meth:`publish_reply` for each message in turn (same
        sequences, refusals, duplicates and PubAcks): only the work is shared. A header
        block is read once per distinct block of the run (``Nats-TTL`` blocks repeat
        byte for byte), and the clock read and group-commit booking are per run. A
        message whose headers ask for more (expectations, rollup, batches, counters,
        schedules, markers...) or a stream whose settings act per message (sealed,
        counters, republish) is left to the caller, which publishes it on its own.
        """
        cfg = stream.config
        n = len(payloads)
        if start >= n or cfg.sealed or cfg.allow_msg_counter or cfg.republish:
            return start
        if cfg.subject_transform:
            subject = _stored_subject(cfg, subject)
        name = stream.name
        now = self.clock.now()
        store_append = self.store.append
        append = stream.append
        sizing = stream.sizing
        overhead = subject_size(subject)
        # Per distinct header block: (stored block, TTL, msg id field, refusal).
        known: dict[bytes, tuple[bytes, int, bytes, errors.ApiError | None] | None] = {}
        # The accepted messages not yet booked into the commit: first..seq.
        first = 0
        seq = 0
        accepted: list[str] = []
        ids: list[str] | None = None  # msg ids of first..seq, when any has one
        # Without limits that could refuse or evict, messages without a msg id are
        # indexed and stored a stretch at a time (pending until then).
        # The server's bound allows that while what is pending keeps under it.
        room = self._room(stream)  # None unless the server bounds this storage
        bulk = cfg.max_msg_size < 0 and cfg.discard != "new" and not stream.evicts
        p_blocks: list[bytes] = []
        p_payloads: list[bytes] = []
        p_sizes: list[int] = []
        p_ttls: list[int] = []
        p_bytes = 0  # sum(p_sizes)
        i = start
        while i < n:
            block = headers[i]
            if block in known:
                plan = known[block]
            else:
                plan = known[block] = _plain_headers(stream, subject, block)
            if plan is None:
                break  # headers that need the general path
            hdrs, ttl, raw_id, refusal = plan
            payload = payloads[i]
            reply = replies[i]
            i += 1
            if refusal is not None:
                if reply and sink is not None:
                    sink.pub_failed(name, [reply], refusal)
                continue
            if (
                bulk
                and not raw_id
                and len(hdrs) <= 65535
                and (room is None or stream.state.bytes + p_bytes <= room)
            ):
                p_blocks.append(hdrs)
                p_payloads.append(payload)
                size = overhead + len(hdrs) + len(payload) + sizing.overhead(hdrs)
                p_sizes.append(size)
                p_bytes += size
                p_ttls.append(ttl)
                accepted.append(reply)
                if ids is not None:
                    ids.append("")
                continue
            if p_payloads:
                pfirst = self._store_run(
                    stream, subject, now, p_blocks, p_payloads, p_sizes, p_ttls
                )
                if not first:
                    first = pfirst
                seq = pfirst + len(p_payloads) - 1
                p_blocks, p_payloads, p_sizes, p_ttls = [], [], [], []
                p_bytes = 0
            msg_id = ""
            try:
                if raw_id:
                    try:
                        msg_id = raw_id.decode()
                    except UnicodeDecodeError:
                        raise errors.invalid_header("Nats-Msg-Id", "not UTF-8") from None
                    dup = stream.duplicate_of(msg_id, now)
                    if dup:
                        if first:  # the original may be among them: booked first
                            self._book(stream, first, seq, sink, accepted, ids)
                            first, accepted, ids = 0, [], None
                        if reply and sink is not None:
                            self._ack_duplicate(stream, dup, sink, [reply])
                        continue
                stream.check_size(len(hdrs), len(payload))
                if room is not None and stream.state.bytes > room:
                    raise errors.insufficient_resources()
                extra = sizing.overhead(hdrs)
                size = overhead + len(hdrs) + len(payload) + extra
                stream.check_limits_for_new(subject, size, False)
            except errors.ApiError as exc:
                if reply and sink is not None:
                    sink.pub_failed(name, [reply], exc)
                continue
            seq = stream.last_seq + 1
            if not first:
                first = seq
            removed = append(MessageMeta(seq, subject, size, now, 0, extra), msg_id)
            if ttl:
                self._track_ttl(stream, seq, now, ttl, False, True)
            store_append(name, StoredMessage(seq, subject, hdrs, payload, now, 0))
            if removed:
                self._delete_seqs(stream, removed)
            if msg_id and ids is None:
                ids = [""] * len(accepted)
            if ids is not None:
                ids.append(msg_id)
            accepted.append(reply)
        if p_payloads:
            pfirst = self._store_run(stream, subject, now, p_blocks, p_payloads, p_sizes, p_ttls)
            if not first:
                first = pfirst
            seq = pfirst + len(p_payloads) - 1
        if first:
            self._book(stream, first, seq, sink, accepted, ids)
        return i

    def _store_run(
        self,
        stream: Stream,
        subject: str,
        now: int,
        blocks: list[bytes],
        payloads: list[bytes],
        sizes: list[int],
        ttls: list[int],
    ) -> int:
        """Index and store messages with headers (``blocks``) and TTLs (0: none) to
        ``subject`` in one go, in a stream that does not :attr:`~Stream.evicts`; returns
        the first sequence. Booking them into the commit is the caller's."""
        if all(blocks):  # the usual run: every message with a header block
            first = stream.append_run(subject, sizes, now, stream.sizing.headers)
        else:
            extras = [stream.sizing.overhead(block) for block in blocks]
            first = stream.append_mixed([subject] * len(sizes), sizes, now, extras)
        name = stream.name
        store_append = self.store.append
        seq = first
        for block, payload in zip(blocks, payloads, strict=True):
            store_append(name, StoredMessage(seq, subject, block, payload, now, 0))
            seq += 1
        ttl = ttls[0]
        if ttl > 0 and ttls.count(ttl) == len(ttls):
            # One TTL for them all (the usual run): one deadline, one slot.
            deadline = now + ttl * NS
            stream.ttls.add_many(range(first, seq), deadline, stream.durable_seq)
            if self._expiry_timer is None or deadline < self._expiry_at:
                self._schedule_expiry()
        elif any(ttls):
            for k, each in enumerate(ttls):
                if each:
                    self._track_ttl(stream, first + k, now, each, False, True)
        return first

    def _book(
        self,
        stream: Stream,
        first: int,
        last: int,
        sink: PubAckSink | None,
        replies: list[str],
        ids: list[str] | None,
    ) -> None:
        """:meth:`_ran` for appends that may carry msg ids (``ids[k]`` for ``first + k``):
        each of those is booked on its own, so a failed commit forgets its id."""
        if ids is None or not any(ids):
            self._ran(stream, first, last, sink, replies)
            return
        tick = self._tick_for(self.store.flush())
        name = stream.name
        appended = tick.appended
        for k, msg_id in enumerate(ids):
            appended.append((stream, first + k, first + k, msg_id))
        if name not in tick.first_seq:
            tick.first_seq[name] = first
        if sink is not None and not self._merge_waiter(tick, sink, name, first, replies):
            tick.waiters.append((sink, name, first, replies, False))
        if stream.config.max_age and not self._expiry_timer:
            self._schedule_expiry()

    def _ran(
        self, stream: Stream, first: int, last: int, sink: PubAckSink | None, replies: list[str]
    ) -> None:
        """Book a run of appends stored at ``first..last`` into the current tick.

        A run that continues the tick's last one (same stream, next sequence, same
        sink) is merged into it: a publisher alternating between subjects sends runs of
        one message, which are then acknowledged together all the same.
        """
        tick = self._tick_for(self.store.flush())
        name = stream.name
        appended = tick.appended
        prev = appended[-1] if appended else None
        if prev is not None and prev[0] is stream and prev[2] + 1 == first and not prev[3]:
            appended[-1] = (stream, prev[1], last, "")
        else:
            appended.append((stream, first, last, ""))
            if name not in tick.first_seq:
                tick.first_seq[name] = first
        if sink is not None and not self._merge_waiter(tick, sink, name, first, replies):
            tick.waiters.append((sink, name, first, replies, False))
        if stream.config.max_age and not self._expiry_timer:
            self._schedule_expiry()

    @staticmethod
    def _merge_waiter(
        tick: _Tick, sink: PubAckSink, name: str, first: int, replies: list[str]
    ) -> bool:
        """Add ``replies`` (for ``first``…) to the tick's last waiter if it is the same
        sink's for the sequences just before; whether it was."""
        if not tick.waiters:
            return False
        target, wname, wfirst, wreplies, duplicate = tick.waiters[-1]
        if (
            target is not sink
            or wname != name
            or wreplies is None
            or duplicate
            or wfirst + len(wreplies) != first
        ):
            return False
        if tick.merged is wreplies:
            wreplies += replies  # a list this tick built: extended in place
        else:
            tick.merged = wreplies + replies
            tick.waiters[-1] = (sink, name, wfirst, tick.merged, False)
        return True

    def _publish_one(
        self,
        stream: Stream,
        subject: str,
        headers: bytes | None,
        payload: bytes,
        target: Any,
        replies: list[str] | None,
    ) -> None:
        """One publish, answered through ``target``: a callback (or None) when
        ``replies`` is None, else a :class:`PubAckSink` for ``replies`` (one reply).

        ``subject`` is the one stored: the stream's input transform, if any, was
        applied by the caller (a marker or a message stored again is not transformed
        twice)."""
        cfg = stream.config
        now = self.clock.now()
        hdrs = headers or b""
        msg_id = ""
        priority = 0
        rollup = ""
        incr: int | None = None
        sources: counters.Sources | None = None
        schedule: sched.Schedule | None = None
        stop = ""
        ttl = 0
        try:
            if cfg.sealed:
                raise errors.stream_sealed()
            if cfg.allow_msg_counter and not hdrs:
                raise counters.missing()
            if hdrs:
                # The checks and their order are nats-server's: expectations, dedup,
                # expected last msg id, rollup, sizes, then the discard-new limits.
                fields = _header_fields(hdrs)
                if fields.get(BATCH_ID) and not self._producing:
                    self._publish_batched(stream, subject, hdrs, payload, fields, target, replies)
                    return
                sourced = counters.SOURCED in fields
                if sourced:
                    # A copy a source made is stored as it came, but a counter stream
                    # adds the source's change since its last copy.
                    if cfg.allow_msg_counter and counters.INCR in fields:
                        known = self._counter_values(stream).sources
                        last = stream.last_by_subject(subject)
                        prev = known.get(last)
                        if prev is None and last in known:
                            raise counters.broken()  # Nats-Counter-Sources is not JSON
                        incr, sources = counters.sourced_increment(
                            payload, fields[counters.SOURCED], prev, subject
                        )
                        hdrs = counters.with_header(hdrs, counters.INCR, str(incr).encode())
                elif cfg.allow_msg_counter or counters.INCR in fields:
                    if cfg.allow_msg_counter and MSG_TTL in fields:
                        stream.check_expectations(subject, None, None, None, None, fields[MSG_TTL])
                    incr = counters.check(cfg.allow_msg_counter, fields, payload)
                if sourced:
                    pass  # schedules are the origin's business
                elif fields.get(sched.SCHEDULE):
                    schedule = self._check_schedule(stream, subject, fields)
                    if schedule is not None and ROLLUP not in fields:
                        hdrs = sched.with_rollup(hdrs)
                        fields[ROLLUP] = b"sub"
                elif sched.SCHEDULER in fields or sched.NEXT in fields:
                    stop = sched.check_stop(
                        subject, cfg.allow_msg_schedules, fields, self._is_schedule(stream)
                    )
                ttl = stream.check_expectations(
                    subject,
                    fields.get(EXPECTED_STREAM),
                    fields.get(EXPECTED_LAST_SEQ),
                    fields.get(EXPECTED_LAST_SUBJ_SEQ),
                    fields.get(EXPECTED_LAST_SUBJ_SEQ_SUBJECT),
                    fields.get(MSG_TTL),
                )
                raw_id = fields.get(MSG_ID)
                if raw_id:
                    try:
                        msg_id = raw_id.decode()
                    except UnicodeDecodeError:
                        raise errors.invalid_header("Nats-Msg-Id", "not UTF-8") from None
                    dup = stream.duplicate_of(msg_id, now)
                    if dup:
                        if target is not None:
                            self._ack_duplicate(stream, dup, target, replies)
                        return
                raw_last_id = fields.get(EXPECTED_LAST_MSG_ID)
                if raw_last_id:
                    stream.check_last_msg_id(raw_last_id)
                raw_rollup = fields.get(ROLLUP)
                if raw_rollup:
                    if not cfg.allow_rollup_hdrs or cfg.deny_purge:
                        raise errors.rollup_not_permitted()
                    rollup = raw_rollup.decode(errors="replace").lower()
                    if rollup not in ("sub", "all"):
                        raise errors.invalid_rollup(rollup)
                raw_priority = fields.get(PRIORITY)
                if raw_priority:
                    # Checked here, not by the store: a value it cannot hold would fail
                    # the whole commit, and every publish of the tick with it.
                    parsed = parse_priority(raw_priority)
                    if parsed is None:
                        raise errors.invalid_header("Tether-Priority", PRIORITY_RANGE)
                    priority = parsed
                if ttl > 0 and cfg.subject_delete_marker_ttl:
                    # A TTL below the delete markers' is raised to it (nats-server's
                    # rule), and the TTL applied is the one stored.
                    floor = cfg.subject_delete_marker_ttl // NS
                    if ttl < floor:
                        ttl = floor
                        hdrs = with_ttl(hdrs, floor)
            if incr is not None:
                total = self._counter_total(stream, subject) + incr
                payload = counters.body(total)
                if sources is None:  # what the subject knows of its sources goes on
                    values = self._counter_values(stream)
                    sources = values.sources.get(stream.last_by_subject(subject))
                if sources:
                    hdrs = counters.with_header(
                        hdrs, counters.SOURCES, counters.encode_sources(sources)
                    )
                if target is not None and replies is None:
                    target = _with_extras(target, val=str(total))
            stream.check_size(len(hdrs), len(payload))
            if self.limits.sized:
                self._check_full(stream)
            extra = stream.sizing.overhead(hdrs)
            size = subject_size(subject) + len(hdrs) + len(payload) + extra
            stream.check_limits_for_new(subject, size, bool(rollup))
        except errors.ApiError as exc:
            if target is not None:
                if replies is None:
                    target(exc)
                else:
                    target.pub_failed(stream.name, replies, exc)
            return
        if stop:
            self._stop_schedule(stream, stop)
        removed = stream.rollup(subject, rollup) if rollup else []
        seq = stream.last_seq + 1
        msg = StoredMessage(seq, subject, hdrs, payload, now, priority)
        if cfg.republish:
            last_on_subject = stream.last_by_subject(subject) or self._marker_for
            self.republisher.record(
                stream, cfg.republish, seq, subject, hdrs, payload, now, last_on_subject
            )
        removed += stream.append(MessageMeta(seq, subject, size, now, priority, extra), msg_id)
        if ttl:
            self._track_ttl(stream, seq, now, ttl, MARKER_REASON in fields, True)
        fut = self.store.append(stream.name, msg)
        if removed:
            self._delete_seqs(stream, removed)
        tick = self._tick_for(fut)
        tick.appended.append((stream, seq, seq, msg_id))
        if stream.name not in tick.first_seq:
            tick.first_seq[stream.name] = seq
        if target is not None and (
            replies is None or not self._merge_waiter(tick, target, stream.name, seq, replies)
        ):
            # One waiter per publish, unless it continues the last one's run (a publisher
            # sending messages with headers one by one is answered as a run all the same).
            tick.waiters.append((target, stream.name, seq, replies, False))
        if cfg.max_age and not self._expiry_timer:
            self._schedule_expiry()
        if incr is not None:
            self._counter_values(stream).set(seq, counters.read_value(payload))
            if sources:
                self._counter_values(stream).sources[seq] = sources
        if schedule is not None:
            schedule.stream = stream.name
            schedule.seq = seq
            schedule.due_ns = schedule.pattern.first_due(now)
            self._arm_schedule(schedule)

    # -- atomic batches ------------------------------------------------------------------------
    def publish_batch_message(
        self,
        stream: Stream,
        subject: str,
        block: bytes,
        payload: bytes,
        on_durable: Callable[[PubAck | errors.ApiError], None] | None,
    ) -> bool:
        """:meth:`publish` for the common atomic batch message, whose header block holds
        only its batch headers and maybe a ``Nats-Msg-Id``, without the general publish
        path's preamble: staged, or (its commit) the whole batch stored, with the same
        outcome and answers.

        Returns False, having done nothing, for any other message or a stream where
        the general path has more to do first (sealed, counters, a subject
        transform): the caller then publishes it with :meth:`publish`."""
        cfg = stream.config
        if cfg.sealed or cfg.allow_msg_counter or cfg.subject_transform or self._producing:
            return False
        fields = batch_fields(block)
        if fields is None:
            return False
        self._publish_batched(stream, subject, block, payload, fields, on_durable, None)
        return True

    def stage_batch_run(
        self,
        stream: Stream,
        subject: str,
        blocks: list[bytes],
        payloads: list[bytes],
        replies: list[str],
        start: int,
    ) -> int:
        """Stage the messages of a run from ``start`` on (all to ``subject``) that only
        continue an open atomic batch (see :meth:`AtomicBatches.stage_run`), in one
        call: no reply, nothing stored, nobody to answer. Returns the index of the first
        message not taken; the caller publishes that one on its own (its batch's first
        message or its commit, a reply, other headers, an error), then calls again."""
        cfg = stream.config
        if (
            not cfg.allow_atomic
            or cfg.sealed
            or cfg.allow_msg_counter
            or cfg.subject_transform
            or self._producing
        ):
            return start
        if self.limits.sized:
            try:
                # Staging stores nothing: what holds for one message holds for the run.
                self._check_full(stream)
            except errors.ApiError:
                return start  # each message is refused on its own
        return self.batches.stage_run(
            stream.name, subject, blocks, payloads, replies, start, cfg.max_msg_size
        )

    def _publish_batched(
        self,
        stream: Stream,
        subject: str,
        hdrs: bytes,
        payload: bytes,
        fields: dict[bytes, bytes],
        target: Any,
        replies: list[str] | None,
    ) -> None:
        """A message of an atomic batch: staged, or (its commit) the whole batch stored."""
        name = stream.name
        try:
            if self.limits.sized:
                self._check_full(stream)
            stream.check_size(len(hdrs), len(payload))
            batch = self.batches.stage(
                name, stream.config.allow_atomic, subject, hdrs, payload, fields
            )
            if batch is None:
                if target is not None:
                    _answer(target, name, replies, PubAck(name, 0, staged=True))
                return
            self._commit_batch(stream, batch, target, replies)
        except errors.ApiError as exc:
            _answer(target, name, replies, exc)

    def _commit_batch(
        self,
        stream: Stream,
        batch: Batch,
        target: Any,
        replies: list[str] | None,
    ) -> None:
        """Store a batch all or nothing: every message is checked against the stream as
        it was before the batch, then all are appended in this one synchronous call,
        which puts them in one group commit (one transaction)."""
        cfg = stream.config
        if cfg.sealed:
            raise errors.stream_sealed()
        if batch.plain and not cfg.allow_msg_counter:
            self._append_plain_batch(stream, batch, target, replies)
            return
        now = self.clock.now()
        last = stream.last_seq
        seen: set[str] = set()
        written: set[str] = set()
        totals: dict[str, int] = {}
        prepared: list[tuple[str, bytes, bytes, str, int, str]] = []
        # Schedules the batch sets and schedules it stops, by its message index.
        schedules: dict[int, sched.Schedule] = {}
        stops: dict[int, str] = {}
        sizes: list[int] = []
        batch_id = batch.id
        for i, (subject, headers, payload, fields) in enumerate(
            zip(batch.subjects, batch.headers, batch.payloads, batch.fields, strict=True)
        ):
            # None: nothing but batch headers, which no check below looks at.
            f = {} if fields is None else fields
            if EXPECTED_LAST_MSG_ID in f:
                raise batches_unsupported("Nats-Expected-Last-Msg-Id")
            if f.get(sched.SCHEDULE):
                schedule = self._check_schedule(stream, subject, f)
                if schedule is not None:
                    schedules[i] = schedule
                    if ROLLUP not in f:
                        headers = sched.with_rollup(headers)
                        f[ROLLUP] = b"sub"
            elif sched.SCHEDULER in f or sched.NEXT in f:
                stop = sched.check_stop(
                    subject, cfg.allow_msg_schedules, f, self._is_schedule(stream)
                )
                if stop:
                    stops[i] = stop
            expected_stream = f.get(EXPECTED_STREAM)
            if expected_stream and expected_stream != stream.name.encode():
                raise errors.expected_stream_mismatch()
            if MSG_TTL in f:
                stream.check_expectations(subject, None, None, None, None, f[MSG_TTL])
            if cfg.allow_msg_counter or counters.INCR in f:
                incr = counters.check(cfg.allow_msg_counter, f, payload)
                if incr is not None:
                    base = totals.get(subject)
                    if base is None:
                        base = self._counter_total(stream, subject)
                    totals[subject] = base + incr
                    payload = counters.body(base + incr)
            subj_seq = f.get(EXPECTED_LAST_SUBJ_SEQ)
            if subj_seq is not None:
                on = f.get(EXPECTED_LAST_SUBJ_SEQ_SUBJECT)
                on_subject = on.decode("utf-8", "surrogateescape") if on else subject
                if on_subject in written:
                    raise batches_wrong_last_sequence()
                stream.check_expectations(subject, None, None, subj_seq, on, None)
            raw_last = f.get(EXPECTED_LAST_SEQ)
            if raw_last is not None and (i or _uint(raw_last) != last):
                raise errors.wrong_last_sequence(last + i)
            msg_id = ""
            raw_id = f.get(MSG_ID)
            if raw_id:
                msg_id = raw_id.decode("utf-8", "replace")
                if msg_id in seen or stream.duplicate_of(msg_id, now):
                    raise batches_duplicate_id()
                seen.add(msg_id)
            rollup = ""
            raw_rollup = f.get(ROLLUP)
            if raw_rollup:
                if not cfg.allow_rollup_hdrs or cfg.deny_purge:
                    raise errors.rollup_not_permitted()
                rollup = raw_rollup.decode(errors="replace").lower()
                if rollup not in ("sub", "all"):
                    raise errors.invalid_rollup(rollup)
            priority = 0
            raw_priority = f.get(PRIORITY)
            if raw_priority:
                parsed = parse_priority(raw_priority)
                if parsed is None:
                    raise errors.invalid_header("Tether-Priority", PRIORITY_RANGE)
                priority = parsed
            stream.check_size(len(headers), len(payload))
            sizes.append(
                subject_size(subject)
                + len(headers)
                + len(payload)
                + stream.sizing.overhead(headers)
            )
            written.add(subject)
            prepared.append((subject, headers, payload, msg_id, priority, rollup))
        self._check_batch_limits(
            stream,
            [p[0] for p in prepared],
            sizes,
            [p[5] for p in prepared],
        )
        name = stream.name
        first = stream.last_seq + 1
        fut = None
        for i, (subject, hdrs, payload, msg_id, priority, rollup) in enumerate(prepared):
            if i in stops:
                self._stop_schedule(stream, stops[i])
            removed = stream.rollup(subject, rollup) if rollup else []
            seq = stream.last_seq + 1
            msg = StoredMessage(seq, subject, hdrs, payload, now, priority)
            extra = stream.sizing.overhead(hdrs)
            size = subject_size(subject) + len(hdrs) + len(payload) + extra
            meta = MessageMeta(seq, subject, size, now, priority, extra)
            if cfg.republish:
                last_on_subject = stream.last_by_subject(subject) or self._marker_for
                self.republisher.record(
                    stream, cfg.republish, seq, subject, hdrs, payload, now, last_on_subject
                )
            removed += stream.append(meta, msg_id)
            fut = self.store.append(name, msg)
            if removed:
                self._delete_seqs(stream, removed)
            if MSG_TTL in hdrs:
                self._track_headers(stream, seq, now, hdrs, True)
            if cfg.allow_msg_counter:
                self._counter_values(stream).set(seq, counters.read_value(payload))
            schedule = schedules.get(i)
            if schedule is not None:
                schedule.stream = name
                schedule.seq = seq
                schedule.due_ns = schedule.pattern.first_due(now)
                self._arm_schedule(schedule)
        assert fut is not None
        last_seq = stream.last_seq
        tick = self._tick_for(fut)
        for (_, _, _, msg_id, _, _), seq in zip(prepared, range(first, last_seq + 1), strict=True):
            tick.appended.append((stream, seq, seq, msg_id))
        tick.first_seq.setdefault(name, first)
        tick.atomic.append((name, first, last_seq))
        if target is not None:
            if replies is None:
                target = _with_extras(target, batch=batch_id, count=len(prepared))
            tick.waiters.append((target, name, last_seq, replies, False))
        if cfg.max_age and not self._expiry_timer:
            self._schedule_expiry()

    def _check_batch_limits(
        self,
        stream: Stream,
        subjects: list[str],
        sizes: list[int],
        rollups: list[str] | None,
    ) -> None:
        """The checks of a whole batch before any of it is stored, in nats-server's order:
        with ``discard: new``, each message in turn against ``max_msgs``, ``max_bytes``
        (counting the batch's messages before it) and ``discard_new_per_subject``
        (rollups pass: they purge the subject); then the server's bound for the
        stream's storage (10023). Where nats-server stores a batch's messages until one
        passes its bound and keeps those, the batch is refused whole: a batch is all or
        nothing. ``rollups``: each message's ``Nats-Rollup`` ("" without), None when
        none has one."""
        cfg = stream.config
        if cfg.discard == "new":
            st = stream.state
            max_msgs, max_bytes = cfg.max_msgs, cfg.max_bytes
            per_subject = cfg.max_msgs_per_subject if cfg.discard_new_per_subject else 0
            if per_subject > 0:
                # Message by message: which limit a message passes first decides the error.
                counts: dict[str, int] = {}
                total = st.bytes
                for i, (subject, size) in enumerate(zip(subjects, sizes, strict=True)):
                    total += size
                    if max_msgs > 0 and st.msgs + i + 1 > max_msgs:
                        raise errors.store_failed("maximum messages exceeded")
                    if max_bytes > 0 and total > max_bytes:
                        raise errors.store_failed("maximum bytes exceeded")
                    count = counts.get(subject)
                    if count is None:
                        count = stream.msgs_on(subject)
                    counts[subject] = count = count + 1
                    if count > per_subject and not (rollups and rollups[i]):
                        raise errors.store_failed("maximum messages per subject exceeded")
            else:
                if max_msgs > 0 and st.msgs + len(sizes) > max_msgs:
                    raise errors.store_failed("maximum messages exceeded")
                if max_bytes > 0 and st.bytes + sum(sizes) > max_bytes:
                    raise errors.store_failed("maximum bytes exceeded")
        room = self._room(stream)
        if room is not None and not self._fits(stream, room, sizes):
            # It would not fit were nothing evicted; the stream's limits (or a rollup)
            # may evict as the messages are stored, which nats-server checks each
            # message after.
            peak = stream.peak_bytes(subjects, sizes, rollups or [""] * len(sizes))
            if peak > room:
                raise errors.insufficient_resources()

    def _append_plain_batch(
        self,
        stream: Stream,
        batch: Batch,
        target: Any,
        replies: list[str] | None,
    ) -> None:
        """:meth:`_commit_batch` for the common batch: no header any check looks at one
        message at a time but ``Nats-Msg-Id``. The checks are those of
        :meth:`_commit_batch`, in its order: each message's msg id (against those
        before it and the window) then its size, then the ``discard: new`` limits. The
        batch is then one run: indexed in one go (as a run of header-less publishes is),
        its ids remembered, the stream-wide limits applied once (evicting what
        appending the messages one by one would have; with ``max_msgs_per_subject`` it
        is indexed message by message instead), handed to the store in one call and
        one entry in its group commit, hence one transaction."""
        now = self.clock.now()
        cfg = stream.config
        name = stream.name
        subjects, headers, payloads = batch.subjects, batch.headers, batch.payloads
        n = len(subjects)
        ids: list[str] | None = None
        if batch.ids:
            ids = [
                "" if f is None else f.get(MSG_ID, b"").decode("utf-8", "replace")
                for f in batch.fields
            ]
        # The first message refused for its id; the sizes of those before it are
        # checked first, as each message's size comes after its id. Staging checked
        # them, but an update may have lowered max_msg_size since, and a batch ended
        # by ``eob`` has a longer last header block now.
        dup = -1 if ids is None else stream.first_duplicate(ids, now)
        if cfg.max_msg_size >= 0 or len(headers[-1]) > MAX_HEADERS_LEN:
            check_size = stream.check_size
            for i in range(n if dup < 0 else dup):
                check_size(len(headers[i]), len(payloads[i]))
        if dup >= 0:
            raise batches_duplicate_id()
        # Every message of a batch has a header block (its batch headers at least).
        extra = stream.sizing.headers
        subject = subjects[0]
        one_subject = subjects.count(subject) == n
        if one_subject:
            # The common batch, all to one subject: sized as one run.
            base = subject_size(subject) + extra
            sizes = [base + len(h) + len(p) for h, p in zip(headers, payloads, strict=True)]
        else:
            sizes = [
                subject_size(s) + len(h) + len(p) + extra
                for s, h, p in zip(subjects, headers, payloads, strict=True)
            ]
        self._check_batch_limits(stream, subjects, sizes, None)
        evicted: list[int] = []
        if cfg.max_msgs_per_subject > 0 or cfg.republish:
            # A subject's limit evicts that subject's oldest, which the stream-wide
            # limits may have evicted already, and a republished message tells the
            # last sequence of its subject before it: indexed one message at a time,
            # as publishes one by one are (still stored as one run).
            first = stream.last_seq + 1
            republish = cfg.republish
            for seq, s, h, p, size, msg_id in zip(
                range(first, first + n),
                subjects,
                headers,
                payloads,
                sizes,
                ids or [""] * n,
                strict=True,
            ):
                if republish:
                    last_on_subject = stream.last_by_subject(s) or self._marker_for
                    self.republisher.record(stream, republish, seq, s, h, p, now, last_on_subject)
                evicted += stream.append(MessageMeta(seq, s, size, now, 0, extra), msg_id)
            evicted.sort()
        else:
            if one_subject:
                first = stream.append_run(subject, sizes, now, extra)
            else:
                first = stream.append_mixed(subjects, sizes, now, [extra] * n)
            if ids is not None:
                stream.remember_run_ids(first, ids, now)
            if stream.evicts:
                evicted = stream.enforce_run_limits()
        fut = self.store.append_run(
            name,
            [
                StoredMessage(seq, s, h, p, now, 0)
                for seq, s, h, p in zip(
                    range(first, first + len(sizes)), subjects, headers, payloads, strict=True
                )
            ],
        )
        last = first + n - 1
        if evicted:
            self._delete_seqs(stream, evicted)
        tick = self._tick_for(fut)
        if ids is None:
            tick.appended.append((stream, first, last, ""))
        else:
            # One entry per message with its id, so that a failed commit forgets them.
            tick.appended += [(stream, seq, seq, msg_id) for seq, msg_id in enumerate(ids, first)]
        tick.first_seq.setdefault(name, first)
        tick.atomic.append((name, first, last))
        if target is not None:
            if replies is None:
                target = _with_extras(target, batch=batch.id, count=n)
            tick.waiters.append((target, name, last, replies, False))
        if cfg.max_age and not self._expiry_timer:
            self._schedule_expiry()

    def _whole_batches(self, name: str, bad: dict[int, str]) -> dict[int, str]:
        """``bad`` plus every other message of the atomic batches it touches: a batch
        the store refuses part of is refused whole."""
        out = dict(bad)
        for tick in self._ticks.values():
            for stream, lo, hi in tick.atomic:
                if stream != name:
                    continue
                why = next((bad[s] for s in bad if lo <= s <= hi), None)
                if why is not None:
                    for seq in range(lo, hi + 1):
                        out.setdefault(seq, f"{why} (its atomic batch is refused whole)")
        return out

    # -- counters --------------------------------------------------------------------------------
    def _counter_values(self, stream: Stream) -> counters.CounterValues:
        values = self._counters.get(stream.name)
        if values is None:
            values = self._counters[stream.name] = counters.CounterValues()
        values.prune(stream.state.msgs, lambda seq: stream.meta(seq) is not None)
        return values

    def _counter_total(self, stream: Stream, subject: str) -> int:
        """The total of ``subject``: what its last live message holds (0 if none)."""
        value = self._counter_values(stream).at(stream.last_by_subject(subject))
        if value is None:
            raise counters.broken()
        return value

    # -- schedules -------------------------------------------------------------------------------
    def _check_schedule(
        self, stream: Stream, subject: str, fields: dict[bytes, bytes]
    ) -> sched.Schedule | None:
        cfg = stream.config
        return sched.check_publish(
            subject,
            cfg.subjects,
            cfg.allow_msg_schedules,
            cfg.allow_msg_ttl,
            fields,
            lambda v: (message_ttl(v) or 0) != 0,
        )

    def _is_schedule(self, stream: Stream) -> Callable[[str], bool]:
        def is_schedule(subject: str) -> bool:
            # nats-server: a subject with no message may be named; one whose last
            # message is not a schedule may not.
            last = stream.last_by_subject(subject)
            found = self._schedules.get((stream.name, subject))
            return not last or (found is not None and found.seq == last)

        return is_schedule

    def _stop_schedule(self, stream: Stream, subject: str) -> None:
        """Purge a schedule's subject (a client stopped it, or it fired for the last
        time): in the same commit as the message that says so."""
        self._schedules.pop((stream.name, subject), None)
        self.timetable.cancel(("schedule", stream.name, subject))
        removed = stream.purge(subject)
        if removed:
            self._delete_seqs(stream, removed)

    def _arm_schedule(self, schedule: sched.Schedule) -> None:
        key = (schedule.stream, schedule.subject)
        self._schedules[key] = schedule
        if schedule.due_ns <= 0:
            self.timetable.cancel(("schedule", *key))  # a cron that never matches
            return
        self.timetable.set(("schedule", *key), schedule.due_ns, lambda: self._fire_soon(schedule))

    def _fire_soon(self, schedule: sched.Schedule) -> None:
        task = asyncio.ensure_future(self._fire(schedule))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fire(self, schedule: sched.Schedule) -> None:
        """Store what a due schedule produces (the schedule's message, or its source
        subject's last one) on its target, and arm its next fire."""
        stream = self.streams.get(schedule.stream)
        key = (schedule.stream, schedule.subject)
        if stream is None or self._schedules.get(key) is not schedule:
            return
        try:
            msg = await self.read(stream, schedule.seq)
            if schedule.source:
                last = stream.last_by_subject(schedule.source)
                msg = await self.read(stream, last) if last else msg
        except StorageError as exc:
            log.error("schedule %s of stream %s: %s", schedule.subject, stream.name, exc)
            msg = None
        if (
            self.streams.get(schedule.stream) is not stream
            or self._schedules.get(key) is not schedule
        ):
            return
        if stream.meta(schedule.seq) is None:
            self._schedules.pop(key, None)  # the schedule is gone (deleted, purged, expired)
            return
        if msg is None:
            return
        now = self.clock.now()
        nxt = schedule.pattern.next_after(now)
        headers = sched.produced_headers(msg.headers, schedule, nxt)

        def failed(result: PubAck | errors.ApiError) -> None:
            if isinstance(result, errors.ApiError):
                log.error("schedule %s of stream %s: %s", schedule.subject, stream.name, result)

        # What a schedule produces keeps the schedule's headers, batch ones included
        # (as on nats-server), but is one message, not part of a batch.
        self._producing = True
        try:
            self._publish_one(stream, schedule.target, headers, msg.data, failed, None)
        finally:
            self._producing = False
        if nxt and self._schedules.get(key) is schedule:
            schedule.due_ns = nxt
            self._arm_schedule(schedule)

    def append_mirrored(
        self,
        stream: Stream,
        msg: StoredMessage,
        on_durable: Callable[[PubAck | errors.ApiError], None],
    ) -> None:
        """Store a message a mirror copied, at its origin's sequence and time.

        Sequences the origin no longer holds are left as gaps (nats-server's skips), so
        the mirror numbers as its origin does. The limits apply (evicting old messages);
        the publish checks do not: a mirror stores what its origin accepted.
        """
        if msg.seq <= stream.last_seq:
            on_durable(errors.ApiError(400, 10071, "wrong last sequence"))
            return
        if self.limits.sized:
            try:
                self._check_full(stream)  # the mirror retries later, as on nats-server
            except errors.ApiError as exc:
                on_durable(exc)
                return
        extra = stream.sizing.overhead(msg.headers)
        size = subject_size(msg.subject) + len(msg.headers) + len(msg.data) + extra
        meta = MessageMeta(msg.seq, msg.subject, size, msg.ts, msg.priority, extra)
        removed = stream.append(meta, "")
        if stream.config.allow_msg_ttl and MSG_TTL in msg.headers:
            # As after a restart: a copied message's TTL counts from its origin's time.
            self._track_headers(stream, msg.seq, msg.ts, msg.headers, True)
        fut = self.store.append(stream.name, msg)
        if removed:
            self._delete_seqs(stream, removed)
        tick = self._tick_for(fut)
        tick.appended.append((stream, msg.seq, msg.seq, ""))
        if stream.name not in tick.first_seq:
            tick.first_seq[stream.name] = msg.seq
        tick.waiters.append((on_durable, stream.name, msg.seq, None, False))
        if stream.config.max_age and not self._expiry_timer:
            self._schedule_expiry()

    def _ack_duplicate(
        self, stream: Stream, seq: int, target: Any, replies: list[str] | None
    ) -> None:
        """Acknowledge a duplicate, but not before the original's commit is durable."""
        for tick in reversed(self._ticks.values()):
            first = tick.first_seq.get(stream.name)
            if first is not None and first <= seq:
                tick.waiters.append((target, stream.name, seq, replies, True))
                return
        if replies is None:
            target(PubAck(stream.name, seq, True))
        else:
            target.pub_acked(stream.name, seq, replies, True)

    def _tick_for(self, fut: asyncio.Future[None]) -> _Tick:
        # Every write of a loop tick returns the same future: remember the last one so
        # the common case is one identity check, not a dict lookup per publish.
        if fut is self._last_fut and self._last_tick is not None:
            return self._last_tick
        key = id(fut)
        tick = self._ticks.get(key)
        if tick is None:
            tick = self._ticks[key] = _Tick()
            fut.add_done_callback(lambda f: self._committed(key, f))
        self._last_fut = fut
        self._last_tick = tick
        return tick

    def _committed(self, key: int, fut: asyncio.Future[None]) -> None:
        tick = self._ticks.pop(key)
        if self._last_tick is tick:
            self._last_fut = None
            self._last_tick = None
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            log.error("group commit failed: %s", exc)
            # Nothing of this commit is stored: forget its messages (and their msg ids,
            # so a retry is stored rather than reported as a duplicate), newest first.
            for stream, first, last, msg_id in reversed(tick.appended):
                for seq in range(last, first - 1, -1):
                    stream.forget(seq, msg_id)
        else:
            by_stream: dict[str, tuple[Stream, list[int]]] = {}
            for stream, first, last, _ in tick.appended:
                if last > stream.durable_seq:
                    stream.durable_seq = last
                entry = by_stream.get(stream.name)
                if entry is None:
                    entry = by_stream[stream.name] = (stream, [])
                if first == last:
                    entry[1].append(first)
                else:
                    entry[1].extend(range(first, last + 1))
            for stream, seqs in by_stream.values():
                if self.streams.get(stream.name) is stream:
                    for listener in self.listeners:
                        listener.on_messages_committed(stream, seqs)
        if exc is None:
            for target, name, seq, replies, duplicate in tick.waiters:
                if replies is None:
                    target(PubAck(name, seq, duplicate))
                else:
                    target.pub_acked(name, seq, replies, duplicate)
        else:
            failed = _storage_failed(exc)
            for target, name, _, replies, _ in tick.waiters:
                if replies is None:
                    target(failed)
                else:
                    target.pub_failed(name, replies, failed)

    # -- appends the store refused ------------------------------------------------------------------
    def _take_back(self, refused: dict[str, dict[int, str]]) -> None:
        """The store can never commit these appends (a value it cannot hold): refuse
        them alone, and store every later message of their streams again.

        Called by the store before the rest of their commit goes ahead (nothing of
        theirs is committed meanwhile). Every message of the stream from the first
        refused one on is taken back (from the store's pending commits and from the
        stream's index, giving the sequences back); the refused ones get an error, the
        others are published again, in their order, as if they had just arrived: same
        checks, the next sequences, acknowledged once their new commit is durable. So
        one bad message never fails its neighbours nor leaves a hole in the numbering.
        """
        for name, bad in refused.items():
            bad = self._whole_batches(name, bad)
            first = min(bad)
            msgs = self.store.withdraw(name, first)
            streams, waiting, dups, msg_ids = self._unbook(name, first)
            for stream in streams:
                for msg in reversed(msgs):  # newest first: each gives its sequence back
                    stream.forget(msg.seq, msg_ids.get(msg.seq, ""))
            live = self.streams.get(name)
            if live is not None and live not in streams:
                live = None  # deleted (and maybe created again) since: nothing to redo
            moved: dict[int, int] = {}
            for msg in msgs:
                target, replies = waiting.pop(msg.seq, (None, None))
                why = bad.get(msg.seq)
                if why is not None or live is None:
                    error = errors.store_failed(f"storage failed: {why or 'stream deleted'}")
                    _answer(target, name, replies, error)
                    continue
                before = live.last_seq
                headers = msg.headers or None
                self._publish_one(live, msg.subject, headers, msg.data, target, replies)
                if live.last_seq != before:
                    moved[msg.seq] = live.last_seq
            for target, replies in waiting.values():  # no message left to store
                _answer(target, name, replies, errors.store_failed("storage failed"))
            for target, seq, replies in dups:
                new = moved.get(seq)
                if new is None or live is None:
                    why = bad.get(seq, "the original was not stored")
                    _answer(target, name, replies, errors.store_failed(f"storage failed: {why}"))
                else:
                    self._ack_duplicate(live, new, target, replies)
            log.warning(
                "stream %s: %d message(s) refused by the store (%s); %d stored again",
                name,
                len(bad),
                next(iter(bad.values())),
                len(moved),
            )

    def _unbook(
        self, name: str, first: int
    ) -> tuple[
        list[Stream],
        dict[int, tuple[Any, list[str] | None]],
        list[tuple[Any, int, list[str] | None]],
        dict[int, str],
    ]:
        """Take the appends of stream ``name`` from ``first`` on out of the commits in
        flight: the streams they were made to, who waits for each sequence (target,
        replies), the duplicates waiting for one of them, and their msg ids."""
        streams: list[Stream] = []
        waiting: dict[int, tuple[Any, list[str] | None]] = {}
        dups: list[tuple[Any, int, list[str] | None]] = []
        msg_ids: dict[int, str] = {}
        for tick in self._ticks.values():
            appended: list[tuple[Stream, int, int, str]] = []
            for entry in tick.appended:
                stream, lo, hi, msg_id = entry
                if stream.name != name or hi < first:
                    appended.append(entry)
                    continue
                if stream not in streams:
                    streams.append(stream)
                if msg_id:
                    msg_ids[lo] = msg_id
                if lo < first:
                    appended.append((stream, lo, first - 1, msg_id))
            tick.appended = appended
            if tick.first_seq.get(name, 0) >= first:
                del tick.first_seq[name]
            waiters: list[_Waiter] = []
            for waiter in tick.waiters:
                target, wname, wseq, replies, duplicate = waiter
                if wname != name:
                    waiters.append(waiter)
                elif duplicate:
                    if wseq >= first:
                        dups.append((target, wseq, replies))
                    else:
                        waiters.append(waiter)
                elif replies is None:
                    if wseq >= first:
                        waiting[wseq] = (target, None)
                    else:
                        waiters.append(waiter)
                else:
                    keep = max(0, min(len(replies), first - wseq))
                    if keep:
                        waiters.append((target, wname, wseq, replies[:keep], False))
                    for i in range(keep, len(replies)):
                        if replies[i]:
                            waiting[wseq + i] = (target, [replies[i]])
            tick.waiters = waiters
            tick.merged = None
        return streams, waiting, dups, msg_ids

    # -- reads ------------------------------------------------------------------------------------
    async def read(self, stream: Stream, seq: int) -> StoredMessage | None:
        """A live message, once durable: one still in its commit is returned after it."""
        if stream.meta(seq) is None:
            return None
        cached = self.store.cached(stream.name, seq)
        if cached is not None:
            return cached
        msg = await self.store.read(stream.name, seq)
        if msg is None and self._ticks and stream.meta(seq) is not None:
            await self._settled()
            msg = await self.store.read(stream.name, seq)
        return msg

    async def _settled(self) -> None:
        """Wait for the commits in flight (their failures are their publishers' business)."""
        with contextlib.suppress(StorageError):
            await self.store.flush()

    async def get_message(
        self, name: str, seq: int = 0, last_by_subj: str = "", next_by_subj: str = ""
    ) -> StoredMessage:
        """STREAM.MSG.GET / DIRECT.GET: by ``seq``, last on a subject (wildcards allowed),
        or the first at or after ``seq`` on a subject. The caller validated the mix."""
        stream = self.get_stream(name)
        if last_by_subj:
            seq = stream.last_by_subject(last_by_subj)
        elif next_by_subj:
            seq = stream.next_by_subject(seq, next_by_subj)
        msg = await self.read(stream, seq) if seq > 0 else None
        if msg is None:
            raise errors.no_message_found()
        return msg

    def select_batch(
        self, stream: Stream, start_seq: int, batch: int, max_bytes: int, next_by_subj: str
    ) -> list[int]:
        """The sequences a batched DIRECT.GET returns, as nats-server picks them.

        Up to ``batch`` live messages from ``start_seq`` (matching ``next_by_subj`` if
        given); the message that takes the bytes sent (subject + headers + payload) to
        ``max_bytes`` or beyond is the last one.
        """
        filters = (next_by_subj,) if next_by_subj else ()
        seqs: list[int] = []
        sent = 0
        for seq in stream.seqs_matching(start_seq, filters):
            meta = stream.meta(seq)
            if meta is None:
                continue
            seqs.append(seq)
            sent += meta.size - meta.overhead
            if len(seqs) >= batch or sent >= max_bytes:
                break
        return seqs

    async def read_many(self, stream: Stream, seqs: list[int]) -> list[StoredMessage]:
        """Live messages among ``seqs`` once durable (see :meth:`read`)."""
        if not seqs:
            return []
        msgs = await self.store.read_many(stream.name, seqs)
        if len(msgs) < len(seqs) and self._ticks:
            await self._settled()
            msgs = await self.store.read_many(stream.name, seqs)
        return msgs

    async def read_columns(
        self, stream: Stream, start_seq: int, last_seq: int, limit: int
    ) -> MessageColumns:
        """Up to ``limit`` live messages in ``[start_seq, last_seq]`` as columns, in
        order, once durable (bulk reads).

        Messages still in a commit are not in the store yet: wait for it rather than
        return a range with holes that are not deletions.
        """
        if self._ticks and stream.last_seq >= start_seq:
            await self._settled()
        return await self.store.read_columns(stream.name, start_seq, last_seq, limit)

    # -- max_age and per-message TTLs -------------------------------------------------------------
    def _track_headers(self, stream: Stream, seq: int, ts: int, block: bytes, live: bool) -> None:
        """Note the ``Nats-TTL`` of message ``seq`` (stored at ``ts``), and whether it
        is a delete marker; ``live``: just appended (the expiry timer may need to move)."""
        fields = _header_fields(block)
        ttl = message_ttl(fields.get(MSG_TTL, b"").decode(errors="replace"))
        if ttl:
            self._track_ttl(stream, seq, ts, ttl, MARKER_REASON in fields, live)

    def _track_ttl(
        self, stream: Stream, seq: int, ts: int, ttl: int, marker: bool, live: bool
    ) -> None:
        """Message ``seq`` expires ``ttl`` seconds after ``ts`` (-1: never)."""
        ttls = stream.ttls
        if marker:
            ttls.markers.add(seq)
        if ttl == -1:
            ttls.forever.add(seq)
            return
        deadline = ts + ttl * NS
        ttls.add(seq, deadline, stream.durable_seq if live else None)
        if live and (self._expiry_timer is None or deadline < self._expiry_at):
            self._schedule_expiry()

    def _expire(self, stream: Stream) -> None:
        gone, markers = stream.expire(self.clock.now())
        if not gone:
            return
        self._delete_seqs(stream, sorted(meta.seq for meta in gone))
        marker_ttl = stream.config.subject_delete_marker_ttl
        if not marker_ttl:
            return
        # The last message of a subject expired (and was not itself a marker): leave a
        # marker so that watchers see the subject go, as nats-server does. It is stored
        # in the commit that deletes the message, so a crash keeps both or neither.
        headers = marker_headers(marker_ttl)
        for meta in gone:
            if meta.seq not in markers and not stream.last_by_subject(meta.subject):
                self._marker_for = meta.seq
                try:
                    self._publish_one(stream, meta.subject, headers, b"", None, None)
                finally:
                    self._marker_for = 0

    def _schedule_expiry(self) -> None:
        nxt = 0
        age = 0
        for stream in self.streams.values():
            due = stream.next_expiry()
            if due and (not nxt or due < nxt):
                nxt = due
            max_age = stream.config.max_age
            if max_age and (not age or max_age < age):
                age = max_age
        if nxt and age:
            # Publishes only move a pending timer earlier for a TTL: one due later than
            # a max_age from now (a long TTL) must not hold up what max_age expires.
            nxt = min(nxt, self.clock.now() + age)
        if self._expiry_timer is not None:
            if nxt and nxt >= self._expiry_at:
                return  # the pending timer fires first and reschedules
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if nxt:
            self._expiry_at = nxt
            delay = max(0.0, (nxt - self.clock.now()) / 1e9)
            self._expiry_timer = self.clock.call_later(delay, self._on_expiry)

    def _on_expiry(self) -> None:
        self._expiry_timer = None
        for stream in list(self.streams.values()):
            self._expire(stream)
        self._schedule_expiry()

    def close(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self.timetable.close()
        self.batches.close()

    # -- account ---------------------------------------------------------------------------------------
    def account_usage(self) -> dict[str, Any]:
        storage = self.used("file")
        memory = self.used("memory")
        consumers = sum(s.consumer_count for s in self.streams.values())
        return {
            "memory": memory,
            "storage": storage,
            "reserved_memory": self.reserved("memory"),
            "reserved_storage": self.reserved("file"),
            "streams": len(self.streams),
            "consumers": consumers,
        }


def _names_storage(body: bytes) -> bool:
    """Whether a stream create request sets ``storage`` (not null)."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    return isinstance(doc, dict) and doc.get("storage") is not None


def _stored_subject(cfg: StreamConfig, subject: str) -> str:
    """The subject a message is stored under: the stream's input transform applied."""
    transform = input_transform(cfg)
    if transform is None:
        return subject
    return transform.apply(subject) or subject


# The headers a run of publishes may carry and still take the run's path (see
# Broker.publish_headered): any other Nats-* or Tether-* header has its own handling.
_RUN_HEADERS = (MSG_TTL, MSG_ID)


def _plain_headers(
    stream: Stream, subject: str, block: bytes
) -> tuple[bytes, int, bytes, errors.ApiError | None] | None:
    """What :meth:`Broker._publish_one` makes of a header block holding nothing but a
    TTL, a msg id and headers of the application's: the block stored, the TTL, the msg
    id's raw value and the refusal every message with it gets; None for any other."""
    fields = _header_fields(block) if block else {}
    for key in fields:
        if key not in _RUN_HEADERS and key.lower().startswith((b"nats-", b"tether-")):
            return None
    ttl = 0
    raw_ttl = fields.get(MSG_TTL)
    if raw_ttl:
        try:
            ttl = stream.check_expectations(subject, None, None, None, None, raw_ttl)
        except errors.ApiError as exc:
            return block, 0, b"", exc
    marker_ttl = stream.config.subject_delete_marker_ttl
    if ttl > 0 and marker_ttl and ttl < marker_ttl // NS:
        # Raised to the delete markers' TTL, as a single publish is.
        ttl = marker_ttl // NS
        block = with_ttl(block, ttl)
    return block, ttl, fields.get(MSG_ID, b""), None


def _header_fields(block: bytes) -> dict[bytes, bytes]:
    """``Key: Value`` lines of a header block, first value per key (one pass, not one
    search per header the publish path looks at)."""
    out: dict[bytes, bytes] = {}
    for line in block.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def _answer(
    target: Any, stream: str, replies: list[str] | None, result: PubAck | errors.ApiError
) -> None:
    """Tell one publisher waiting on ``target`` (a callback, or a sink for ``replies``)."""
    if target is None:
        return
    if replies is None:
        target(result)
    elif isinstance(result, errors.ApiError):
        target.pub_failed(stream, replies, result)
    else:
        target.pub_acked(stream, result.seq, replies, result.duplicate)


def _with_extras(target: Callable[[Any], None], **extras: Any) -> Callable[[Any], None]:
    """A publish callback whose PubAck also carries ``extras`` (a batch's id and count,
    a counter's total); errors and duplicates pass as they are."""

    def answer(result: PubAck | errors.ApiError) -> None:
        if isinstance(result, PubAck) and not result.duplicate:
            for key, value in extras.items():
                setattr(result, key, value)
        target(result)

    return answer


def _uint(raw: bytes) -> int:
    return int(raw) if raw.isdigit() and len(raw) <= 19 else -1


def batches_unsupported(header: str) -> errors.ApiError:
    return errors.ApiError(400, 10177, f"atomic publish unsupported header used: {header}")


def batches_duplicate_id() -> errors.ApiError:
    return errors.ApiError(400, 10201, "atomic publish batch contains duplicate message id")


def batches_wrong_last_sequence() -> errors.ApiError:
    return errors.ApiError(400, 10164, "wrong last sequence")


def _storage_failed(exc: BaseException) -> errors.ApiError:
    """A failed commit as the publisher sees it: 503 / 10077 with the cause, no path."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return errors.store_failed(f"storage failed: {cause}")
