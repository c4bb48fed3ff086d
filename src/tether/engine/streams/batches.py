"""Atomic batch publish (ADR-50): messages staged per batch id, stored all or nothing.

A publisher sends messages carrying ``Nats-Batch-Id`` and ``Nats-Batch-Sequence``
(1, 2, … without gaps); the one carrying ``Nats-Batch-Commit: 1`` (stored too) or
``Nats-Batch-Commit: eob`` (not stored) ends the batch. Until then nothing is stored:
the messages wait here, in memory. At the commit the broker checks every message
against the stream as it was before the batch, then appends them all in one
synchronous call, so they all land in one group commit, which is one storage
transaction: after a crash either the whole batch is there or none of it.

A batch keeps its messages as parallel lists (subjects, header blocks, payloads,
header fields), so that staging a message is a few list appends and the commit of a
batch whose messages hold nothing but their batch headers and maybe a ``Nats-Msg-Id``
stores the lists as they are, as one run (see :meth:`AtomicBatches.stage_run`).

The checks made while staging, their order, limits and errors are nats-server's
(``processJetStreamAtomicBatchMsg``): see :meth:`AtomicBatches.stage`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.engine.clock import Clock, Timer
from tether.engine.errors import ApiError
from tether.engine.streams import counters, schedules
from tether.engine.streams.stream import (
    EXPECTED_LAST_MSG_ID,
    EXPECTED_LAST_SEQ,
    EXPECTED_LAST_SUBJ_SEQ,
    EXPECTED_LAST_SUBJ_SEQ_SUBJECT,
    EXPECTED_STREAM,
    MSG_ID,
    MSG_TTL,
    PRIORITY,
    ROLLUP,
)

BATCH_ID = b"Nats-Batch-Id"
BATCH_SEQ = b"Nats-Batch-Sequence"
BATCH_COMMIT = b"Nats-Batch-Commit"
REQUIRED_API_LEVEL = b"Nats-Required-Api-Level"

MAX_BATCH_ID_LEN = 64
# A header block longer than this is refused (nats-server's limit, Stream.check_size's).
MAX_HEADERS_LEN = 65535
# nats-server's defaults (its ``jetstream`` block can change them; so can Tether's).
MAX_BATCH_SIZE = 1000
MAX_INFLIGHT_PER_STREAM = 50
MAX_INFLIGHT_TOTAL = 1000
BATCH_TIMEOUT_NS = 10 * 1_000_000_000


def disabled() -> ApiError:
    return ApiError(400, 10174, "atomic publish is disabled")


def missing_sequence() -> ApiError:
    return ApiError(400, 10175, "atomic publish sequence is missing")


def incomplete() -> ApiError:
    return ApiError(400, 10176, "atomic publish batch is incomplete")


def unsupported_header(name: str) -> ApiError:
    return ApiError(400, 10177, f"atomic publish unsupported header used: {name}")


def invalid_id() -> ApiError:
    return ApiError(400, 10179, "atomic publish batch ID is invalid")


def too_large(limit: int) -> ApiError:
    return ApiError(400, 10199, f"atomic publish batch is too large: {limit}")


def invalid_commit() -> ApiError:
    return ApiError(400, 10200, "atomic publish batch commit is invalid")


def duplicate_msg_id() -> ApiError:
    return ApiError(400, 10201, "atomic publish batch contains duplicate message id")


def api_level_required() -> ApiError:
    return ApiError(412, 10185, "JetStream minimum api level required")


def too_many_inflight() -> ApiError:
    return ApiError(429, 10210, "atomic publish too many inflight")


def wrong_last_sequence_in_batch() -> ApiError:
    # nats-server's JSStreamWrongLastSequenceConstantError: an expectation on a subject
    # the batch itself already wrote to can never hold.
    return ApiError(400, 10164, "wrong last sequence")


@dataclass(slots=True)
class Batch:
    """An open batch of one stream: message ``i`` is ``subjects[i]``, ``headers[i]``,
    ``payloads[i]``, with ``fields[i]`` its header fields, or None when they hold
    nothing but its batch headers (no check at the commit looks at those; a message
    staged by :meth:`AtomicBatches.stage_run` with a ``Nats-Msg-Id`` has only that)."""

    stream: str
    id: str
    subjects: list[str] = field(default_factory=list)
    headers: list[bytes] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    fields: list[dict[bytes, bytes] | None] = field(default_factory=list)
    # False once a message holds a header the commit checks one by one (expectations,
    # TTLs…; not Nats-Msg-Id, which the commit of a run checks for all at once).
    plain: bool = True
    # True once a message holds a Nats-Msg-Id.
    ids: bool = False
    last_ns: int = 0
    timer: Timer | None = None
    # Nats-Batch-Id as sent, for stage_run to recognise the batch's messages by.
    raw_id: bytes = b""

    def __len__(self) -> int:
        return len(self.subjects)

    def add(
        self, subject: str, headers: bytes, payload: bytes, fields: dict[bytes, bytes] | None
    ) -> None:
        self.subjects.append(subject)
        self.headers.append(headers)
        self.payloads.append(payload)
        self.fields.append(fields)
        if fields is not None:
            if self.plain and not CHECKED.isdisjoint(fields):
                self.plain = False
            if fields.get(MSG_ID):
                self.ids = True


# The headers the checks of a batch's commit look at one message at a time (the
# broker's, in nats-server's order): a batch whose messages carry none of them is
# stored as one run, its msg ids (``Nats-Msg-Id``, not in this list) checked together.
CHECKED = frozenset(
    (
        EXPECTED_LAST_MSG_ID,
        EXPECTED_STREAM,
        EXPECTED_LAST_SEQ,
        EXPECTED_LAST_SUBJ_SEQ,
        EXPECTED_LAST_SUBJ_SEQ_SUBJECT,
        MSG_TTL,
        ROLLUP,
        PRIORITY,
        counters.INCR,
        schedules.SCHEDULE,
        schedules.SCHEDULER,
        schedules.NEXT,
    )
)


@dataclass(slots=True)
class BatchLimits:
    max_size: int = MAX_BATCH_SIZE
    inflight_per_stream: int = MAX_INFLIGHT_PER_STREAM
    inflight_total: int = MAX_INFLIGHT_TOTAL
    timeout_ns: int = BATCH_TIMEOUT_NS


# The header block of a batch message carrying nothing but its batch headers and maybe
# a msg id, as publishers write it: read with one match instead of line by line. The
# values are printable ASCII without blanks, so they read as the general parser reads
# them.
_BATCH_ONLY = re.compile(
    rb"NATS/1\.0\r\nNats-Batch-Id: ([!-~]+)\r\nNats-Batch-Sequence: ([!-~]+)\r\n"
    rb"(?:Nats-Msg-Id: ([!-~]+)\r\n)?(?:Nats-Batch-Commit: ([!-~]+)\r\n)?\r\n"
)


# A header block of batch headers and ``Nats-Msg-Id`` in any order (publishers that
# deduplicate their batches send one per message; Go clients write a map's headers in
# no set order), the same values as above: its lines.
_BATCH_AND_ID = re.compile(
    rb"NATS/1\.0\r\n((?:Nats-(?:Batch-Id|Batch-Sequence|Batch-Commit|Msg-Id): [!-~]+\r\n)+)\r\n"
)

# The start of a batch-only block, up to its sequence, for a batch id.
_BATCH_PREFIX = b"NATS/1.0\r\nNats-Batch-Id: %s\r\nNats-Batch-Sequence: "


def batch_fields(block: bytes) -> dict[bytes, bytes] | None:
    """The fields of a header block holding ``Nats-Batch-Id`` and nothing but
    ``Nats-Batch-Sequence``, ``Nats-Batch-Commit`` and ``Nats-Msg-Id`` (one space after
    each colon, values of printable ASCII without blanks), as the general header parser
    would give them; None for any other block, which the general parser then reads."""
    m = _BATCH_ONLY.fullmatch(block)
    if m is not None:
        batch_id, seq, msg_id, commit = m.groups()
        out = {BATCH_ID: batch_id, BATCH_SEQ: seq}
        if msg_id is not None:
            out[MSG_ID] = msg_id
        if commit is not None:
            out[BATCH_COMMIT] = commit
        return out
    m = _BATCH_AND_ID.fullmatch(block)
    if m is None:
        return None
    out = {}
    for line in m.group(1).split(b"\r\n")[:-1]:
        name, _, value = line.partition(b": ")
        out.setdefault(name, value)  # the first of a repeated header, as the parser
    return out if BATCH_ID in out else None


def with_commit_header(headers: bytes) -> bytes:
    """``headers`` plus ``Nats-Batch-Commit: 1`` (the last stored message of a batch
    ended by ``eob`` carries it, as on nats-server)."""
    if not headers:
        return b"NATS/1.0\r\nNats-Batch-Commit: 1\r\n\r\n"
    body = headers[:-2] if headers.endswith(b"\r\n\r\n") else headers + b"\r\n"
    return body + b"Nats-Batch-Commit: 1\r\n\r\n"


class AtomicBatches:
    """Every open atomic batch, by stream and id, with nats-server's limits.

    ``on_abandoned(batch, reason)`` hears about a batch dropped without a commit
    (``timeout``, ``large``, ``incomplete``); nobody is answered then, as on nats-server.
    """

    def __init__(
        self,
        clock: Clock,
        limits: BatchLimits | None = None,
        on_abandoned: Callable[[Batch, str], None] | None = None,
    ) -> None:
        self.clock = clock
        self.limits = limits or BatchLimits()
        self._open: dict[tuple[str, str], Batch] = {}
        self._per_stream: dict[str, int] = {}
        self.on_abandoned = on_abandoned
        # The JetStream API level the server offers (the front door sets it): a batch
        # message asking for more ends its batch, as on nats-server.
        self.api_level = 1

    def __len__(self) -> int:
        return len(self._open)

    def inflight(self, stream: str) -> int:
        return self._per_stream.get(stream, 0)

    def stage(
        self,
        stream: str,
        allow_atomic: bool,
        subject: str,
        headers: bytes,
        payload: bytes,
        fields: dict[bytes, bytes],
    ) -> Batch | None:
        """Take one batch message; raises :class:`ApiError` in nats-server's order.

        Returns None while the batch goes on (the publisher gets an empty reply), or at
        the commit the batch, holding the messages to store (a batch ended by ``eob``:
        its last one now carries ``Nats-Batch-Commit: 1``); the batch is then no longer
        open whatever its commit's outcome. An error ends the batch.
        """
        if not allow_atomic:
            raise disabled()
        raw_id = fields[BATCH_ID]
        if len(raw_id) > MAX_BATCH_ID_LEN:
            raise invalid_id()
        batch_id = raw_id.decode("utf-8", "surrogateescape")
        raw_seq = fields.get(BATCH_SEQ)
        seq = _batch_seq(raw_seq)
        if seq is None:
            raise missing_sequence()
        key = (stream, batch_id)
        batch = self._open.get(key)
        limits = self.limits
        if batch is None and seq != 1:
            if seq > limits.max_size:
                raise too_large(limits.max_size)
            raise incomplete()
        if batch is None and (
            self._per_stream.get(stream, 0) >= limits.inflight_per_stream
            or len(self._open) >= limits.inflight_total
        ):
            raise too_many_inflight()
        commit = fields.get(BATCH_COMMIT)
        try:
            if commit is not None and commit not in (b"1", b"eob"):
                raise invalid_commit()
            level = fields.get(REQUIRED_API_LEVEL)
            if level and _level_unmet(level, self.api_level):
                raise api_level_required()
            expected = len(batch) + 1 if batch is not None else 1
            if seq != expected or (commit == b"eob" and seq == 1):
                raise incomplete()
            if seq > limits.max_size:
                raise too_large(limits.max_size)
        except ApiError as exc:
            if batch is not None:
                self._close(batch)
                reason = _ABANDONED.get(exc.err_code)
                if reason:
                    self._abandoned(batch, reason)
            raise
        now = self.clock.now()
        if batch is None:
            batch = self._open[key] = Batch(stream, batch_id, raw_id=raw_id)
            self._per_stream[stream] = self._per_stream.get(stream, 0) + 1
            batch.timer = self.clock.call_later(limits.timeout_ns / 1e9, lambda: self._idle(key))
        batch.last_ns = now
        if commit == b"eob":
            self._close(batch)
            batch.headers[-1] = with_commit_header(batch.headers[-1])
            return batch
        if REQUIRED_API_LEVEL in fields:
            headers = _without(headers, REQUIRED_API_LEVEL)  # not stored, as on nats-server
        batch.add(subject, headers, payload, fields)
        if commit is not None:
            self._close(batch)
            return batch
        return None

    def stage_run(
        self,
        stream: str,
        subject: str,
        blocks: list[bytes],
        payloads: list[bytes],
        replies: list[str],
        start: int,
        max_msg_size: int,
    ) -> int:
        """:meth:`stage` for the messages from ``start`` on (all to ``subject``) that
        need nothing but to be added to their batch: a header block of only
        ``Nats-Batch-Id`` and ``Nats-Batch-Sequence`` (as publishers write them), or of
        those and a ``Nats-Msg-Id`` in any order (see :func:`batch_fields`), the next
        sequence (in plain digits) of a batch of ``stream`` already open, no commit, no
        reply, within the stream's ``max_msg_size`` (-1: none), the header size limit
        and the batch's size limit. Every check of :meth:`stage` holds for such a
        message, so it is taken without them: its block is compared with the one the
        batch's next message has as publishers write it (else read by the quick
        parser), then it is appended to the batch's lists (with its msg id as its
        fields, which the commit checks). Returns the index of the first message not
        taken, which the caller stages on its own (with every check and its error),
        then calls again for the rest."""
        n = len(blocks)
        i = start
        if i >= n:
            return i
        match = _BATCH_ONLY.fullmatch
        open_batches = self._open
        max_size = self.limits.max_size
        now = self.clock.now()
        # The current batch: the block of its next message is ``prefix``, the sequence
        # ``expected`` in ASCII digits and an empty line (what the match would read).
        batch: Batch | None = None
        with_ids = False
        raw_batch = b""
        prefix = b""
        expected = 0
        # Its lists, bound once per batch rather than looked up per message.
        subjects: list[str] = []
        headers: list[bytes] = []
        bodies: list[bytes] = []
        fields: list[dict[bytes, bytes] | None] = []
        while i < n:
            if replies[i]:
                break
            block = blocks[i]
            found: dict[bytes, bytes] | None = None
            if with_ids or not prefix or block != b"%s%d\r\n\r\n" % (prefix, expected):
                # The first message of this run, another batch's, one with a msg id or
                # a block that is not the next one as publishers write it.
                m = match(block)
                if m is not None:
                    raw_id, raw_seq, msg_id, commit = m.groups()
                else:
                    found = batch_fields(block)
                    if found is None:
                        break
                    raw_id = found[BATCH_ID]
                    raw_seq = found.get(BATCH_SEQ, b"")
                    msg_id = found.get(MSG_ID)
                    commit = found.get(BATCH_COMMIT)
                if commit is not None or len(raw_id) > MAX_BATCH_ID_LEN:
                    break
                if batch is None or raw_id != raw_batch:
                    batch = open_batches.get((stream, raw_id.decode("utf-8", "surrogateescape")))
                    if batch is None:
                        break
                    raw_batch = raw_id
                    prefix = _BATCH_PREFIX % raw_id
                    expected = len(batch) + 1
                    batch.last_ns = now
                    subjects, headers, bodies, fields = (
                        batch.subjects,
                        batch.headers,
                        batch.payloads,
                        batch.fields,
                    )
                if raw_seq != b"%d" % expected or len(block) > MAX_HEADERS_LEN:
                    break  # a gap, a repeat, a sequence spelt otherwise: with its checks
                # What the commit checks: the msg id. (A batch whose messages have
                # one goes straight to the match, not the comparison above.)
                found = None if msg_id is None else {MSG_ID: msg_id}
                with_ids = found is not None
            payload = payloads[i]
            if expected > max_size or (
                max_msg_size >= 0 and len(block) + len(payload) > max_msg_size
            ):
                break
            if found is not None and batch is not None:  # (found: batch is bound)
                batch.ids = True
            subjects.append(subject)
            headers.append(block)
            bodies.append(payload)
            fields.append(found)
            expected += 1
            i += 1
        return i

    def drop_stream(self, stream: str) -> None:
        """The stream is gone: its open batches with it."""
        for batch in [b for b in self._open.values() if b.stream == stream]:
            self._close(batch)

    def close(self) -> None:
        for batch in list(self._open.values()):
            self._close(batch)

    def _close(self, batch: Batch) -> None:
        if self._open.pop((batch.stream, batch.id), None) is None:
            return
        left = self._per_stream.get(batch.stream, 1) - 1
        if left:
            self._per_stream[batch.stream] = left
        else:
            self._per_stream.pop(batch.stream, None)
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None

    def _idle(self, key: tuple[str, str]) -> None:
        batch = self._open.get(key)
        if batch is None:
            return
        batch.timer = None
        # One timer per batch, moved on only when it fires: cheaper than re-arming it
        # for every message of a busy batch.
        left = batch.last_ns + self.limits.timeout_ns - self.clock.now()
        if left > 0:
            batch.timer = self.clock.call_later(left / 1e9, lambda: self._idle(key))
            return
        self._close(batch)
        self._abandoned(batch, "timeout")

    def _abandoned(self, batch: Batch, reason: str) -> None:
        if self.on_abandoned is not None:
            self.on_abandoned(batch, reason)


# Why a batch ended by an error is announced as abandoned (the others end silently).
_ABANDONED = {10176: "incomplete", 10199: "large", 10185: "unsupported"}
_GO_ATOI = re.compile(rb"[+-]?[0-9]+")


def _level_unmet(value: bytes, level: int) -> bool:
    """``Nats-Required-Api-Level`` as nats-server reads it: not a number, or above."""
    return _GO_ATOI.fullmatch(value) is None or int(value) > level


def _without(headers: bytes, name: bytes) -> bytes:
    lines = headers.split(b"\r\n")
    kept = [line for line in lines if line.partition(b":")[0].strip() != name]
    return b"\r\n".join(kept)


def _batch_seq(raw: bytes | None) -> int | None:
    """``Nats-Batch-Sequence`` as nats-server reads it: ASCII digits, else missing."""
    if not raw or len(raw) > 19 or not raw.isdigit():
        return None
    return int(raw)
