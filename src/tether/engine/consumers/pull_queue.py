"""Pull requests: parsing ``CONSUMER.MSG.NEXT`` bodies, the waiting request, status blocks.

The status header blocks are byte-for-byte those nats-server sends (see the pull
consumer ADR and ``consumer.go``), because clients branch on the code and text.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from tether.engine.clock import Timer

NS = 1_000_000_000
# The priority of a request that is not JSON (a bare batch number): after all others.
NO_PRIORITY = (1 << 31) - 1

NO_MESSAGES = b"NATS/1.0 404 No Messages\r\n\r\n"
REQUESTS_PENDING = b"NATS/1.0 408 Requests Pending\r\n\r\n"
EXCEEDED_MAX_WAITING = b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n"
CONSUMER_DELETED = b"NATS/1.0 409 Consumer Deleted\r\n\r\n"
PUSH_BASED = b"NATS/1.0 409 Consumer is push based\r\n\r\n"
FLOW_CONTROL = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
_PENDING_T = b"Nats-Pending-Messages: %d\r\nNats-Pending-Bytes: %d\r\n\r\n"
_TIMEOUT_T = b"NATS/1.0 408 Request Timeout\r\n" + _PENDING_T
_MAX_BYTES_T = b"NATS/1.0 409 Message Size Exceeds MaxBytes\r\n" + _PENDING_T
_BATCH_DONE_T = b"NATS/1.0 409 Batch Completed\r\n" + _PENDING_T
_SHUTDOWN_T = b"NATS/1.0 409 Server Shutdown\r\n" + _PENDING_T
_HEARTBEAT_T = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: %d\r\nNats-Last-Stream: %d\r\n"


def request_timeout(batch: int, max_bytes: int) -> bytes:
    return _TIMEOUT_T % (batch, max_bytes)


def size_exceeds_max_bytes(batch: int, max_bytes: int) -> bytes:
    return _MAX_BYTES_T % (batch, max_bytes)


def batch_completed(batch: int, max_bytes: int) -> bytes:
    return _BATCH_DONE_T % (batch, max_bytes)


def server_shutdown(batch: int, max_bytes: int) -> bytes:
    """What a waiting request hears when the server shuts down: what it still wanted."""
    return _SHUTDOWN_T % (batch, max_bytes)


def bad_request(reason: str) -> bytes:
    return b"NATS/1.0 400 Bad Request - %s\r\n\r\n" % reason.encode()


def conflict(reason: str) -> bytes:
    return b"NATS/1.0 409 %s\r\n\r\n" % reason.encode()


def idle_heartbeat(last_consumer: int, last_stream: int, stalled: str = "") -> bytes:
    block = _HEARTBEAT_T % (last_consumer, last_stream)
    if stalled:
        block += b"Nats-Consumer-Stalled: %s\r\n" % stalled.encode()
    return block + b"\r\n"


# Go's int and time.Duration: a number beyond int64 fails the request, as in nats-server.
_Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


class NextRequest(msgspec.Struct):
    """The JSON body of ``CONSUMER.MSG.NEXT``."""

    batch: _Int64 = 0
    expires: _Int64 = 0
    no_wait: bool = False
    max_bytes: _Int64 = 0
    idle_heartbeat: _Int64 = 0
    # Priority groups (ADR-42).
    group: str = ""
    min_pending: _Int64 = 0
    min_ack_pending: _Int64 = 0
    id: str = ""
    priority: _Int64 = 0


_next_decoder = msgspec.json.Decoder(NextRequest)
# Go's strconv.Atoi: an optional sign and ASCII digits (no spaces, no underscores).
_ATOI = re.compile(rb"[+-]?[0-9]{1,19}")


class PullRequestError(Exception):
    """A malformed pull request; ``str(exc)`` is the text after ``Bad Request - ``."""


def parse_next_request(body: bytes) -> NextRequest:
    """Decode a pull request body like nats-server's ``nextReqFromMsg``.

    Empty → batch 1; ``{...}`` → JSON; a bare integer → that batch; anything else → batch 1.
    """
    text = body.strip()
    if not text:
        return NextRequest(batch=1)
    if text[:1] == b"{":
        try:
            req = _next_decoder.decode(text)
        except msgspec.ValidationError as exc:
            req = _with_nulls(text, exc)
        except msgspec.DecodeError as exc:
            raise PullRequestError(str(exc)) from None
        except RecursionError:
            raise PullRequestError("exceeded max depth") from None
        except UnicodeDecodeError:
            raise PullRequestError("invalid UTF-8") from None
        if req.idle_heartbeat > 0 and req.idle_heartbeat * 2 > req.expires:
            raise PullRequestError("heartbeat value too large")
        return req
    if _ATOI.fullmatch(text):
        batch = int(text)
        if -(1 << 63) <= batch < 1 << 63:
            return NextRequest(batch=batch)
    return NextRequest(batch=1)


def _with_nulls(text: bytes, exc: msgspec.ValidationError) -> NextRequest:
    """A body the typed decoder refused: fine after all if only ``null`` s were in the
    way (Go leaves those fields at zero); otherwise the decoder's error."""
    try:
        doc = msgspec.json.decode(text)
        if isinstance(doc, dict) and None in doc.values():
            fields = {k: v for k, v in doc.items() if v is not None}
            return msgspec.convert(fields, NextRequest)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        pass
    raise PullRequestError(str(exc)) from None


class PullRequest:
    """One waiting ``MSG.NEXT`` (or ``+NXT``) request."""

    __slots__ = (
        "batch",
        "bytes_left",
        "delivered",
        "expires_at",
        "group",
        "has_group",
        "hb_next",
        "hb_timer",
        "heartbeat",
        "max_bytes",
        "min_ack_pending",
        "min_pending",
        "no_wait",
        "pin_id",
        "priority",
        "queued",
        "reply",
        "timer",
    )

    def __init__(
        self,
        reply: str,
        batch: int,
        expires_at: int = 0,
        max_bytes: int = 0,
        no_wait: bool = False,
        heartbeat: int = 0,
    ) -> None:
        self.reply = reply
        self.batch = batch
        self.expires_at = expires_at
        self.max_bytes = max_bytes
        self.bytes_left = max_bytes
        self.no_wait = no_wait
        self.heartbeat = heartbeat
        self.hb_next = 0
        self.delivered = 0
        self.queued = False
        self.timer: Timer | None = None
        self.hb_timer: Timer | None = None
        # Priority groups: set from a JSON request (``has_group``); a bare batch number
        # has none and the lowest priority.
        self.has_group = False
        self.group = ""
        self.min_pending = 0
        self.min_ack_pending = 0
        self.pin_id = ""
        self.priority = NO_PRIORITY

    def cancel_timers(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.hb_timer is not None:
            self.hb_timer.cancel()
            self.hb_timer = None

    def __repr__(self) -> str:
        return f"PullRequest({self.reply!r}, batch={self.batch}, delivered={self.delivered})"
