"""Deferred publishes (``DPUB``): kept durably until due, then published to their topic.

nsqd holds a deferred message in each channel's memory; here it is a record in the
store (a consumer record of the reserved pseudo stream :data:`DEFERRED_STREAM`, whose
name no real stream can take, so this needs nothing new of the storage interface) and
enters the topic's stream when due. Publishing it and deleting its record happen in
the same loop tick, hence the same group commit: a crash neither loses it nor
publishes it twice. It is readable over NATS from then on, like any message of the
topic, and stamped with the time it was published.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

import msgspec

from tether.engine.clock import Clock, Timer
from tether.storage.base import ConsumerRecord, StorageError, Store

log = logging.getLogger("tether.nsq")

DEFERRED_STREAM = "$tether.nsq.deferred"  # not a valid stream name: cannot collide
NS = 1_000_000_000


class _Record(msgspec.Struct, array_like=True):
    topic: str
    due_ns: int
    body: bytes


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_Record).decode

# Publishes a body to a topic (creating the topic if needed); done in the caller's tick.
# The publish raises when it is refused at once.
Publisher = Callable[[str, bytes], Awaitable[Callable[[], None]]]
LOG_EVERY_NS = 10 * NS  # at most one line about failed releases per 10 s


class DeferredPublishes:
    """Messages waiting for their time, earliest first."""

    def __init__(self, store: Store, clock: Clock, publish: Publisher) -> None:
        self.store = store
        self.clock = clock
        self._publish = publish
        self._due: list[tuple[int, str, _Record]] = []
        self._timer: Timer | None = None
        self._timer_at = 0
        self._counter = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        # Failed releases since the last line about them: a full store refuses every
        # due message once a second, which must not become a line each.
        self._failed = 0
        self._failed_logged_ns = -LOG_EVERY_NS
        # After a failed release, one due message at a time is tried (once a second)
        # until one goes through: a backlog is not tried whole every second.
        self._failing = False
        self._probe_at = 0  # while failing: when the next one is tried

    def __len__(self) -> int:
        return len(self._due)

    async def load(self) -> None:
        for record in await self.store.load_consumers(DEFERRED_STREAM):
            try:
                entry = _decode(record.config)
            except msgspec.DecodeError:
                log.error("deferred message %s: unreadable record, dropped", record.name)
                continue
            heapq.heappush(self._due, (entry.due_ns, record.name, entry))
        self._arm()

    async def add(self, topic: str, body: bytes, delay_ns: int) -> None:
        """Keep ``body`` for ``topic`` until ``delay_ns`` from now; returns once durable."""
        now = self.clock.now()
        entry = _Record(topic, now + delay_ns, body)
        name = f"{entry.due_ns:020d}-{next(self._counter)}-{now}"
        record = ConsumerRecord(DEFERRED_STREAM, name, _encode(entry), b"", now)
        await self.store.put_consumer(record)
        heapq.heappush(self._due, (entry.due_ns, name, entry))
        self._arm()

    def _arm(self) -> None:
        if not self._due:
            return
        due = self._due[0][0]
        if self._failing:
            due = max(due, self._probe_at)
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer_at = due
        self._timer = self.clock.call_later(max(0, due - self.clock.now()) / NS, self._fire)

    def _fire_soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self.clock.now()
        self._timer = self.clock.call_later(0, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.clock.now()
        while self._due and self._due[0][0] <= now:
            _, name, entry = heapq.heappop(self._due)
            task = asyncio.ensure_future(self._release(name, entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if self._failing:
                # One probe this second; the rest of what is due waits for the next.
                self._probe_at = now + NS
                break
        self._arm()

    async def _release(self, name: str, entry: _Record) -> None:
        try:
            publish = await self._publish(entry.topic, entry.body)
            # Refused (the server's size bound reached): raises, its record kept.
            publish()
        except Exception as exc:  # no topic, or no room for the message: later
            if not self._failing:
                self._failing = True
                self._probe_at = self.clock.now() + NS
            self._failed += 1
            now = self.clock.now()
            if now - self._failed_logged_ns >= LOG_EVERY_NS:
                log.error(
                    "deferred message for %s: %s; retrying in 1s (%d failed since the last line)",
                    entry.topic,
                    exc,
                    self._failed,
                )
                self._failed, self._failed_logged_ns = 0, now
            heapq.heappush(self._due, (self.clock.now() + NS, name, entry))
            self._arm()
            return
        if self._failing:  # through again: the rest of what is due goes too
            self._failing = False
            self._fire_soon()
        try:
            await self.store.delete_consumer(DEFERRED_STREAM, name)
        except StorageError as exc:
            log.error("deferred message for %s: %s", entry.topic, exc)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            task.cancel()
