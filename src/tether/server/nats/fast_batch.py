"""Fast-ingest batch publish (ADR-50, ``allow_batched``): flow-controlled publishing.

A publisher streams messages whose reply subject carries the batch's state,
``<inbox>.<id>.<flow>.<gap>.<seq>.<op>.$FI`` (read from the right): ``op`` 0 starts the
batch (seq 1), 1 appends, 2 stores this message and commits, 3 commits without storing
it (end of batch), 4 pings. Unlike an atomic batch, every message is stored as it comes
(each through the broker's normal publish, with its checks); the server answers on the
reply subjects with flow acks (``{"type":"ack","seq":<persisted>,"msgs":N}``, every N
messages), gaps, per-message errors and a final PubAck with ``batch`` and ``count``.

The protocol lives in the reply subject, so it is a NATS front-door matter; what is
stored goes through the one engine like any other publish. Formats, checks and their
order are nats-server 2.15's (see tests/conformance).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tether.engine import errors
from tether.engine.broker import Broker, PubAck
from tether.engine.clock import Timer
from tether.engine.streams import Stream

SUFFIX = ".$FI"
MAX_ID_LEN = 64
MAX_FLOW = 65535
DEFAULT_FLOW = 10
MAX_ACK_EVERY = 500
MAX_INFLIGHT_PER_STREAM = 1000
MAX_INFLIGHT_TOTAL = 50_000
IDLE_NS = 10 * 1_000_000_000

START, APPEND, COMMIT, EOB, PING = range(5)


def disabled() -> errors.ApiError:
    return errors.ApiError(400, 10205, "batch publish is disabled")


def invalid_pattern() -> errors.ApiError:
    return errors.ApiError(400, 10206, "batch publish pattern is invalid")


def invalid_id() -> errors.ApiError:
    return errors.ApiError(400, 10207, "batch publish ID is invalid")


def unknown_id() -> errors.ApiError:
    return errors.ApiError(400, 10208, "batch publish ID unknown")


def too_many_inflight() -> errors.ApiError:
    return errors.ApiError(429, 10211, "batch publish too many inflight")


@dataclass(slots=True)
class Control:
    """What a fast-ingest reply subject says."""

    batch_id: str
    flow: int
    fail_on_gap: bool
    seq: int
    op: int


def parse_reply(reply: str) -> Control | None:
    """The control fields of a fast-ingest reply subject, or None if malformed."""
    tokens = reply.split(".")
    if len(tokens) < 7:
        return None
    batch_id, flow_s, gap, seq_s, op_s = tokens[-6:-1]
    if gap not in ("ok", "fail") or not seq_s.isdigit() or op_s not in ("0", "1", "2", "3", "4"):
        return None
    try:
        flow = int(flow_s)
    except ValueError:
        return None
    seq, op = int(seq_s), int(op_s)
    if seq == 0 or (op == START and seq != 1) or (op in (APPEND, EOB) and seq == 1):
        return None
    if flow <= 0:
        flow = DEFAULT_FLOW
    return Control(batch_id, min(flow, MAX_FLOW), gap == "fail", seq, op)


@dataclass(slots=True)
class FastBatch:
    stream: str
    id: str
    flow: int
    fail_on_gap: bool
    ack_every: int
    seq: int = 0  # the last batch sequence received
    acked: int = 0  # the last batch sequence a flow ack reported
    last_stream_seq: int = 0  # where its last stored message went
    last_ns: int = 0
    timer: Timer | None = None
    ended: bool = False


Send = Callable[[str, bytes], None]


class FastBatches:
    """The open fast-ingest batches of every stream, answered through ``send``."""

    def __init__(self, broker: Broker, send: Send) -> None:
        self.broker = broker
        self.send = send
        self._open: dict[tuple[str, str], FastBatch] = {}
        self._per_stream: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._open)

    @property
    def _idle_ns(self) -> int:
        return self.broker.limits.batch_timeout_ns or IDLE_NS

    def publish(
        self, stream: Stream, subject: str, reply: str, headers: bytes | None, payload: bytes
    ) -> None:
        """One message whose reply subject ends in ``.$FI``."""
        name = stream.name
        answer = not stream.config.no_ack
        try:
            ctl = self._check(stream, reply)
        except errors.ApiError as exc:
            if answer:
                self._fail(name, reply, exc)
            return
        key = (name, ctl.batch_id)
        batch = self._open.get(key)
        if batch is None:
            batch = self._start(name, ctl)
        batch.last_ns = self.broker.clock.now()
        if ctl.op == PING:
            self._ack(reply, batch.acked, batch)
            return
        expected = batch.seq + 1
        if ctl.seq < expected:
            self._end(batch, reply, batch.seq)  # going backwards ends the batch
            return
        if ctl.seq > expected:
            self._send(reply, {"type": "gap", "last_seq": expected, "seq": ctl.seq})
            if batch.fail_on_gap:
                self._end(batch, reply, batch.seq)
                return
        batch.seq = ctl.seq
        if ctl.op == EOB:
            self._end(batch, reply, ctl.seq - 1)
            return
        if ctl.op == COMMIT:
            self._close(batch)

        def stored(result: PubAck | errors.ApiError, seq: int = ctl.seq, op: int = ctl.op) -> None:
            self._stored(batch, reply, seq, op, result)

        self.broker.publish(stream, subject, headers, payload, stored)

    def _check(self, stream: Stream, reply: str) -> Control:
        if stream.config.sealed:
            raise errors.stream_sealed()
        if not stream.config.allow_batched:
            raise disabled()
        ctl = parse_reply(reply)
        if ctl is None:
            raise invalid_pattern()
        if len(ctl.batch_id) > MAX_ID_LEN:
            raise invalid_id()
        if (stream.name, ctl.batch_id) not in self._open:
            if ctl.seq != 1 or ctl.op == PING:
                raise unknown_id()
            limits = self.broker.limits  # the jetstream block's, else nats-server's
            if self._per_stream.get(stream.name, 0) >= (
                limits.batch_inflight_per_stream or MAX_INFLIGHT_PER_STREAM
            ) or len(self._open) >= (limits.batch_inflight_total or MAX_INFLIGHT_TOTAL):
                raise too_many_inflight()
        return ctl

    def _start(self, name: str, ctl: Control) -> FastBatch:
        alone = not self._per_stream.get(name)
        batch = FastBatch(
            name,
            ctl.batch_id,
            ctl.flow,
            ctl.fail_on_gap,
            min(MAX_ACK_EVERY, ctl.flow) if alone else 1,
        )
        self._open[(name, ctl.batch_id)] = batch
        self._per_stream[name] = self._per_stream.get(name, 0) + 1
        clock = self.broker.clock
        batch.timer = clock.call_later(self._idle_ns / 1e9, lambda: self._idle(batch))
        return batch

    def _stored(
        self, batch: FastBatch, reply: str, seq: int, op: int, result: PubAck | errors.ApiError
    ) -> None:
        if isinstance(result, errors.ApiError):
            if batch.fail_on_gap:
                if seq == 1:
                    self._close(batch)
                    self._fail(batch.stream, reply, result)
                    return
                self._send(reply, {"type": "err", "seq": seq, "error": result.to_dict()})
                self._end(batch, reply, seq - 1)
                return
            self._send(reply, {"type": "err", "seq": seq, "error": result.to_dict()})
            if op == COMMIT:
                self._final(batch, reply, seq)
            return
        batch.last_stream_seq = max(batch.last_stream_seq, result.seq)
        if op == COMMIT:
            self._final(batch, reply, seq)
        elif seq == 1:
            self._ack(reply, 0, batch)
        elif seq - batch.acked >= batch.ack_every:
            batch.acked = seq
            self._ack(reply, seq, batch)
            self._adapt(batch)

    def _adapt(self, batch: FastBatch) -> None:
        """Acks come every N messages: N moves towards ``flow`` shared among the
        stream's fast batches (at most 500), doubling or halving."""
        target = max(
            1, min(batch.flow, MAX_ACK_EVERY // max(1, self._per_stream.get(batch.stream, 1)))
        )
        if batch.ack_every < target:
            batch.ack_every = min(batch.ack_every * 2, target)
        elif batch.ack_every > target:
            batch.ack_every = max(batch.ack_every // 2, target)

    def _end(self, batch: FastBatch, reply: str, count: int) -> None:
        """The batch ends without a stored commit: the final PubAck once what it stored
        is durable."""
        self._close(batch)
        self._after_writes(lambda: self._final(batch, reply, count))

    def _after_writes(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the writes made so far are settled: what the server says on a
        batch's reply subjects keeps the order of the messages it answers."""
        self.broker.store.flush().add_done_callback(lambda _f: fn())

    def _final(self, batch: FastBatch, reply: str, count: int) -> None:
        self._close(batch)
        body = {"stream": batch.stream, "seq": batch.last_stream_seq, "batch": batch.id}
        body["count"] = count
        self._send(reply, body)

    def _ack(self, reply: str, seq: int, batch: FastBatch) -> None:
        self._send(reply, {"type": "ack", "seq": seq, "msgs": batch.ack_every})

    def _send(self, reply: str, body: dict[str, Any]) -> None:
        self.send(reply, json.dumps(body, separators=(",", ":")).encode())

    def _fail(self, stream: str, reply: str, error: errors.ApiError) -> None:
        self._send(reply, {"error": error.to_dict(), "stream": stream, "seq": 0})

    def _close(self, batch: FastBatch) -> None:
        if batch.ended:
            return
        batch.ended = True
        if self._open.get((batch.stream, batch.id)) is batch:
            del self._open[(batch.stream, batch.id)]
            left = self._per_stream.get(batch.stream, 1) - 1
            if left:
                self._per_stream[batch.stream] = left
            else:
                self._per_stream.pop(batch.stream, None)
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None

    def _idle(self, batch: FastBatch) -> None:
        """A batch idle for 10 s is dropped silently, as on nats-server."""
        batch.timer = None
        if batch.ended:
            return
        left = batch.last_ns + self._idle_ns - self.broker.clock.now()
        if left > 0:
            batch.timer = self.broker.clock.call_later(left / 1e9, lambda: self._idle(batch))
            return
        self._close(batch)

    def drop_stream(self, name: str) -> None:
        for batch in [b for b in self._open.values() if b.stream == name]:
            self._close(batch)

    def close(self) -> None:
        for batch in list(self._open.values()):
            self._close(batch)
