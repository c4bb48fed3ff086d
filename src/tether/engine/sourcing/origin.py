"""Where a mirror or source reads from: a stream of this server, or one on another
server reached through a :class:`RemoteOrigins` the front door provides."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

from tether.engine import errors
from tether.engine.broker import Broker
from tether.engine.streams.sourcing import SourceSpec, stream_identity
from tether.storage.base import StoredMessage

# How many messages one read returns at most: bounds what a copy holds in memory.
BATCH = 256


@dataclass(slots=True)
class Batch:
    """Messages of the origin in order, how many matching ones remain after them, and
    the origin's identity (a hash of its creation time, "" if unknown)."""

    msgs: list[StoredMessage] = field(default_factory=list)
    pending: int = 0
    identity: str = ""


class OriginReader(Protocol):
    """Reads one origin for one mirror or source."""

    async def read(self, after: int, spec: SourceSpec, filters: tuple[str, ...]) -> Batch:
        """Matching messages from ``after + 1`` on (``after`` 0: from where ``spec``
        says to start); raises :class:`errors.ApiError` when the origin cannot be read."""

    async def wait(self, seconds: float) -> None:
        """Return when the origin may have more, or after ``seconds``."""

    async def close(self) -> None:
        """Release what the reader holds (a connection, a consumer)."""


class RemoteOrigins(Protocol):
    """Opens readers for origins on other servers (``external`` sources)."""

    def open(self, spec: SourceSpec) -> OriginReader: ...


class LocalOrigin:
    """A stream of this server, read through the broker; woken by its commits."""

    def __init__(self, broker: Broker, name: str) -> None:
        self.broker = broker
        self.name = name
        self.more = asyncio.Event()

    async def read(self, after: int, spec: SourceSpec, filters: tuple[str, ...]) -> Batch:
        self.more.clear()
        stream = self.broker.streams.get(self.name)
        if stream is None:
            raise errors.stream_not_found()
        if after:
            start = after + 1
        elif spec.opt_start_seq:
            start = spec.opt_start_seq
        elif spec.opt_start_time:
            start = stream.seq_from_time(spec.start_time_ns()) or stream.last_seq + 1
        else:
            start = stream.first_seq
        # Only what is durable: a copy must never get ahead of its origin's commits.
        seqs = [
            seq
            for seq in islice(stream.seqs_matching(start, filters), BATCH)
            if seq <= stream.durable_seq
        ]
        msgs = await self.broker.read_many(stream, seqs) if seqs else []
        nxt = (msgs[-1].seq + 1) if msgs else start
        return Batch(msgs, stream.count_matching(nxt, filters), stream_identity(stream.created_ns))

    async def wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.more.wait(), seconds)

    async def close(self) -> None:
        self.more.set()
