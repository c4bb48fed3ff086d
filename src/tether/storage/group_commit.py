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

A write the backend can never store (a value it cannot hold) must not fail the
writes it happens to share a commit with: a committer that can tell which ops are to
blame (:meth:`Isolating.find_culprits`) gets them refused alone. The store's owner
hears about refused appends (:meth:`BatchingStore.on_refused`) and takes back what
depends on them (:meth:`BatchingStore.withdraw`) before the rest is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from tether.storage.base import (
    ConsumerRecord,
    RefusalHandler,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
)
from tether.storage.stats import StoreStats

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
    "Isolating",
    "Op",
    "Settled",
    "ThreadCommitter",
]

T = TypeVar("T")

log = logging.getLogger("tether.storage")

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

    __slots__ = ("_batch", "_closed", "_flying", "_hand_off", "_in_flight", "_loop")

    def __init__(self, hand_off: Callable[[Batch], None]) -> None:
        self._hand_off = hand_off
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: Batch | None = None
        self._in_flight = 0
        self._flying: deque[Batch] = deque()  # handed off, not settled yet, in order
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

    def add_all(self, ops: list[Op]) -> asyncio.Future[None]:
        """:meth:`add` each of ``ops``, in order, into the current tick's batch."""
        batch = self._batch
        if batch is None:
            batch = self._start()
        batch.ops += ops
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
        flying = self._flying
        if flying and flying[0] is batch:
            flying.popleft()
        else:
            with contextlib.suppress(ValueError):
                flying.remove(batch)
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
        self._flying.append(batch)
        self._hand_off(batch)

    def withdraw(self, stream: str, from_seq: int) -> list[StoredMessage]:
        """Take the appends of ``stream`` with seq >= ``from_seq`` out of every batch
        not settled yet (and the one collecting); returns them in sequence order.

        Only while the backend is not committing any of them: from a refusal handler
        (see :meth:`BatchingStore.on_refused`), during which the writer waits.
        """
        taken: list[StoredMessage] = []
        batches = list(self._flying)
        if self._batch is not None:
            batches.append(self._batch)
        for batch in batches:
            ops = batch.ops
            if not any(op[0] == APPEND and op[1] == stream and op[2].seq >= from_seq for op in ops):
                continue
            kept: list[Op] = []
            for op in ops:
                if op[0] == APPEND and op[1] == stream and op[2].seq >= from_seq:
                    taken.append(op[2])
                else:
                    kept.append(op)
            ops[:] = kept
        taken.sort(key=lambda m: m.seq)
        return taken


class BatchingStore(Store):
    """A :class:`Store` whose writes all go through one :class:`GroupCommit`.

    Subclasses implement :meth:`_hand_off` (commit the batch, then settle it), the
    reads and the lifecycle.
    """

    def __init__(self) -> None:
        self._group = GroupCommit(self._hand_off)
        self._refusal_handler: RefusalHandler | None = None

    @abstractmethod
    def _hand_off(self, batch: Batch) -> None:
        """Commit ``batch`` and eventually call ``self._group.settle`` for it."""

    def on_refused(self, handler: RefusalHandler) -> None:
        self._refusal_handler = handler

    def withdraw(self, stream: str, from_seq: int) -> list[StoredMessage]:
        return self._group.withdraw(stream, from_seq)

    def _refused(self, batch: Batch, refused: list[tuple[Op, str]]) -> bool:
        """The committer found ops of ``batch`` it can never commit (with why): tell
        the owner and take them out, so that the rest of the batch can be committed.

        Returns False (the batch then fails whole) when that is not possible: no
        owner to tell, or an op other than an append is to blame.
        """
        handler = self._refusal_handler
        if handler is None or any(op[0] != APPEND for op, _ in refused):
            return False
        by_stream: dict[str, dict[int, str]] = {}
        for op, reason in refused:
            if op[0] == APPEND:  # always (checked above); narrows the type
                by_stream.setdefault(op[1], {})[op[2].seq] = reason
        handler(by_stream)
        # The handler withdrew them with what depends on them; make sure they are out.
        gone = {id(op) for op, _ in refused}
        if any(id(op) in gone for op in batch.ops):
            batch.ops[:] = [op for op in batch.ops if id(op) not in gone]
        return True

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

    def append_run(self, stream: str, messages: Sequence[StoredMessage]) -> asyncio.Future[None]:
        # One batch holds them all: a batch is committed whole, never split.
        return self._group.add_all([(APPEND, stream, m) for m in messages])

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


