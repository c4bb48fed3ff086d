"""Messages: core :class:`Msg` and JetStream :class:`JsMsg` with acks and metadata.

Headers arrive as the raw ``NATS/1.0`` block and are parsed only when asked for, so a
consumer that never looks at them pays nothing. JetStream metadata is parsed from the
ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``,
or the v2 form with domain and account hash) the first time it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tether.client.errors import MsgAlreadyAcked, NotJetStreamMessage
from tether.client.options import Options
from tether.protocol.nats import encode_pub, parse_headers

ACK = b"+ACK"
NAK = b"-NAK"
WPI = b"+WPI"
TERM = b"+TERM"

STATUS_NO_MESSAGES = 404
STATUS_REQUEST_TIMEOUT = 408
STATUS_CONFLICT = 409
STATUS_NO_RESPONDERS = 503
STATUS_CONTROL = 100


def status_of(hdr: bytes | None) -> int:
    """The status code of a header block (``NATS/1.0 404 No Messages`` → 404), else 0.

    Checked on every pulled message, so it looks at fixed offsets instead of parsing.
    """
    if hdr is None or len(hdr) < 12 or hdr[8] != 0x20:
        return 0
    code = hdr[9:12]
    return int(code) if code.isdigit() else 0


def description_of(hdr: bytes) -> str:
    """The text after the status code on the first header line."""
    end = hdr.find(b"\r\n")
    return hdr[13 : end if end >= 0 else len(hdr)].decode("utf-8", "replace").strip()


class MsgConnection(Protocol):
    """What a message needs of its connection: a way to reply and to send acks."""

    options: Options
    _out_bytes: int
    _paused: bool

    def _send(self, frame: bytes) -> None: ...
    async def _wait_writable(self) -> None: ...
    async def _publish_frame(self, frame: bytes) -> None: ...
    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None: ...
    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        timeout: float = 5.0,  # noqa: ASYNC109 - the NATS client API
        headers: dict[str, str] | None = None,
    ) -> Msg: ...


class Msg:
    """A message received on a subscription."""

    __slots__ = ("_conn", "_hdr", "_headers", "data", "reply", "subject")

    def __init__(
        self,
        conn: MsgConnection | None,
        subject: str,
        reply: str,
        data: bytes,
        hdr: bytes | None = None,
    ) -> None:
        self._conn = conn
        self.subject = subject
        self.reply = reply
        self.data = data
        self._hdr = hdr
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str] | None:
        """Headers as a dict (first value of a repeated key wins), or None without headers."""
        if self._hdr is None:
            return None
        if self._headers is None:
            parsed: dict[str, str] = {}
            for key, value in parse_headers(self._hdr).items:
                parsed.setdefault(key, value)
            self._headers = parsed
        return self._headers

    @property
    def raw_headers(self) -> bytes | None:
        """The header block exactly as received."""
        return self._hdr

    @property
    def status(self) -> int:
        """The status code of a status message (404, 408, 503, ...), 0 for a normal message."""
        return status_of(self._hdr)

    async def respond(self, data: bytes = b"", headers: dict[str, str] | None = None) -> None:
        """Publish ``data`` to this message's reply subject."""
        if not self.reply or self._conn is None:
            raise NotJetStreamMessage("message has no reply subject")
        await self._conn.publish(self.reply, data, headers=headers)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} subject={self.subject!r} reply={self.reply!r} data={self.data[:32]!r}>"


@dataclass(frozen=True, slots=True)
class MsgMetadata:
    """Delivery facts carried in a JetStream ack subject."""

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    num_pending: int
    domain: str = ""


def parse_ack_subject(reply: str) -> MsgMetadata:
    """Metadata from a v1 or v2 ack subject; :class:`NotJetStreamMessage` otherwise."""
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise NotJetStreamMessage(f"not a JetStream ack subject: {reply!r}")
    try:
        if len(tokens) == 9:
            domain = ""
            rest = tokens[2:]
        else:
            # v2: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
            domain = "" if tokens[2] == "_" else tokens[2]
            rest = tokens[4:]
        return MsgMetadata(
            stream=rest[0],
            consumer=rest[1],
            num_delivered=int(rest[2]),
            stream_seq=int(rest[3]),
            consumer_seq=int(rest[4]),
            timestamp_ns=int(rest[5]),
            num_pending=int(rest[6]),
            domain=domain,
        )
    except (IndexError, ValueError) as exc:
        raise NotJetStreamMessage(f"malformed ack subject: {reply!r}") from exc


