"""Group commit: the write path shared by every backend.

Every write made during one event-loop tick is appended, as a small tuple ("op"), to
the tick's :class:`Batch`. The first write of a tick schedules (``loop.call_soon``) the
hand-off of that batch to the backend's committer, so the hand-off runs once the
callbacks that were ready in this tick have run. Every write of the tick returns the
batch's future, which completes when the batch is durable or fails with
:class:`StorageError`.

Backends that do blocking I/O commit on a :class:`ThreadCommitter`: one dedicated
thread owning the only write connection, fed through a queue. When batches pile up
while it is busy, it merges them into one transaction, which is what lets group
commit scale: the cost of a durable commit (an fsync) is shared by every write that
arrived while the previous one was in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from tether.storage.base import (
    ConsumerRecord,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
)

__all__ = [
    "APPEND",
    "DELETE_CONSUMER",
    "DELETE_MESSAGES",
    "DELETE_RANGE",
    "DELETE_STREAM",
    "PUT_CONSUMER",
    "PUT_CONSUMER_STATE",
    "PUT_STREAM",
    "Batch",
    "BatchingStore",
    "CommitFuture",
    "Committer",
    "GroupCommit",
    "Op",
    "Settled",
    "ThreadCommitter",
]

T = TypeVar("T")

# -- ops ---------------------------------------------------------------------------
# Plain tuples tagged by a small int: the cheapest object Python can build on the hot
# path, and mypy narrows the union below on ``op[0] == APPEND`` and friends.
APPEND: Final = 0
PUT_STREAM: Final = 1
DELETE_STREAM: Final = 2
DELETE_MESSAGES: Final = 3
DELETE_RANGE: Final = 4
PUT_CONSUMER: Final = 5
PUT_CONSUMER_STATE: Final = 6
DELETE_CONSUMER: Final = 7

AppendOp = tuple[Literal[0], str, StoredMessage]
PutStreamOp = tuple[Literal[1], StreamRecord]
DeleteStreamOp = tuple[Literal[2], str]
DeleteMessagesOp = tuple[Literal[3], str, tuple[int, ...]]
DeleteRangeOp = tuple[Literal[4], str, int, int]
PutConsumerOp = tuple[Literal[5], ConsumerRecord]
PutConsumerStateOp = tuple[Literal[6], str, str, bytes]
DeleteConsumerOp = tuple[Literal[7], str, str]

Op = (
    AppendOp
    | PutStreamOp
    | DeleteStreamOp
    | DeleteMessagesOp
    | DeleteRangeOp
    | PutConsumerOp
    | PutConsumerStateOp
    | DeleteConsumerOp
)


class CommitFuture(asyncio.Future[None]):
    """The shared future of one group commit. It cannot be cancelled.

    Every write of a tick shares this future, so if cancelling one awaiting task
    cancelled the future itself, every other writer of that tick would see a spurious
    ``CancelledError`` for a write that is in fact being committed. Refusing
    cancellation makes a cancelled awaiting task raise ``CancelledError`` once the
    commit completes, while the other waiters get the real outcome. Callers that need
    to stop waiting earlier can await ``asyncio.shield(future)``.
    """

    __slots__ = ()

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class Batch:
    """The ops of one group commit and the future every write of it returned."""

    __slots__ = ("future", "ops")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.ops: list[Op] = []


# A batch with the error that failed it, or None when it committed.
Settled = tuple[Batch, StorageError | None]


class GroupCommit:
    """Collects the writes of one event-loop tick into a :class:`Batch`.

    ``hand_off`` receives each batch, in order, one tick after its first write. The
    backend must eventually call :meth:`settle` for every batch it was handed, in
    the order the batches were handed off.
    """

    __slots__ = ("_batch", "_closed", "_hand_off", "_in_flight", "_loop")

    def __init__(self, hand_off: Callable[[Batch], None]) -> None:
        self._hand_off = hand_off
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: Batch | None = None
        self._in_flight = 0
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Accept writes, creating futures on ``loop``."""
        self._loop = loop

    def close(self) -> None:
        """Refuse every later write (the caller has flushed what was pending)."""
        self._closed = True

    @property
    def idle(self) -> bool:
        """True when no batch is collecting or waiting for its commit."""
        return self._batch is None and self._in_flight == 0

    def add(self, op: Op) -> asyncio.Future[None]:
        """Add ``op`` to the current tick's batch and return that batch's future."""
        batch = self._batch
        if batch is None:
            batch = self._start()
        batch.ops.append(op)
        return batch.future

    def flush(self) -> asyncio.Future[None]:
        """A future that completes once every write made so far is durable.

        It is the current tick's future when this tick has writes; otherwise an empty
        batch queued behind the in-flight ones, or a completed future when idle. The
        empty batch cannot fail, so an earlier failed commit does not fail a flush.
        """
        batch = self._batch
        if batch is not None:
            return batch.future
        if self._in_flight == 0:
            done = CommitFuture(loop=self._loop or asyncio.get_running_loop())
            done.set_result(None)
            return done
        return self._start().future

    def settle(self, batch: Batch, error: StorageError | None) -> None:
        """Complete ``batch``'s future; called by the backend on the loop thread."""
        self._in_flight -= 1
        future = batch.future
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _start(self) -> Batch:
        loop = self._loop
        if loop is None:
            raise StorageError("the store is not open")
        if self._closed:
            raise StorageError("the store is closed")
        batch = Batch(CommitFuture(loop=loop))
        self._batch = batch
        loop.call_soon(self._dispatch)
        return batch

    def _dispatch(self) -> None:
        batch = self._batch
        if batch is None:
            return
        self._batch = None
        self._in_flight += 1
        self._hand_off(batch)