class Isolating(Protocol):
    """A :class:`Committer` that can tell which ops a failed commit is to blame on."""

    def find_culprits(self, ops: list[Op], error: BaseException) -> list[tuple[int, str]]:
        """The indexes in ``ops`` of the ops that cannot be committed, each with why,
        given that committing ``ops`` failed with ``error``. Empty when the failure is
        not about the ops (a full disk, an I/O error): then nothing is to blame alone.
        Leaves nothing applied."""


C = TypeVar("C", bound=Committer)

# A batch with culprits is retried without them at most this many times.
_MAX_REFUSALS = 3
# How long the writer waits for the loop to take refused writes back.
_HAND_BACK_TIMEOUT = 30.0


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
    failure only fails the batch that caused it. A batch that fails alone, with a
    committer that is :class:`Isolating` and an ``on_refused`` to call, is committed
    without the ops to blame: ``on_refused(batch, [(op, why), ...])`` runs on the loop
    thread while this thread waits, takes them out of the batch (and whatever depends
    on them out of every batch not committed yet) and returns True; then the batch is
    committed again. Outcomes go back to the loop through ``on_settled``, called on
    the loop thread once per transaction.
    """

    def __init__(
        self,
        committer: C,
        *,
        name: str,
        on_settled: Callable[[list[Settled]], None],
        max_merge_ops: int = 65536,
        on_refused: Callable[[Batch, list[tuple[Op, str]]], bool] | None = None,
    ) -> None:
        self._committer = committer
        self._name = name
        self._on_settled = on_settled
        self._on_refused = on_refused
        self._max_merge_ops = max_merge_ops
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.stats = StoreStats()  # commit sizes and latencies, for /metrics

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
        started = time.perf_counter()
        try:
            self._committer.commit([batch.ops for batch in batches])
            stats = self.stats
            stats.commit_seconds.observe(time.perf_counter() - started)
            stats.commit_ops.observe(sum(len(batch.ops) for batch in batches))
        except Exception as exc:
            if len(batches) == 1:
                results = [self._without_culprits(batches[0], exc)]
            else:
                results = [self._commit_alone(batch) for batch in batches]
        else:
            results = [(batch, None) for batch in batches]
        self._post(self._on_settled, results)

    def _commit_alone(self, batch: Batch) -> Settled:
        try:
            self._committer.commit([batch.ops])
        except Exception as exc:
            return self._without_culprits(batch, exc)
        return (batch, None)

    def _without_culprits(self, batch: Batch, exc: Exception) -> Settled:
        """``batch`` failed alone with ``exc``: commit it without the ops to blame, if
        the committer can name them and the loop takes them back.

        When nothing is to blame alone (a full disk, an I/O error), its appends are
        handed back all the same: they fail, and the loop takes back the later appends
        of their streams (which would otherwise be committed above a gap); the rest of
        the batch is tried once more and fails or commits on its own merits.
        """
        error = _as_storage_error(exc)
        if self._on_refused is None:
            return (batch, error)
        find = getattr(self._committer, "find_culprits", None)
        for _ in range(_MAX_REFUSALS):
            culprits: list[tuple[int, str]] = []
            if find is not None:
                try:
                    culprits = find(batch.ops, exc)
                except Exception:
                    log.exception("looking for the writes to blame failed")
            if culprits:
                refused = [(batch.ops[i], why) for i, why in culprits]
            else:
                why = str(error.__cause__ if error.__cause__ is not None else error)
                refused = [(op, why) for op in batch.ops if op[0] == APPEND]
                if not refused:
                    return (batch, error)
            if not self._hand_back(batch, refused):
                return (batch, error)
            try:
                self._committer.commit([batch.ops])
            except Exception as again:
                exc = again
                error = _as_storage_error(again)
                continue
            return (batch, None)
        return (batch, error)

    def _hand_back(self, batch: Batch, refused: list[tuple[Op, str]]) -> bool:
        """Run ``on_refused`` on the loop thread and wait for it (nothing is committed
        meanwhile, so it may edit every batch not committed yet)."""
        on_refused = self._on_refused
        loop = self._loop
        if on_refused is None or loop is None:
            return False
        done = threading.Event()
        lock = threading.Lock()
        answer = [False, False]  # [taken back, given up waiting]

        def run() -> None:
            with lock:
                if answer[1]:
                    return  # too late: the writer went on without it
                try:
                    answer[0] = bool(on_refused(batch, refused))
                except Exception:
                    log.exception("taking refused writes back failed")
                finally:
                    done.set()

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:
            return False  # the loop is closed
        if not done.wait(_HAND_BACK_TIMEOUT):
            with lock:
                if not done.is_set():
                    answer[1] = True
                    return False
        return answer[0]

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
