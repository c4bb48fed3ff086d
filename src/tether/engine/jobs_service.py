"""The webhook-broker model on top of the broker: channels are streams, jobs are ledgers.

A channel ``orders`` is the stream ``WB_orders`` capturing the subject ``wb.orders``;
a message broadcast over HTTP is an ordinary stream message (NATS clients can read it)
and anything published to ``wb.orders`` over NATS becomes jobs for the channel's HTTP
consumers. Each consumer has a :class:`JobLedger` fed by the broker's commit
notifications, so jobs exist exactly for the messages stored after it was created.

HTTP-specific message fields travel as headers of the stored message:
``Nats-Msg-Id`` (the message id), ``Content-Type``, ``Tether-Priority``,
``Tether-Producer`` and the metadata headers listed in ``X-Broker-Metadata-Headers``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import msgspec

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.clock import Clock, Timer
from tether.engine.jobs import JobLedger, LedgerSettings
from tether.engine.jobs_messages import (
    MessageView,
    encode_headers,
    view_of,
)
from tether.engine.jobs_registry import (
    Channel,
    Consumer,
    ConsumerType,
    Producer,
    Registry,
    Scheduled,
    hash_token,
)
from tether.engine.stream import Stream

log = logging.getLogger("tether.webhook")

STREAM_PREFIX = "WB_"
SUBJECT_PREFIX = "wb."
_GENERATED_ID = re.compile(r"^s(\d+)$")


def stream_name(channel_id: str) -> str:
    return STREAM_PREFIX + channel_id


def subject(channel_id: str) -> str:
    return SUBJECT_PREFIX + channel_id


class DuplicateMessage(Exception):
    """``X-Broker-Message-ID`` already used in the channel (409)."""


@dataclass(slots=True)
class ServiceSettings:
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    seal_key: str | None = None


@dataclass(slots=True)
class Counters:
    """Monotonic counters for /metrics."""

    broadcasts: int = 0
    duplicates: int = 0
    scheduled: int = 0
    deliveries_ok: int = 0
    deliveries_failed: int = 0
    claimed: int = 0


class WebhookService:
    """Channels, producers, consumers and their job ledgers over one :class:`Broker`."""

    def __init__(self, broker: Broker, clock: Clock, settings: ServiceSettings) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.registry = Registry(broker.store, settings.seal_key)
        self.ledgers: dict[tuple[str, str], JobLedger] = {}
        self.counters = Counters()
        # Per channel: message id → seq, and the reverse for ids set explicitly.
        self._ids: dict[str, dict[str, int]] = {}
        self._id_of: dict[str, dict[int, str]] = {}
        self._reserved: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()
        self._flush_timer: Timer | None = None
        self._sched_timer: Timer | None = None
        self._index_tasks: set[asyncio.Task[None]] = set()
        # Set by the server: a ledger has ready jobs / a consumer was added or changed.
        self.on_ready: Callable[[Consumer], None] | None = None
        self.on_consumer: Callable[[Consumer, bool], None] | None = None

    # -- startup / shutdown ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.registry.load()
        for channel in self.registry.channels.values():
            stream = await self._ensure_stream(channel.id)
            await self._index(channel.id, stream, list(stream.seqs(0)))
        for key, consumer in self.registry.consumers.items():
            stream = self.broker.get_stream(stream_name(consumer.channel))
            ledger = self._new_ledger(consumer, stream.last_seq + 1)
            state = self.registry.states.get(key, b"")
            if state:
                ledger.load(state, partial(self._metas, stream))
            ledger.dispatch_many(self._metas(stream, ledger.cursor + 1))
        self.broker.listeners.append(self)
        self._arm_scheduler()

    def stop(self) -> None:
        if self in self.broker.listeners:
            self.broker.listeners.remove(self)
        self._flush()
        for ledger in self.ledgers.values():
            ledger.close()
        for timer in (self._flush_timer, self._sched_timer):
            if timer is not None:
                timer.cancel()
        for task in self._index_tasks:
            task.cancel()

    @staticmethod
    def _metas(stream: Stream, start: int) -> Iterator[tuple[int, int, int]]:
        for seq in stream.seqs(start):
            meta = stream.meta(seq)
            if meta is not None:
                yield seq, meta.priority, meta.ts

    async def _ensure_stream(self, channel_id: str) -> Stream:
        name = stream_name(channel_id)
        existing = self.broker.streams.get(name)
        if existing is not None:
            return existing
        body = msgspec.json.encode({"name": name, "subjects": [subject(channel_id)]})
        stream, _ = await self.broker.create_stream(name, body)
        return stream

    def _new_ledger(self, consumer: Consumer, start: int) -> JobLedger:
        key = (consumer.channel, consumer.id)
        ledger = JobLedger(self.settings.ledger, self.clock, start)
        ledger.on_change = lambda: self._mark_dirty(key)
        ledger.on_ready = lambda: self._ready(key)
        old = self.ledgers.get(key)
        if old is not None:
            old.close()
        self.ledgers[key] = ledger
        return ledger

    def _ready(self, key: tuple[str, str]) -> None:
        consumer = self.registry.consumers.get(key)
        if consumer is not None and self.on_ready is not None:
            self.on_ready(consumer)

    # -- ledger persistence (one write per consumer per loop tick) ------------------------------
    def _mark_dirty(self, key: tuple[str, str]) -> None:
        self._dirty.add(key)
        if self._flush_timer is None:
            self._flush_timer = self.clock.call_later(0.0, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            consumer = self.registry.consumers.get(key)
            ledger = self.ledgers.get(key)
            if consumer is not None and ledger is not None:
                self.registry.put_consumer_state(consumer, ledger.encode())

    # -- broker listener ---------------------------------------------------------------------------
    def _channel_of(self, stream: Stream) -> str | None:
        if not stream.name.startswith(STREAM_PREFIX):
            return None
        channel = stream.name[len(STREAM_PREFIX) :]
        return channel if channel in self.registry.channels else None

    def on_stream_changed(self, stream: Stream) -> None:
        pass

    def on_stream_deleted(self, stream: Stream) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        # Deleted over NATS: the jobs went with the messages; start over when it returns.
        self._ids.pop(channel, None)
        self._id_of.pop(channel, None)
        for (ch, _), ledger in list(self.ledgers.items()):
            if ch == channel:
                for seq in list(ledger.jobs):
                    ledger.forget(seq)
                ledger.start = ledger.cursor = 0

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        items = [(seq, m.priority, m.ts) for seq in seqs if (m := stream.meta(seq)) is not None]
        for (ch, _), ledger in self.ledgers.items():
            if ch == channel:
                ledger.dispatch_many(items)
        missing = [s for s in seqs if s not in self._id_of.get(channel, {})]
        if missing:
            task = asyncio.ensure_future(self._index(channel, stream, missing))
            self._index_tasks.add(task)
            task.add_done_callback(self._index_tasks.discard)

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        ids = self._ids.get(channel, {})
        id_of = self._id_of.get(channel, {})
        for seq in seqs:
            msg_id = id_of.pop(seq, None)
            if msg_id is not None:
                ids.pop(msg_id, None)
        for (ch, _), ledger in self.ledgers.items():
            if ch == channel:
                for seq in seqs:
                    ledger.forget(seq)

    async def _index(self, channel: str, stream: Stream, seqs: list[int]) -> None:
        """Learn the message ids (``Nats-Msg-Id``) of messages not broadcast over HTTP."""
        ids = self._ids.setdefault(channel, {})
        id_of = self._id_of.setdefault(channel, {})
        for i in range(0, len(seqs), 500):
            for msg in await self.broker.read_many(stream, seqs[i : i + 500]):
                view = view_of(msg)
                if view.message_id != f"s{msg.seq}":
                    ids.setdefault(view.message_id, msg.seq)
                    id_of[msg.seq] = view.message_id

    # -- resources -----------------------------------------------------------------------------------
    async def put_producer(self, producer_id: str, name: str, token: str) -> Producer:
        now = self.clock.now()
        old = self.registry.producers.get(producer_id)
        p = Producer(
            id=producer_id,
            name=name,
            token_hash=hash_token(token),
            created_ns=old.created_ns if old else now,
            changed_ns=now,
        )
        await self.registry.put_producer(p)
        return p

    async def put_channel(self, channel_id: str, name: str, token: str) -> Channel:
        now = self.clock.now()
        await self._ensure_stream(channel_id)
        old = self.registry.channels.get(channel_id)
        c = Channel(
            id=channel_id,
            name=name,
            token_hash=hash_token(token),
            created_ns=old.created_ns if old else now,
            changed_ns=now,
        )
        await self.registry.put_channel(c)
        return c

    async def put_consumer(
        self,
        channel_id: str,
        consumer_id: str,
        name: str,
        token: str,
        callback: str,
        kind: ConsumerType,
    ) -> Consumer:
        now = self.clock.now()
        stream = await self._ensure_stream(channel_id)
        key = (channel_id, consumer_id)
        old = self.registry.consumers.get(key)
        k = Consumer(
            channel=channel_id,
            id=consumer_id,
            name=name,
            token_hash=hash_token(token),
            callback=callback,
            type=kind,
            num=old.num if old else self.registry.new_consumer_num(),
            created_ns=old.created_ns if old else now,
            changed_ns=now,
            sealed_token=self.registry.sealer.seal(token) if kind == "push" else "",
        )
        ledger = self.ledgers.get(key)
        if ledger is None:
            ledger = self._new_ledger(k, stream.last_seq + 1)
        await self.registry.put_consumer(k, ledger.encode())
        if self.on_consumer is not None:
            self.on_consumer(k, True)
        return k

    async def delete_consumer(self, k: Consumer) -> None:
        ledger = self.ledgers.pop((k.channel, k.id), None)
        if ledger is not None:
            ledger.close()
        self._dirty.discard((k.channel, k.id))
        if self.on_consumer is not None:
            self.on_consumer(k, False)
        await self.registry.delete_consumer(k)

    def consumers_of(self, channel_id: str) -> list[Consumer]:
        return [k for (ch, _), k in self.registry.consumers.items() if ch == channel_id]

    def ledger(self, k: Consumer) -> JobLedger:
        return self.ledgers[(k.channel, k.id)]

    # -- messages --------------------------------------------------------------------------------------
    def message_seq(self, channel_id: str, message_id: str) -> int | None:
        seq = self._ids.get(channel_id, {}).get(message_id)
        if seq is not None:
            return seq
        m = _GENERATED_ID.match(message_id)
        if m is None:
            return None
        seq = int(m.group(1))
        if seq in self._id_of.get(channel_id, {}):
            return None  # that message has an id of its own
        stream = self.broker.streams.get(stream_name(channel_id))
        return seq if stream is not None and stream.meta(seq) is not None else None

    def message_id_taken(self, channel_id: str, message_id: str) -> bool:
        return (
            self.message_seq(channel_id, message_id) is not None
            or (channel_id, message_id) in self._reserved
        )

    async def broadcast(
        self,
        channel_id: str,
        producer_id: str,
        payload: bytes,
        content_type: str,
        priority: int,
        message_id: str,
        metadata: dict[str, str],
    ) -> int:
        """Store one message; returns its sequence once durable."""
        key = (channel_id, message_id)
        if self.message_id_taken(channel_id, message_id):
            self.counters.duplicates += 1
            raise DuplicateMessage(message_id)
        stream = await self._ensure_stream(channel_id)
        headers = encode_headers(message_id, content_type, priority, producer_id, metadata)
        done: asyncio.Future[PubAck | errors.ApiError] = asyncio.get_running_loop().create_future()

        def on_durable(result: PubAck | errors.ApiError) -> None:
            if not done.done():
                done.set_result(result)

        ids = self._ids.setdefault(channel_id, {})
        id_of = self._id_of.setdefault(channel_id, {})
        self._reserved.add(key)
        seq = 0
        try:
            before = stream.last_seq
            self.broker.publish(stream, subject(channel_id), headers, payload, on_durable)
            # publish assigns the sequence synchronously: index it now, so the commit
            # notification (which comes first) does not read the message back.
            if stream.last_seq != before:
                seq = stream.last_seq
                ids[message_id] = seq
                id_of[seq] = message_id
            result = await done
        finally:
            self._reserved.discard(key)
        if isinstance(result, errors.ApiError) or result.duplicate:
            if seq and id_of.get(seq) == message_id:
                del id_of[seq]
                ids.pop(message_id, None)
            if isinstance(result, errors.ApiError):
                raise result
            self.counters.duplicates += 1
            raise DuplicateMessage(message_id)
        self.counters.broadcasts += 1
        return result.seq

    async def read(self, channel_id: str, seq: int) -> MessageView | None:
        stream = self.broker.streams.get(stream_name(channel_id))
        if stream is None:
            return None
        msg = await self.broker.read(stream, seq)
        return None if msg is None else view_of(msg)

    async def read_many(self, channel_id: str, seqs: list[int]) -> list[MessageView]:
        stream = self.broker.streams.get(stream_name(channel_id))
        if stream is None or not seqs:
            return []
        cached = [self.broker.store.cached(stream.name, s) for s in seqs]
        if all(m is not None for m in cached):
            return [view_of(m) for m in cached if m is not None]
        return [view_of(m) for m in await self.broker.read_many(stream, sorted(seqs))]

    # -- scheduled messages ------------------------------------------------------------------------------
    async def schedule(self, s: Scheduled) -> None:
        if (s.channel, s.message_id) in self.registry.scheduled:
            self.counters.duplicates += 1
            raise DuplicateMessage(s.message_id)
        await self.registry.put_scheduled(s)
        self.counters.scheduled += 1
        self._arm_scheduler()

    def _arm_scheduler(self) -> None:
        due = [s.due_ns for s in self.registry.scheduled.values() if not s.dispatched_ns]
        if self._sched_timer is not None:
            self._sched_timer.cancel()
            self._sched_timer = None
        if due:
            delay = max(0.0, (min(due) - self.clock.now()) / 1e9)
            self._sched_timer = self.clock.call_later(delay, self._on_schedule)

    def _on_schedule(self) -> None:
        self._sched_timer = None
        task = asyncio.ensure_future(self._dispatch_due())
        self._index_tasks.add(task)
        task.add_done_callback(self._index_tasks.discard)

    async def _dispatch_due(self) -> None:
        now = self.clock.now()
        for s in sorted(self.registry.scheduled.values(), key=lambda s: s.due_ns):
            if s.dispatched_ns or s.due_ns > now or s.channel not in self.registry.channels:
                continue
            try:
                await self.broadcast(
                    s.channel,
                    s.producer,
                    s.payload,
                    s.content_type,
                    s.priority,
                    s.message_id,
                    s.headers,
                )
            except DuplicateMessage:
                log.warning("scheduled message %s/%s: id already used", s.channel, s.message_id)
            except errors.ApiError as exc:
                log.error("scheduled message %s/%s: %s", s.channel, s.message_id, exc)
                continue
            s.dispatched_ns = self.clock.now()
            await self.registry.put_scheduled(s)
        self._arm_scheduler()
