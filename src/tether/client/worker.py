"""Worker: handle messages from one consumer on one or more servers, NSQ style.

``Worker(subs, handler, max_in_flight=…)`` pulls from every pull subscription in
``subs`` (typically the same consumer on several servers) and never has more than
``max_in_flight`` messages requested or being handled in total; :mod:`ready` decides
how that budget is spread (RDY rules of the NSQ client guide).

The handler's outcome settles the message: return → ack; raise :class:`Retry` or any
exception → nak with a delay growing with the attempt count; after ``max_attempts``
deliveries → ``on_give_up(msg)``, then term. Failures put the whole worker in backoff
(pull nothing, then test with one message, shrink on success). ``msg.in_progress()``
is sent only when the handler asks for it. An ``async def`` handler runs in a pool of
at most ``max_in_flight`` tasks; a plain function runs in a thread pool.

With ``discovery`` (:class:`~tether.client.discovery.Discovery`) the worker also finds
its servers itself: it polls nsqlookupd-style ``/lookup`` endpoints and adds a source
for each new producer (:meth:`Worker.add`); ``max_in_flight`` is shared by them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tether.client._pull_requests import expires_ns, status_error
from tether.client.backoff import Backoff
from tether.client.discovery import Discovery
from tether.client.errors import ClientError, HeartbeatMissed
from tether.client.message import (
    STATUS_CONFLICT,
    STATUS_CONTROL,
    STATUS_NO_MESSAGES,
    STATUS_REQUEST_TIMEOUT,
    WPI,
    JsMsg,
    JsMsgView,
)
from tether.client.pull import PullSubscription
from tether.client.ready import Phase, ReadyController, SourceState
from tether.protocol.nats import encode_pub

log = logging.getLogger("tether.client.worker")

# 409 reasons that end one request but leave the consumer usable.
_TRANSIENT_409 = ("exceeded maxwaiting", "batch completed", "message size exceeds maxbytes")

Handler = Callable[[Any], Awaitable[Any] | Any]
GiveUp = Callable[[JsMsg], Awaitable[Any] | Any]


class Retry(Exception):
    """Raise from a handler to have the message redelivered.

    ``delay`` overrides the computed requeue delay; ``backoff=False`` keeps this from
    counting as a failure for the worker's backoff.
    """

    def __init__(self, delay: float | None = None, *, backoff: bool = True) -> None:
        super().__init__("retry requested")
        self.delay = delay
        self.backoff = backoff


class ThreadMsg(JsMsgView):
    """What a synchronous handler receives (it runs in a thread): the message's content,
    and a thread-safe :meth:`in_progress`. The worker settles the message."""

    __slots__ = ("_loop",)

    def __init__(self, msg: JsMsg, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(msg)
        self._loop = loop

    def in_progress(self) -> None:
        """Ask the server for more time (reset its ack timer)."""
        conn = self.msg._conn
        if conn is not None and not self.msg.settled:
            self._loop.call_soon_threadsafe(conn._send, encode_pub(self.msg.reply, WPI))


class _Source:
    """One pull subscription feeding the worker; receives its wildcard-inbox traffic."""

    def __init__(self, worker: Worker, sub: PullSubscription, state: SourceState) -> None:
        self.worker = worker
        self.sub = sub
        self.state = state
        self.cancelling = False
        self.last_activity = 0.0
        self.paused_until = 0.0

    def _feed_message(self, msg: JsMsg) -> None:
        worker = self.worker
        self.last_activity = worker._loop.time()
        worker.ready.on_message(self.state)
        worker._queue.append((self, msg, worker.ready.epoch))
        worker._wake()

    def _feed_status(self, status: int, description: str, pending: int) -> None:
        worker = self.worker
        self.last_activity = worker._loop.time()
        if status == STATUS_CONTROL:
            return
        state = self.state
        if status in (STATUS_REQUEST_TIMEOUT, STATUS_NO_MESSAGES) or (
            status == STATUS_CONFLICT and description.lower().startswith(_TRANSIENT_409)
        ):
            # One request ended; without a count we cannot tell what it still owed.
            state.owed = max(0, state.owed - pending) if pending else 0
        else:
            # The consumer is gone or refuses our requests: pause before asking again,
            # or we would spin on errors.
            state.owed = 0
            self.paused_until = self.last_activity + worker.error_pause
            worker._report(status_error(status, description))
        worker._reconcile(self)

    def _feed_reconnected(self) -> None:
        self.state.owed = 0  # the server forgot our waiting requests
        self.worker._reconcile(self)

    def _feed_closed(self) -> None:
        self.state.owed = 0


class Worker:
    """Consume with a handler; see the module documentation for the rules."""

    def __init__(
        self,
        consumer: PullSubscription | Sequence[PullSubscription],
        handler: Handler,
        *,
        max_in_flight: int = 100,
        max_attempts: int = 0,
        on_give_up: GiveUp | None = None,
        backoff: Backoff | None = Backoff(1.0, 60.0, 2.0, 0.1),  # noqa: B008 - immutable
        requeue_delay: float = 1.0,
        max_requeue_delay: float = 60.0,
        pull_expires: float = 10.0,
        heartbeat: float | None = 2.0,
        low_rdy_idle_timeout: float = 10.0,
        threads: int | None = None,
        stop_timeout: float = 30.0,
        error_pause: float = 1.0,
        discovery: Discovery | None = None,
    ) -> None:
        subs = [consumer] if isinstance(consumer, PullSubscription) else list(consumer)
        if not subs and discovery is None:
            raise ValueError("a worker needs at least one pull subscription, or discovery")
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.pull_expires = pull_expires
        self.heartbeat = heartbeat if heartbeat and heartbeat * 2 < pull_expires else None
        self.stop_timeout = stop_timeout
        self.error_pause = error_pause
        self._loop = asyncio.get_running_loop()
        self.ready = ReadyController(
            max_in_flight,
            backoff=backoff,
            low_rdy_idle_timeout=low_rdy_idle_timeout,
            clock=self._loop.time,
        )
        self._sources = [
            _Source(self, sub, self.ready.add_source(f"{sub.stream}/{sub.consumer}#{i}"))
            for i, sub in enumerate(subs)
        ]
        self._is_async = inspect.iscoroutinefunction(handler)
        self._executor: ThreadPoolExecutor | None = None
        if not self._is_async:
            self._executor = ThreadPoolExecutor(
                max_workers=threads or min(max_in_flight, 32), thread_name_prefix="tether-worker"
            )
        self._queue: deque[tuple[_Source, JsMsg, int]] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._aux: set[asyncio.Task[None]] = set()
        self._busy = 0
        self._drained: asyncio.Future[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._window: asyncio.TimerHandle | None = None
        self._running = False
        self._stopped = asyncio.Event()
        self.discovery = discovery
        self._discovering: asyncio.Task[None] | None = None
        self.processed = 0
        self.acked = 0
        self.retried = 0
        self.gave_up = 0
        self.errors: list[Exception] = []

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start pulling (returns at once)."""
        if self._running:
            return
        self._running = True
        for src in self._sources:
            src.sub._attach(src)
            src.last_activity = self._loop.time()
            self._reconcile(src)
        self._ticker = self._loop.create_task(self._tick_loop())
        if self.discovery is not None:
            self._discovering = self._loop.create_task(self.discovery.run(self.add))

    def add(self, sub: PullSubscription) -> None:
        """Pull from one more subscription (a server found by discovery); it starts at
        RDY 1 and gets its share of ``max_in_flight`` as messages flow."""
        i = len(self._sources)
        src = _Source(self, sub, self.ready.add_source(f"{sub.stream}/{sub.consumer}#{i}"))
        self._sources.append(src)
        if self._running:
            sub._attach(src)
            src.last_activity = self._loop.time()
            self.ready.rebalance()
            self._reconcile_all()

    async def run(self) -> None:
        """Start, then wait until :meth:`stop` is called."""
        await self.start()
        await self._stopped.wait()

    async def stop(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a grace period
        """Stop pulling, let in-flight handlers finish (up to ``timeout``), nak the rest."""
        if not self._running:
            return
        self._running = False
        if self._discovering is not None:
            self._discovering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovering
            self._discovering = None
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._window is not None:
            self._window.cancel()
        for src in self._sources:
            if src.sub._sink is src:
                src.sub._attach(None)
        # Messages not started yet go back to the server at once; handlers running now finish.
        while self._queue:
            src, msg, _ = self._queue.popleft()
            await self._nak_unstarted(src, msg)
        await asyncio.gather(*(self._cancel(src) for src in self._sources))
        if self._busy:
            self._drained = self._loop.create_future()
            grace = self.stop_timeout if timeout is None else timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, grace)
        for task in [*self._tasks, *self._aux]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._aux, return_exceptions=True)
        for src in self._sources:
            # Delivered while we were cancelling the pulls: hand it back too.
            while src.sub._buffer:
                await self._nak_unstarted(src, src.sub._buffer.popleft(), count=False)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    async def _nak_unstarted(self, src: _Source, msg: JsMsg, *, count: bool = True) -> None:
        if not msg.settled and not src.sub._conn.is_closed:
            with contextlib.suppress(ClientError):
                await msg.nak()
        if count:
            self.ready.on_finished(src.state)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def is_starved(self) -> bool:
        """Whether some source is close to its RDY (handlers should flush batched work)."""
        return self.ready.is_starved()

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.ready.sources)

    # -- pulling ------------------------------------------------------------------------------

    def _reconcile(self, src: _Source) -> None:
        """Bring a source's outstanding pulls in line with its RDY."""
        if not self._running or src.cancelling or src.paused_until > self._loop.time():
            return
        state = src.state
        if state.over_cap():
            src.cancelling = True
            self._spawn(self._cancel(src))
            return
        conn = src.sub._conn
        if state.wants_pull() and conn.is_connected:
            if not state.owed:
                src.last_activity = self._loop.time()
            src.sub._request(state.credit, expires_ns(self.pull_expires), self.heartbeat)
            state.owed += state.credit

    async def _cancel(self, src: _Source) -> None:
        src.cancelling = True
        try:
            if src.state.owed and not src.sub._conn.is_closed:
                await src.sub._cancel_requests()
        finally:
            src.state.owed = 0
            src.cancelling = False
        # What arrived while cancelling went to the subscription's buffer: handle it.
        while src.sub._buffer and self._running:
            src._feed_message(src.sub._buffer.popleft())
        self._reconcile(src)

    def _reconcile_all(self) -> None:
        for src in self._sources:
            self._reconcile(src)

    async def _tick_loop(self) -> None:
        interval = min(1.0, self.heartbeat or 1.0, max(0.05, self.ready.low_rdy_idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            now = self._loop.time()
            if self.heartbeat:
                for src in self._sources:
                    if src.state.owed and now - src.last_activity > 2 * self.heartbeat:
                        src.state.owed = 0  # the pull went silent: it is gone
                        self._report(HeartbeatMissed(f"pull on {src.sub.next_subject} went silent"))
            self.ready.rebalance()
            self._reconcile_all()

    def _arm_window(self) -> None:
        if self._window is not None:
            self._window.cancel()
        delay = max(0.0, self.ready.window_ends - self._loop.time())
        self._window = self._loop.call_later(delay, self._window_over)

    def _window_over(self) -> None:
        self._window = None
        if self._running:
            self.ready.end_window()
            self._reconcile_all()

    # -- handling ---------------------------------------------------------------------------

    def _wake(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        if self._queue and len(self._tasks) < self.max_in_flight and self._running:
            # Handler tasks are created on demand and then reused: never one per message.
            task = self._loop.create_task(self._handler_loop())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _spawn(self, aw: Awaitable[None]) -> None:
        task = asyncio.ensure_future(aw)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)

    async def _handler_loop(self) -> None:
        while True:
            while self._queue and self._running:
                src, msg, epoch = self._queue.popleft()
                self._busy += 1
                try:
                    await self._handle(src, msg, epoch)
                finally:
                    self._busy -= 1
                    if not self._busy and self._drained is not None and not self._drained.done():
                        self._drained.set_result(None)
            waiter = self._loop.create_future()
            self._idle.append(waiter)
            await waiter

    async def _handle(self, src: _Source, msg: JsMsg, epoch: int) -> None:
        success = True
        try:
            attempts = msg.metadata.num_delivered
            if self.max_attempts and attempts > self.max_attempts:
                await self._give_up(msg)  # e.g. redelivered after an ack timeout
                return
            try:
                if self._is_async:
                    await self.handler(msg)
                else:
                    await self._loop.run_in_executor(
                        self._executor, self.handler, ThreadMsg(msg, self._loop)
                    )
            except Exception as exc:
                success = isinstance(exc, Retry) and not exc.backoff
                if not isinstance(exc, Retry):
                    log.debug("handler failed on %s: %r", msg.subject, exc)
                if msg.settled:
                    return
                if self.max_attempts and attempts >= self.max_attempts:
                    await self._give_up(msg)
                    return
                delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else None
                if delay is None:
                    delay = min(self.max_requeue_delay, self.requeue_delay * attempts)
                self.retried += 1
                await msg.nak(delay)
                return
            if not msg.settled:
                await msg.ack()
            self.acked += 1
        except ClientError as exc:
            self._report(exc)  # e.g. the connection closed under us: the server redelivers
        finally:
            self.processed += 1
            ready = self.ready
            before = ready.phase
            ready.on_finished(src.state)
            ready.on_result(success, epoch)
            if ready.phase is Phase.BACKOFF and (before is not Phase.BACKOFF or not self._window):
                self._arm_window()
            if ready.phase is not before:
                self._reconcile_all()
            else:
                self._reconcile(src)

    async def _give_up(self, msg: JsMsg) -> None:
        self.gave_up += 1
        if self.on_give_up is not None:
            try:
                result = self.on_give_up(msg)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                log.exception("on_give_up failed")
                self._report(exc)
        if not msg.settled:
            await msg.term("max attempts reached")

    def _report(self, exc: Exception) -> None:
        if len(self.errors) < 100:
            self.errors.append(exc)
        log.debug("worker: %r", exc)
