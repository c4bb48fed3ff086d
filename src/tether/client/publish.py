"""Publishing to streams: ``publish`` (wait for the ack) and ``publish_async`` (a window).

``publish_async`` returns a :class:`PubAckFuture`: a small object the reader resolves
in place when the ack arrives. An asyncio future is created only if somebody awaits
it, so a bulk publisher that just calls :meth:`Publisher.publish_async_completed`
pays for no futures, done-callbacks or extra loop iterations per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Protocol

import msgspec

from tether.client._mux import Decoder, ReplyTarget
from tether.client.errors import ApiError, NoStreamResponse, PublishStalled, Timeout
from tether.client.message import STATUS_NO_RESPONDERS, MsgConnection, status_of
from tether.client.models import PubAck, PubAckResponse

MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"
EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"

_pub_ack_decoder = msgspec.json.Decoder(PubAck)
_error_decoder = msgspec.json.Decoder(PubAckResponse)


def decode_pub_ack(hdr: bytes | None, data: bytes) -> PubAck:
    """The PubAck in a publish reply; raises the error it carries instead."""
    if hdr is not None and status_of(hdr) == STATUS_NO_RESPONDERS and not data:
        raise NoStreamResponse("no stream captures this subject (no responders)")
    if b'"error"' in data:
        err = _error_decoder.decode(data).error
        if err is not None:
            raise ApiError.from_response(
                {"code": err.code, "err_code": err.err_code, "description": err.description}
            )
    return _pub_ack_decoder.decode(data)


def publish_headers(
    headers: dict[str, str] | None,
    msg_id: str | None = None,
    expected_stream: str | None = None,
    expected_last_seq: int | None = None,
    expected_last_subject_seq: int | None = None,
    expected_last_msg_id: str | None = None,
) -> dict[str, str] | None:
    """Merge the deduplication and optimistic-concurrency headers into ``headers``."""
    extra = (
        (MSG_ID, msg_id),
        (EXPECTED_STREAM, expected_stream),
        (EXPECTED_LAST_SEQ, expected_last_seq),
        (EXPECTED_LAST_SUBJECT_SEQ, expected_last_subject_seq),
        (EXPECTED_LAST_MSG_ID, expected_last_msg_id),
    )
    if msg_id is None and all(v is None for _, v in extra):
        return headers
    merged = dict(headers or {})
    merged.update({k: str(v) for k, v in extra if v is not None})
    return merged


class PublishConnection(MsgConnection, Protocol):
    """What publishing needs of the connection: the muxed inbox and its reply map."""

    _loop: asyncio.AbstractEventLoop
    _resp_map: dict[str, ReplyTarget]

    def _request_to(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, target: ReplyTarget
    ) -> str: ...
    def _request_future(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        decode: Decoder | None = None,
    ) -> tuple[str, asyncio.Future[Any]]: ...


class PubAckFuture:
    """The pending ack of one ``publish_async``; ``await`` it for the :class:`PubAck`."""

    __slots__ = ("_ack", "_exc", "_fut", "_owner", "generation", "token")

    def __init__(self, owner: Publisher, generation: int) -> None:
        self._owner = owner
        self._ack: PubAck | None = None
        self._exc: BaseException | None = None
        self._fut: asyncio.Future[PubAck] | None = None
        self.generation = generation
        self.token = ""

    def done(self) -> bool:
        return self._ack is not None or self._exc is not None

    def result(self) -> PubAck:
        """The ack; raises the publish's error, or ``InvalidStateError`` while pending."""
        if self._exc is not None:
            raise self._exc
        if self._ack is None:
            raise asyncio.InvalidStateError("publish ack not received yet")
        return self._ack

    def exception(self) -> BaseException | None:
        if not self.done():
            raise asyncio.InvalidStateError("publish ack not received yet")
        return self._exc

    def __await__(self) -> Generator[Any, None, PubAck]:
        if not self.done():
            if self._fut is None:
                self._fut = asyncio.get_running_loop().create_future()
            yield from self._fut.__await__()
        return self.result()

    def _settle(self, ack: PubAck | None, exc: BaseException | None) -> None:
        if self._ack is not None or self._exc is not None:
            return
        self._ack = ack
        self._exc = exc
        self._owner._release(exc is not None)
        fut = self._fut
        if fut is not None and not fut.done():
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(ack)  # type: ignore[arg-type]

    def _on_reply(
        self, conn: MsgConnection, subject: str, reply: str, hdr: bytes | None, data: bytes
    ) -> None:
        try:
            if hdr is None and b'"error"' not in data:
                ack = _pub_ack_decoder.decode(data)
                owner = self._owner
                if self._fut is None and owner._slot_waiter is None and owner._pending > 1:
                    # The common case inline: nobody waits on this ack or for a slot.
                    if self._ack is None and self._exc is None:
                        self._ack = ack
                        owner._pending -= 1
                    return
            else:
                ack = decode_pub_ack(hdr, data)
        except Exception as exc:
            self._settle(None, exc)
        else:
            self._settle(ack, None)

    def _fail(self, exc: BaseException) -> None:
        self._settle(None, exc)


