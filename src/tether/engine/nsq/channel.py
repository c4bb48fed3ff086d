"""An NSQ channel: a durable consumer of its topic's stream, dealt out to clients by RDY.

Every channel of a topic is its own consumer, so each gets every message; within a
channel, messages go to the subscribed clients (:class:`Member` s) that have room under
their RDY, a few at a time in turn, so they spread over the clients. The consumer keeps
the delivery state (what is in flight, requeued, how often delivered: a message's
``attempts``), the deadlines and the redeliveries, with the same rules whichever door a
client came through; this class adds what NSQ has and JetStream has not: which client
owns each message in flight, RDY, ``TOUCH`` bounded by ``max_msg_timeout`` and
``sample_rate``.

The front door owns the consumer (``Consumer.on_available``): nothing is delivered
over NATS, and a timeout or a requeue calls :meth:`Channel.dispatch`.
"""

from __future__ import annotations

import random

from tether.engine.clock import Clock
from tether.engine.consumers import Consumer
from tether.engine.nsq.member import InFlight, Member, MessageSink
from tether.engine.nsq.names import message_id
from tether.storage.base import MessageMeta

NOT_IN_FLIGHT = b"ID not in flight"
NOT_OWNER = b"client does not own message"
MAX_ATTEMPTS = 0xFFFF  # the frame's attempts field is a uint16


