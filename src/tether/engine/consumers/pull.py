"""Pull delivery: waiting ``MSG.NEXT`` requests and how messages are dealt to them.

Requests are served round robin (a request that got a message goes to the back), as
nats-server does, so concurrent fetches share a backlog fairly. Expired requests get
``408``, requests whose reply subject lost its subscribers are dropped silently, and a
one-shot (``no_wait``) request ends with ``404`` once nothing more is deliverable.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Generic

from tether.engine.clock import Clock, go_duration
from tether.engine.consumers import pull_queue as pq
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.cursor import PriorityCursor, SequenceCursor
from tether.engine.consumers.delivery_state import DeliveryState
from tether.engine.consumers.priority import (
    WRONG_PIN_ID_T,
    PriorityGroups,
    Verdict,
    insert_by_priority,
    request_error,
)
from tether.engine.consumers.pull_queue import PullRequest, PullRequestError
from tether.engine.consumers.sinks import DeliverySink, Me, RunSink
from tether.storage.base import MessageMeta

NS = 1_000_000_000
# Messages looked up ahead per run: bounds the list, not the delivery (runs repeat).
_RUN_LIMIT = 1024


class PullDelivery(Generic[Me]):
    """The pull side of :class:`~tether.engine.consumers.consumer.Consumer` (a mixin)."""

    # Provided by Consumer.
    _me: Me  # the consumer itself, passed to the sink and the host as is
    clock: Clock
    sink: DeliverySink[Me]
    run_sink: RunSink[Me] | None
    config: ConsumerConfig
    cursor: SequenceCursor | PriorityCursor
    state: DeliveryState
    waiting: deque[PullRequest]
    is_pull: bool
    deleted: bool
    max_waiting: int
    ack_none: bool
    ack_wait: int
    max_ack_pending: int
    priority: PriorityGroups | None
    delivery_headers: bytes
    _replay_end: int
    dseq: int
    last_delivered_ns: int
    _ack_first: str
    _stalled: bool
    _last_activity: int

    def pump(self) -> None:
        raise NotImplementedError

    def _candidate(self) -> tuple[MessageMeta, bool] | None:
        raise NotImplementedError

    def _prepare(self, meta: MessageMeta, redelivery: bool) -> str:
        raise NotImplementedError

    def _commit(self, meta: MessageMeta, redelivery: bool, now: int) -> None:
        raise NotImplementedError

    def _held(self, meta: MessageMeta, now: int) -> bool:
        raise NotImplementedError

    def _heartbeat_block(self) -> bytes:
        raise NotImplementedError

    def _arm_ack_timer(self, deadline: int) -> None:
        raise NotImplementedError

    def _changed_state(self) -> None:
        raise NotImplementedError

    # -- pull requests ---------------------------------------------------------------------------------
    def pull(self, reply: str, body: bytes) -> None:
        """A ``CONSUMER.MSG.NEXT`` request (or the rest of a ``+NXT`` ack)."""
        sink = self.sink
        if not self.is_pull:
            sink.control(self._me, reply, pq.PUSH_BASED)
            return
        try:
            req = pq.parse_next_request(body)
        except PullRequestError as exc:
            sink.control(self._me, reply, pq.bad_request(str(exc)))
            return
        cfg = self.config
        batch = max(req.batch, 1)
        if cfg.max_batch and batch > cfg.max_batch:
            sink.control(
                self._me, reply, pq.conflict(f"Exceeded MaxRequestBatch of {cfg.max_batch}")
            )
            return
        if req.expires and cfg.max_expires and req.expires > cfg.max_expires:
            text = f"Exceeded MaxRequestExpires of {go_duration(cfg.max_expires)}"
            sink.control(self._me, reply, pq.conflict(text))
            return
        if req.max_bytes > 0 and cfg.max_bytes and req.max_bytes > cfg.max_bytes:
            text = f"Exceeded MaxRequestMaxBytes of {cfg.max_bytes}"
            sink.control(self._me, reply, pq.conflict(text))
            return
        json_body = body.lstrip()[:1] == b"{"
        if json_body:
            why = request_error(
                cfg, req.group, req.min_pending, req.min_ack_pending, req.id, req.priority
            )
            if why:
                sink.control(self._me, reply, pq.bad_request(why))
                return
        request = PullRequest(reply, batch)
        if json_body:
            request.has_group = True
            request.group = req.group
            request.min_pending = req.min_pending
            request.min_ack_pending = req.min_ack_pending
            request.pin_id = req.id
            request.priority = req.priority
        priority = self.priority
        if priority is not None:
            block = priority.on_request(request)
            if block is not None:
                sink.control(self._me, reply, block)
                return
        now = self.clock.now()
        self._last_activity = now
        if req.expires < 0:
            sink.control(self._me, reply, pq.request_timeout(batch, max(req.max_bytes, 0)))
            return
        if len(self.waiting) >= self.max_waiting:
            self.prune_waiting()
        if req.no_wait:
            available = self.cursor.num_pending + len(self.state.queued)
            if available == 0 and not req.expires:
                sink.control(self._me, reply, pq.NO_MESSAGES)
                return
            if available:
                self.prune_waiting()
                if available < sum(r.batch for r in self.waiting):
                    sink.control(self._me, reply, pq.REQUESTS_PENDING)
                    return
        if len(self.waiting) >= self.max_waiting:
            if not req.idle_heartbeat:
                sink.control(self._me, reply, pq.EXCEEDED_MAX_WAITING)
            return
        request.expires_at = now + req.expires if req.expires > 0 else 0
        request.max_bytes = request.bytes_left = max(req.max_bytes, 0)
        request.no_wait = req.no_wait
        request.heartbeat = req.idle_heartbeat
        request.queued = True
        if priority is not None and priority.prioritized:
            insert_by_priority(self.waiting, request)
        else:
            self.waiting.append(request)
        self.pump()
        if request.queued:
            self._arm_request(request, now)

    def _arm_request(self, req: PullRequest, now: int) -> None:
        clock = self.clock
        if req.expires_at:
            req.timer = clock.call_later((req.expires_at - now) / NS, lambda: self._expire(req))
        if req.heartbeat:
            req.hb_next = now + req.heartbeat
            req.hb_timer = clock.call_later(req.heartbeat / NS, lambda: self._request_hb(req))

    def _expire(self, req: PullRequest) -> None:
        req.timer = None
        if not req.queued:
            return
        # A request nobody listens to any more would have been dropped by nats-server
        # before it expired: its expiry wakes nothing there.
        live = self.sink.has_interest(req.reply)
        self._finish(req, pq.request_timeout(req.batch, req.bytes_left))
        if live:
            self.end_one_shots()

    def _request_hb(self, req: PullRequest) -> None:
        req.hb_timer = None
        if not req.queued or self.deleted:
            return
        if self.end_one_shots(req):
            return
        now = self.clock.now()
        if now >= req.hb_next:
            self.sink.control(self._me, req.reply, self._heartbeat_block())
            req.hb_next = now + req.heartbeat
        req.hb_timer = self.clock.call_later(
            (req.hb_next - now) / NS, lambda: self._request_hb(req)
        )

    def _finish(self, req: PullRequest, block: bytes | None) -> None:
        """Take ``req`` off the waiting queue, optionally telling the client why."""
        if req.queued:
            req.queued = False
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        req.cancel_timers()
        self._last_activity = self.clock.now()
        if block is not None:
            self.sink.control(self._me, req.reply, block)

    def release_requests(self, *, tell: bool) -> None:
        """The server is going away: every waiting request ends now. With ``tell``, it
        hears ``409 Server Shutdown`` with the messages and bytes it still wanted (a clean
        shutdown, as nats-server's), so its client pulls again once it has reconnected;
        otherwise it is dropped without a word (JetStream stopping in lame duck mode)."""
        for req in list(self.waiting):
            self._finish(req, pq.server_shutdown(req.batch, req.bytes_left) if tell else None)

    def prune_waiting(self) -> None:
        """Drop requests that expired (408) or whose reply subject lost interest."""
        if not self.waiting:
            return
        now = self.clock.now()
        for req in list(self.waiting):
            if req.expires_at and now >= req.expires_at:
                self._finish(req, pq.request_timeout(req.batch, req.bytes_left))
            elif not self.sink.has_interest(req.reply):
                self._finish(req, None)

    def drop_requests_for(self, subject_matches: Callable[[str], bool]) -> None:
        """Interest changed: drop requests whose reply matches and lost interest."""
        for req in list(self.waiting):
            if subject_matches(req.reply) and not self.sink.has_interest(req.reply):
                self._finish(req, None)

    def _pump_pull(self) -> None:
        waiting = self.waiting
        sink = self.sink
        now = self.clock.now()
        while waiting:
            if self._deliver_run(now):
                continue
            got = self._candidate()
            if got is None:
                self._end_of_stream()
                return
            meta, redelivery = got
            if self._replay_end and self._held(meta, now):
                return
            reply = self._prepare(meta, redelivery)
            size = meta.size - meta.overhead + len(reply)
            priority = self.priority
            if priority is None:
                req = self._take_request(size, now)
            else:
                pending = self.cursor.num_pending + (1 if redelivery else 0)
                req = self._take_group_request(priority, size, now, pending)
            if req is None:
                if waiting:
                    # Messages, but no request may have them now (priority groups):
                    # one-shot requests end as at the end of the stream.
                    self._end_of_stream()
                return
            if priority is not None and priority.pinned:
                self.delivery_headers = priority.delivery_header()
                sink.deliver(self._me, req.reply, meta, reply)
                self.delivery_headers = b""
            else:
                sink.deliver(self._me, req.reply, meta, reply)
            self._commit(meta, redelivery, now)
            req.batch -= 1
            req.delivered += 1
            if req.heartbeat:
                req.hb_next = now + req.heartbeat
            if req.batch <= 0:
                left = req.bytes_left if req.max_bytes else 0
                self._finish(req, pq.batch_completed(0, left) if left > 0 else None)
            elif len(waiting) > 1:
                if priority is not None and priority.prioritized:
                    # To the back of its own priority: FIFO within a priority.
                    waiting.popleft()
                    insert_by_priority(waiting, req)
                else:
                    waiting.rotate(-1)

    def _deliver_run(self, now: int) -> bool:
        """Deliver a run of new messages to plain waiting requests; False if the next
        message needs the general path (one at a time) instead.

        The common case of a pull consumer, done with as little work per message as
        possible: the same decisions as :meth:`_candidate`, :meth:`_take_request` and
        :meth:`_commit` make one message at a time, with everything that cannot change
        during the run checked once (requests that expired, carry a byte budget or lost
        interest, redeliveries, the ack pending limit). Requests still take turns per
        message. When every request's reply subject is steady (see
        :meth:`RunSink.steady`), the run is decided first and handed to the sink in one
        call; otherwise each message goes to the sink before the next is decided, so a
        request dropped by a delivery (its subscription ended) gets no more.
        """
        state = self.state
        cursor = self.cursor
        if (
            state.queued
            or self.ack_none
            or self.priority is not None
            or self._replay_end
            or not isinstance(cursor, SequenceCursor)
        ):
            return False
        waiting = self.waiting
        has_interest = self.sink.has_interest
        run_sink = self.run_sink
        steady = run_sink.steady if run_sink is not None else None
        deliver_run = run_sink.deliver_run if run_sink is not None else None
        budget = 0
        for req in waiting:
            if req.max_bytes or (req.expires_at and now >= req.expires_at):
                return False
            if steady is not None and steady(req.reply):
                pass
            elif has_interest(req.reply):
                deliver_run = None
            else:
                return False
            budget += req.batch
        pending = state.pending
        max_ack_pending = self.max_ack_pending
        if max_ack_pending:
            budget = min(budget, max_ack_pending - len(pending))
        if budget <= 0:
            return False
        run = cursor.peek_run(min(budget, _RUN_LIMIT))
        if not run:
            return False
        num_pending = cursor.num_pending
        template = self._ack_first
        deliver = self.sink.deliver
        me = self._me
        dseq = self.dseq
        done = 0
        tos: list[str] = []
        replies: list[str] = []
        try:
            for meta in run:
                if not waiting:
                    break
                req = waiting[0]
                seq = meta.seq
                num_pending -= 1  # what is left after this one
                reply = template % (seq, dseq + 1, meta.ts, num_pending if num_pending > 0 else 0)
                if deliver_run is not None:
                    tos.append(req.reply)
                    replies.append(reply)
                else:
                    deliver(me, req.reply, meta, reply)
                self.dseq = dseq = dseq + 1
                entry = pending.pop(seq, None)  # as DeliveryState.track
                pending[seq] = (dseq if entry is None else entry[0], now)
                done += 1
                req.batch -= 1
                req.delivered += 1
                if req.heartbeat:
                    req.hb_next = now + req.heartbeat
                if req.batch <= 0:
                    self._finish(req, None)
                elif len(waiting) > 1:
                    waiting.rotate(-1)
            if tos and deliver_run is not None:
                deliver_run(me, tos, run if done == len(run) else run[:done], replies)
        finally:
            if done:
                cursor.take_run(run[done - 1], done)
                self._stalled = False
                self.last_delivered_ns = now
                self._arm_ack_timer(now + self.ack_wait)
                self._changed_state()
        return done > 0

    def _take_request(self, size: int, now: int) -> PullRequest | None:
        """The request the next message goes to (expired and uninterested ones dropped)."""
        waiting = self.waiting
        has_interest = self.sink.has_interest
        while waiting:
            req = waiting[0]
            if req.expires_at and now >= req.expires_at:
                self._finish(req, pq.request_timeout(req.batch, req.bytes_left))
                continue
            if req.max_bytes:
                if size > req.bytes_left:
                    self._finish(req, pq.size_exceeds_max_bytes(req.batch, req.bytes_left))
                    continue
                req.bytes_left -= size
                if req.bytes_left == 0:
                    req.batch = 1
            if not has_interest(req.reply):
                self._finish(req, None)
                continue
            return req
        return None

    def _take_group_request(
        self, priority: PriorityGroups, size: int, now: int, num_pending: int
    ) -> PullRequest | None:
        """:meth:`_take_request` for a consumer with priority groups: requests the
        policy holds back are passed over (and stay), stale pins end with ``423``."""
        waiting = self.waiting
        has_interest = self.sink.has_interest
        ack_pending = len(self.state.pending)
        skipped = 0
        while waiting:
            req = waiting[0]
            if req.expires_at and now >= req.expires_at:
                self._finish(req, pq.request_timeout(req.batch, req.bytes_left))
                continue
            had_pin = bool(priority.pin_id)
            verdict = priority.verdict(req, num_pending, ack_pending)
            if verdict is Verdict.WRONG_PIN:
                self._finish(req, WRONG_PIN_ID_T % (req.batch, req.bytes_left))
                continue
            if verdict is Verdict.SKIP:
                waiting.rotate(-1)
                skipped += 1
                if skipped >= len(waiting):
                    return None
                continue
            if req.max_bytes:
                if size > req.bytes_left:
                    if priority.pin_id and not had_pin:
                        priority.release()
                    self._finish(req, pq.size_exceeds_max_bytes(req.batch, req.bytes_left))
                    continue
                req.bytes_left -= size
                if req.bytes_left == 0:
                    req.batch = 1
            if not has_interest(req.reply):
                self._finish(req, None)
                continue
            return req
        return None

    def end_one_shots(self, watch: PullRequest | None = None) -> bool:
        """End the one-shot (``no_wait``) requests that are done waiting: those without
        ``expires`` and those that got messages already, with ``404``, even when
        ``max_ack_pending`` or a pause is what holds them. nats-server does this each
        time its delivery loop wakes for a waiting request's expiry or heartbeat.
        Returns whether ``watch`` was one of them."""
        ended = False
        for req in list(self.waiting):
            if req.no_wait and (not req.expires_at or req.delivered > 0):
                self._finish(req, pq.NO_MESSAGES)
                ended = ended or req is watch
        return ended

    def _end_of_stream(self) -> None:
        """Nothing more to send now: one-shot (no_wait) requests end, as on nats-server."""
        if self._stalled:
            return  # max ack pending, not the end: no_wait requests keep waiting
        for req in list(self.waiting):
            if req.no_wait and (not req.expires_at or req.delivered > 0):
                self._finish(req, pq.NO_MESSAGES)
