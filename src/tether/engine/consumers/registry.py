"""Every consumer of every stream: creation rules, persistence, retention, stream events.

The registry listens to the broker (committed and removed messages, stream changes)
and fans events out to the consumers of the stream. It owns the consumers' storage.
A consumer's state is the whole of its messages in flight, so writing it costs in
proportion to them, not to what changed: it is written only when someone waits for
it, or :data:`SAVE_INTERVAL` after its first unsaved change. Whoever must not answer
before a change is durable (an ack with a reply, an HTTP job change) asks for the
save of this tick (:meth:`ConsumerRegistry.after_save`); the store's group commit
batches it with everything else of that tick. Changes nobody waits for (acks without
a reply, NSQ's ``FIN``, deliveries) ride on the next save: a crash before it only
means those messages are delivered again (at-least-once). It applies the ``interest``
and ``workqueue`` retention policies: acked messages are collected during a tick and
removed through the broker (storage delete plus listeners) at its end.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from tether.engine import errors
from tether.engine.clock import Clock, Timer
from tether.engine.consumers.config import (
    ConsumerConfig,
    apply_defaults,
    check_update,
    consumer_does_not_exist,
    consumer_exists,
    decode_config,
    encode_config,
    validate,
    wq_multiple_unfiltered,
    wq_not_deliver_all,
    wq_not_unique,
    wq_requires_explicit_ack,
)
from tether.engine.consumers.consumer import Consumer
from tether.engine.consumers.cursor import Matcher, SequenceCursor, StreamHead
from tether.engine.consumers.delivery_state import decode_state, encode_state
from tether.engine.consumers.sinks import DeliverySink
from tether.engine.limits import ServerLimits
from tether.engine.streams import Stream, StreamListener
from tether.engine.subjects import filters_overlap
from tether.storage.base import ConsumerRecord, MessageMeta, StorageError, Store

log = logging.getLogger("tether.consumers")

_NAME_CHARS = string.ascii_letters + string.digits
# After a state save failed (a full disk), the next try comes this much later at most.
SAVE_RETRY_SECONDS = 1.0
# A change nobody waits for is saved at most this long after it (seconds). nats-server
# too writes consumer state behind the acks; what it costs a crash is a redelivery.
SAVE_INTERVAL = 0.1

# Told once a consumer's state is committed (None), or why it could not be.
SaveWaiter: TypeAlias = Callable[[StorageError | None], None]


class StreamOwner(Protocol):
    """What the registry needs of the broker: its streams, their events, and a way to
    remove messages (retention). The broker is passed in; it never knows the registry."""

    clock: Clock
    store: Store
    streams: dict[str, Stream]
    listeners: list[StreamListener]
    limits: ServerLimits  # the server's caps on consumers' settings

    def get_stream(self, name: str) -> Stream: ...
    def remove_messages(self, stream: Stream, seqs: list[int]) -> None: ...


class _NullSink:
    """Used until a front door attaches: drops everything."""

    def deliver(self, consumer: Consumer, to: str, meta: MessageMeta, reply: str) -> None:
        pass

    def control(self, consumer: Consumer, to: str, block: bytes, reply: str = "") -> None:
        pass

    def advisory(self, subject: str, body: dict[str, Any]) -> None:
        pass

    def has_interest(self, subject: str) -> bool:
        return False

    def backlog(self, consumer: Consumer) -> int:
        return 0


class ConsumerRegistry:
    """The consumers of all streams, fed by the broker's listener hooks."""

    def __init__(self, broker: StreamOwner, sink: DeliverySink[Consumer] | None = None) -> None:
        self.broker = broker
        self.clock = broker.clock
        self.store = broker.store
        self.sink: DeliverySink[Consumer] = sink or _NullSink()
        self.streams: dict[str, dict[str, Consumer]] = {}
        self.heads: dict[str, StreamHead] = {}
        # Changed since their last save; and those of them someone waits for.
        self._dirty: dict[int, Consumer] = {}
        self._urgent: dict[int, Consumer] = {}
        self._interval_timer: Timer | None = None
        self._acked: dict[str, tuple[Stream, list[int]]] = {}
        self._sweep: set[str] = set()
        self._flush_timer: Timer | None = None
        self._save_after = 0.0
        self._save_timer: Timer | None = None
        self._save_waiters: list[SaveWaiter] = []
        self._retry_timer: Timer | None = None
        self._closing = False
        self._removing = False
        broker.listeners.append(self)
        for stream in broker.streams.values():
            self.on_stream_changed(stream)

    # -- startup ----------------------------------------------------------------------------------
    async def load(self) -> None:
        """Rebuild every persisted consumer (after the broker loaded its streams)."""
        for stream in list(self.broker.streams.values()):
            self.on_stream_changed(stream)
            for record in await self.store.load_consumers(stream.name):
                try:
                    config = decode_config(record.config)
                    saved = decode_state(record.state) if record.state else None
                except Exception:
                    log.exception("consumer %s > %s: unreadable record", stream.name, record.name)
                    continue
                consumer = self._build(stream, record.name, config, record.created_ns, saved)
                if consumer.is_pull is False:
                    consumer.set_push_interest(self.sink.has_interest(config.deliver_subject))

    def _build(
        self,
        stream: Stream,
        name: str,
        config: ConsumerConfig,
        created_ns: int,
        saved: Any = None,
    ) -> Consumer:
        consumer = Consumer(
            stream,
            self.heads[stream.name],
            name,
            config,
            created_ns,
            self.clock,
            self.sink,
            self,
            saved,
        )
        consumer.notify_acks = stream.config.retention != "limits"
        consumers = self.streams.setdefault(stream.name, {})
        consumers[name] = consumer
        stream.consumer_count = len(consumers)
        return consumer

    # -- management ------------------------------------------------------------------------------------
    def get(self, stream: str, name: str) -> Consumer:
        consumer = self.streams.get(stream, {}).get(name)
        if consumer is None:
            if stream not in self.broker.streams:
                raise errors.stream_not_found()
            raise errors.consumer_not_found()
        return consumer

    def find(self, stream: str, name: str) -> Consumer | None:
        return self.streams.get(stream, {}).get(name)

    def consumers_of(self, stream: str) -> list[Consumer]:
        self.broker.get_stream(stream)
        return sorted(self.streams.get(stream, {}).values(), key=lambda c: c.name)

    async def create(
        self,
        stream_name: str,
        config: ConsumerConfig,
        action: str = "",
        activate: bool = True,
        pedantic: bool = False,
    ) -> tuple[Consumer, bool]:
        """Create a consumer, or update one (``action``: ``""``, ``create`` or ``update``).

        A new push consumer starts delivering at once unless ``activate`` is False; then
        the caller calls :meth:`activate` (after replying, as nats-server does). With
        ``pedantic``, values nats-server would adjust are refused instead.
        """
        stream = self.broker.get_stream(stream_name)
        scfg = stream.config
        limits = self.broker.limits
        apply_defaults(config, scfg, pedantic, limits)
        validate(config, scfg, limits)
        consumers = self.streams.setdefault(stream.name, {})
        name = config.durable_name or config.name
        existing = consumers.get(name) if name else None
        if existing is not None:
            config.pause_until = existing.config.pause_until
            if action == "create" and config != existing.config:
                raise consumer_exists()
            if scfg.retention == "workqueue" and not self._partition_unique(
                stream, name, config.filters
            ):
                raise wq_not_unique()
            bound = bool(existing.config.deliver_subject) and self.sink.has_interest(
                existing.config.deliver_subject
            )
            check_update(existing.config, config, bound)
            if config != existing.config:
                existing.update_config(config)
                await self._durable(self._put(existing))
                log.debug("consumer %s > %s updated", stream.name, name)
            return existing, False
        if action == "update":
            raise consumer_does_not_exist()
        # A stream without max_consumers has the server's default_max_consumers.
        most = scfg.max_consumers if scfg.max_consumers > 0 else limits.default_max_consumers
        if most > 0 and len(consumers) >= most:
            raise errors.max_consumers_reached()
        if scfg.retention == "workqueue":
            if config.ack_policy not in ("explicit", "flow_control"):
                raise wq_requires_explicit_ack()
            if config.deliver_policy != "all":
                raise wq_not_deliver_all()
            if consumers:
                if not config.filters:
                    raise wq_multiple_unfiltered()
                if not self._partition_unique(stream, name, config.filters):
                    raise wq_not_unique()
        if not name:
            name = self._new_name(consumers)
        consumer = self._build(stream, name, config, self.clock.now())
        await self._durable(self._put(consumer))
        log.debug("consumer %s > %s created", stream.name, name)
        self._action(consumer, "create", "CREATED")
        if activate:
            self.activate(consumer)
        return consumer, True

    def _action(self, consumer: Consumer, action: str, past: str) -> None:
        """nats-server's ``CONSUMER.CREATED`` / ``DELETED`` advisory (only while listened to)."""
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.{past}.{consumer.stream.name}.{consumer.name}"
        if self.sink.has_interest(subject):
            self.sink.advisory(
                subject,
                {
                    "type": "io.nats.jetstream.advisory.v1.consumer_action",
                    "stream": consumer.stream.name,
                    "consumer": consumer.name,
                    "action": action,
                },
            )

    def activate(self, consumer: Consumer) -> None:
        """Start a push consumer if its deliver subject has interest."""
        if not consumer.is_pull and not consumer.deleted:
            consumer.set_push_interest(self.sink.has_interest(consumer.config.deliver_subject))

    def _partition_unique(self, stream: Stream, name: str, filters: tuple[str, ...]) -> bool:
        for other in self.streams.get(stream.name, {}).values():
            if other.name == name:
                continue
            for f in filters:
                if not other.config.filters:
                    return False
                if any(filters_overlap(f, g) for g in other.config.filters):
                    return False
        return True

    @staticmethod
    def _new_name(taken: dict[str, Consumer]) -> str:
        while True:
            name = "".join(secrets.choice(_NAME_CHARS) for _ in range(8))
            if name not in taken:
                return name

    def _put(self, consumer: Consumer) -> asyncio.Future[None]:
        if consumer.config.mem_storage:
            return self.store.flush()
        consumer._changed = False  # the full record carries the state
        self._dirty.pop(id(consumer), None)
        self._urgent.pop(id(consumer), None)
        return self.store.put_consumer(
            ConsumerRecord(
                consumer.stream.name,
                consumer.name,
                encode_config(consumer.config),
                encode_state(consumer.save()),
                consumer.created_ns,
            )
        )

    async def delete(self, stream_name: str, name: str) -> None:
        consumer = self.get(stream_name, name)
        await self._durable(self._remove(consumer))
        log.debug("consumer %s > %s deleted", stream_name, name)

    async def pause(self, stream_name: str, name: str, until_ns: int | None) -> Consumer:
        consumer = self.get(stream_name, name)
        consumer.pause(until_ns)
        await self._durable(self._put(consumer))
        return consumer

    async def reset(self, consumer: Consumer, seq: int) -> int:
        """``CONSUMER.RESET``: see :meth:`Consumer.reset`; answered once saved."""
        try:
            seq = consumer.reset(seq)
        except ValueError as exc:
            raise errors.ApiError(400, 10204, f"invalid reset: {exc}") from None
        await self._durable(self._put(consumer))
        return seq

    def _remove(self, consumer: Consumer, notify: bool = True) -> asyncio.Future[None]:
        stream = consumer.stream
        consumers = self.streams.get(stream.name, {})
        if consumers.get(consumer.name) is consumer:
            del consumers[consumer.name]
        stream.consumer_count = len(consumers)
        consumer.close(notify)
        self._action(consumer, "delete", "DELETED")
        self._dirty.pop(id(consumer), None)
        self._urgent.pop(id(consumer), None)
        if stream.config.retention == "interest" and self.broker.streams.get(stream.name) is stream:
            self._sweep.add(stream.name)
            self._schedule()
        if consumer.config.mem_storage:
            return self.store.flush()
        return self.store.delete_consumer(stream.name, consumer.name)

    @staticmethod
    async def _durable(fut: asyncio.Future[None]) -> None:
        try:
            await fut
        except StorageError as exc:
            raise errors.store_failed(str(exc)) from None

    # -- consumer host ---------------------------------------------------------------------------------
    def consumer_changed(self, consumer: Consumer) -> None:
        # Once per save of the consumer (it calls again only after :meth:`Consumer.save`).
        self._dirty[id(consumer)] = consumer
        if self._interval_timer is None and not self._closing:
            self._interval_timer = self.clock.call_later(SAVE_INTERVAL, self._save_dirty)

    def consumer_acked(self, consumer: Consumer, seqs: list[int]) -> None:
        self._retire(consumer.stream, seqs)

    def after_save(self, consumer: Consumer, done: SaveWaiter) -> None:
        """Call ``done(None)`` once ``consumer``'s state as it is now is committed, or
        ``done(error)`` if that commit fails. The state is saved in this tick's batch
        (with every other change of the tick), even if it did not change: the last
        save may still be in flight, or may have failed."""
        if consumer.deleted or consumer.config.mem_storage:
            done(None)  # nothing is kept: nothing to wait for
            return
        self._urgent[id(consumer)] = consumer
        self._save_waiters.append(done)
        self._schedule()

    def state_saved(self, consumer: Consumer) -> asyncio.Future[StorageError | None]:
        """:meth:`after_save` as a future: None once ``consumer``'s state as it is now is
        committed, or why that commit failed."""
        done: asyncio.Future[StorageError | None] = asyncio.get_running_loop().create_future()

        def told(error: StorageError | None) -> None:
            if not done.done():  # the request may be gone (a closed connection)
                done.set_result(error)

        self.after_save(consumer, told)
        return done

    async def saved(self, consumer: Consumer) -> None:
        """Return once ``consumer``'s state as it is now is committed; raise the
        JetStream store error if that commit fails."""
        error = await self.state_saved(consumer)
        if error is not None:
            raise errors.store_failed(str(error))

    def consumer_inactive(self, consumer: Consumer) -> None:
        log.debug("consumer %s > %s inactive, deleting", consumer.stream.name, consumer.name)
        fut = self._remove(consumer)
        fut.add_done_callback(_log_failure)

    # -- the per-tick flush -----------------------------------------------------------------------------
    def _schedule(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = self.clock.call_later(0, self.flush)

    def flush(self) -> None:
        """Apply retention for this tick's acks and save the consumers someone waits for."""
        self._flush_timer = None
        if self._acked:
            acked, self._acked = self._acked, {}
            for stream, seqs in acked.values():
                self._retain(stream, seqs)
        if self._sweep:
            sweep, self._sweep = self._sweep, set()
            for name in sweep:
                swept = self.broker.streams.get(name)
                if swept is not None:
                    self._retain(swept, list(swept.seqs(swept.first_seq)))
        if not self._urgent and not self._save_waiters:
            return
        wait = self._save_after - time.monotonic()
        if wait > 0:
            if self._save_timer is None:
                self._save_timer = self.clock.call_later(wait, self._save_due)
            return
        self._save([])

    def _save_due(self) -> None:
        self._save_timer = None
        self.flush()

    def _save_dirty(self) -> None:
        """The interval is up: save every consumer changed since its last save."""
        self._interval_timer = None
        if not self._dirty:
            return
        wait = self._save_after - time.monotonic()
        if wait > 0 and not self._closing:
            self._interval_timer = self.clock.call_later(wait, self._save_dirty)
            return
        self._save(list(self._dirty.values()))

    def _save(self, consumers: list[Consumer]) -> None:
        """Write the states of ``consumers`` and of those someone waits for, and tell the
        waiters once they commit (the waiters and their consumers always go together)."""
        started = time.perf_counter()
        waiters, self._save_waiters = self._save_waiters, []
        urgent, self._urgent = self._urgent, {}
        for consumer in consumers:
            urgent[id(consumer)] = consumer
        store = self.store
        dirty = self._dirty
        saved: list[Consumer] = []
        for consumer in urgent.values():
            dirty.pop(id(consumer), None)
            if consumer.deleted or consumer.config.mem_storage:
                continue
            state = encode_state(consumer.save())
            store.put_consumer_state(consumer.stream.name, consumer.name, state)
            saved.append(consumer)
        if saved or waiters:
            # This tick's commit: it holds every state written above.
            store.flush().add_done_callback(lambda fut: self._saved(fut, saved, waiters))
        # A huge state (hundreds of thousands of unacked messages) costs real time to
        # encode: space such writes out so that saving stays a few percent of the loop.
        took = time.perf_counter() - started
        self._save_after = time.monotonic() + min(took * 20, 1.0) if took > 0.005 else 0.0

    def _saved(
        self, fut: asyncio.Future[None], saved: list[Consumer], waiters: list[SaveWaiter]
    ) -> None:
        exc = fut.exception() if not fut.cancelled() else StorageError("cancelled")
        error: StorageError | None = None
        if exc is not None:
            error = exc if isinstance(exc, StorageError) else StorageError(str(exc))
            log.error("saving consumer state failed: %s", error)
            # The states in memory are ahead of the stored ones: save them again (when
            # someone waits for one, or after a pause, so that a full disk is not
            # retried in a loop).
            for consumer in saved:
                if not consumer.deleted:
                    self._dirty[id(consumer)] = consumer
            if self._retry_timer is None and not self._closing:
                self._retry_timer = self.clock.call_later(SAVE_RETRY_SECONDS, self._retry)
        for done in waiters:
            done(error)

    def _retry(self) -> None:
        self._retry_timer = None
        if self._dirty and self._interval_timer is None:
            self._save_dirty()

    def _retain(self, stream: Stream, seqs: list[int]) -> None:
        if self.broker.streams.get(stream.name) is not stream:
            return
        metas = [m for m in map(stream.meta, sorted(set(seqs))) if m is not None]
        if stream.config.retention != "workqueue":
            # One pass per consumer over what the passes before it left (the common case
            # is a few consumers and thousands of acks a tick): a message stays once any
            # consumer still needs it.
            for consumer in list(self.streams.get(stream.name, {}).values()):
                metas = _done_with_all(consumer, metas)
                if not metas:
                    return
        removable = [m.seq for m in metas]
        if removable:
            self._removing = True
            try:
                self.broker.remove_messages(stream, removable)
            finally:
                self._removing = False

    async def close(self) -> None:
        """Save every consumer's state (clean shutdown) and stop the timers."""
        self._closing = True
        for timer in (
            self._flush_timer,
            self._save_timer,
            self._retry_timer,
            self._interval_timer,
        ):
            if timer is not None:
                timer.cancel()
        self._save_timer = None
        self._retry_timer = None
        self._interval_timer = None
        self._save_after = 0.0
        # Every state, changed or not, with this tick's retention and every waiter.
        self._urgent = {id(consumer): consumer for consumer in self.all()}
        self.flush()
        for consumers in self.streams.values():
            for consumer in consumers.values():
                consumer.close(notify=False)
        self._flush_timer = None
        try:
            await self.store.flush()
        except StorageError as exc:
            log.error("saving consumer state failed: %s", exc)

    # -- broker listener -----------------------------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        head = self.heads.get(stream.name)
        if head is None:
            self.heads[stream.name] = StreamHead(stream.last_seq)
            return
        # The stream's subjects may have changed: whether a filter covers them all too.
        for consumer in self.streams.get(stream.name, {}).values():
            consumer.cursor.set_match(Matcher(consumer.config.filters, stream.config.subjects))

    def on_stream_deleted(self, stream: Stream) -> None:
        for consumer in list(self.streams.pop(stream.name, {}).values()):
            consumer.close()
            self._action(consumer, "delete", "DELETED")
            self._dirty.pop(id(consumer), None)
            self._urgent.pop(id(consumer), None)
        self.heads.pop(stream.name, None)
        self._acked.pop(stream.name, None)

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        head = self.heads.get(stream.name)
        if head is None:
            head = self.heads[stream.name] = StreamHead(0)
        head.committed = max(head.committed, seqs[-1])
        consumers = self.streams.get(stream.name)
        meta_of = stream.meta
        metas = [m for m in map(meta_of, seqs) if m is not None]
        if stream.config.retention == "interest":
            # Nobody is interested in a message no consumer's filter matches.
            live = list(consumers.values()) if consumers else []
            orphans = [m.seq for m in metas if not any(c.cursor.match(m.subject) for c in live)]
            if orphans:
                self._retire(stream, orphans)
        if consumers:
            for consumer in list(consumers.values()):
                consumer.on_committed(metas)

    def _retire(self, stream: Stream, seqs: list[int]) -> None:
        """Queue messages for the end-of-tick retention check."""
        entry = self._acked.get(stream.name)
        if entry is None:
            self._acked[stream.name] = (stream, list(seqs))
        else:
            entry[1].extend(seqs)
        self._schedule()

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        consumers = self.streams.get(stream.name)
        if consumers:
            known = self._removing
            for consumer in list(consumers.values()):
                consumer.on_removed(seqs, known)

    # -- interest (front doors call these) --------------------------------------------------------------------
    def interest_changed(self, subject: str, matches: Callable[[str], bool]) -> None:
        """A client subscription on ``subject`` came or went."""
        has_interest = self.sink.has_interest
        for consumers in self.streams.values():
            for consumer in list(consumers.values()):
                if consumer.is_pull:
                    if consumer.waiting:
                        consumer.drop_requests_for(matches)
                elif matches(consumer.config.deliver_subject):
                    consumer.set_push_interest(has_interest(consumer.config.deliver_subject))

    def all(self) -> list[Consumer]:
        return [c for consumers in self.streams.values() for c in consumers.values()]


def _done_with_all(consumer: Consumer, metas: list[MessageMeta]) -> list[MessageMeta]:
    """The messages of ``metas`` that ``consumer`` no longer needs (:func:`_done_with`
    of each, with the consumer's parts looked up once)."""
    cursor = consumer.cursor
    if not isinstance(cursor, SequenceCursor) or not cursor.match.match_all:
        return [m for m in metas if _done_with(consumer, m)]
    state = consumer.state
    pending, dead, lps = state.pending, state.dead, cursor.lps
    next_seq = cursor.next_seq
    if lps:
        return [
            m
            for m in metas
            if m.seq < next_seq and m.seq not in pending and m.seq not in dead and m.seq not in lps
        ]
    return [m for m in metas if m.seq < next_seq and m.seq not in pending and m.seq not in dead]


def _done_with(consumer: Consumer, meta: MessageMeta) -> bool:
    """Interest retention: ``consumer`` no longer needs ``meta`` (acked or not its subject)."""
    if not consumer.cursor.match(meta.subject):
        return True
    seq = meta.seq
    state = consumer.state
    if seq in state.pending or seq in state.dead:
        return False
    return consumer.cursor.passed(meta)


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("saving consumer state failed: %s", fut.exception())