class Publisher:
    """The publishing half of :class:`~tether.client.jetstream.JetStream`."""

    conn: PublishConnection
    timeout: float

    def _init_publisher(
        self, max_pending_acks: int, backpressure: bool, publish_ack_timeout: float
    ) -> None:
        if max_pending_acks < 1:
            raise ValueError("max_pending_acks must be at least 1")
        self.max_pending_acks = max_pending_acks
        self._wake_at = max_pending_acks - max(1, max_pending_acks // 4)
        self.backpressure = backpressure
        self.publish_ack_timeout = publish_ack_timeout
        self.publish_async_failures = 0
        self._pending = 0
        self._slot_waiter: asyncio.Future[None] | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._generation = 0
        self._sweeper: asyncio.TimerHandle | None = None

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        headers: dict[str, str] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_msg_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - sent to the server as the pull expiry / API timeout
    ) -> PubAck:
        """Publish to a stream and wait for its :class:`PubAck`."""
        hdrs = publish_headers(
            headers, msg_id, expected_stream, expected_last_seq, expected_last_subject_seq,
            expected_last_msg_id,
        )  # fmt: skip
        token, fut = self.conn._request_future(subject, payload, hdrs, decode_pub_ack)
        timeout = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                ack: PubAck = await fut
                return ack
        except TimeoutError:
            raise Timeout(f"no publish ack from the stream within {timeout}s") from None
        finally:
            self.conn._resp_map.pop(token, None)

    async def publish_async(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        headers: dict[str, str] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_msg_id: str | None = None,
        wait_stall: float | None = None,
    ) -> PubAckFuture:
        """Publish without waiting for the ack; returns a :class:`PubAckFuture`.

        At most ``max_pending_acks`` publishes may await their ack; beyond that this
        waits for a slot (up to ``wait_stall`` seconds) or, without backpressure,
        raises :class:`PublishStalled` at once.
        """
        if self._pending >= self.max_pending_acks:
            await self._wait_slot(wait_stall)
        if (
            headers is not None
            or msg_id is not None
            or expected_stream is not None
            or (
                expected_last_seq is not None
                or expected_last_subject_seq is not None
                or expected_last_msg_id is not None
            )
        ):
            headers = publish_headers(
                headers, msg_id, expected_stream, expected_last_seq, expected_last_subject_seq,
                expected_last_msg_id,
            )  # fmt: skip
        conn = self.conn
        ack = PubAckFuture(self, self._generation)
        ack.token = conn._request_to(subject, payload, headers, ack)
        self._pending += 1
        if self._sweeper is None:
            self._arm_sweeper()
        if conn._out_bytes > conn.options.write_high_water or conn._paused:
            await conn._wait_writable()
        return ack

    @property
    def publish_async_pending(self) -> int:
        """Publishes still waiting for their ack."""
        return self._pending

    async def publish_async_completed(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - the NATS client API
        """Wait until every ``publish_async`` so far has its ack (or failed)."""
        if not self._pending:
            return
        fut: asyncio.Future[None] = self.conn._loop.create_future()
        self._idle_waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            raise Timeout(f"{self._pending} publishes still unacknowledged") from None

    async def _wait_slot(self, wait_stall: float | None) -> None:
        if not self.backpressure:
            raise PublishStalled(f"{self._pending} publishes await their ack")
        while self._pending >= self.max_pending_acks:
            # Every blocked publisher waits on the same future; each re-checks on wake-up.
            waiter = self._slot_waiter
            if waiter is None or waiter.done():
                waiter = self._slot_waiter = self.conn._loop.create_future()
            try:
                async with asyncio.timeout(wait_stall):
                    await asyncio.shield(waiter)
            except TimeoutError:
                raise PublishStalled(f"no ack slot within {wait_stall}s") from None
            finally:
                if self._slot_waiter is waiter and waiter.done():
                    self._slot_waiter = None  # lets acks take the fast path again

    def _release(self, failed: bool) -> None:
        self._pending -= 1
        if failed:
            self.publish_async_failures += 1
        waiter = self._slot_waiter
        # Wake the blocked publisher only once a quarter of the window is free, so it
        # publishes a batch per wake-up instead of one message per loop iteration.
        if waiter is not None and not waiter.done() and self._pending <= self._wake_at:
            waiter.set_result(None)
        if not self._pending:
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            for idle in self._idle_waiters:
                if not idle.done():
                    idle.set_result(None)
            self._idle_waiters.clear()

    def _arm_sweeper(self) -> None:
        self._sweeper = self.conn._loop.call_later(self.publish_ack_timeout / 2, self._sweep)

    def _sweep(self) -> None:
        """Fail publishes whose ack is overdue.

        One timer ticks every half ack timeout and numbers its ticks; a publish made
        during tick ``g`` fails at tick ``g + 3``, between one and one and a half ack
        timeouts later. That keeps clocks and queues out of the per-message path.
        """
        self._sweeper = None
        self._generation += 1
        expired = self._generation - 3
        resp_map = self.conn._resp_map
        for token, target in list(resp_map.items()):
            if (
                type(target) is PubAckFuture
                and target._owner is self
                and target.generation <= expired
            ):
                del resp_map[token]
                target._fail(Timeout("no publish ack within the ack timeout"))
        if self._pending:
            self._arm_sweeper()