class Channel:
    """One channel of one topic, over its durable consumer."""

    def __init__(
        self, topic: str, name: str, consumer: Consumer, clock: Clock, max_msg_timeout_ns: int
    ) -> None:
        self.topic = topic
        self.name = name
        self.consumer = consumer
        self.clock = clock
        self.max_msg_timeout = max_msg_timeout_ns
        self.members: list[Member] = []
        self.ephemeral = name.endswith("#ephemeral")
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.held = False  # the topic is paused: nothing goes out, whatever the channel's state
        self._turn = 0
        self._dispatching = False
        self._again = False
        consumer.on_available = self.dispatch

    # -- membership --------------------------------------------------------------------------
    def join(self, sink: MessageSink, msg_timeout_ns: int, sample_rate: int = 0) -> Member:
        member = Member(sink, msg_timeout_ns, sample_rate)
        self.members.append(member)
        return member

    def leave(self, member: Member) -> None:
        """The client went away. Its messages stay in flight until they time out, as in
        nsqd (then they go to another client)."""
        if member in self.members:
            self.members.remove(member)
        member.rdy = 0

    def ready(self, member: Member, count: int) -> None:
        """``RDY count``: the client takes up to ``count`` messages in flight."""
        member.rdy = count
        if member.capacity > 0:
            self.dispatch()

    def close(self, member: Member) -> None:
        """``CLS``: send the client nothing more."""
        member.closing = True
        member.rdy = 0

    # -- FIN, REQ, TOUCH --------------------------------------------------------------------------
    def _owned(self, member: Member, msg_id: bytes) -> InFlight | bytes:
        """The in-flight entry ``member`` holds for ``msg_id``, taken out of its table,
        or why there is none (nsqd's reasons)."""
        entry = member.in_flight.pop(msg_id, None)
        if entry is None:
            if any(msg_id in m.in_flight for m in self.members if m is not member):
                return NOT_OWNER
            return NOT_IN_FLIGHT
        state = self.consumer.state
        seq = entry.seq
        if seq not in state.pending or seq in state.queued or state.deliveries(seq) != entry[1]:
            return NOT_IN_FLIGHT  # it timed out (and may be with another client by now)
        return entry

    def finish(self, member: Member, ids: list[bytes]) -> list[tuple[bytes, bytes]]:
        """``FIN`` each id, in order; returns (id, reason) for each that failed."""
        failed: list[tuple[bytes, bytes]] = []
        pop = member.in_flight.pop
        state = self.consumer.state
        pending = state.pending
        queued = state.queued
        rdc = state.rdc
        ack = self.consumer.ack
        for msg_id in ids:
            entry = pop(msg_id, None)
            if entry is not None:
                seq = entry[0]
                if seq in pending and seq not in queued and rdc.get(seq, 1) == entry[1]:
                    ack(seq)
                    continue
                member.in_flight[msg_id] = entry  # _owned takes it out again and says why
            why = self._owned(member, msg_id)
            failed.append((msg_id, why if isinstance(why, bytes) else NOT_IN_FLIGHT))
        member.finish_count += len(ids) - len(failed)
        if failed or member.capacity > 0:
            self.dispatch()
        return failed

    def requeue(self, member: Member, msg_id: bytes, delay_ns: int) -> bytes | None:
        """``REQ``: deliver again now, or after ``delay_ns``; None, or why it failed."""
        entry = self._owned(member, msg_id)
        if isinstance(entry, bytes):
            return entry
        member.requeue_count += 1
        self.requeue_count += 1
        self.consumer.nak(entry.seq, delay_ns)  # which calls dispatch: there is room now
        return None

    def touch(self, member: Member, msg_id: bytes) -> bytes | None:
        """``TOUCH``: restart the message's timeout, up to ``max_msg_timeout`` after
        its delivery; None, or why it failed."""
        entry = self._owned(member, msg_id)
        if isinstance(entry, bytes):
            return entry
        now = self.clock.now()
        deadline = min(now + member.msg_timeout, entry.delivered + self.max_msg_timeout)
        self.consumer.extend(entry.seq, deadline)
        member.in_flight[msg_id] = entry._replace(deadline=deadline)
        return None

    # -- pause, empty, counts ------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """Paused itself (``/channel/pause``): kept as the consumer's ``pause_until``, so
        it is saved with the consumer and survives a restart."""
        return self.consumer.paused

    def empty(self) -> int:
        """``/channel/empty``: drop every message the channel holds (queued, deferred and
        in flight), as nsqd does; how many. Clients that still send ``FIN`` for one get
        ``E_FIN_FAILED``."""
        consumer = self.consumer
        for member in self.members:
            member.in_flight.clear()
        dropped = 0
        for seq in list(consumer.state.pending):
            consumer.ack(seq)
            dropped += 1
        while True:
            got = consumer.claim(1000)
            if not got:
                break
            for meta in got:
                consumer.ack(meta.seq)
            dropped += len(got)
        return dropped

    def counts(self) -> tuple[int, int, int]:
        """(depth, in flight, deferred) as nsqd counts them: waiting to be sent, sent and
        not finished, requeued with a delay (or held by a client that went away)."""
        consumer = self.consumer
        state = consumer.state
        queued = len(state.queued)
        in_flight = sum(len(m.in_flight) for m in self.members)
        deferred = max(0, len(state.pending) - queued - in_flight)
        return consumer.num_pending + queued, in_flight, deferred

    # -- delivery ----------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Send what can be sent: requeued and new messages, to clients with room."""
        if self._dispatching:
            self._again = True
            return
        self._dispatching = True
        try:
            while True:
                self._again = False
                self._deal()
                if not self._again:
                    break
        finally:
            self._dispatching = False

    def _deal(self) -> None:
        members = self.members
        consumer = self.consumer
        if not members or consumer.deleted:
            return
        now = self.clock.now()
        for member in members:
            if member.in_flight:
                self.timeout_count += member.expire(now)
        if self.held or (consumer.paused_until and consumer.paused):
            return
        ready = [m for m in members if m.capacity > 0]
        if not ready:
            return
        if len(ready) == 1:
            member = ready[0]
            self._give(member, consumer.claim(member.capacity, self._deadline(member, now)), now)
            return
        # Several clients with room: one message each in turn, starting with a
        # different client each time, so that they share the work.
        start = self._turn % len(ready)
        self._turn += 1
        ready = ready[start:] + ready[:start]
        given: dict[int, list[MessageMeta]] = {id(m): [] for m in ready}
        claim = consumer.claim
        while ready:
            for member in list(ready):
                got = claim(1, self._deadline(member, now))
                if not got:
                    ready = []
                    break
                batch = given[id(member)]
                batch.append(got[0])
                if len(batch) >= member.capacity:
                    ready.remove(member)
        for member in members:
            mine = given.get(id(member))
            if mine:
                self._give(member, mine, now)

    def _deadline(self, member: Member, now: int) -> int:
        # The consumer's ack_wait is the server's msg_timeout: only a client that asked
        # for another one needs a deadline of its own per message.
        timeout = member.msg_timeout
        return 0 if timeout == self.consumer.ack_wait else now + timeout

    def _give(self, member: Member, metas: list[MessageMeta], now: int) -> None:
        if not metas:
            return
        if member.sample_rate:
            metas = self._sample(member, metas)
            if not metas:
                return
        state = self.consumer.state
        rdc = state.rdc
        ids = [message_id(m.seq) for m in metas]
        if rdc:
            attempts = [min(rdc.get(m.seq, 1), MAX_ATTEMPTS) for m in metas]
        else:
            attempts = [1] * len(metas)
        deadline = now + member.msg_timeout
        in_flight = member.in_flight
        for meta, msg_id, n in zip(metas, ids, attempts, strict=True):
            in_flight[msg_id] = InFlight(meta.seq, n, deadline, now)
        member.message_count += len(metas)
        self.message_count += len(metas)
        member.sink.send_messages(metas, ids, attempts)

    def _sample(self, member: Member, metas: list[MessageMeta]) -> list[MessageMeta]:
        """nsqd's ``sample_rate``: each message goes to this client with that percent
        chance (nsqd keeps it unless a draw in 0-99 exceeds the rate); the others are
        finished without being sent (the channel loses them)."""
        keep: list[MessageMeta] = []
        for meta in metas:
            if random.randrange(100) <= member.sample_rate:
                keep.append(meta)
            else:
                self.consumer.ack(meta.seq)
        return keep

    def drop(self) -> None:
        """The channel is deleted: its clients must go."""
        self.consumer.on_available = None
        members, self.members = self.members, []
        for member in members:
            member.sink.channel_gone()
