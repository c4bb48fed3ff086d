"""A consumer: a durable cursor over a stream plus the delivery state of each message.

Pull consumers hand messages to waiting :class:`PullRequest` s (round robin, as
nats-server does); push consumers send them to their deliver subject while it has
interest, within the flow-control window. Every delivered message is outstanding
until acked; on ``ack_wait`` (or ``backoff``) it is queued for redelivery, and after
``max_deliver`` deliveries it becomes dead (kept, requeueable). Redeliveries go before
new messages (in stream order, or priority order with ``priority_order``); the
``max_ack_pending`` limit stalls new messages only.

The consumer talks to the outside through two small interfaces: a
:class:`DeliverySink` (a front door: sends messages and status blocks, checks
interest) and a :class:`ConsumerHost` (the registry: persistence, retention,
deletion). Time comes from the :class:`Clock`, so every rule is testable with a
fake clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from tether.engine.clock import Clock, Timer
from tether.engine.consumers import pull_queue as pq
from tether.engine.consumers.ack_subject import ack_format, first_delivery_format
from tether.engine.consumers.acks import PRIORITY_KEY, AckHandling
from tether.engine.consumers.config import ConsumerConfig, format_rfc3339, parse_rfc3339
from tether.engine.consumers.cursor import (
    Matcher,
    PriorityCursor,
    SequenceCursor,
    StreamHead,
    make_cursor,
    start_position,
)
from tether.engine.consumers.delivery_state import (
    DeadLetter,
    DeliveryState,
    SavedState,
)
from tether.engine.consumers.job_control import JobControl
from tether.engine.consumers.priority import PriorityGroups
from tether.engine.consumers.pull import PullDelivery
from tether.engine.consumers.pull_queue import PullRequest
from tether.engine.consumers.push import FC_START, PushDelivery
from tether.engine.consumers.sinks import ConsumerHost, DeliverySink, RunSink
from tether.engine.streams import Stream
from tether.storage.base import MessageMeta

NS = 1_000_000_000
# A pause_until at the epoch, which format_rfc3339 would write as Go's zero time (not set).
EPOCH = "1970-01-01T00:00:00Z"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time, an unset ``pause_until`` in advisories


class Consumer(
    AckHandling["Consumer"], JobControl, PullDelivery["Consumer"], PushDelivery["Consumer"]
):
    """One consumer of one stream."""

    def __init__(
        self,
        stream: Stream,
        head: StreamHead,
        name: str,
        config: ConsumerConfig,
        created_ns: int,
        clock: Clock,
        sink: DeliverySink[Consumer],
        host: ConsumerHost[Consumer],
        saved: SavedState | None = None,
    ) -> None:
        self.stream = stream
        self.head = head
        self.name = name
        self.created_ns = created_ns
        self.clock = clock
        self.sink = sink
        # The sink as one that takes whole runs, if it is one (checked once: costly).
        self.run_sink: RunSink[Consumer] | None = sink if isinstance(sink, RunSink) else None
        self.host = host
        self._me = self
        self.state = DeliveryState()
        self.waiting: deque[PullRequest] = deque()
        self.notify_acks = False  # set by the registry for interest/workqueue streams
        self.deleted = False
        self.dseq = 0
        self.last_delivered_ns = 0
        self.last_ack_ns = 0
        # Since this process started (a Prometheus counter may restart from zero).
        self.acked_count = 0
        self.redelivered_count = 0
        self.push_active = False
        # Set when another front door owns the consumer (the webhook-broker HTTP API):
        # nothing is delivered over NATS, and this is called whenever messages may have
        # become available (a timeout, a nak, a requeue), so that door can hand them out.
        self.on_available: Callable[[], None] | None = None
        self._changed = False
        self._pumping = False
        self._again = False
        self._stalled = False
        self._ack_timer: Timer | None = None
        self._ack_timer_at = 0
        self._idle_timer: Timer | None = None
        self._hb_timer: Timer | None = None
        self._pause_timer: Timer | None = None
        self._push_timer: Timer | None = None
        # replay_policy "original": the messages stored up to now go out spaced as they
        # were stored (nats-server's replay mode); later ones go out at once.
        self._replay_end = stream.last_seq if config.replay_policy == "original" else 0
        self._replay_lts = 0  # store time of the last message sent while replaying
        self._replay_due = 0  # when the held message may go
        self._replay_timer: Timer | None = None
        # rate_limit_bps (push): a token bucket of bytes, nats-server's rate.Limiter.
        self._rl_tokens = 0.0
        self._rl_at = 0
        self._rl_timer: Timer | None = None
        self._last_activity = clock.now()
        self._interest_lost_at = self._last_activity
        self._last_hb = self._last_activity
        # Flow control (push): bytes sent since the last answered request.
        self._pbytes = 0
        self._maxpb = FC_START
        self._fcid = ""
        self._fcsz = 0
        self.config = config
        self.priority: PriorityGroups | None = None
        # Extra header lines of the message being handed to the sink (a pin id).
        self.delivery_headers = b""
        self._apply_config(config)
        self.cursor: SequenceCursor | PriorityCursor = make_cursor(stream, head, config, saved)
        if saved is not None:
            self.dseq = saved.dseq
            self.last_delivered_ns = saved.last_delivered_ns
            self.last_ack_ns = saved.last_ack_ns
            self.state.load_from(saved)
            self._drop_vanished()
            deadline = self.state.next_deadline(self.ack_wait)
            if deadline:
                self._arm_ack_timer(deadline)
        self._arm_idle_timer()
        if not config.is_pull and config.idle_heartbeat:
            self._hb_timer = clock.call_later(config.idle_heartbeat / NS, self._on_heartbeat)
        self._apply_pause()

    # -- configuration ---------------------------------------------------------------------------
    def _apply_config(self, config: ConsumerConfig) -> None:
        self.config = config
        self.is_pull = config.is_pull
        self.ack_none = config.ack_policy == "none"
        # flow_control acks like "all", with the answers to flow control requests.
        self.ack_fc = config.ack_policy == "flow_control"
        self.ack_all = config.ack_policy == "all" or self.ack_fc
        self.ack_wait = config.ack_wait if not self.ack_none else 0
        self.backoff = list(config.backoff)
        self.max_deliver = config.max_deliver if config.max_deliver > 0 else 0
        # -1 means unlimited, like 0 here.
        self.max_ack_pending = max(config.max_ack_pending, 0) if not self.ack_none else 0
        self.max_waiting = config.max_waiting
        self.priority_order = config.priority_order
        freq = config.sample_freq.removesuffix("%")
        self.sample_freq = int(freq) if freq else 0
        self._key_mod = PRIORITY_KEY if config.priority_order else 0
        self._ack_format = ack_format(self.stream.name, self.name)
        self._ack_first = first_delivery_format(self.stream.name, self.name)
        self.paused_until = parse_rfc3339(config.pause_until) if config.pause_until else 0
        if config.priority_policy == "none":
            if self.priority is not None:
                self.priority.close()
                self.priority = None
        elif self.priority is None:
            self.priority = PriorityGroups(config, self.clock, self._pin_event, self.pump)
        else:
            self.priority.configure(config)

    def _pin_event(self, kind: str, fields: dict[str, str]) -> None:
        type_ = "consumer_group_pinned" if kind == "PINNED" else "consumer_group_unpinned"
        # These two name the account (every client is in the global one here).
        self._advisory(kind, type_, {"account": "$G", **fields})

    def unpin(self, group: str) -> None:
        """``CONSUMER.UNPIN``: the pin is dropped; the next request without an id gets
        a new one."""
        if self.priority is not None:
            self.priority.unpin(group, "admin")
        self.pump()

    def update_config(self, config: ConsumerConfig) -> None:
        """Apply an allowed update (the registry checked it)."""
        old_filters = self.config.filters
        self._apply_config(config)
        if config.filters != old_filters:
            self.cursor.set_match(Matcher(config.filters, self.stream.config.subjects))
        self._apply_pause()
        self._changed_state()
        self.pump()

    def _drop_vanished(self) -> None:
        """After loading: forget deliveries of messages that no longer exist."""
        meta = self.stream.meta
        for seq in [s for s in self.state.pending if meta(s) is None]:
            self.state.forget(seq)
        for seq in [s for s in self.state.dead if meta(s) is None]:
            self.state.forget(seq)
        for seq in list(self.state.pending if not self.ack_fc else ()):
            # Nothing is in flight after a restart: what was due goes back in the queue.
            entry = self.state.pending[seq]
            if entry[1] + self._wait_for(self.state.deliveries(seq)) <= self.clock.now():
                self._timeout(seq)

    # -- views -----------------------------------------------------------------------------------------
    @property
    def num_pending(self) -> int:
        return self.cursor.num_pending

    @property
    def num_ack_pending(self) -> int:
        return len(self.state.pending)

    @property
    def num_redelivered(self) -> int:
        return 0 if self.config.max_deliver == 1 else self.state.num_redelivered()

    def count_waiting(self) -> int:
        """``num_waiting``: live requests (expired or abandoned ones are dropped first)."""
        self.prune_waiting()
        return len(self.waiting)

    @property
    def delivered(self) -> tuple[int, int]:
        """(consumer_seq, stream_seq) of the last delivery, as ``delivered`` reports it."""
        return self.dseq, self.cursor.delivered_seq

    @property
    def ack_floor(self) -> tuple[int, int]:
        if self.ack_none:
            return self.delivered
        floor = self.state.floor_seq()
        if floor is None:
            return self.delivered
        return floor[0] - 1, floor[1] - 1

    @property
    def paused(self) -> bool:
        return self.paused_until > self.clock.now()

    def dead_messages(self) -> list[DeadLetter]:
        """Messages that reached ``max_deliver`` or were terminated, oldest first."""
        self.reap()
        return sorted(self.state.dead.values(), key=lambda d: d.seq)

    def pending_messages(self) -> list[tuple[int, int, int]]:
        """(stream seq, consumer seq, delivered_at) of every unacked delivery."""
        return list(self.state.iter_pending())

    # -- persistence ----------------------------------------------------------------------------------
    def save(self) -> SavedState:
        cursor = self.cursor
        start = max_taken = lps_end = 0
        lps: list[int] = []
        prio: list[int] = []
        ahead: list[int] = []
        if isinstance(cursor, PriorityCursor):
            position, prio = cursor.max_taken + 1, cursor.save()
            start, max_taken, ahead = cursor.start, cursor.max_taken, sorted(cursor.ahead)
        else:
            position, lps, lps_end = cursor.save()
        state = SavedState(
            start=start,
            max_taken=max_taken,
            cursor=position,
            dseq=self.dseq,
            pending=[],
            redelivered=[],
            dead=[],
            priority_cursors=prio,
            last_delivered_ns=self.last_delivered_ns,
            last_ack_ns=self.last_ack_ns,
            lps=lps,
            lps_end=lps_end,
            ahead=ahead,
        )
        self.state.dump_into(state)
        self._changed = False
        return state

    def _changed_state(self) -> None:
        if not self._changed:
            self._changed = True
            self.host.consumer_changed(self)

    # -- stream events --------------------------------------------------------------------------------
    def on_committed(self, metas: list[MessageMeta]) -> None:
        """New messages are durable in the stream."""
        self.cursor.on_committed(metas)
        if self.waiting or self.push_active:
            self.pump()

    def on_removed(self, seqs: list[int], delivered_known: bool) -> None:
        """Messages left the stream; ``delivered_known`` when they were acked (retention)."""
        state = self.state
        if state.pending or state.dead:
            touched = False
            for seq in seqs:
                if seq in state.pending or seq in state.dead:
                    state.forget(seq)
                    touched = True
            if touched:
                self._changed_state()
        if not delivered_known:
            self.cursor.on_removed(seqs)

    # -- delivery ----------------------------------------------------------------------------------------
    def pump(self) -> None:
        """Deliver whatever can be delivered now."""
        if self._pumping:
            self._again = True
            return
        if self.deleted:
            return
        if self.paused_until and self.paused:
            if self.is_pull and self.waiting:
                self.end_one_shots()  # nothing goes out: one-shots end, as on nats-server
            return
        if self.on_available is not None:
            self.on_available()
            return
        self._pumping = True
        try:
            while True:
                self._again = False
                if self.is_pull:
                    self._pump_pull()
                else:
                    self._pump_push()
                if not self._again:
                    break
        finally:
            self._pumping = False

    def _candidate(self) -> tuple[MessageMeta, bool] | None:
        """The next message to send and whether it is a redelivery."""
        state = self.state
        red: MessageMeta | None = None
        if state.queued:
            meta_of = self.stream.meta
            max_deliver = self.max_deliver
            while True:
                seq = state.peek_queued(self._key_mod)
                if not seq:
                    break
                red = meta_of(seq)
                if red is not None:
                    if not max_deliver or state.deliveries(seq) < max_deliver:
                        break
                    state.pop_queued(seq)
                    self._exhausted(seq)
                    red = None
                    continue
                state.pop_queued(seq)
                state.forget(seq)
            if red is not None and not self.priority_order:
                return red, True
        if self.max_ack_pending and len(state.pending) >= self.max_ack_pending:
            self._stalled = True
            return (red, True) if red is not None else None
        self._stalled = False
        new = self.cursor.peek()
        if new is None:
            return (red, True) if red is not None else None
        if red is None or (new.priority, -new.seq) > (red.priority, -red.seq):
            return new, False
        return red, True

    def _prepare(self, meta: MessageMeta, redelivery: bool) -> str:
        """The ack subject the next delivery of ``meta`` will carry."""
        if redelivery:
            dc = self.state.deliveries(meta.seq) + 1
            return self._ack_format % (
                dc,
                meta.seq,
                self.dseq + 1,
                meta.ts,
                self.cursor.num_pending,
            )
        pending = self.cursor.num_pending - 1
        return self._ack_first % (meta.seq, self.dseq + 1, meta.ts, pending if pending > 0 else 0)

    @property
    def replaying(self) -> bool:
        return bool(self._replay_end) and self.cursor.delivered_seq < self._replay_end

    def _held(self, meta: MessageMeta, now: int) -> bool:
        """Replay mode: ``meta`` waits as long after the last message sent as it was
        stored after it (nats-server skips gaps up to a millisecond). True: not yet (a
        timer pumps again when it is due)."""
        if not self._replay_lts or not self.replaying:
            return False
        gap = meta.ts - self._replay_lts
        if gap <= 1_000_000:
            return False
        if not self._replay_due:
            self._replay_due = now + gap
        if now >= self._replay_due:
            return False
        if self._replay_timer is None:
            self._replay_timer = self.clock.call_later(
                (self._replay_due - now) / NS, self._on_replay_due
            )
        return True

    def _throttled(self, size: int, now: int) -> bool:
        """``rate_limit_bps``: True if ``size`` bytes may not go yet (a timer pumps
        again once the bucket holds them). The bucket fills at the rate (in bytes) up
        to the stream's ``max_msg_size``, or 1 MiB, as nats-server's limiter does."""
        rate = self.config.rate_limit_bps / 8
        limit = self.stream.config.max_msg_size
        burst = float(limit if limit > 0 else 1024 * 1024)
        if not self._rl_at:
            self._rl_tokens = burst
        else:
            self._rl_tokens = min(burst, self._rl_tokens + (now - self._rl_at) / NS * rate)
        self._rl_at = now
        if self._rl_tokens >= size or size > burst:
            self._rl_tokens -= size
            return False
        if self._rl_timer is None:
            wait = (size - self._rl_tokens) / rate
            self._rl_timer = self.clock.call_later(wait, self._on_rate_due)
        return True

    def _on_rate_due(self) -> None:
        self._rl_timer = None
        self.pump()

    def _on_replay_due(self) -> None:
        self._replay_timer = None
        self.pump()

    def _commit(self, meta: MessageMeta, redelivery: bool, now: int) -> None:
        seq = meta.seq
        state = self.state
        if self._replay_end:
            self._replay_lts = meta.ts
            self._replay_due = 0
        self.dseq += 1
        self.last_delivered_ns = now
        if redelivery:
            self.redelivered_count += 1
            state.pop_queued(seq)
            dc = state.count_redelivery(seq)
            state.track(seq, self.dseq, now)
            wait = self._wait_for(dc)
            if wait != self.ack_wait:
                state.set_deadline(seq, now + wait)
            self._arm_ack_timer(now + wait)
        else:
            self.cursor.take(meta)
            if self.ack_none:
                if self.notify_acks:
                    self.host.consumer_acked(self, [seq])
            else:
                state.track(seq, self.dseq, now)
                self._arm_ack_timer(now + self.ack_wait)
        self._changed_state()

    # -- reset ----------------------------------------------------------------------------------------
    def reset(self, seq: int) -> int:
        """``CONSUMER.RESET`` (ADR-60): start again at ``seq`` (0: the ack floor + 1).

        Every outstanding delivery, redelivery and dead letter is forgotten and the
        consumer sequence starts over, as on nats-server. A consumer that delivers all
        messages may go anywhere; one that starts at a sequence or time may not go below
        it; others may only go back to their ack floor. Raises ``ValueError`` with
        nats-server's reason otherwise. Returns the sequence it starts at.
        """
        cfg = self.config
        match = Matcher(cfg.filters, self.stream.config.subjects)
        if seq <= 0:
            seq = self.ack_floor[1] + 1
        elif cfg.deliver_policy == "by_start_sequence":
            if seq < cfg.opt_start_seq:
                raise ValueError("below start seq")
        elif cfg.deliver_policy == "by_start_time":
            if seq < start_position(self.stream, self.head, cfg, match)[0]:
                raise ValueError("below start time")
        elif cfg.deliver_policy != "all":
            raise ValueError("not allowed")
        seq = max(seq, 1)
        old_floor = self.ack_floor[1]
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
            self._ack_timer_at = 0
        self.state = DeliveryState()
        self.dseq = 0
        self.last_delivered_ns = self.last_ack_ns = 0
        self._stalled = False
        if isinstance(self.cursor, PriorityCursor):
            self.cursor = PriorityCursor(self.stream, self.head, match, seq)
        else:
            self.cursor = SequenceCursor(self.stream, self.head, match, seq)
        if self.notify_acks and seq - 1 > old_floor:
            # Interest and work queue streams: what the consumer jumped over is done
            # with, as if acked (nats-server checks the stream's interest the same way).
            meta_of = self.stream.meta
            skipped: list[int] = []
            for s in self.stream.seqs(old_floor + 1):
                if s >= seq:
                    break
                meta = meta_of(s)
                if meta is not None and match(meta.subject):
                    skipped.append(s)
            if skipped:
                self.host.consumer_acked(self, skipped)
        self._changed_state()
        self.pump()
        return seq

    # -- heartbeats ---------------------------------------------------------------------------------
    def _heartbeat_block(self) -> bytes:
        """``100 Idle Heartbeat`` with the last consumer and stream sequences."""
        return pq.idle_heartbeat(self.dseq, self.cursor.delivered_seq, self._fcid)

    # -- inactivity, pause ---------------------------------------------------------------------------------
    def _arm_idle_timer(self) -> None:
        threshold = self.config.inactive_threshold
        if not threshold or self._idle_timer is not None or self.deleted:
            return
        self._idle_timer = self.clock.call_later(threshold / NS, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._idle_timer = None
        if self.deleted:
            return
        threshold = self.config.inactive_threshold
        if not threshold:
            return
        now = self.clock.now()
        if self.is_pull:
            self.prune_waiting()
            since = self._last_activity
            if self.waiting:
                since = now
        else:
            if self.push_active:
                return  # re-armed when interest goes away
            since = self._interest_lost_at
        if now - since >= threshold:
            self.host.consumer_inactive(self)
            return
        self._idle_timer = self.clock.call_later(
            (since + threshold - now) / NS, self._on_idle_timer
        )

    def pause(self, until_ns: int | None) -> None:
        """``CONSUMER.PAUSE``: no deliveries until ``until_ns``; None resumes and forgets the
        time. A past time also resumes but stays in the config, as nats-server keeps it: the
        epoch included (nats.js resumes with it), which 0 alone would read as "not set"."""
        if until_ns is None:
            self.config.pause_until = None
        else:
            self.config.pause_until = format_rfc3339(until_ns) if until_ns > 0 else EPOCH
        self.paused_until = max(until_ns or 0, 0)
        self._apply_pause()
        self._changed_state()
        self._pause_advisory()
        self.pump()

    def _pause_advisory(self) -> None:
        """nats-server's ``CONSUMER.PAUSE`` advisory: on every pause or resume, and when a
        pause runs out."""
        self._advisory(
            "PAUSE",
            "consumer_pause",
            {"paused": self.paused, "pause_until": self.config.pause_until or ZERO_TIME},
        )

    def _apply_pause(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None
        if self.paused:
            delay = (self.paused_until - self.clock.now()) / NS
            self._pause_timer = self.clock.call_later(delay, self._on_unpause)

    def _on_unpause(self) -> None:
        self._pause_timer = None
        if self.paused:
            # The loop's timer (monotonic) may fire a little before the wall clock
            # reaches the end: wait the rest, at least a millisecond so as not to spin.
            rest = max((self.paused_until - self.clock.now()) / NS, 0.001)
            self._pause_timer = self.clock.call_later(rest, self._on_unpause)
            return
        self._pause_advisory()
        self.pump()

    # -- lifecycle --------------------------------------------------------------------------------------------
    def close(self, notify: bool = True) -> None:
        """The consumer is deleted: waiting requests hear ``409 Consumer Deleted``."""
        self.deleted = True
        if self.priority is not None:
            self.priority.close()
        for req in list(self.waiting):
            self._finish(req, pq.CONSUMER_DELETED if notify else None)
        for timer in (
            self._ack_timer,
            self._idle_timer,
            self._hb_timer,
            self._pause_timer,
            self._replay_timer,
            self._rl_timer,
        ):
            if timer is not None:
                timer.cancel()
        if self._push_timer is not None:
            self._push_timer.cancel()
        self._ack_timer = self._idle_timer = self._hb_timer = None
        self._pause_timer = self._push_timer = self._replay_timer = self._rl_timer = None

    def _advisory(self, kind: str, type_: str, fields: dict[str, Any]) -> None:
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.{kind}.{self.stream.name}.{self.name}"
        self._event(subject, f"io.nats.jetstream.advisory.v1.{type_}", fields)

    def _event(self, subject: str, type_: str, fields: dict[str, Any]) -> None:
        """An advisory or metric on ``subject``, sent only when someone listens."""
        if not self.sink.has_interest(subject):
            return
        self.sink.advisory(
            subject,
            {"type": type_, "stream": self.stream.name, "consumer": self.name, **fields},
        )

    def _me_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Consumer({self.stream.name!r}, {self.name!r})"
