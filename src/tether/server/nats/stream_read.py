"""Bulk stream reads: ``$TETHER.API.STREAM.READ.<stream>``, a Tether extension.

A batched ``DIRECT.GET`` answers with one NATS message per stored message, each with
six ``Nats-*`` headers; for analytics (the Spark connector reads whole streams) that
framing, not the data, is the cost. This request answers with **message blocks**
(:mod:`tether.protocol.block`): each reply holds up to ``block_bytes`` of messages as
columns, and an end-of-batch status closes the request, as ``DIRECT.GET`` does::

    PUB $TETHER.API.STREAM.READ.ORDERS _INBOX.x 42
    {"seq": 1, "up_to_seq": 100000, "max_bytes": 8388608, "subjects": ["orders.eu.>"]}

    MSG _INBOX.x 1 1048612        <- a block (plain payload, no headers)
    ...
    HMSG _INBOX.x 1 76 76         <- NATS/1.0 204 EOB
                                     Nats-Num-Pending: 0
                                     Nats-Last-Sequence: 100000

Request fields (all optional): ``seq`` first sequence, ``up_to_seq`` last one
(inclusive), ``batch`` most messages, ``max_bytes`` most bytes in all (default 8 MiB,
at most 64 MiB; the block that reaches it is the last one), ``block_bytes`` about how
many bytes per block (default 1 MiB), ``subjects`` filters (any match), ``no_hdr`` leave the stored
headers out. ``Nats-Last-Sequence`` is the last sequence the reply covers (the next
request starts after it) and ``Nats-Num-Pending`` how many matching messages follow.
Errors are statuses: ``400 Bad Request: <why>``, ``404 Stream Not Found``. On a
server without this extension (nats-server) the request gets ``503`` no responders.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import msgspec

from tether.engine.subjects import is_valid_filter
from tether.protocol.block import encode_block
from tether.server.nats.requests import BodyError, Int, decode_as
from tether.storage.base import MessageColumns, Sizing, subject_size

if TYPE_CHECKING:
    from tether.engine.broker import Broker
    from tether.engine.streams import Stream
    from tether.server.nats.router import Router
from tether.server.nats.subscriptions import InternalSubscription

READ_PREFIX = "$TETHER.API.STREAM.READ."
MiB = 1024 * 1024
DEFAULT_MAX_BYTES = 8 * MiB
LIMIT_MAX_BYTES = 64 * MiB  # what one connection may be owed before it is a slow consumer
DEFAULT_BLOCK_BYTES = MiB
MAX_BLOCK_ROWS = 65_536


class ReadRequest(msgspec.Struct, forbid_unknown_fields=True):
    seq: Int = 0
    up_to_seq: Int = 0
    batch: Int = 0
    max_bytes: Int = 0
    block_bytes: Int = 0
    subjects: list[str] = msgspec.field(default_factory=list)
    no_hdr: bool = False


class BadReadRequest(Exception):
    """A read request that cannot be served as asked (answered with a 400 status)."""


def parse_request(payload: bytes) -> ReadRequest:
    """The request body (empty means "everything from the start"), validated."""
    if not payload.strip():
        return ReadRequest()
    try:
        req = decode_as(payload, ReadRequest)
    except BodyError as exc:
        raise BadReadRequest(str(exc)) from None
    for field in ("seq", "up_to_seq", "batch", "max_bytes", "block_bytes"):
        if getattr(req, field) < 0:
            raise BadReadRequest(f"{field} must not be negative")
    for field in ("max_bytes", "block_bytes"):
        if getattr(req, field) > LIMIT_MAX_BYTES:
            raise BadReadRequest(f"{field} must be at most {LIMIT_MAX_BYTES}")
    for subject in req.subjects:
        if not is_valid_filter(subject):
            raise BadReadRequest(f"invalid subject filter {subject!r}")
    return req


class StreamReadApi:
    """Answers bulk reads for every stream; one internal subscription."""

    def __init__(self, router: Router, broker: Broker) -> None:
        self.router = router
        self.broker = broker
        self._sub: InternalSubscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # One store read at a time: a SQLite read builds its rows holding the GIL and
        # drops it around every row's step, so two readers in parallel only hand the GIL
        # back and forth (measured: ~30% more server CPU per row, no more rows/s).
        self._reading = asyncio.Lock()

    def start(self) -> None:
        self._sub = self.router.subscribe_internal(READ_PREFIX + "*", self._on_request)

    async def stop(self) -> None:
        if self._sub is not None:
            self.router.unsubscribe_internal(self._sub)
            self._sub = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_request(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        if not reply:
            return
        task = asyncio.ensure_future(self._serve(subject[len(READ_PREFIX) :], reply, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _status(self, reply: str, block: bytes) -> None:
        self.router.publish(None, reply, "", block, b"")

    async def _serve(self, name: str, reply: str, payload: bytes) -> None:
        try:
            req = parse_request(payload)
        except BadReadRequest as exc:
            why = str(exc).replace("\r", " ").replace("\n", " ")
            self._status(reply, b"NATS/1.0 400 Bad Request: %s\r\n\r\n" % why.encode())
            return
        stream = self.broker.streams.get(name)
        if stream is None:
            self._status(reply, b"NATS/1.0 404 Stream Not Found\r\n\r\n")
            return
        try:
            covered = await self._send_blocks(stream, reply, req)
        except Exception as exc:  # a storage failure: tell the reader, keep serving
            with contextlib.suppress(Exception):
                why = f"{type(exc).__name__}: {exc}".replace("\r", " ").replace("\n", " ")
                self._status(reply, b"NATS/1.0 500 Read Failed: %s\r\n\r\n" % why.encode())
            return
        filters = tuple(req.subjects)
        pending = stream.count_matching(covered + 1, filters) if covered < stream.last_seq else 0
        self._status(
            reply,
            b"NATS/1.0 204 EOB\r\nNats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n\r\n"
            % (pending, covered),
        )

    async def _send_blocks(self, stream: Stream, reply: str, req: ReadRequest) -> int:
        """Send the blocks; the last sequence covered (everything up to it was sent)."""
        start = max(req.seq, stream.first_seq, 1)
        covered = start - 1
        remaining = req.batch or 1 << 62
        budget = req.max_bytes or DEFAULT_MAX_BYTES
        block_bytes = req.block_bytes or DEFAULT_BLOCK_BYTES
        filters = tuple(req.subjects)
        while remaining > 0 and budget > 0:
            last = min(req.up_to_seq or stream.last_seq, stream.last_seq)
            if covered >= last:
                break
            want = min(remaining, last - covered, MAX_BLOCK_ROWS)
            limit_bytes = min(block_bytes, budget)
            cols: MessageColumns
            if filters:
                seqs, scanned = _select(stream, covered + 1, last, want, limit_bytes, filters)
                cols = MessageColumns.of(await self.broker.read_many(stream, seqs))
            else:
                # Columns, not message objects, straight from the store; a block holds
                # about ``block_bytes`` by the stream's average message size.
                state = stream.state
                average = max(1, state.bytes // max(1, state.msgs))
                count = max(1, min(want, limit_bytes // average))
                async with self._reading:
                    cols = await self.broker.read_columns(stream, covered + 1, last, count)
                scanned = cols.seqs[-1] if len(cols.seqs) == count else last
            covered = max(covered, scanned)
            if cols.seqs:
                budget -= self._send_block(reply, cols, not req.no_hdr, stream.sizing)
                remaining -= len(cols.seqs)
                await asyncio.sleep(0)  # let the connection flush between blocks
        return covered

    def _send_block(
        self, reply: str, cols: MessageColumns, with_headers: bool, sizing: Sizing
    ) -> int:
        """Publish one block; returns its size as its stream counts bytes."""
        seqs, subjects, headers, data, stamps = cols
        payload = encode_block(seqs, stamps, subjects, headers if with_headers else None, data)
        self.router.publish(None, reply, "", None, payload)
        overheads = sum(map(sizing.overhead, headers))
        subject_bytes = sum(map(subject_size, subjects))
        return subject_bytes + sum(map(len, headers)) + sum(map(len, data)) + overheads


def _select(
    stream: Stream, start: int, last: int, want: int, max_bytes: int, filters: tuple[str, ...]
) -> tuple[list[int], int]:
    """Matching live sequences in ``[start, last]`` for one block, and the last sequence
    the selection accounts for (every matching one up to it is selected)."""
    seqs: list[int] = []
    size = 0
    for seq in stream.seqs_matching(start, filters):
        if seq > last:
            break
        meta = stream.meta(seq)
        if meta is None:
            continue
        if seqs and size + meta.size > max_bytes:
            return seqs, seqs[-1]
        seqs.append(seq)
        size += meta.size
        if len(seqs) >= want:
            return seqs, seq
    return seqs, last
