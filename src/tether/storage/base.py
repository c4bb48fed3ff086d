"""The narrow, domain-level storage interface every backend implements.

The engine keeps its own in-memory index of each stream (sequences, subjects, sizes,
timestamps) and decides *what* to store or delete; a backend only persists and reads
back. Writes are buffered into the current **group commit**: every write made during
one event-loop tick goes to the backend in one transaction, and each write call
returns the same awaitable for that tick, which completes once the transaction is
durable (or fails with :class:`StorageError`).

Configurations and consumer states are opaque ``bytes`` to the backend: the engine
owns their encoding, so a schema change never needs a storage migration.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import NamedTuple

import msgspec


class StorageError(Exception):
    """A backend could not durably commit or read (disk full, read-only dir, corruption)."""


class CorruptMessage(StorageError):
    """A stored message does not match its checksum: it was damaged after it was written.

    Raised by every read that meets it, instead of returning the damaged content.
    """

    def __init__(self, stream: str, seq: int, hint: str = "") -> None:
        self.stream = stream
        self.seq = seq
        self.hint = hint
        super().__init__(
            f"message {seq} of stream {stream!r} is damaged (its checksum does not match){hint}"
        )

    def __reduce__(self) -> tuple[type[CorruptMessage], tuple[str, int, str]]:
        return (CorruptMessage, (self.stream, self.seq, self.hint))


class DamagedStore(StorageError):
    """The store does not hold what it must (a missing or truncated database, a lost
    write-ahead log, a missing stream): it refuses to open rather than serve less."""


class StoredMessage(msgspec.Struct, frozen=True, gc=False):
    """One message of a stream as persisted.

    ``headers`` is the raw ``NATS/1.0`` header block (empty when the message has none),
    kept as sent so it can be replayed byte for byte.
    """

    seq: int
    subject: str
    headers: bytes
    data: bytes
    ts: int  # nanoseconds since the Unix epoch, assigned when the message was stored
    priority: int = 0

    @property
    def size(self) -> int:
        # nats-server's memory-storage accounting: subject + headers + payload + 16.
        return subject_size(self.subject) + len(self.headers) + len(self.data) + MEMORY_SIZING.plain


def subject_size(subject: str) -> int:
    """The bytes of ``subject`` as sent (UTF-8), which nats-server counts."""
    # isascii() reads a flag of the string: nearly every subject costs no encoding.
    # A subject that is not valid UTF-8 reaches here only to be refused by the store;
    # it is sized, not rejected, here ("surrogatepass" counts what it would take).
    return len(subject) if subject.isascii() else len(subject.encode("utf-8", "surrogatepass"))


class Sizing(NamedTuple):
    """How many bytes a stream counts for a message beyond its subject, headers and
    payload (``state.bytes``, ``max_bytes``), as nats-server counts them."""

    plain: int  # a message without headers
    headers: int  # a message with a header block

    def overhead(self, headers: bytes) -> int:
        return self.headers if headers else self.plain


# nats-server's memory store: subject + headers + payload + 16.
MEMORY_SIZING = Sizing(16, 16)
# nats-server's file store counts its record: length 4 + seq 8 + time 8 + subject
# length 2 + checksum 8, and 4 more (the header length) when there are headers.
FILE_SIZING = Sizing(30, 34)


def sizing(storage: str) -> Sizing:
    """The accounting of a stream with ``storage`` (``file`` or ``memory``), whatever
    backend holds its messages."""
    return MEMORY_SIZING if storage == "memory" else FILE_SIZING


class MessageMeta(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """What the engine indexes in memory for each stored message (no payload)."""

    seq: int
    subject: str
    size: int  # what the stream counts: subject + headers + payload + overhead
    ts: int
    priority: int = 0
    # The bytes of ``size`` beyond subject + headers + payload (see :class:`Sizing`):
    # ``size - overhead`` is what a delivery of the message carries.
    overhead: int = 16


class MessageColumns(NamedTuple):
    """Stored messages column by column, in ascending sequence order: the bulk-read
    form (the columns of a message block), which backends can produce without a
    message object, or even a Python frame, per row."""

    seqs: list[int]
    subjects: list[str]
    headers: list[bytes]
    data: list[bytes]
    stamps: list[int]  # store times, ns since the epoch

    @classmethod
    def of(cls, msgs: Sequence[StoredMessage]) -> MessageColumns:
        return cls(
            list(map(_seq, msgs)),
            list(map(_subject, msgs)),
            list(map(_headers, msgs)),
            list(map(_data, msgs)),
            list(map(_ts, msgs)),
        )


_seq = attrgetter("seq")
_subject = attrgetter("subject")
_headers = attrgetter("headers")
_data = attrgetter("data")
_ts = attrgetter("ts")


class StreamRecord(msgspec.Struct, frozen=True):
    """A stream's persisted definition."""

    name: str
    config: bytes  # engine-encoded configuration
    created_ns: int
    # The configuration's ``compression`` ("none" or "s2"), the one setting a backend
    # applies itself: durable backends store an "s2" stream's payloads compressed
    # (see compression.py), the memory backend keeps them as they are.
    compression: str = "none"


class ConsumerRecord(msgspec.Struct, frozen=True):
    """A consumer's persisted definition and its latest state snapshot."""

    stream: str
    name: str
    config: bytes  # engine-encoded configuration
    state: bytes  # engine-encoded delivery state (cursor, ack floor, pending, dead set)
    created_ns: int


# Who hears about refused appends: {stream: {seq: why}} (see Store.on_refused).
RefusalHandler = Callable[[dict[str, dict[int, str]]], None]


