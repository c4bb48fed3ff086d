"""Acks, naks, progress, terminations and ack timeouts of a consumer.

Every delivery waits for its ack until ``ack_wait`` (or the ``backoff`` step for its
delivery count) passes; then it is queued for redelivery. One that already had
``max_deliver`` deliveries dies when its turn comes again, which is when nats-server
gives up on it too, and is kept as a dead letter that can be requeued.
"""

from __future__ import annotations

import random
from typing import Any, Generic

from tether.engine.clock import Clock, Timer
from tether.engine.consumers.delivery_state import MAX_DELIVERIES, TERMINATED, DeliveryState
from tether.engine.consumers.sinks import ConsumerHost, Me
from tether.engine.streams import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
PRIORITY_KEY = 1 << 64  # redelivery sort key = -priority * 2**64 + seq


class AckHandling(Generic[Me]):
    """The ack side of :class:`~tether.engine.consumers.consumer.Consumer` (a mixin)."""

    # Provided by Consumer.
    _me: Me  # the consumer itself, passed to the sink and the host as is
    stream: Stream
    clock: Clock
    host: ConsumerHost[Me]
    state: DeliveryState
    deleted: bool
    notify_acks: bool
    ack_none: bool
    ack_all: bool
    ack_fc: bool
    ack_wait: int
    backoff: list[int]
    max_deliver: int
    max_ack_pending: int
    priority_order: bool
    sample_freq: int
    last_ack_ns: int
    acked_count: int
    _changed: bool
    _last_activity: int
    _ack_timer: Timer | None
    _ack_timer_at: int

    @property
    def ack_floor(self) -> tuple[int, int]:
        raise NotImplementedError

    def pump(self) -> None:
        raise NotImplementedError

    def _changed_state(self) -> None:
        raise NotImplementedError

    def _advisory(self, kind: str, type_: str, fields: dict[str, Any]) -> None:
        raise NotImplementedError

    def _event(self, subject: str, type_: str, fields: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- acks -------------------------------------------------------------------------------------------------
    def ack(self, seq: int) -> None:
        """``+ACK`` (or ``+NXT``): the message is done."""
        if self.ack_none:
            return
        state = self.state
        max_ack_pending = self.max_ack_pending
        stalled = max_ack_pending and len(state.pending) >= max_ack_pending
        acked: list[int] | None = None  # None: just ``seq`` (no list built per ack)
        if self.sample_freq and not self.ack_all:
            self._sample_ack(seq)
        if self.ack_all:
            floor = self.ack_floor[1]
            if seq <= floor:
                return
            acked = state.ack_up_to(seq)
        elif not state.ack(seq):
            if state.dead.pop(seq, None) is None:
                return
            state.rdc.pop(seq, None)  # a late ack for a dead message still means it was processed
        self.last_ack_ns = self._last_activity = self.clock.now()
        self.acked_count += 1 if acked is None else len(acked)
        if not self._changed:
            self._changed_state()
        if self.notify_acks:
            if acked is None:
                self.host.consumer_acked(self._me, [seq])
            elif acked:
                self.host.consumer_acked(self._me, acked)
        if stalled:
            self.pump()

    def _sample_ack(self, seq: int) -> None:
        """``sample_freq``: an explicit ack of an outstanding delivery is reported on
        ``$JS.EVENT.METRIC.CONSUMER.ACK`` that often (in percent), as nats-server does."""
        entry = self.state.pending.get(seq)
        if entry is None or (self.sample_freq < 100 and random.randrange(100) > self.sample_freq):
            return
        self._event(
            f"$JS.EVENT.METRIC.CONSUMER.ACK.{self.stream.name}.{self._me_name()}",
            "io.nats.jetstream.metric.v1.consumer_ack",
            {
                "consumer_seq": entry[0],
                "stream_seq": seq,
                "ack_time": self.clock.now() - entry[1],
                "deliveries": self.state.deliveries(seq),
            },
        )

    def _me_name(self) -> str:
        raise NotImplementedError

    def nak(self, seq: int, delay_ns: int = 0) -> None:
        """``-NAK``: redeliver now, or after ``delay_ns``."""
        state = self.state
        entry = state.pending.get(seq)
        if entry is None or seq in state.queued:
            return
        self._last_activity = now = self.clock.now()
        self._advisory(
            "MSG_NAKED",
            "nak",
            {"consumer_seq": entry[0], "stream_seq": seq, "deliveries": state.deliveries(seq)},
        )
        if delay_ns > 0:
            state.set_deadline(seq, now + delay_ns)
            self._arm_ack_timer(now + delay_ns)
        else:
            self._timeout(seq)
        self._changed_state()
        self.pump()

    def progress(self, seq: int) -> None:
        """``+WPI``: the client is still working on it; restart its ack timer."""
        state = self.state
        now = self.clock.now()
        if state.touch(seq, now):
            self._last_activity = now
            wait = self._wait_for(state.deliveries(seq))
            if wait != self.ack_wait:
                state.set_deadline(seq, now + wait)
            self._arm_ack_timer(now + wait)
            self._changed_state()

    def term(self, seq: int, reason: str = "") -> None:
        """``+TERM``: never redeliver; the message is kept as dead."""
        state = self.state
        entry = state.pending.get(seq)
        if entry is None:
            return
        now = self.clock.now()
        deliveries = state.deliveries(seq)
        state.kill(seq, TERMINATED, now, reason)
        self.last_ack_ns = self._last_activity = now
        self._changed_state()
        self._advisory(
            "MSG_TERMINATED",
            "terminated",
            {
                "consumer_seq": entry[0],
                "stream_seq": seq,
                "deliveries": deliveries,
                "reason": reason,
            },
        )
        if self.notify_acks:
            self.host.consumer_acked(self._me, [seq])  # terminated counts as acked for retention
        self.pump()

    def requeue_dead(self, seq: int) -> bool:
        """Put a dead message back in the redelivery queue (its delivery count restarts)."""
        meta = self.stream.meta(seq)
        if meta is None or self.state.revive(seq, self.clock.now()) is None:
            return False
        self.state.queue(seq, self._key(meta))
        self._changed_state()
        self.pump()
        return True

    # -- ack timeouts ---------------------------------------------------------------------------
    def _wait_for(self, deliveries: int) -> int:
        backoff = self.backoff
        if backoff:
            return backoff[min(max(deliveries, 1), len(backoff)) - 1]
        return self.ack_wait

    def _key(self, meta: MessageMeta) -> int:
        return -meta.priority * PRIORITY_KEY + meta.seq if self.priority_order else meta.seq

    def _timeout(self, seq: int) -> None:
        """A delivery timed out or was nak'd: queue it for redelivery.

        One that already had ``max_deliver`` deliveries waits in the queue too and dies
        when its turn comes (see :meth:`_exhausted`), which is when nats-server gives up
        on it: until then it still counts as ack pending.
        """
        state = self.state
        meta = self.stream.meta(seq)
        if meta is None:
            state.forget(seq)
            return
        state.queue(seq, self._key(meta))

    def _exhausted(self, seq: int) -> None:
        """``seq`` reached ``max_deliver``: it becomes a dead letter, with an advisory."""
        deliveries = self.state.deliveries(seq)
        self.state.kill(seq, MAX_DELIVERIES, self.clock.now())
        self._changed_state()
        self._advisory(
            "MAX_DELIVERIES", "max_deliver", {"stream_seq": seq, "deliveries": deliveries}
        )

    def reap(self) -> None:
        """Turn queued messages that reached ``max_deliver`` into dead letters now."""
        if self.max_deliver:
            state = self.state
            for seq in [s for s in state.queued if state.deliveries(s) >= self.max_deliver]:
                self._exhausted(seq)

    def _arm_ack_timer(self, deadline: int) -> None:
        if self.ack_fc:
            return  # acked through flow control: nothing is redelivered on a timer
        if self._ack_timer is not None:
            if self._ack_timer_at <= deadline:
                return
            self._ack_timer.cancel()
        self._ack_timer_at = deadline
        delay = max(deadline - self.clock.now(), 0) / NS
        self._ack_timer = self.clock.call_later(delay, self._on_ack_timer)

    def _on_ack_timer(self) -> None:
        self._ack_timer = None
        if self.deleted:
            return
        now = self.clock.now()
        expired = self.state.expired(now, self.ack_wait)
        for seq in expired:
            self._timeout(seq)
        nxt = self.state.next_deadline(self.ack_wait)
        if nxt:
            self._arm_ack_timer(max(nxt, now + 1_000_000))
        if expired:
            self._changed_state()
            self.pump()