class JsMsg(Msg):
    """A message delivered by a JetStream consumer: acknowledge it exactly once.

    ``ack``/``nak``/``term`` settle the message; ``in_progress`` may be sent any number
    of times before that to reset the server's ack timer.
    """

    __slots__ = ("_meta", "_settled")

    def __init__(
        self,
        conn: MsgConnection | None,
        subject: str,
        reply: str,
        data: bytes,
        hdr: bytes | None = None,
    ) -> None:
        # Built once per pulled message: assign every slot here rather than chain inits.
        self._conn = conn
        self.subject = subject
        self.reply = reply
        self.data = data
        self._hdr = hdr
        self._headers: dict[str, str] | None = None
        self._meta: MsgMetadata | None = None
        self._settled = False

    @property
    def metadata(self) -> MsgMetadata:
        """Stream/consumer sequences, delivery count, timestamp and pending count."""
        if self._meta is None:
            self._meta = parse_ack_subject(self.reply)
        return self._meta

    @property
    def settled(self) -> bool:
        """True once ack, nak or term was sent."""
        return self._settled

    def _settle(self) -> MsgConnection:
        if self._settled:
            raise MsgAlreadyAcked(f"message {self.reply!r} was already acknowledged")
        if self._conn is None or not self.reply:
            raise NotJetStreamMessage("message cannot be acknowledged")
        self._settled = True
        return self._conn

    async def ack(self) -> None:
        """Acknowledge: the message is processed."""
        conn = self._settle()
        conn._send(b"PUB %s 4\r\n+ACK\r\n" % self.reply.encode("utf-8", "surrogateescape"))
        if conn._out_bytes > conn.options.write_high_water or conn._paused:
            await conn._wait_writable()

    def ack_nowait(self) -> None:
        """Acknowledge without waiting for write buffer space (for tight loops)."""
        conn = self._settle()
        conn._send(b"PUB %s 4\r\n+ACK\r\n" % self.reply.encode("utf-8", "surrogateescape"))

    async def ack_sync(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 - the NATS client API
        """Acknowledge and wait until the server confirms it received the ack."""
        conn = self._settle()
        try:
            await conn.request(self.reply, ACK, timeout=timeout)
        except BaseException:
            self._settled = False  # not confirmed: let the caller retry
            raise

    async def nak(self, delay: float | None = None) -> None:
        """Negative ack: redeliver, after ``delay`` seconds if given."""
        conn = self._settle()
        payload = NAK if delay is None else b'-NAK {"delay":%d}' % int(delay * 1e9)
        await conn._publish_frame(encode_pub(self.reply, payload))

    async def in_progress(self) -> None:
        """Still working on it: reset the server's ack timer (may be repeated)."""
        if self._settled:
            raise MsgAlreadyAcked(f"message {self.reply!r} was already acknowledged")
        if self._conn is None or not self.reply:
            raise NotJetStreamMessage("message cannot be acknowledged")
        await self._conn._publish_frame(encode_pub(self.reply, WPI))

    async def term(self, reason: str = "") -> None:
        """Never redeliver this message."""
        conn = self._settle()
        payload = TERM + b" " + reason.encode() if reason else TERM
        await conn._publish_frame(encode_pub(self.reply, payload))

    def __repr__(self) -> str:
        return f"<JsMsg subject={self.subject!r} reply={self.reply!r} data={self.data[:32]!r}>"


class JsMsgView:
    """The fields of a :class:`JsMsg` (``msg``), for wrappers that settle it their own way
    (a blocking call, another thread)."""

    __slots__ = ("msg",)

    def __init__(self, msg: JsMsg) -> None:
        self.msg = msg

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self.msg.headers

    @property
    def metadata(self) -> MsgMetadata:
        return self.msg.metadata