class BatchingStore(Store):
    """A :class:`Store` whose writes all go through one :class:`GroupCommit`.

    Subclasses implement :meth:`_hand_off` (commit the batch, then settle it), the
    reads and the lifecycle.
    """

    def __init__(self) -> None:
        self._group = GroupCommit(self._hand_off)

    @abstractmethod
    def _hand_off(self, batch: Batch) -> None:
        """Commit ``batch`` and eventually call ``self._group.settle`` for it."""

    async def _drain(self) -> None:
        """Wait until every write made so far has been committed (or has failed)."""
        while not self._group.idle:
            # A failed commit was already reported to its writers through their future.
            with contextlib.suppress(StorageError):
                await self._group.flush()

    def put_stream(self, record: StreamRecord) -> asyncio.Future[None]:
        return self._group.add((PUT_STREAM, record))

    def delete_stream(self, stream: str) -> asyncio.Future[None]:
        return self._group.add((DELETE_STREAM, stream))

    def append(self, stream: str, message: StoredMessage) -> asyncio.Future[None]:
        return self._group.add((APPEND, stream, message))

    def delete_messages(self, stream: str, seqs: Sequence[int]) -> asyncio.Future[None]:
        # Copied: the caller may reuse its list before the batch is committed.
        return self._group.add((DELETE_MESSAGES, stream, tuple(seqs)))

    def delete_range(self, stream: str, first_seq: int, last_seq: int) -> asyncio.Future[None]:
        return self._group.add((DELETE_RANGE, stream, first_seq, last_seq))

    def put_consumer(self, record: ConsumerRecord) -> asyncio.Future[None]:
        return self._group.add((PUT_CONSUMER, record))

    def put_consumer_state(self, stream: str, name: str, state: bytes) -> asyncio.Future[None]:
        return self._group.add((PUT_CONSUMER_STATE, stream, name, state))

    def delete_consumer(self, stream: str, name: str) -> asyncio.Future[None]:
        return self._group.add((DELETE_CONSUMER, stream, name))

    def flush(self) -> asyncio.Future[None]:
        return self._group.flush()


# -- the committer thread -----------------------------------------------------------


class Committer(Protocol):
    """What a :class:`ThreadCommitter` runs on its thread."""

    def setup(self) -> None:
        """Open the write connection; raise :class:`StorageError` when impossible."""

    def commit(self, batches: Sequence[list[Op]]) -> None:
        """Apply every op of ``batches`` in order in ONE durable transaction.

        On failure, leave nothing of it applied and raise (ideally a
        :class:`StorageError` with a message fit for an operator).
        """

    def teardown(self) -> None:
        """Close the write connection."""


C = TypeVar("C", bound=Committer)


class _Job:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Any], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future


class _Stop:
    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future


_Item = Batch | _Job | _Stop


