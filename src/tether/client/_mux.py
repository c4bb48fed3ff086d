"""Request/reply over one muxed inbox (``_INBOX.<nuid>.*``) per connection.

Each request publishes with reply subject ``<prefix><token>``; the single wildcard
subscription hands every reply to the :class:`ReplyTarget` registered for its token:
a future for :meth:`request`, or a publish-ack object for ``publish_async``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from tether.client.errors import NoResponders, Timeout
from tether.client.message import STATUS_NO_RESPONDERS, Msg, MsgConnection, status_of
from tether.client.options import Options
from tether.client.subscription import RawHandler, Subscription
from tether.protocol.nats import encode

Decoder = Callable[[bytes | None, bytes], Any]


class ReplyTarget(Protocol):
    """What a reply on the muxed inbox is handed to (a request's future, a PubAck future)."""

    def _on_reply(
        self, conn: MsgConnection, subject: str, reply: str, hdr: bytes | None, data: bytes
    ) -> None: ...
    def _fail(self, exc: BaseException) -> None: ...


class _FutureReply:
    __slots__ = ("decode", "fut")

    def __init__(self, fut: asyncio.Future[Any], decode: Decoder | None) -> None:
        self.fut = fut
        self.decode = decode

    def _on_reply(
        self, conn: MsgConnection, subject: str, reply: str, hdr: bytes | None, data: bytes
    ) -> None:
        fut = self.fut
        if fut.done():
            return
        decode = self.decode
        if decode is None:
            if hdr is not None and status_of(hdr) == STATUS_NO_RESPONDERS and not data:
                fut.set_exception(NoResponders(f"no responders for request ({subject})"))
            else:
                fut.set_result(Msg(conn, subject, reply, data, hdr))
            return
        try:
            fut.set_result(decode(hdr, data))
        except Exception as exc:
            fut.set_exception(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)
            self.fut.exception()  # retrieved: the waiter may be gone already


class RequestMux:
    """The request half of :class:`~tether.client.connection.Connection`."""

    options: Options
    _loop: asyncio.AbstractEventLoop
    _max_payload: int
    _resp_sid: str
    _resp_handler: RawHandler

    def __init__(self) -> None:
        self._resp_prefix = ""
        self._resp_prefix_b = b""
        self._resp_map: dict[str, ReplyTarget] = {}
        self._resp_seq = 0
        self._subject_bytes: dict[str, bytes] = {}

    def new_inbox(self) -> str:
        raise NotImplementedError

    def _send(self, frame: bytes) -> None:
        raise NotImplementedError

    def _subscribe_raw(self, subject: str, handler: RawHandler, queue: str = "") -> Subscription:
        raise NotImplementedError

    def _encode_publish(
        self, subject: str, payload: bytes, reply: str, headers: dict[str, str] | None
    ) -> bytes:
        raise NotImplementedError

    def _request_to(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, target: ReplyTarget
    ) -> str:
        """Publish a request whose reply goes to ``target``; returns the reply token."""
        if not self._resp_prefix:
            self._resp_prefix = self.new_inbox() + "."
            self._resp_prefix_b = self._resp_prefix.encode()
            sub = self._subscribe_raw(self._resp_prefix + "*", self._on_response)
            self._resp_sid = sub.sid
            self._resp_handler = self._on_response
        self._resp_seq += 1
        seq = self._resp_seq
        token = str(seq)
        if headers or len(payload) > self._max_payload:
            frame = self._encode_publish(subject, payload, self._resp_prefix + token, headers)
        else:
            # The hot path of publish_async: one formatting operation, subject bytes cached.
            subj = self._subject_bytes.get(subject)
            if subj is None:
                subj = encode(subject)
                if len(self._subject_bytes) > 1024:
                    self._subject_bytes.clear()
                self._subject_bytes[subject] = subj
            frame = b"PUB %s %s%d %d\r\n%s\r\n" % (
                subj,
                self._resp_prefix_b,
                seq,
                len(payload),
                payload,
            )
        self._send(frame)
        self._resp_map[token] = target
        return token

    def _request_future(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        decode: Decoder | None = None,
    ) -> tuple[str, asyncio.Future[Any]]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        return self._request_to(subject, payload, headers, _FutureReply(fut, decode)), fut

    def _on_response(self, subject: str, reply: str, hdr: bytes | None, data: bytes) -> None:
        target = self._resp_map.pop(subject[len(self._resp_prefix) :], None)
        if target is not None:
            target._on_reply(self, subject, reply, hdr, data)  # type: ignore[arg-type]

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        timeout: float = 5.0,  # noqa: ASYNC109 - sent to the server as the pull expiry / API timeout
        headers: dict[str, str] | None = None,
    ) -> Msg:
        """Publish a request and wait for the first reply."""
        token, fut = self._request_future(subject, payload, headers)
        try:
            async with asyncio.timeout(timeout):
                result: Msg = await fut
                return result
        except TimeoutError:
            raise Timeout(f"no reply from {subject!r} within {timeout}s") from None
        finally:
            self._resp_map.pop(token, None)
