"""What the SQLite and PostgreSQL stores share: a writer thread, reader threads, a cache.

One writer thread commits each group commit; a pool of two reader threads runs the
reads, each with its own connection; the cache of committed messages answers
``cached()``; and one lifecycle starts and stops them. A subclass brings its writer,
how a reader thread connects (``_in_reader``), and the reads themselves."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from tether.storage.base import StorageError, StoredMessage
from tether.storage.cache import MessageCache
from tether.storage.group_commit import (
    Batch,
    BatchingStore,
    Committer,
    Settled,
    ThreadCommitter,
)

__all__ = ["ThreadedStore"]

T = TypeVar("T")
W = TypeVar("W", bound=Committer)


class Connection(Protocol):
    def close(self) -> object: ...


Conn = TypeVar("Conn", bound=Connection)


class ThreadedStore(BatchingStore, Generic[W, Conn]):
    """A store whose writes go to ``writer`` on its own thread and whose reads run on
    two reader threads (``_run_read``); ``cache_bytes`` bounds the message cache (0
    disables it). ``name`` names the threads."""

    name: str

    def __init__(self, writer: W, cache_bytes: int) -> None:
        super().__init__()
        self._committer = ThreadCommitter(
            writer,
            name=f"tether-{self.name}-writer",
            on_settled=self._settle,
            on_refused=self._refused,
        )
        self._cache = MessageCache(cache_bytes) if cache_bytes > 0 else None
        self._readers: ThreadPoolExecutor | None = None
        self._reader_conns: list[Conn] = []
        self._reader_lock = threading.Lock()
        self._local = threading.local()
        self._state = "new"
        self._closing: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        if self._state == "open":
            return
        if self._state != "new":
            raise StorageError("the store is closed and cannot be reopened")
        self._loop = asyncio.get_running_loop()
        await self._committer.start()
        self._readers = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix=f"tether-{self.name}-reader"
        )
        self._group.bind(self._loop)
        self._state = "open"

    async def close(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    def _closed(self) -> None:
        """Called once the store no longer takes writes, before the threads stop."""

    async def _close(self) -> None:
        if self._state == "open":
            await self._drain()
            self._group.close()
        self._state = "closed"
        self._closed()
        readers, self._readers = self._readers, None
        if readers is not None:
            # Reads in flight finish on their own; none can start any more.
            readers.shutdown(wait=True)
        with self._reader_lock:
            conns, self._reader_conns = self._reader_conns, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        # The writer stops last (SQLite's connection then checkpoints the WAL away).
        await self._committer.stop()
        if self._cache is not None:
            self._cache.clear()

    # -- group commit ----------------------------------------------------------------
    def _hand_off(self, batch: Batch) -> None:
        self._committer.submit(batch)

    def _settle(self, results: list[Settled]) -> None:
        cache, group = self._cache, self._group
        for batch, error in results:
            if error is None and cache is not None:
                cache.apply(batch.ops)
            group.settle(batch, error)

    # -- reads -----------------------------------------------------------------------
    async def _run_read(self, fn: Callable[[Conn], T]) -> T:
        readers = self._readers
        if readers is None:
            raise StorageError(f"the store is {self._state}, not open")
        return await asyncio.get_running_loop().run_in_executor(readers, self._in_reader, fn)

    @abstractmethod
    def _in_reader(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` with this reader thread's connection (see :meth:`_keep_reader`)."""

    def _keep_reader(self, conn: Conn) -> Conn:
        """Make ``conn`` this reader thread's connection; the store closes it."""
        with self._reader_lock:
            self._reader_conns.append(conn)
        self._local.conn = conn
        return conn

    def _all_cached(self, stream: str, seqs: Sequence[int]) -> list[StoredMessage] | None:
        """The messages ``seqs`` if the cache holds every one of them, else None."""
        cache = self._cache
        if cache is None or self._state != "open":
            return None
        hits = [cache.get(stream, seq) for seq in seqs]
        if all(hit is not None for hit in hits):
            return [hit for hit in hits if hit is not None]
        return None

    def cached(self, stream: str, seq: int) -> StoredMessage | None:
        cache = self._cache
        if cache is None or self._state != "open":
            return None
        return cache.get(stream, seq)