class Store(ABC):
    """A storage backend. Reads are async and never block the event loop.

    A read that meets a message damaged since it was written raises
    :class:`CorruptMessage` (a :class:`StorageError`) rather than return it.

    Write methods are plain (non-async) calls that enqueue the change into the current
    group commit and return that commit's awaitable. Callers that need durability
    (a PubAck, an API reply) await it; callers that do not may ignore it. Changes are
    applied in the order they were made.
    """

    name: str = "abstract"

    # -- lifecycle -------------------------------------------------------------------
    @abstractmethod
    async def open(self) -> None:
        """Prepare the backend (create files, schema, start the writer)."""

    @abstractmethod
    async def close(self) -> None:
        """Commit what is pending, stop the writer and release every resource."""

    # -- loading at startup ------------------------------------------------------------
    @abstractmethod
    async def load_streams(self) -> list[StreamRecord]:
        """Every stream, ordered by name."""

    @abstractmethod
    async def load_index(self, stream: str, sizing: Sizing = MEMORY_SIZING) -> list[MessageMeta]:
        """The metadata of every message of ``stream``, ordered by sequence, each
        sized with ``sizing``."""

    @abstractmethod
    async def load_consumers(self, stream: str) -> list[ConsumerRecord]:
        """Every consumer of ``stream``, ordered by name."""

    @abstractmethod
    async def load_last_seq(self, stream: str) -> int:
        """The highest sequence ever assigned in ``stream`` (survives deleting the tail)."""

    # -- reads ------------------------------------------------------------------------
    @abstractmethod
    async def read(self, stream: str, seq: int) -> StoredMessage | None:
        """The message with sequence ``seq``, or None if absent or deleted."""

    @abstractmethod
    async def read_range(
        self, stream: str, start_seq: int, limit: int, max_bytes: int = 0
    ) -> list[StoredMessage]:
        """Up to ``limit`` messages with seq >= ``start_seq`` in order.

        With ``max_bytes`` > 0 the result stops before the message that would take the
        total of :attr:`StoredMessage.size` over it (but always holds at least one).
        """

    async def read_columns(
        self, stream: str, start_seq: int, last_seq: int, limit: int
    ) -> MessageColumns:
        """Up to ``limit`` messages with ``start_seq <= seq <= last_seq``, in order, as
        columns (the bulk-read form)."""
        msgs = await self.read_range(stream, start_seq, min(limit, last_seq - start_seq + 1))
        return MessageColumns.of([m for m in msgs if m.seq <= last_seq])

    @abstractmethod
    async def read_many(self, stream: str, seqs: Sequence[int]) -> list[StoredMessage]:
        """The messages with the given sequences that exist, in ascending sequence order."""

    def cached(self, stream: str, seq: int) -> StoredMessage | None:
        """A message if the backend can return it without I/O, else None.

        Lets hot paths (delivering what was just published) skip a thread hop.
        """
        return None

    # -- writes (group commit) -------------------------------------------------------
    @abstractmethod
    def put_stream(self, record: StreamRecord) -> asyncio.Future[None]:
        """Create or replace a stream definition."""

    @abstractmethod
    def delete_stream(self, stream: str) -> asyncio.Future[None]:
        """Delete a stream with all its messages and consumers."""

    @abstractmethod
    def append(self, stream: str, message: StoredMessage) -> asyncio.Future[None]:
        """Append one message; its ``seq`` is greater than every earlier one."""

    def append_run(self, stream: str, messages: Sequence[StoredMessage]) -> asyncio.Future[None]:
        """:meth:`append` each of ``messages`` (at least one, in sequence order) in one
        call; they are committed together, in one transaction, or not at all."""
        future = None
        for message in messages:
            future = self.append(stream, message)
        assert future is not None
        return future

    @abstractmethod
    def delete_messages(self, stream: str, seqs: Sequence[int]) -> asyncio.Future[None]:
        """Delete the given messages (missing ones are ignored)."""

    @abstractmethod
    def delete_range(self, stream: str, first_seq: int, last_seq: int) -> asyncio.Future[None]:
        """Delete every message with ``first_seq <= seq <= last_seq``."""

    @abstractmethod
    def put_consumer(self, record: ConsumerRecord) -> asyncio.Future[None]:
        """Create or replace a consumer's definition and state."""

    @abstractmethod
    def put_consumer_state(self, stream: str, name: str, state: bytes) -> asyncio.Future[None]:
        """Replace a consumer's state snapshot (the consumer exists)."""

    @abstractmethod
    def delete_consumer(self, stream: str, name: str) -> asyncio.Future[None]:
        """Delete a consumer."""

    @abstractmethod
    def flush(self) -> asyncio.Future[None]:
        """The awaitable of the current group commit (completes at once if none pending)."""

    # -- writes the store can never commit ---------------------------------------------
    def on_refused(self, handler: RefusalHandler) -> None:  # noqa: B027 - optional
        """Register who hears about appends the store found it can never commit (a value
        it cannot hold): ``handler({stream: {seq: why}})``, on the event loop, before
        the rest of their commit goes ahead without them. The handler takes the refused
        appends back, with every later one of their streams (:meth:`withdraw`), so that
        no sequence is left out. Without a handler, or in a backend that cannot tell
        which write is to blame, such a commit fails whole."""

    def withdraw(self, stream: str, from_seq: int) -> list[StoredMessage]:
        """Take the appends of ``stream`` with seq >= ``from_seq`` out of every commit
        not done yet and return them in order. Only from a refusal handler."""
        return []
