"""The webhook-broker model on top of the broker: channels are streams, consumers are
durable consumers, jobs are their delivery state.

A channel ``orders`` is the stream ``WB_orders`` capturing the subject ``wb.orders``;
a message broadcast over HTTP is an ordinary stream message (NATS clients can read it)
and anything published to ``wb.orders`` over NATS becomes jobs for the channel's HTTP
consumers. A consumer ``hook`` of that channel is the durable consumer ``hook`` of
``WB_orders`` (``deliver_policy: new``, ``priority_order``), so it shows in
``CONSUMER.INFO`` and jobs exist exactly for the messages stored after it was created.
The HTTP side owns it: it has no NATS delivery target, and a :class:`JobView` reads and
moves its jobs.

HTTP-specific message fields travel as headers of the stored message:
``Nats-Msg-Id`` (the message id), ``Content-Type``, ``Tether-Priority``,
``Tether-Producer`` and the metadata headers listed in ``X-Broker-Metadata-Headers``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.clock import Clock, Timer
from tether.engine.consumers import Consumer as EngineConsumer
from tether.engine.consumers import ConsumerRegistry
from tether.engine.consumers.registry import SAVE_RETRY_SECONDS
from tether.engine.jobs.messages import (
    MessageView,
    encode_headers,
    view_of,
)
from tether.engine.jobs.registry import (
    Channel,
    Consumer,
    ConsumerType,
    Producer,
    Registry,
    Scheduled,
    hash_token,
)
from tether.engine.jobs.view import JobSettings, JobView, engine_config
from tether.engine.streams import Stream
from tether.storage.base import StorageError

log = logging.getLogger("tether.webhook")

# How long a change of when jobs last changed (and nothing else) may wait to be saved.
STAMPS_DELAY = 0.2

STREAM_PREFIX = "WB_"
SUBJECT_PREFIX = "wb."
_GENERATED_ID = re.compile(r"s([0-9]{1,19})")


def stream_name(channel_id: str) -> str:
    return STREAM_PREFIX + channel_id


def subject(channel_id: str) -> str:
    return SUBJECT_PREFIX + channel_id


def channel_id(stream: str) -> str:
    """The channel a ``WB_`` stream carries."""
    return stream.removeprefix(STREAM_PREFIX)


# The key of the webhook-broker's scheduled messages in the broker's timetable.
_SCHEDULED = ("http-scheduled",)


class DuplicateMessage(Exception):
    """``X-Broker-Message-ID`` already used in the channel (409)."""


@dataclass(slots=True)
class ServiceSettings:
    jobs: JobSettings = field(default_factory=JobSettings)
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
    """Channels, producers, consumers and their jobs over one :class:`Broker`."""

    def __init__(
        self, broker: Broker, consumers: ConsumerRegistry, clock: Clock, settings: ServiceSettings
    ) -> None:
        self.broker = broker
        self.consumers = consumers
        self.clock = clock
        self.settings = settings
        self.registry = Registry(broker.store, settings.seal_key)
        self.views: dict[tuple[str, str], JobView] = {}
        self.counters = Counters()
        # Per channel: message id → seq, and the reverse for ids set explicitly.
        self._ids: dict[str, dict[str, int]] = {}
        self._id_of: dict[str, dict[int, str]] = {}
        self._reserved: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()
        self._flush_timer: Timer | None = None
        self._flush_soon = False
        self._flush_waiters: list[asyncio.Future[StorageError | None]] = []
        self._saved_revision: dict[tuple[str, str], int] = {}
        self._stopped = False
        self._index_tasks: set[asyncio.Task[None]] = set()
        # Set by the server: a consumer has ready jobs / a consumer was added or changed.
        self.on_ready: Callable[[Consumer], None] | None = None
        self.on_consumer: Callable[[Consumer, bool], None] | None = None

    # -- startup / shutdown ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.registry.load()
        for channel in self.registry.channels.values():
            stream = await self._ensure_stream(channel.id)
            await self._index(channel.id, stream, list(stream.seqs(0)))
        for key, consumer in list(self.registry.consumers.items()):
            await self._ensure_stream(consumer.channel)
            view = await self._attach(consumer)
            state = self.registry.states.get(key, b"")
            if state:
                view.load(state)
        self.broker.listeners.append(self)
        self._arm_scheduler()

    def stop(self) -> None:
        self._stopped = True
        if self in self.broker.listeners:
            self.broker.listeners.remove(self)
        self._flush()
        for view in self.views.values():
            view.consumer.on_available = None
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        self.broker.timetable.cancel(_SCHEDULED)
        for task in self._index_tasks:
            task.cancel()

    async def _ensure_stream(self, channel_id: str) -> Stream:
        name = stream_name(channel_id)
        existing = self.broker.streams.get(name)
        if existing is not None:
            return existing
        body = msgspec.json.encode({"name": name, "subjects": [subject(channel_id)]})
        stream, _ = await self.broker.create_stream(name, body)
        return stream

    async def _engine_consumer(self, consumer: Consumer) -> EngineConsumer:
        """Find or create the durable consumer of ``consumer`` (settings may have changed
        since it was created: the allowed updates are applied)."""
        registry = self.consumers
        name = stream_name(consumer.channel)
        try:
            engine, _ = await registry.create(name, engine_config(consumer.id, self.settings.jobs))
        except errors.ApiError:
            found = registry.find(name, consumer.id)
            if found is None:
                raise
            engine = found
        return engine

    async def _attach(self, consumer: Consumer) -> JobView:
        """The job view of ``consumer``, over its (found or created) durable consumer."""
        key = (consumer.channel, consumer.id)
        engine = await self._engine_consumer(consumer)
        engine.on_available = lambda: self._ready(key)
        view = self.views.get(key)
        if view is None:
            view = JobView(engine, self.settings.jobs, self.clock)
            view.on_change = lambda: self._mark_dirty(key)
            self.views[key] = view
        else:
            view.consumer = engine
        return view

    async def _reattach(self, channel: str) -> None:
        """The channel's stream was created again (deleted over NATS): so are its
        consumers, starting over from the new stream's end."""
        for (ch, _), k in list(self.registry.consumers.items()):
            if ch == channel:
                try:
                    await self._attach(k)
                except errors.ApiError as exc:
                    log.error("consumer %s/%s: %s", ch, k.id, exc)

    def _ready(self, key: tuple[str, str]) -> None:
        consumer = self.registry.consumers.get(key)
        if consumer is not None and self.on_ready is not None:
            self.on_ready(consumer)

    # -- job extras persistence (one write per consumer per loop tick) -------------------------
    def _mark_dirty(self, key: tuple[str, str]) -> None:
        """A job of ``key`` changed: its extras are saved in the next tick when a change
        a restart must not lose was made (see :attr:`JobView.revision`), else within
        :data:`STAMPS_DELAY` (only when jobs last changed is new: with thousands of
        DELIVERED stamps kept, saving them at every tick would cost more than the
        changes themselves)."""
        self._dirty.add(key)
        view = self.views.get(key)
        if view is not None and view.revision != self._saved_revision.get(key):
            if self._flush_timer is not None and not self._flush_soon:
                self._flush_timer.cancel()
                self._flush_timer = None
            if self._flush_timer is None:
                self._flush_timer = self.clock.call_later(0.0, self._flush)
                self._flush_soon = True
        elif self._flush_timer is None:
            self._flush_timer = self.clock.call_later(STAMPS_DELAY, self._flush)
            self._flush_soon = False

    def _flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()  # when called directly (stop, tests)
        self._flush_timer = None
        dirty, self._dirty = self._dirty, set()
        written: list[tuple[str, str]] = []
        for key in dirty:
            consumer = self.registry.consumers.get(key)
            view = self.views.get(key)
            if consumer is not None and view is not None:
                self.registry.put_consumer_state(consumer, view.encode())
                self._saved_revision[key] = view.revision
                written.append(key)
        waiters, self._flush_waiters = self._flush_waiters, []
        if written or waiters:
            # This tick's commit: it holds every state written above.
            self.broker.store.flush().add_done_callback(
                lambda fut: self._flushed(fut, written, waiters)
            )

    def _flushed(
        self,
        fut: asyncio.Future[None],
        written: list[tuple[str, str]],
        waiters: list[asyncio.Future[StorageError | None]],
    ) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            # Not stored (a full disk): write them again in a while, whole.
            for key in written:
                self._dirty.add(key)
                self._saved_revision.pop(key, None)
            if self._flush_timer is None and written and not self._stopped:
                self._flush_timer = self.clock.call_later(SAVE_RETRY_SECONDS, self._flush)
                self._flush_soon = False
        _tell(fut, waiters)

    async def committed(self, k: Consumer) -> StorageError | None:
        """Wait until the jobs of ``k`` are stored as they are now: the durable
        consumer's state (each job's status) and the extras a restart must not lose
        (sticky timeouts, backoffs, dead jobs deleted), each in the commit of this tick
        or the next; when jobs last changed follows within :data:`STAMPS_DELAY`.
        Returns why not if a commit fails (None when all is stored).

        Every request waiting in the same tick shares those commits.
        """
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[StorageError | None]] = []
        view = self.views.get((k.channel, k.id))
        if view is not None and not view.closed:
            waits.append(self.consumers.state_saved(view.consumer))
        key = (k.channel, k.id)
        if (
            key in self._dirty
            and view is not None
            and view.revision != self._saved_revision.get(key)
        ):
            extras: asyncio.Future[StorageError | None] = loop.create_future()
            self._flush_waiters.append(extras)
            waits.append(extras)
        for wait in waits:
            error = await wait
            if error is not None:
                return error
        return None

    # -- broker listener ---------------------------------------------------------------------------
    def _channel_of(self, stream: Stream) -> str | None:
        if not stream.name.startswith(STREAM_PREFIX):
            return None
        channel = stream.name[len(STREAM_PREFIX) :]
        return channel if channel in self.registry.channels else None

    def on_stream_changed(self, stream: Stream) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        if any(ch == channel and v.closed for (ch, _), v in self.views.items()):
            self._spawn(self._reattach(channel))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._index_tasks.add(task)
        task.add_done_callback(self._index_tasks.discard)

    def on_stream_deleted(self, stream: Stream) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        # Deleted over NATS: the jobs went with the messages and the durable consumers
        # with the stream; they start over when it returns (on_stream_changed).
        self._ids.pop(channel, None)
        self._id_of.pop(channel, None)

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        channel = self._channel_of(stream)
        if channel is None:
            return
        for ch, kid in list(self.views):
            if ch == channel:
                self._ready((ch, kid))
        missing = [s for s in seqs if s not in self._id_of.get(channel, {})]
        if missing:
            self._spawn(self._index(channel, stream, missing))

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
        await self._ensure_stream(channel_id)
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
        view = self.views.get(key)
        if view is None or view.closed:
            view = await self._attach(k)
        await self.registry.put_consumer(k, view.encode())
        if self.on_consumer is not None:
            self.on_consumer(k, True)
        return k

    async def delete_consumer(self, k: Consumer) -> None:
        view = self.views.pop((k.channel, k.id), None)
        self._dirty.discard((k.channel, k.id))
        if view is not None and not view.closed:
            view.consumer.on_available = None
            await self.consumers.delete(view.consumer.stream.name, view.consumer.name)
        if self.on_consumer is not None:
            self.on_consumer(k, False)
        await self.registry.delete_consumer(k)

    def consumers_of(self, channel_id: str) -> list[Consumer]:
        return [k for (ch, _), k in self.registry.consumers.items() if ch == channel_id]

    def jobs(self, k: Consumer) -> JobView:
        return self.views[(k.channel, k.id)]

    # -- messages --------------------------------------------------------------------------------------
    def message_seq(self, channel_id: str, message_id: str) -> int | None:
        seq = self._ids.get(channel_id, {}).get(message_id)
        if seq is not None:
            return seq
        m = _GENERATED_ID.fullmatch(message_id)
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
        if result.seq != seq:
            # Stored again at another sequence (a neighbour in its commit was refused).
            if seq and id_of.get(seq) == message_id:
                del id_of[seq]
            ids[message_id] = result.seq
            id_of[result.seq] = message_id
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
        # The broker's timetable holds every delayed delivery (stream schedules too).
        due = [s.due_ns for s in self.registry.scheduled.values() if not s.dispatched_ns]
        if due and not self._stopped:
            self.broker.timetable.set(_SCHEDULED, min(due), self._on_schedule)
        else:
            self.broker.timetable.cancel(_SCHEDULED)

    def _on_schedule(self) -> None:
        self._spawn(self._dispatch_due())

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


def _resolve(fut: asyncio.Future[StorageError | None], error: StorageError | None) -> None:
    if not fut.done():
        fut.set_result(error)


def _tell(fut: asyncio.Future[None], waiters: list[asyncio.Future[StorageError | None]]) -> None:
    """Pass a commit's outcome to the requests waiting for it."""
    exc = fut.exception() if not fut.cancelled() else StorageError("cancelled")
    error = None if exc is None else exc if isinstance(exc, StorageError) else StorageError(exc)
    for waiter in waiters:
        _resolve(waiter, error)