def _as_storage_error(exc: BaseException, doing: str = "commit") -> StorageError:
    if isinstance(exc, StorageError):
        return exc
    error = StorageError(f"{doing} failed: {exc!r}")
    error.__cause__ = exc
    return error


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class ThreadCommitter(Generic[C]):
    """Runs a :class:`Committer` on one dedicated thread fed by a queue.

    Batches are committed in submission order. Whatever has queued up while a commit
    was in progress is merged into the next transaction (up to ``max_merge_ops``
    ops). If a merged transaction fails, its batches are retried one by one so that a
    failure only fails the batch that caused it. Outcomes go back to the loop
    through ``on_settled``, called on the loop thread once per transaction.
    """

    def __init__(
        self,
        committer: C,
        *,
        name: str,
        on_settled: Callable[[list[Settled]], None],
        max_merge_ops: int = 65536,
    ) -> None:
        self._committer = committer
        self._name = name
        self._on_settled = on_settled
        self._max_merge_ops = max_merge_ops
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    async def start(self) -> None:
        """Start the thread and wait for :meth:`Committer.setup` to succeed or fail."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        ready: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=self._name, daemon=True
        )
        self._thread.start()
        try:
            await ready
        except BaseException:
            self._thread.join()
            self._thread = None
            raise

    def submit(self, batch: Batch) -> None:
        """Queue ``batch`` for commit (called on the loop thread)."""
        self._queue.put(batch)

    def call(self, fn: Callable[[C], T]) -> asyncio.Future[T]:
        """Run ``fn(committer)`` on the writer thread, between two commits."""
        loop = asyncio.get_running_loop()
        if self._thread is None or self._stopping:
            raise StorageError("the writer is not running")
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Job(fn, future))
        return future

    async def stop(self) -> None:
        """Commit what is queued, run :meth:`Committer.teardown` and end the thread."""
        thread = self._thread
        if thread is None or self._stopping:
            return
        self._stopping = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put(_Stop(done))
        try:
            await done
        finally:
            thread.join()  # the thread has nothing left to do but return
            self._thread = None

    # -- on the writer thread ---------------------------------------------------------
    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        assert loop is not None
        # RuntimeError: the loop is closed, nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _run(self, ready: asyncio.Future[None]) -> None:
        try:
            self._committer.setup()
        except BaseException as exc:
            self._post(_resolve, ready, None, _as_storage_error(exc, "opening the store"))
            return
        self._post(_resolve, ready, None, None)
        stop = self._serve()
        error: StorageError | None = None
        try:
            self._committer.teardown()
        except Exception as exc:
            error = _as_storage_error(exc, "closing the store")
        self._fail_leftovers()
        self._post(_resolve, stop.future, None, error)

    def _serve(self) -> _Stop:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        carry: _Item | None = None
        while True:
            item = carry if carry is not None else get()
            carry = None
            batches: list[Batch] = []
            n_ops = 0
            while True:
                if isinstance(item, Batch):
                    if batches and n_ops + len(item.ops) > self._max_merge_ops:
                        carry = item
                        break
                    batches.append(item)
                    n_ops += len(item.ops)
                else:
                    # Jobs and the stop signal run after the batches queued before them.
                    if batches:
                        self._commit(batches)
                        batches = []
                        n_ops = 0
                    if isinstance(item, _Stop):
                        return item
                    self._run_job(item)
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if batches:
                self._commit(batches)

    def _commit(self, batches: list[Batch]) -> None:
        results: list[Settled]
        try:
            self._committer.commit([batch.ops for batch in batches])
        except Exception as exc:
            if len(batches) == 1:
                results = [(batches[0], _as_storage_error(exc))]
            else:
                results = [self._commit_alone(batch) for batch in batches]
        else:
            results = [(batch, None) for batch in batches]
        self._post(self._on_settled, results)

    def _commit_alone(self, batch: Batch) -> Settled:
        try:
            self._committer.commit([batch.ops])
        except Exception as exc:
            return (batch, _as_storage_error(exc))
        return (batch, None)

    def _run_job(self, job: _Job) -> None:
        try:
            result = job.fn(self._committer)
        except Exception as exc:
            self._post(_resolve, job.future, None, exc)
        else:
            self._post(_resolve, job.future, result, None)

    def _fail_leftovers(self) -> None:
        # Nothing should follow the stop signal; fail whatever did rather than hang.
        error = StorageError("the store is closed")
        leftovers: list[Settled] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                leftovers.append((item, error))
            else:
                self._post(_resolve, item.future, None, error)
        if leftovers:
            self._post(self._on_settled, leftovers)
