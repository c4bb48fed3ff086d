"""Push delivery: send to the deliver subject while it has interest.

Flow control follows nats-server: the window starts at 2 MiB, a ``100 FlowControl
Request`` goes out once the bytes sent since the last answer pass half of it, delivery
stalls past the whole window, and each answer doubles it up to 32 MiB. Idle heartbeats
carry the last consumer and stream sequences (and the pending flow-control subject while
stalled), which is what ordered consumers check for gaps.
"""

from __future__ import annotations

import random
import string
from typing import Generic

from tether.engine.clock import Clock, Timer
from tether.engine.consumers import pull_queue as pq
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.cursor import PriorityCursor, SequenceCursor
from tether.engine.consumers.delivery_state import DeliveryState
from tether.engine.consumers.sinks import DeliverySink, Me
from tether.engine.streams import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
_PUSH_BUDGET = 512  # messages per push run before yielding to the loop
_SINK_BACKLOG = 4096  # sink-side queued deliveries before a push consumer waits
FC_START = 2 * 1024 * 1024
FC_LIMIT = 32 * 1024 * 1024


class PushDelivery(Generic[Me]):
    """The push side of :class:`~tether.engine.consumers.consumer.Consumer` (a mixin)."""

    # Provided by Consumer.
    _me: Me  # the consumer itself, passed to the sink and the host as is
    clock: Clock
    sink: DeliverySink[Me]
    config: ConsumerConfig
    cursor: SequenceCursor | PriorityCursor
    stream: Stream
    name: str
    is_pull: bool
    deleted: bool
    dseq: int
    push_active: bool
    last_delivered_ns: int
    _push_timer: Timer | None
    _hb_timer: Timer | None
    _interest_lost_at: int
    _last_hb: int
    _pbytes: int
    _maxpb: int
    _fcid: str
    _fcsz: int
    _replay_end: int
    _stalled: bool
    ack_fc: bool
    state: DeliveryState

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

    def _throttled(self, size: int, now: int) -> bool:
        raise NotImplementedError

    def ack(self, seq: int) -> None:
        raise NotImplementedError

    def _arm_idle_timer(self) -> None:
        raise NotImplementedError

    def _heartbeat_block(self) -> bytes:
        raise NotImplementedError

    def _pump_push(self) -> None:
        if not self.push_active:
            return
        sink = self.sink
        cfg = self.config
        to = cfg.deliver_subject
        fc = cfg.flow_control
        rate = cfg.rate_limit_bps
        budget = _PUSH_BUDGET
        now = self.clock.now()
        while budget:
            if fc and self._pbytes > self._maxpb:
                return
            got = self._candidate()
            if got is None:
                if self.ack_fc and self._stalled and not self._fcid:
                    self._send_flow_control()  # its answer acks what is outstanding
                return
            meta, redelivery = got
            if self._replay_end and self._held(meta, now):
                return
            reply = self._prepare(meta, redelivery)
            # nats-server counts subject, ack reply, headers and payload.
            if rate and self._throttled(meta.size - meta.overhead + len(reply), self.clock.now()):
                return
            sink.deliver(self._me, to, meta, reply)
            self._commit(meta, redelivery, now)
            budget -= 1
            if fc:
                self._pbytes += meta.size
                self._flow_control(meta.size)
        if sink.backlog(self._me) < _SINK_BACKLOG and self._push_timer is None:
            # Let the loop breathe, then carry on.
            self._push_timer = self.clock.call_later(0, self._push_resume)

    def _push_resume(self) -> None:
        self._push_timer = None
        self.pump()

    def sink_drained(self) -> None:
        """The sink caught up with a backlog of slow reads."""
        if not self.is_pull:
            self.pump()

    def _flow_control(self, size: int) -> None:
        if not self._fcid and self._pbytes > self._maxpb // 2:
            self._send_flow_control()
        elif self._fcid and self._pbytes - self._fcsz >= self._maxpb:
            self._fcsz += size

    def _send_flow_control(self) -> None:
        token = "".join(random.choices(string.ascii_letters + string.digits, k=4))
        self._fcid = f"$JS.FC.{self.stream.name}.{self.name}.{token}"
        self._fcsz = self._pbytes
        self.sink.control(self._me, self.config.deliver_subject, pq.FLOW_CONTROL, self._fcid)

    def flow_control_reply(self, subject: str, headers: bytes | None = None) -> None:
        """The client answered a flow control request. With ``ack_policy:
        flow_control`` its ``Nats-Last-Stream`` header acknowledges everything up to
        that stream sequence, as nats-server reads it."""
        if subject != self._fcid:
            return
        self._maxpb = min(self._maxpb * 2, FC_LIMIT)
        self._pbytes = max(self._pbytes - self._fcsz, 0)
        self._fcid = ""
        self._fcsz = 0
        if self.ack_fc and headers:
            last = _last_stream(headers)
            if last > 0:
                self.ack(last)
        self.pump()

    def set_push_interest(self, active: bool) -> None:
        """The deliver subject gained or lost its subscribers."""
        if self.is_pull or active == self.push_active:
            return
        self.push_active = active
        if active:
            self.pump()
        else:
            self._interest_lost_at = self.clock.now()
            self._arm_idle_timer()

    # -- heartbeats ----------------------------------------------------------------------------------------
    def _on_heartbeat(self) -> None:
        self._hb_timer = None
        if self.deleted:
            return
        hb = self.config.idle_heartbeat
        now = self.clock.now()
        due = max(self.last_delivered_ns, self._last_hb) + hb
        if now >= due:
            if self.push_active:
                self.sink.control(self._me, self.config.deliver_subject, self._heartbeat_block())
                if self.ack_fc and self.state.pending and not self._fcid:
                    self._send_flow_control()  # acknowledges what went out since
            self._last_hb = now
            due = now + hb
        self._hb_timer = self.clock.call_later(max(due - now, 0) / NS, self._on_heartbeat)


def _last_stream(headers: bytes) -> int:
    """``Nats-Last-Stream`` of a flow control answer (the first one, case as sent), or 0."""
    key = b"\r\nNats-Last-Stream:"
    i = headers.find(key)
    if i < 0:
        return 0
    end = headers.find(b"\r\n", i + len(key))
    value = headers[i + len(key) : end if end >= 0 else len(headers)].strip()
    return int(value) if value.isdigit() else 0
