"""Catch-up subscription: pull to catch up, then switch to push, without gaps or duplicates.

The algorithm (durable subscriptions that combine pull and push):

1. pull from the start position until nothing is left (caught up);
2. start an ordered push consumer for *new* messages, buffering what it delivers;
3. pull one last time, closing the window between 1 and 2;
4. process the buffer, skipping every stream sequence already processed;
5. stay on push. A gap (consumer sequence jump), a silent push (two missed
   heartbeats) or a disconnect drops the push consumer and goes back to 1, pulling
   from the last processed sequence + 1.

The handler sees each stream sequence once, in order, one at a time. Optional
``checkpoint(seq)`` calls report progress so a restarted process can resume with
``start_seq=checkpoint + 1``. A handler exception stops the subscription; the failed
message is not counted as processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from tether.client.errors import ClientError, NotJetStreamMessage, Timeout
from tether.client.jetstream import JetStream
from tether.client.message import STATUS_CONTROL, JsMsg, parse_ack_subject, status_of
from tether.client.models import AckPolicy, ConsumerConfig, DeliverPolicy
from tether.client.subscription import Subscription
from tether.protocol.nats import encode_pub, header_value

log = logging.getLogger("tether.client.catchup")

CatchUpHandler = Callable[[JsMsg], Awaitable[Any] | Any]
Checkpoint = Callable[[int], Awaitable[Any] | Any]


class _Resync(Exception):
    """Internal: leave push mode and catch up by pulling again."""


class _HandlerFailed(Exception):
    """Internal: the user's handler raised; ends the subscription with that error."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class CatchUpSubscription:
    """Deliver a stream to ``handler`` from ``start_seq`` (or ``start_time``) on, live."""

    def __init__(
        self,
        js: JetStream,
        stream: str,
        handler: CatchUpHandler,
        *,
        start_seq: int = 1,
        start_time: datetime | None = None,
        filter_subject: str | None = None,
        checkpoint: Checkpoint | None = None,
        checkpoint_every: int = 1000,
        batch: int = 256,
        heartbeat: float = 1.0,
    ) -> None:
        self._js = js
        self._conn = js.conn
        self.stream = stream
        self.handler = handler
        self.filter_subject = filter_subject
        self.checkpoint = checkpoint
        self.checkpoint_every = max(1, checkpoint_every)
        self.batch = batch
        self.heartbeat = heartbeat
        self._start_time = start_time
        self.last_seq = max(0, start_seq - 1)  # last processed stream sequence
        self.phase = "idle"
        self.resyncs = 0
        self._since_checkpoint = 0
        self._push: Subscription | None = None
        self._push_name = ""
        self._push_buffer: deque[JsMsg] = deque()
        self._push_waiter: asyncio.Future[None] | None = None
        self._last_cseq = 0
        self._last_push_activity = 0.0
        self._resync_reason = ""
        self._task: asyncio.Task[None] | None = None
        self._live = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start delivering in the background."""
        if self._task is None:
            self._conn._listen(self)
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait_live(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the subscription has caught up and runs on push."""
        try:
            async with asyncio.timeout(timeout):
                await self._live.wait()
        except TimeoutError:
            raise Timeout(f"not caught up within {timeout}s (phase {self.phase})") from None

    async def wait(self) -> None:
        """Wait until the subscription ends (raises the handler's error, if any)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        """Stop: the last processed sequence is checkpointed."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif task is not None and not task.cancelled():
            task.exception()  # a handler error: reported by wait(), not raised by stop()
        self._conn._unlisten(self)
        await self._drop_push()
        await self._checkpoint()
        self.phase = "stopped"

    async def __aenter__(self) -> CatchUpSubscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the state machine ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._run_phases()
        except _HandlerFailed as failed:
            self.phase = "failed"
            raise failed.error from None

    async def _run_phases(self) -> None:
        while True:
            try:
                self.phase = "pulling"
                await self._pull_until_caught_up()
                self.phase = "switching"
                await self._start_push()
                await self._pull_until_caught_up()  # closes the window before the push began
                self.phase = "live"
                self._live.set()
                await self._live_loop()
            except _Resync as why:
                self._live.clear()
                self.resyncs += 1
                log.info("catch-up on %s resyncs from %d: %s", self.stream, self.last_seq + 1, why)
                await self._drop_push()
            except ClientError as exc:
                self._live.clear()
                if self._conn.is_closed:
                    raise
                log.info("catch-up on %s retries after %r", self.stream, exc)
                await self._drop_push()
                await self._wait_connected()

    async def _wait_connected(self) -> None:
        await self._conn.wait_connected()
        await asyncio.sleep(0.05)  # do not spin if the server keeps failing our requests

    def _start_config(self) -> ConsumerConfig:
        if self.last_seq == 0 and self._start_time is not None:
            start = self._start_time.astimezone(UTC).isoformat().replace("+00:00", "Z")
            return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
        return ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last_seq + 1
        )

    async def _pull_until_caught_up(self) -> None:
        """Pull from ``last_seq + 1`` with an ephemeral consumer until nothing is left."""
        name = f"catchup_{self._conn._nuid.next()}"
        start = self._start_config()
        config = ConsumerConfig(
            name=name,
            deliver_policy=start.deliver_policy,
            opt_start_seq=start.opt_start_seq,
            opt_start_time=start.opt_start_time,
            ack_policy=AckPolicy.NONE,
            filter_subject=self.filter_subject,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        await self._js.add_consumer(self.stream, config)
        sub = await self._js.pull_subscribe(self.stream, name)
        try:
            while True:
                msgs = await sub.fetch(self.batch, timeout=5.0, no_wait=True)
                for msg in msgs:
                    await self._process(msg)
                if not msgs or (len(msgs) < self.batch and msgs[-1].metadata.num_pending == 0):
                    return
        finally:
            await sub.unsubscribe(nak_buffered=False)
            with contextlib.suppress(ClientError):
                await self._js.delete_consumer(self.stream, name)

    async def _start_push(self) -> None:
        """An ordered push consumer for new messages; what it delivers waits in a buffer."""
        inbox = self._conn.new_inbox()
        self._push_buffer.clear()
        self._last_cseq = 0
        self._resync_reason = ""
        self._last_push_activity = asyncio.get_running_loop().time()
        self._push = self._conn._subscribe_raw(inbox, self._on_push)
        self._push_name = f"catchup_push_{self._conn._nuid.next()}"
        await self._js.add_consumer(
            self.stream,
            ConsumerConfig(
                name=self._push_name,
                deliver_subject=inbox,
                deliver_policy=DeliverPolicy.NEW,
                ack_policy=AckPolicy.NONE,
                max_deliver=1,
                flow_control=True,
                idle_heartbeat=self.heartbeat,
                filter_subject=self.filter_subject,
                mem_storage=True,
            ),
        )

    def _on_push(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        """Runs inline in the reader: buffer messages, answer flow control, spot gaps."""
        self._last_push_activity = asyncio.get_running_loop().time()
        if hdr is not None and status_of(hdr) == STATUS_CONTROL:
            # Flow control requests carry a reply subject; a heartbeat may name a stalled one.
            target = reply or (header_value(hdr, b"Nats-Consumer-Stalled") or b"").decode()
            if target:
                self._conn._send(encode_pub(target, b""))
            return
        try:
            meta = parse_ack_subject(reply)
        except NotJetStreamMessage:
            return
        if self._last_cseq and meta.consumer_seq != self._last_cseq + 1:
            self._resync_reason = f"gap: consumer sequence {self._last_cseq} -> {meta.consumer_seq}"
        self._last_cseq = meta.consumer_seq
        self._push_buffer.append(JsMsg(self._conn, subject, reply, data, hdr))
        waiter = self._push_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _live_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._push_buffer:
                if self._resync_reason:
                    raise _Resync(self._resync_reason)
                await self._process(self._push_buffer.popleft())
            if self._resync_reason:
                raise _Resync(self._resync_reason)
            if loop.time() - self._last_push_activity > 2 * self.heartbeat:
                raise _Resync("push consumer went silent")
            self._push_waiter = loop.create_future()
            try:
                await asyncio.wait((self._push_waiter,), timeout=self.heartbeat)
            finally:
                self._push_waiter = None

    async def _process(self, msg: JsMsg) -> None:
        seq = msg.metadata.stream_seq
        if seq <= self.last_seq:
            return  # already processed (the overlap between pull and push)
        try:
            result = self.handler(msg)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            raise _HandlerFailed(exc) from exc
        self.last_seq = seq
        self._since_checkpoint += 1
        if self._since_checkpoint >= self.checkpoint_every:
            await self._checkpoint()

    async def _checkpoint(self) -> None:
        if self.checkpoint is None or not self._since_checkpoint:
            return
        self._since_checkpoint = 0
        result = self.checkpoint(self.last_seq)
        if inspect.isawaitable(result):
            await result

    async def _drop_push(self) -> None:
        sub, self._push = self._push, None
        name, self._push_name = self._push_name, ""
        self._push_buffer.clear()
        if sub is not None and not sub.closed and not self._conn.is_closed:
            with contextlib.suppress(ClientError):
                await sub.unsubscribe()
        if name and self._conn.is_connected:
            with contextlib.suppress(ClientError):
                await self._js.delete_consumer(self.stream, name)

    # -- connection events (Listener) -----------------------------------------------------

    def _on_disconnected(self) -> None:
        if self.phase == "live":
            self._resync_reason = "disconnected"
            waiter = self._push_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _on_reconnected(self) -> None:
        pass

    def _on_closed(self) -> None:
        waiter = self._push_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
