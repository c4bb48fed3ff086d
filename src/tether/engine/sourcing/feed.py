"""One mirror or one source of a stream: reads its origin and copies what it reads,
one durable batch at a time.

Progress is what the stream holds, never a separate counter: a mirror stands at its
last sequence (it numbers as its origin does), a source at the origin sequence in the
``Nats-Stream-Source`` header of the last message it copied. A copy is acknowledged by
the group commit like any publish, and the next batch is read only once the previous
one is durable, so after a crash (kill -9 included) the stream holds a prefix of the
copies and the feed resumes right after it: nothing is copied twice, nothing skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.sourcing.origin import Batch, OriginReader
from tether.engine.streams import Stream
from tether.engine.streams.sourcing import STREAM_SOURCE, SourceSpec, source_header
from tether.engine.subjects import subject_matches
from tether.storage.base import StoredMessage

log = logging.getLogger("tether.sourcing")

# Headers a copy does not carry over: the origin's publish expectations and batch
# markers apply to the origin's publish only (nats-server strips the same ones).
_DROPPED_PREFIXES = (b"nats-expected-", b"nats-batch-")
# How long an idle feed waits for its origin before looking again (a heartbeat).
IDLE = 1.0
# Retries after an error: 2 s at first, doubling up to 2 minutes, plus jitter.
RETRY_FIRST = 2.0
RETRY_MAX = 120.0


def copy_headers(block: bytes, stamp: str) -> bytes:
    """The origin's header block without what a copy drops, plus ``stamp`` (a
    ``Nats-Stream-Source`` value, replacing any earlier one) when given."""
    lines: list[bytes] = []
    if block:
        for line in block.split(b"\r\n")[1:]:
            if not line:
                continue
            key = line.partition(b":")[0].strip().lower()
            if key.startswith(_DROPPED_PREFIXES) or (stamp and key == b"nats-stream-source"):
                continue
            lines.append(line)
    if stamp:
        lines.append(f"{STREAM_SOURCE}: {stamp}".encode())
    if not lines:
        return b""
    status = block.split(b"\r\n", 1)[0] if block else b"NATS/1.0"
    return b"\r\n".join([status, *lines]) + b"\r\n\r\n"


class Feed:
    """A mirror or a source of ``target``, copying from ``reader``."""

    def __init__(
        self,
        broker: Broker,
        target: str,
        spec: SourceSpec,
        reader: OriginReader,
        *,
        mirror: bool,
        last_seq: int,
        identity: str = "",
    ) -> None:
        self.broker = broker
        self.target = target
        self.spec = spec
        self.iname = spec.index_name()
        self.reader = reader
        self.mirror = mirror
        self.filters = spec.filters()
        self.transforms = spec.transforms()
        # The origin sequence of the last message copied and durable (0: none yet).
        self.last_seq = last_seq
        # The origin's identity when that was copied: another one means the origin was
        # deleted and created again, and a source starts over (as nats-server's does).
        self.identity = identity
        self.lag = 0
        self.heard = 0  # clock time the origin last answered (0: never)
        self.error: errors.ApiError | None = None
        self._task: asyncio.Task[None] | None = None
        self._fails = 0
        self._stopped = asyncio.Event()
        self._copying = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop copying. A batch being stored is finished first, so :attr:`last_seq`
        is exactly what the stream holds when this returns."""
        self._stopped.set()
        task, self._task = self._task, None
        if task is not None:
            if not self._copying:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reader.close()

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), delay)

    # -- what stream info shows ---------------------------------------------------------------
    def info(self) -> dict[str, object]:
        """A ``mirror`` / ``sources[]`` entry of a stream info, as nats-server writes it."""
        out: dict[str, object] = {"name": self.spec.name}
        if self.spec.external is not None:
            out["external"] = {"api": self.spec.external.api, "deliver": self.spec.external.deliver}
        out["lag"] = self.lag
        if not self.mirror and self.last_seq:
            out["seq"] = self.last_seq
        out["active"] = self.broker.clock.now() - self.heard if self.heard else -1
        if self.error is not None:
            out["error"] = self.error.to_dict()
        if self.spec.filter_subject:
            out["filter_subject"] = self.spec.filter_subject
        if self.spec.subject_transforms:
            out["subject_transforms"] = [
                {"src": t.src, "dest": t.dest} for t in self.spec.subject_transforms
            ]
        return out

    # -- copying ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                batch = await self.reader.read(self.last_seq, self.spec, self.filters)
            except errors.ApiError as exc:
                self._failed(exc)
                await self._pause(self._retry_delay())
                continue
            except (OSError, TimeoutError) as exc:
                self._failed(errors.ApiError(503, 10008, f"origin unreachable: {exc}"))
                await self._pause(self._retry_delay())
                continue
            self.error = None
            self.heard = self.broker.clock.now()
            if self._recreated(batch.identity):
                continue
            if not batch.msgs:
                self.lag = batch.pending
                self._fails = 0
                await self.reader.wait(IDLE)
                continue
            self._copying = True
            try:
                failure = await self._copy(batch)
            finally:
                self._copying = False
            if failure is not None:
                self._failed(failure)
                await self._pause(self._retry_delay())
                continue
            self._fails = 0
            self.lag = batch.pending

    def _recreated(self, identity: str) -> bool:
        """Whether the origin turned out to be another stream of the same name (the
        source then starts again from its first message)."""
        if not identity:
            return False
        if self.mirror or not self.identity or identity == self.identity or not self.last_seq:
            self.identity = identity
            return False
        log.warning(
            "stream %s: source %s was recreated, starting over", self.target, self.spec.name
        )
        self.identity = identity
        self.last_seq = 0
        return True

    def _failed(self, exc: errors.ApiError) -> None:
        if self.error is None or self.error.err_code != exc.err_code:
            log.warning(
                "stream %s: %s %s: %s",
                self.target,
                "mirror" if self.mirror else "source",
                self.spec.name,
                exc,
            )
        self.error = exc
        self._fails += 1

    def _retry_delay(self) -> float:
        delay = min(RETRY_FIRST * (2 ** max(0, self._fails - 1)), RETRY_MAX)
        return float(delay) + random.uniform(0.1, 0.2)

    async def _copy(self, batch: Batch) -> errors.ApiError | None:
        """Store the batch's copies in order, waiting until they are durable; the first
        error stops the batch (what came before it stays, and counts as progress)."""
        stream = self.broker.streams.get(self.target)
        if stream is None:
            return errors.stream_not_found()
        loop = asyncio.get_running_loop()
        waiting: list[tuple[int, asyncio.Future[PubAck | errors.ApiError]]] = []
        for msg in batch.msgs:
            fut: asyncio.Future[PubAck | errors.ApiError] = loop.create_future()
            self._store(stream, msg, batch.identity, fut.set_result)
            waiting.append((msg.seq, fut))
            if fut.done() and isinstance(fut.result(), errors.ApiError):
                break  # refused at once: later ones must not overtake it
        for origin_seq, fut in waiting:
            result = await fut
            if isinstance(result, errors.ApiError):
                return result
            self.last_seq = origin_seq
        return None

    def _store(
        self,
        stream: Stream,
        msg: StoredMessage,
        identity: str,
        done: Callable[[PubAck | errors.ApiError], None],
    ) -> None:
        subject = self._subject(msg.subject)
        if self.mirror:
            headers = copy_headers(msg.headers, "")
            copy = StoredMessage(msg.seq, subject, headers, msg.data, msg.ts, msg.priority)
            self.broker.append_mirrored(stream, copy, done)
            return
        stamp = source_header(self.iname, msg.seq, msg.subject, identity)
        headers = copy_headers(msg.headers, stamp)
        self.broker.publish(stream, subject, headers or None, msg.data, done)

    def _subject(self, subject: str) -> str:
        for filter_, transform in self.transforms:
            if subject_matches(filter_, subject):
                if transform is None:
                    return subject
                return transform.apply(subject) or subject
        return subject
