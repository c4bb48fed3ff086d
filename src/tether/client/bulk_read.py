"""Bulk reads of a stream in message blocks (a Tether extension).

``JetStream.read_blocks()`` reads sequences ``[start, end)`` of a stream with
``$TETHER.API.STREAM.READ.<stream>`` requests: the server answers each with
:class:`~tether.protocol.block.MessageBlock` replies (columns, about 1 MiB each) and an
end-of-batch status. The range is cut into windows of ``window`` sequences and
``ahead`` windows are requested at once, so the server is already sending the next one
while the caller works on this one; blocks still come out in sequence order.

Against a server without the extension (nats-server) the first request gets no
responders and :class:`NotSupported` is raised; read with batched ``DIRECT.GET`` or a
consumer there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import msgspec

from tether.client.errors import BadRequest, ClientError, StreamNotFound, Timeout
from tether.client.message import Msg, description_of, status_of
from tether.client.subscription import MsgCallback, Subscription
from tether.protocol.block import MessageBlock, decode_block

__all__ = ["BulkReadConnection", "NotSupported", "read_blocks"]

READ_PREFIX = "$TETHER.API.STREAM.READ."


class BulkReadConnection(Protocol):
    """What a bulk read needs of the connection: an inbox, its subscription, requests."""

    def new_inbox(self) -> str: ...
    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None: ...
    async def subscribe(
        self, subject: str, queue: str = "", *, cb: MsgCallback | None = None
    ) -> Subscription: ...


class NotSupported(ClientError):
    """The server does not offer this Tether extension (it is not Tether)."""


class _Window:
    """One request: sequences ``[lo, hi]`` and the blocks received for it so far."""

    __slots__ = ("blocks", "covered", "done", "error", "hi", "lo", "pending", "wake")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo
        self.hi = hi
        self.blocks: deque[MessageBlock] = deque()
        self.done = False
        self.covered = lo - 1
        self.pending = -1
        self.error: ClientError | None = None
        self.wake = asyncio.Event()


class _Reader:
    def __init__(
        self,
        conn: BulkReadConnection,
        stream: str,
        start: int,
        end: int,
        subjects: Sequence[str],
        headers: bool,
        window: int,
        ahead: int,
        max_bytes: int,
        block_bytes: int,
        timeout: float,
    ) -> None:
        self.conn = conn
        self.subject = READ_PREFIX + stream
        self.stream = stream
        self.next = start
        self.end = end
        self.body: dict[str, object] = {"subjects": list(subjects)} if subjects else {}
        if not headers:
            self.body["no_hdr"] = True
        self.window = window
        self.ahead = ahead
        self.max_bytes = max_bytes
        self.block_bytes = block_bytes
        self.timeout = timeout
        self.inbox = conn.new_inbox()
        self.windows: dict[str, _Window] = {}
        self.order: deque[_Window] = deque()
        self.serial = 0

    async def _request(self, lo: int, hi: int, *, first: bool = False) -> None:
        win = _Window(lo, hi)
        self.serial += 1
        reply = f"{self.inbox}.{self.serial}"
        self.windows[reply] = win
        if first:
            self.order.appendleft(win)
        else:
            self.order.append(win)
        body = {
            **self.body,
            "seq": lo,
            "up_to_seq": hi,
            "max_bytes": self.max_bytes,
            "block_bytes": self.block_bytes,
        }
        await self.conn.publish(self.subject, msgspec.json.encode(body), reply=reply)

    async def _fill(self) -> None:
        while len(self.order) < self.ahead and self.next < self.end:
            lo = self.next
            hi = min(lo + self.window, self.end) - 1
            self.next = hi + 1
            await self._request(lo, hi)

    def on_msg(self, msg: Msg) -> None:
        win = self.windows.get(msg.subject)
        if win is None or win.done:
            return
        hdr = msg.raw_headers
        if hdr is None:
            try:
                win.blocks.append(decode_block(msg.data))
            except ValueError as exc:
                win.error = ClientError(f"bulk read of {self.stream!r}: {exc}")
                win.done = True
        else:
            self._on_status(win, hdr, msg)
        win.wake.set()

    def _on_status(self, win: _Window, hdr: bytes, msg: Msg) -> None:
        code = status_of(hdr)
        win.done = True
        if code == 204:
            headers = msg.headers or {}
            win.covered = int(headers.get("Nats-Last-Sequence", win.hi))
            win.pending = int(headers.get("Nats-Num-Pending", -1))
        elif code == 503:
            win.error = NotSupported(
                "the server does not answer bulk stream reads (no responders): "
                "it is not Tether; read with DIRECT.GET batches or a consumer"
            )
        elif code == 404:
            win.error = StreamNotFound(404, 10059, f"stream {self.stream!r} not found")
        elif code == 400:
            win.error = BadRequest(400, 0, description_of(hdr))
        else:
            win.error = ClientError(
                f"bulk read of {self.stream!r} failed: {code} {description_of(hdr)}"
            )

    async def blocks(self) -> AsyncIterator[MessageBlock]:
        sub = await self.conn.subscribe(self.inbox + ".*", cb=self.on_msg)
        try:
            await self._fill()
            while self.order:
                win = self.order[0]
                while not win.blocks and not win.done:
                    win.wake.clear()
                    try:
                        await asyncio.wait_for(win.wake.wait(), self.timeout)
                    except TimeoutError:
                        raise Timeout(
                            f"no reply to a bulk read of {self.stream!r} "
                            f"(sequences {win.lo}..{win.hi}) within {self.timeout}s"
                        ) from None
                if win.blocks:
                    yield win.blocks.popleft()
                    continue
                if win.error is not None:
                    raise win.error
                self.order.popleft()
                # A window cut short by max_bytes: ask for the rest before the next one.
                if win.covered < win.hi and win.pending != 0:
                    await self._request(win.covered + 1, win.hi, first=True)
                await self._fill()
        finally:
            with contextlib.suppress(ClientError):
                await sub.unsubscribe()


def read_blocks(
    conn: BulkReadConnection,
    stream: str,
    start: int,
    end: int,
    *,
    subjects: Sequence[str] = (),
    headers: bool = True,
    window: int = 50_000,
    ahead: int = 2,
    max_bytes: int = 16 * 1024 * 1024,
    block_bytes: int = 1024 * 1024,
    timeout: float = 5.0,
) -> AsyncIterator[MessageBlock]:
    """Blocks of sequences ``[start, end)`` in order (see the module docstring)."""
    if start < 1 or end < start:
        raise ValueError(f"bad range [{start}, {end})")
    if window < 1 or ahead < 1 or max_bytes < 1 or block_bytes < 1:
        raise ValueError("window, ahead, max_bytes and block_bytes must be positive")
    reader = _Reader(
        conn, stream, start, end, subjects, headers, window, ahead, max_bytes, block_bytes, timeout
    )
    return reader.blocks()
