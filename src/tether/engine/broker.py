"""The broker: the one facade front doors use to reach streams (and consumers).

It applies the engine's decisions to storage through group commit: every change made
in one loop tick is committed together and a publish is acknowledged only once its
commit is durable. Listeners hear about committed messages and stream changes, which
is how consumers learn about new work and front doors about subjects to capture.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tether.engine import errors
from tether.engine.clock import Clock, Timer
from tether.engine.stream import (
    EXPECTED_LAST_MSG_ID,
    EXPECTED_LAST_SEQ,
    EXPECTED_LAST_SUBJ_SEQ,
    EXPECTED_LAST_SUBJ_SEQ_SUBJECT,
    EXPECTED_STREAM,
    MSG_ID,
    PRIORITY,
    ROLLUP,
    Stream,
)
from tether.engine.stream_config import (
    StreamConfig,
    check_update,
    decode_config,
    encode_config,
    normalize,
)
from tether.engine.subjects import filters_overlap, is_valid_subject
from tether.protocol.nats.headers import header_value
from tether.storage.base import MessageMeta, StorageError, Store, StoredMessage, StreamRecord

log = logging.getLogger("tether.broker")


class BrokerListener(Protocol):
    """Hooks the broker calls; consumers and front doors implement the ones they need."""

    def on_stream_changed(self, stream: Stream) -> None: ...
    def on_stream_deleted(self, stream: Stream) -> None: ...
    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None: ...
    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None: ...


@dataclass(slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False


class _Tick:
    """What one group commit carries besides the writes: who to tell when it lands."""

    __slots__ = ("appended", "waiters")

    def __init__(self) -> None:
        self.appended: list[tuple[Stream, int]] = []
        self.waiters: list[Callable[[BaseException | None], None]] = []


class Broker:
    """Streams and their messages, persisted through a :class:`Store`."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.streams: dict[str, Stream] = {}
        self.listeners: list[BrokerListener] = []
        self._ticks: dict[int, _Tick] = {}
        self._expiry_timer: Timer | None = None
        self._expiry_at = 0

    # -- startup ---------------------------------------------------------------------------
    async def load(self) -> None:
        """Rebuild every stream's index from storage (after a restart or a crash)."""
        now = self.clock.now()
        for record in await self.store.load_streams():
            config = decode_config(record.config)
            stream = Stream(config, record.created_ns)
            index = await self.store.load_index(record.name)
            stream.load(index, await self.store.load_last_seq(record.name))
            await self._restore_dedup(stream, index, now)
            self.streams[stream.name] = stream
        for stream in self.streams.values():
            self._expire(stream)
        self._schedule_expiry()

    async def _restore_dedup(self, stream: Stream, index: list[MessageMeta], now: int) -> None:
        cutoff = now - stream.config.duplicate_window
        recent = [m.seq for m in index if m.ts >= cutoff]
        if index and not recent:
            recent = [index[-1].seq]  # for Nats-Expected-Last-Msg-Id
        for i in range(0, len(recent), 1000):
            for msg in await self.store.read_many(stream.name, recent[i : i + 1000]):
                msg_id = header_value(msg.headers, MSG_ID)
                if msg_id:
                    stream.remember_msg_id(msg_id.decode(), msg.seq, msg.ts)

    # -- stream management ------------------------------------------------------------------
    def _notify_changed(self, stream: Stream) -> None:
        for listener in self.listeners:
            listener.on_stream_changed(stream)

    async def create_stream(self, name: str, body: bytes) -> tuple[Stream, bool]:
        """STREAM.CREATE: returns (stream, created); identical re-create succeeds."""
        config = decode_config(body) if body.strip() else StreamConfig()
        if config.name and name and config.name != name:
            raise errors.stream_name_mismatch()
        config.name = config.name or name
        normalize(config)
        existing = self.streams.get(config.name)
        if existing is not None:
            if encode_config(existing.config) == encode_config(config):
                return existing, False
            raise errors.stream_name_exists()
        self._check_overlap(config, None)
        stream = Stream(config, self.clock.now())
        stream.state.first_seq = max(1, config.first_seq)
        stream.state.last_seq = stream.state.first_seq - 1
        self.streams[config.name] = stream
        await self._durable(
            self.store.put_stream(
                StreamRecord(config.name, encode_config(config), stream.created_ns)
            )
        )
        self._notify_changed(stream)
        return stream, True

    async def update_stream(self, name: str, body: bytes) -> Stream:
        config = decode_config(body)
        if config.name and name and config.name != name:
            raise errors.stream_name_mismatch()
        config.name = config.name or name
        stream = self.get_stream(config.name)
        normalize(config)
        check_update(stream.config, config)
        self._check_overlap(config, stream)
        stream.config = config
        removed = stream._enforce_limits_all()  # noqa: SLF001 - same package
        if removed:
            self._delete_seqs(stream, removed)
        await self._durable(
            self.store.put_stream(
                StreamRecord(config.name, encode_config(config), stream.created_ns)
            )
        )
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

    def get_stream(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            raise errors.stream_not_found()
        return stream

    async def delete_stream(self, name: str) -> None:
        stream = self.get_stream(name)
        del self.streams[name]
        for listener in self.listeners:
            listener.on_stream_deleted(stream)
        await self._durable(self.store.delete_stream(name))

    async def purge_stream(self, name: str, filter_: str, seq: int, keep: int) -> int:
        stream = self.get_stream(name)
        if stream.config.deny_purge:
            raise errors.purge_not_permitted()
        if stream.config.sealed:
            raise errors.stream_sealed()
        if filter_ and not is_valid_subject(filter_.replace("*", "x").replace(">", "x")):
            raise errors.bad_request("invalid purge subject")
        if seq and keep:
            raise errors.bad_request("can not specify both sequence and keep")
        removed = stream.purge(filter_, seq, keep)
        if removed:
            self._delete_seqs(stream, removed)
        await self._durable(self.store.flush())
        return len(removed)

    async def delete_message(self, name: str, seq: int) -> None:
        stream = self.get_stream(name)
        if stream.config.deny_delete:
            raise errors.delete_not_permitted()
        if stream.config.sealed:
            raise errors.stream_sealed()
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

    async def _durable(self, fut: asyncio.Future[None]) -> None:
        try:
            await fut
        except StorageError as exc:
            raise errors.store_failed(str(exc)) from None

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
        cfg = stream.config
        now = self.clock.now()
        hdrs = headers or b""
        msg_id = ""
        priority = 0
        try:
            if cfg.sealed:
                raise errors.stream_sealed()
            if hdrs:
                raw_id = header_value(hdrs, MSG_ID)
                if raw_id:
                    msg_id = raw_id.decode()
                    dup = stream.duplicate_of(msg_id, now)
                    if dup:
                        if on_durable is not None:
                            on_durable(PubAck(stream.name, dup, True))
                        return
                stream.check_expectations(
                    subject,
                    header_value(hdrs, EXPECTED_STREAM),
                    header_value(hdrs, EXPECTED_LAST_SEQ),
                    header_value(hdrs, EXPECTED_LAST_SUBJ_SEQ),
                    header_value(hdrs, EXPECTED_LAST_SUBJ_SEQ_SUBJECT),
                    header_value(hdrs, EXPECTED_LAST_MSG_ID),
                )
                raw_priority = header_value(hdrs, PRIORITY)
                if raw_priority:
                    try:
                        priority = int(raw_priority)
                    except ValueError:
                        raise errors.bad_request("invalid priority header") from None
            size = len(subject) + len(hdrs) + len(payload) + 16
            stream.check_limits_for_new(subject, size)
            rollup = header_value(hdrs, ROLLUP) if hdrs else None
            removed: list[int] = []
            if rollup:
                if not cfg.allow_rollup_hdrs:
                    raise errors.rollup_not_permitted()
                mode = rollup.decode().lower()
                if mode not in ("sub", "all"):
                    raise errors.invalid_rollup(mode)
                removed = stream.rollup(subject, mode)
        except errors.ApiError as exc:
            if on_durable is not None:
                on_durable(exc)
            return
        if msg_id == "" and cfg.duplicate_window and stream.last_msg_id:
            stream.last_msg_id = ""
        seq = stream.last_seq + 1
        msg = StoredMessage(seq, subject, hdrs, payload, now, priority)
        meta = MessageMeta(seq, subject, msg.size, now, priority)
        removed += stream.append(meta, msg_id)
        fut = self.store.append(stream.name, msg)
        if removed:
            self._delete_seqs(stream, removed)
        tick = self._tick_for(fut)
        tick.appended.append((stream, seq))
        if on_durable is not None:
            ack = PubAck(stream.name, seq)

            def done(exc: BaseException | None) -> None:
                if exc is None:
                    on_durable(ack)
                else:
                    on_durable(errors.store_failed(str(exc)))

            tick.waiters.append(done)
        if cfg.max_age and not self._expiry_timer:
            self._schedule_expiry()

    def _tick_for(self, fut: asyncio.Future[None]) -> _Tick:
        key = id(fut)
        tick = self._ticks.get(key)
        if tick is None:
            tick = self._ticks[key] = _Tick()
            fut.add_done_callback(lambda f: self._committed(key, f))
        return tick

    def _committed(self, key: int, fut: asyncio.Future[None]) -> None:
        tick = self._ticks.pop(key)
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            log.error("group commit failed: %s", exc)
            # Nothing of this commit is stored: forget its messages so the index matches disk.
            for stream, seq in tick.appended:
                stream.remove(seq)
        else:
            by_stream: dict[str, tuple[Stream, list[int]]] = {}
            for stream, seq in tick.appended:
                entry = by_stream.get(stream.name)
                if entry is None:
                    by_stream[stream.name] = (stream, [seq])
                else:
                    entry[1].append(seq)
            for stream, seqs in by_stream.values():
                if self.streams.get(stream.name) is stream:
                    for listener in self.listeners:
                        listener.on_messages_committed(stream, seqs)
        for waiter in tick.waiters:
            waiter(exc)

    # -- reads ------------------------------------------------------------------------------------
    async def read(self, stream: Stream, seq: int) -> StoredMessage | None:
        if stream.meta(seq) is None:
            return None
        cached = self.store.cached(stream.name, seq)
        if cached is not None:
            return cached
        return await self.store.read(stream.name, seq)

    async def get_message(
        self, name: str, seq: int = 0, last_by_subj: str = "", next_by_subj: str = ""
    ) -> StoredMessage:
        """STREAM.MSG.GET / DIRECT.GET semantics."""
        stream = self.get_stream(name)
        if last_by_subj:
            seq = stream.last_by_subject(last_by_subj)
        elif next_by_subj:
            seq = stream.next_by_subject(max(seq, 1), next_by_subj)
        elif seq <= 0:
            raise errors.bad_request("request seq or last_by_subj required")
        msg = await self.read(stream, seq) if seq else None
        if msg is None:
            raise errors.no_message_found()
        return msg

    async def get_batch(
        self, name: str, start_seq: int, batch: int, max_bytes: int, next_by_subj: str
    ) -> list[StoredMessage]:
        """Batched DIRECT.GET: up to ``batch`` messages from ``start_seq`` (optionally filtered)."""
        stream = self.get_stream(name)
        if next_by_subj:
            seqs: list[int] = []
            for seq in stream.seqs_matching(max(start_seq, 1), (next_by_subj,)):
                seqs.append(seq)
                if len(seqs) >= batch:
                    break
            msgs = await self.store.read_many(name, seqs) if seqs else []
            if max_bytes > 0:
                msgs = _trim_bytes(msgs, max_bytes)
            return msgs
        return await self.store.read_range(name, max(start_seq, 1), batch, max_bytes)

    # -- max_age ------------------------------------------------------------------------------------
    def _expire(self, stream: Stream) -> None:
        gone = stream.expired(self.clock.now())
        if gone:
            self._delete_seqs(stream, gone)

    def _schedule_expiry(self) -> None:
        nxt = 0
        for stream in self.streams.values():
            due = stream.next_expiry()
            if due and (not nxt or due < nxt):
                nxt = due
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

    # -- account ---------------------------------------------------------------------------------------
    def account_usage(self) -> dict[str, Any]:
        storage = sum(s.state.bytes for s in self.streams.values() if s.config.storage == "file")
        memory = sum(s.state.bytes for s in self.streams.values() if s.config.storage == "memory")
        consumers = sum(s.consumer_count for s in self.streams.values())
        return {
            "memory": memory,
            "storage": storage,
            "streams": len(self.streams),
            "consumers": consumers,
        }


def _trim_bytes(msgs: list[StoredMessage], max_bytes: int) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    total = 0
    for msg in msgs:
        total += msg.size
        if out and total > max_bytes:
            break
        out.append(msg)
    return out
