"""An incremental parser for the NATS text protocol, for both directions.

Bytes are fed as they arrive from a socket: a frame may be split across reads at any
byte and one read may hold many frames. Each complete frame is reported to a handler
by calling one method on it, so the hot path allocates no frame objects. Any input
yields either handler calls or a :class:`ProtocolError`, never another exception.

What counts as an error, and which error, follows nats-server's own parser:

- an operation it does not know (checked as soon as the first bytes of a line arrive,
  so a peer cannot make us buffer garbage) is ``Unknown Protocol Operation``;
- malformed arguments of a known operation (a missing or non-numeric size, the wrong
  number of arguments) close the connection silently (``ProtocolError.silent``);
- keywords are case-insensitive; ``PING``, ``PONG`` and ``+OK`` ignore anything after
  the keyword up to the end of the line, ``CONNECT`` and ``INFO`` need no space before
  their JSON, the other operations need a space or tab after the keyword;
- ``max_control_line`` bounds the arguments of an operation (the keyword excluded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tether.protocol.nats.errors import (
    MAX_CONTROL_LINE,
    MAX_PAYLOAD,
    UNKNOWN_OPERATION,
    ProtocolError,
    bad_arguments,
)

DEFAULT_MAX_CONTROL_LINE = 4096
DEFAULT_MAX_PAYLOAD = 1024 * 1024

# nats-server parses at most 9 digits of a size; anything longer is a malformed size.
_MAX_SIZE = 999_999_999


def decode(raw: bytes) -> str:
    """Subjects and sids are bytes on the wire; keep any byte sequence round-trippable."""
    return raw.decode("utf-8", "surrogateescape")


class Handler(Protocol):
    """Receives parsed frames. A server implements the client-side ops, a client the rest;
    an op a side never expects should raise ``ProtocolError(UNKNOWN_OPERATION)``."""

    def on_connect(self, options: bytes) -> None: ...
    def on_pub(self, subject: str, reply: str, payload: bytes) -> None: ...
    def on_hpub(self, subject: str, reply: str, headers: bytes, payload: bytes) -> None: ...
    def on_sub(self, subject: str, queue: str, sid: str) -> None: ...
    def on_unsub(self, sid: str, max_msgs: int) -> None: ...
    def on_ping(self) -> None: ...
    def on_pong(self) -> None: ...
    def on_info(self, info: bytes) -> None: ...
    def on_msg(self, subject: str, sid: str, reply: str, payload: bytes) -> None: ...
    def on_hmsg(
        self, subject: str, sid: str, reply: str, headers: bytes, payload: bytes
    ) -> None: ...
    def on_ok(self) -> None: ...
    def on_err(self, message: str) -> None: ...


class RunHandler(Handler, Protocol):
    """A handler that also takes consecutive PUBs to one subject, without headers,
    in one call: the same as ``on_pub`` for each, in order. The parser uses it when
    the handler has it, for PUBs it predicts in one read (see ``Parser._reply_run``)."""

    def on_pub_run(self, subject: str, replies: list[str], payloads: list[bytes]) -> None: ...


class BatchHandler(Handler, Protocol):
    """A handler that also takes consecutive PUBs without headers, each to its own
    subject, in one call: the same as ``on_pub`` for each, in order. The parser uses it
    when the handler has it, for acks (``PUB $JS.ACK.…``) it finds in one read: the one
    high-rate kind of PUB whose subject changes with every message."""

    def on_pub_batch(
        self, subjects: list[str], replies: list[str], payloads: list[bytes]
    ) -> None: ...


class HeaderedRunHandler(Handler, Protocol):
    """A handler that also takes consecutive HPUBs to one subject in one call: the
    same as ``on_hpub`` for each, in order. The parser uses it when the handler has it,
    for the complete HPUB frames it finds in one read (see ``Parser._hpub_run``)."""

    def on_hpub_run(
        self, subject: str, replies: list[str], headers: list[bytes], payloads: list[bytes]
    ) -> None: ...


# The start of an HPUB line as publishers write it (see Parser._hpub_run).
_HPUB_LINE = b"HPUB "

# The start of an ack's PUB line (see Parser._ack_run).
_ACK_PUB = b"PUB $JS.ACK."
_ACK_PUB_LEN = len(_ACK_PUB)

# Payload kinds awaiting their bytes.
_PUB, _HPUB, _MSG, _HMSG = 1, 2, 3, 4

# Operation codes, looked up by keyword (upper or lower case) in one dict probe.
_OP_PUB, _OP_HPUB, _OP_SUB, _OP_UNSUB, _OP_MSG, _OP_HMSG = 1, 2, 3, 4, 5, 6
_OP_PING, _OP_PONG, _OP_OK, _OP_ERR, _OP_CONNECT, _OP_INFO = 7, 8, 9, 10, 11, 12

_KEYWORDS: dict[bytes, int] = {
    b"PUB": _OP_PUB,
    b"HPUB": _OP_HPUB,
    b"SUB": _OP_SUB,
    b"UNSUB": _OP_UNSUB,
    b"MSG": _OP_MSG,
    b"HMSG": _OP_HMSG,
    b"PING": _OP_PING,
    b"PONG": _OP_PONG,
    b"+OK": _OP_OK,
    b"-ERR": _OP_ERR,
    b"CONNECT": _OP_CONNECT,
    b"INFO": _OP_INFO,
}
_OPS = {**_KEYWORDS, **{k.lower(): v for k, v in _KEYWORDS.items()}}

# Keywords that take no arguments: the rest of their line is ignored.
_NO_ARGS = frozenset((_OP_PING, _OP_PONG, _OP_OK))
# Keywords whose argument may follow without a separator.
_NO_SEPARATOR = frozenset((_OP_PING, _OP_PONG, _OP_OK, _OP_CONNECT, _OP_INFO))
_SEPARATORS = (0x20, 0x09)


# Sizes seen recently, so the hot path skips int() (slow on bytes); bounded.
_SIZES: dict[bytes, int] = {}
_SIZES_MAX = 4096


def _size(raw: bytes) -> int:
    size = _SIZES.get(raw)
    if size is not None:
        return size
    # int() accepts "+5", " 5" and "5_0"; the protocol allows only plain digits.
    if not raw.isdigit():
        raise bad_arguments("bad or missing size")
    size = int(raw)
    if len(_SIZES) < _SIZES_MAX:
        _SIZES[raw] = size
    return size


def _too_big(size: int) -> ProtocolError:
    if size > _MAX_SIZE:
        return bad_arguments("size out of range")
    return ProtocolError(MAX_PAYLOAD)


def _classify(head: bytes, complete: bool, server_side: bool) -> tuple[bytes, int] | None:
    """Which keyword a line starts with, as nats-server's state machine reads it.

    ``head`` is the start of the line, upper-cased (8 bytes are enough). For an
    incomplete line, ``(b"", 0)`` means "could still become a valid operation".
    Returns None when the bytes cannot start any operation.
    """
    for keyword, op in _KEYWORDS.items():
        if server_side and op in (_OP_MSG, _OP_HMSG):
            continue  # a client may not send these
        k = len(keyword)
        if len(head) < k:
            if not complete and keyword.startswith(head):
                return b"", 0
            continue
        if not head.startswith(keyword):
            continue
        if op in _NO_SEPARATOR:
            return keyword, op
        if len(head) > k and head[k] in _SEPARATORS:
            return keyword, op
        if len(head) == k and not complete:
            return b"", 0
    return None


def _arg_length(line: bytes, keyword: bytes) -> int:
    """Length of an op's arguments: after the keyword and its separators, without a CR."""
    start = len(keyword)
    end = len(line)
    while start < end and line[start] in _SEPARATORS:
        start += 1
    if end > start and line[end - 1] == 0x0D:
        end -= 1
    return end - start


def _arguments_error(line: bytes, op: bytes) -> ProtocolError:
    """A known op with the wrong number of arguments."""
    if len(line) == len(op):
        # No separator after the keyword at all: nats-server's state machine fails there.
        return ProtocolError(UNKNOWN_OPERATION)
    return bad_arguments("wrong number of arguments")


class Parser:
    """Incremental NATS protocol parser.

    ``max_payload`` bounds the size a PUB/HPUB/MSG/HMSG may declare (checked before
    the payload is buffered, so a peer cannot make us hold more than that);
    ``max_control_line`` bounds an op's arguments. ``server_side`` rejects the ops
    only a server sends (MSG, HMSG) as soon as their line arrives.
    """

    __slots__ = (
        "_args",
        "_buf",
        "_dead",
        "_handler",
        "_hsize",
        "_kind",
        "_need",
        "_on_hpub_run",
        "_on_pub_batch",
        "_on_pub_run",
        "_pub_lines",
        "_subjects",
        "max_control_line",
        "max_payload",
        "server_side",
    )

    def __init__(
        self,
        handler: Handler,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        server_side: bool = False,
    ) -> None:
        self._handler = handler
        # A handler may take runs of PUBs to one subject in one call (see RunHandler).
        self._on_pub_run: Callable[[str, list[str], list[bytes]], None] | None = getattr(
            handler, "on_pub_run", None
        )
        # ... and runs of acks, each to its own subject (see BatchHandler).
        self._on_pub_batch: Callable[[list[str], list[str], list[bytes]], None] | None = getattr(
            handler, "on_pub_batch", None
        )
        # ... and runs of HPUBs to one subject (see HeaderedRunHandler).
        self._on_hpub_run: Callable[[str, list[str], list[bytes], list[bytes]], None] | None = (
            getattr(handler, "on_hpub_run", None)
        )
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self.server_side = server_side
        self._buf = bytearray()
        self._kind = 0  # payload kind being awaited, 0 when awaiting an op line
        self._need = 0  # payload size + CRLF
        self._hsize = 0
        self._args: tuple[str, str, str] = ("", "", "")
        self._dead = False
        self._pub_lines: dict[bytes, tuple[str, str, int, bytes]] = {}
        # Subjects of recent PUB lines, decoded once (the same str each time).
        self._subjects: dict[bytes, str] = {}

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Parse ``data``; calls the handler for every complete frame.

        Raises :class:`ProtocolError` on the first violation; the parser is unusable
        afterwards (the caller closes the connection).
        """
        if self._dead:
            raise ProtocolError(UNKNOWN_OPERATION)
        if self._buf:
            self._buf += data
            if self._kind and len(self._buf) < self._need:
                # Still waiting for a payload: do not rescan, but fail as soon as the
                # byte after it is there and is not the CR it must be.
                if len(self._buf) == self._need - 1 and self._buf[-1] != 13:
                    self._dead = True
                    raise ProtocolError(UNKNOWN_OPERATION)
                return
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = data
        try:
            pos = self._parse(buf)
        except ProtocolError:
            self._dead = True
            raise
        except BaseException:
            # A handler failed mid-buffer: the bytes after its frame are lost, so the
            # stream cannot be resumed. Re-raise the handler's own error unchanged (the
            # property tests prove the parser itself raises nothing but ProtocolError).
            self._dead = True
            raise
        if pos < len(buf):
            self._buf += buf[pos:] if pos else buf

    def _parse(self, buf: bytes) -> int:
        h = self._handler
        n = len(buf)
        pos = 0
        max_line = self.max_control_line
        pub_lines = self._pub_lines
        subjects = self._subjects
        while pos < n:
            kind = self._kind
            if kind:
                end = pos + self._need
                if end > n:
                    if end - 1 == n and buf[n - 1] != 13:
                        raise ProtocolError(UNKNOWN_OPERATION)
                    return pos
                if buf[end - 2 : end] != b"\r\n":
                    raise ProtocolError(UNKNOWN_OPERATION)
                subject, second, third = self._args
                self._kind = 0
                if kind == _PUB:
                    h.on_pub(subject, second, buf[pos : end - 2])
                elif kind == _MSG:
                    h.on_msg(subject, second, third, buf[pos : end - 2])
                else:
                    split = pos + self._hsize
                    if kind == _HPUB:
                        h.on_hpub(subject, second, buf[pos:split], buf[split : end - 2])
                    else:
                        h.on_hmsg(subject, second, third, buf[pos:split], buf[split : end - 2])
                pos = end
                continue

            nl = buf.find(b"\n", pos)
            if nl < 0:
                return self._partial(buf, pos)
            line = buf[pos : nl - 1] if nl > pos and buf[nl - 1] == 13 else buf[pos:nl]
            if nl - pos > max_line:
                self._check_long_line(line)
            if line.startswith(_ACK_PUB) and self._on_pub_batch is not None:
                after = self._ack_run(buf, pos)
                if after > pos:
                    pos = after
                    continue
            if line.startswith(_HPUB_LINE) and self._on_hpub_run is not None:
                after = self._hpub_run(buf, pos)
                if after > pos:
                    pos = after
                    continue
            pos = nl + 1
            hit = pub_lines.get(line)
            if hit is not None:
                # A PUB line seen before on this connection: no split, no decode.
                subject, reply, size, head = hit
                end = pos + size + 2
                if end > n:
                    if end - 1 == n and buf[n - 1] != 13:
                        raise ProtocolError(UNKNOWN_OPERATION)
                    self._kind = _PUB
                    self._need = size + 2
                    self._args = (subject, reply, "")
                    return pos
                if buf[end - 2] != 13 or buf[end - 1] != 10:
                    raise ProtocolError(UNKNOWN_OPERATION)
                h.on_pub(subject, reply, buf[pos : end - 2])
                pos = end
                # A run of the same PUB line (one publisher, one subject, one size): the
                # next line is predicted, so no find, no slice, no lookup.
                hl = len(head)
                while buf.startswith(head, pos):
                    start = pos + hl
                    end = start + size + 2
                    if end > n:
                        break  # the general path above records the partial frame
                    if buf[end - 2] != 13 or buf[end - 1] != 10:
                        raise ProtocolError(UNKNOWN_OPERATION)
                    h.on_pub(subject, reply, buf[start : end - 2])
                    pos = end
                continue
            parts = line.split()
            if not parts:
                raise ProtocolError(UNKNOWN_OPERATION)
            if parts[0] == b"PUB" and line[0] == 80:
                # The hot path inlined: a PUB, usually with its payload already at hand.
                argc = len(parts)
                if argc == 3:
                    reply = ""
                elif argc == 4:
                    reply = parts[2].decode("utf-8", "surrogateescape")  # decode(), inlined
                else:
                    raise _arguments_error(line, parts[0])
                raw = parts[argc - 1]
                known = _SIZES.get(raw)
                size = _size(raw) if known is None else known
                if size > self.max_payload:
                    raise _too_big(size)
                raw_subject = parts[1]
                known_subject = subjects.get(raw_subject)
                if known_subject is None:
                    if len(subjects) >= 256:
                        subjects.clear()
                    known_subject = subjects[raw_subject] = decode(raw_subject)
                subject = known_subject
                if argc == 3:
                    # Only lines without a reply are worth remembering whole: a reply is
                    # usually a fresh inbox per request, so such a line never comes back.
                    if len(pub_lines) >= 256:
                        pub_lines.clear()
                    pub_lines[line] = (subject, reply, size, line + b"\r\n")
                end = pos + size + 2
                if end > n:
                    if end - 1 == n and buf[n - 1] != 13:
                        raise ProtocolError(UNKNOWN_OPERATION)
                    self._kind = _PUB
                    self._need = size + 2
                    self._args = (subject, reply, "")
                    return pos
                if buf[end - 2 : end] != b"\r\n":
                    raise ProtocolError(UNKNOWN_OPERATION)
                h.on_pub(subject, reply, buf[pos : end - 2])
                pos = end
                if argc == 4:
                    pos = self._reply_run(buf, pos, raw_subject, raw, subject, size)
                continue
            self._op(line, parts, h)
        return pos

    def _reply_run(
        self, buf: bytes, pos: int, raw_subject: bytes, raw_size: bytes, subject: str, size: int
    ) -> int:
        """PUBs like the one just parsed but for their reply, from ``pos``: a publisher
        awaiting an ack per message (a fresh inbox each). Such lines are predicted
        around the reply, which is all that is split and decoded; a line that is not
        exactly that, or a frame that is not complete, is left to the general path.
        Returns the position after the last frame handled."""
        head = b"PUB " + raw_subject + b" "
        tail = b" " + raw_size + b"\r"
        hl = len(head)
        tl = len(tail)
        n = len(buf)
        max_line = self.max_control_line
        on_pub = self._handler.on_pub
        on_pub_run = self._on_pub_run
        replies: list[str] = []
        payloads: list[bytes] = []
        startswith = buf.startswith
        while startswith(head, pos):
            nl = buf.find(b"\n", pos + hl)
            if nl < 0 or nl - pos > max_line or not buf.endswith(tail, pos, nl):
                break
            # What the general path's split would make of it: exactly one reply token.
            reply_parts = buf[pos + hl : nl - tl].split()
            if len(reply_parts) != 1:
                break
            start = nl + 1
            end = start + size + 2
            if end > n:
                break
            if buf[end - 2] != 13 or buf[end - 1] != 10:
                if payloads and on_pub_run is not None:
                    on_pub_run(subject, replies, payloads)  # the frames before the error
                raise ProtocolError(UNKNOWN_OPERATION)
            reply = reply_parts[0].decode("utf-8", "surrogateescape")
            if on_pub_run is None:
                on_pub(subject, reply, buf[start : end - 2])
            else:
                replies.append(reply)
                payloads.append(buf[start : end - 2])
            pos = end
        if payloads and on_pub_run is not None:
            on_pub_run(subject, replies, payloads)
        return pos

    def _ack_run(self, buf: bytes, pos: int) -> int:
        """Complete ``PUB $JS.ACK.… [reply] <size>`` frames from ``pos`` (the start of a
        line), handed to ``on_pub_batch`` in one call. Only lines the general path would
        take as they are (CRLF, plain size within the limit) are handled; anything else
        is left to it. Returns the position after the last frame handled."""
        on_pub_batch = self._on_pub_batch
        assert on_pub_batch is not None
        n = len(buf)
        max_line = self.max_control_line
        max_payload = self.max_payload
        sizes = _SIZES
        subjects: list[str] = []
        replies: list[str] = []
        payloads: list[bytes] = []
        startswith = buf.startswith
        find = buf.find
        while startswith(_ACK_PUB, pos):
            nl = find(b"\n", pos + _ACK_PUB_LEN)
            if nl < 0 or nl - pos > max_line or buf[nl - 1] != 13:
                break
            parts = buf[pos + 4 : nl - 1].split()
            argc = len(parts)
            if argc == 2:
                reply = ""
            elif argc == 3:
                reply = parts[1].decode("utf-8", "surrogateescape")
            else:
                break
            raw = parts[argc - 1]
            size = sizes.get(raw)
            if size is None:
                if not raw.isdigit() or len(raw) > 9:
                    break
                size = int(raw)
            if size > max_payload:
                break
            start = nl + 1
            end = start + size + 2
            if end > n:
                break
            if buf[end - 2] != 13 or buf[end - 1] != 10:
                if payloads:
                    on_pub_batch(subjects, replies, payloads)  # the frames before the error
                raise ProtocolError(UNKNOWN_OPERATION)
            subjects.append(parts[0].decode("utf-8", "surrogateescape"))
            replies.append(reply)
            payloads.append(buf[start : end - 2])
            pos = end
        if payloads:
            on_pub_batch(subjects, replies, payloads)
        return pos

    def _hpub_run(self, buf: bytes, pos: int) -> int:
        """Complete ``HPUB <subject> [reply] <hsize> <size>`` frames from ``pos`` (the
        start of a line), all to the subject of the first, handed to ``on_hpub_run`` in
        one call (a single frame to ``on_hpub``). Only lines the general path would take
        as they are (CRLF, plain sizes within the limits) are handled; anything else is
        left to it. Returns the position after the last frame handled."""
        on_hpub_run = self._on_hpub_run
        assert on_hpub_run is not None
        n = len(buf)
        max_line = self.max_control_line
        max_payload = self.max_payload
        sizes = _SIZES
        head = _HPUB_LINE
        raw_subject = b""
        replies: list[str] = []
        blocks: list[bytes] = []
        payloads: list[bytes] = []
        # The end of the last line, `` <hsize> <size>\r``: a publisher's lines usually
        # differ only by their reply (if at all), so the next is predicted around it.
        tail = b""
        hl = tl = hsize = size = 0
        startswith = buf.startswith
        find = buf.find
        while startswith(head, pos):
            nl = find(b"\n", pos + 5)
            if nl < 0 or nl - pos > max_line or buf[nl - 1] != 13:
                break
            if tail and buf.endswith(tail, pos, nl):
                # What the split below would make of it: no reply (the subject's blank
                # is the tail's, as in the messages of an atomic batch), or exactly one
                # reply token.
                if nl - tl == pos + hl - 1:
                    reply: str | None = ""
                else:
                    reply_parts = buf[pos + hl : nl - tl].split()
                    reply = (
                        reply_parts[0].decode("utf-8", "surrogateescape")
                        if len(reply_parts) == 1
                        else None
                    )
                if reply is not None:
                    start = nl + 1
                    end = start + size + 2
                    if end > n:
                        break
                    if buf[end - 2] != 13 or buf[end - 1] != 10:
                        if payloads:  # the frames before the error
                            self._hpub_done(raw_subject, replies, blocks, payloads)
                        raise ProtocolError(UNKNOWN_OPERATION)
                    split = start + hsize
                    replies.append(reply)
                    blocks.append(buf[start:split])
                    payloads.append(buf[split : end - 2])
                    pos = end
                    continue
            parts = buf[pos + 5 : nl - 1].split()
            argc = len(parts)
            if argc == 3:
                reply = ""
            elif argc == 4:
                reply = parts[1].decode("utf-8", "surrogateescape")
            else:
                break
            if not raw_subject:
                # The subject of the run: later lines must start with exactly this.
                raw_subject = parts[0]
                head = _HPUB_LINE + raw_subject + b" "
                hl = len(head)
            raw_h = parts[argc - 2]
            known = sizes.get(raw_h)
            if known is None:
                if not raw_h.isdigit() or len(raw_h) > 9:
                    break
                known = int(raw_h)
                if len(sizes) < _SIZES_MAX:
                    sizes[raw_h] = known
            hsize = known
            raw = parts[argc - 1]
            known = sizes.get(raw)
            if known is None:
                if not raw.isdigit() or len(raw) > 9:
                    break
                known = int(raw)
                if len(sizes) < _SIZES_MAX:
                    sizes[raw] = known
            size = known
            if size > max_payload or hsize > size:
                break
            tail = b" %s %s\r" % (raw_h, raw)
            tl = len(tail)
            start = nl + 1
            end = start + size + 2
            if end > n:
                break
            if buf[end - 2] != 13 or buf[end - 1] != 10:
                if payloads:  # the frames before the error
                    self._hpub_done(raw_subject, replies, blocks, payloads)
                raise ProtocolError(UNKNOWN_OPERATION)
            split = start + hsize
            replies.append(reply)
            blocks.append(buf[start:split])
            payloads.append(buf[split : end - 2])
            pos = end
        if payloads:
            self._hpub_done(raw_subject, replies, blocks, payloads)
        return pos

    def _hpub_done(
        self, raw_subject: bytes, replies: list[str], blocks: list[bytes], payloads: list[bytes]
    ) -> None:
        subject = decode(raw_subject)
        if len(payloads) == 1:
            self._handler.on_hpub(subject, replies[0], blocks[0], payloads[0])
            return
        on_hpub_run = self._on_hpub_run
        assert on_hpub_run is not None
        on_hpub_run(subject, replies, blocks, payloads)

    def _partial(self, buf: bytes, pos: int) -> int:
        """A line without its newline yet: fail now if it cannot become a valid op."""
        found = _classify(buf[pos : pos + 8].upper(), False, self.server_side)
        if found is None:
            raise ProtocolError(UNKNOWN_OPERATION)
        keyword, op = found
        if len(buf) - pos > self.max_control_line and keyword:
            if op in _NO_ARGS:
                # nats-server skips the rest of such a line without holding it.
                self._buf += buf[pos : pos + len(keyword)]
                return len(buf)
            if _arg_length(buf[pos:], keyword) > self.max_control_line:
                raise ProtocolError(MAX_CONTROL_LINE)
        return pos

    def _check_long_line(self, line: bytes) -> None:
        """A complete line longer than the limit: is it the arguments that are too long?"""
        found = _classify(line[:8].upper(), True, self.server_side) if line[:1] > b" " else None
        if found is None:
            raise ProtocolError(UNKNOWN_OPERATION)
        keyword, op = found
        if op not in _NO_ARGS and _arg_length(line, keyword) > self.max_control_line:
            raise ProtocolError(MAX_CONTROL_LINE)

    def _op(self, line: bytes, parts: list[bytes], h: Handler) -> None:
        op = _OPS.get(parts[0], 0)
        if not op or line[0] <= 32:
            op = self._unusual_op(line, parts)
        argc = len(parts) - 1
        if op == _OP_PUB:
            if argc == 2:
                self._await(_PUB, _size(parts[2]), 0, decode(parts[1]), "", "")
            elif argc == 3:
                self._await(_PUB, _size(parts[3]), 0, decode(parts[1]), decode(parts[2]), "")
            else:
                raise _arguments_error(line, parts[0])
        elif op == _OP_HPUB:
            if argc == 3:
                subject, reply, hraw, traw = parts[1], b"", parts[2], parts[3]
            elif argc == 4:
                subject, reply, hraw, traw = parts[1], parts[2], parts[3], parts[4]
            else:
                raise _arguments_error(line, parts[0])
            hsize, total = _size(hraw), _size(traw)
            if hsize > total:
                raise bad_arguments("header size larger than total size")
            self._await(_HPUB, total, hsize, decode(subject), decode(reply), "")
        elif op == _OP_SUB:
            if argc == 2:
                h.on_sub(decode(parts[1]), "", decode(parts[2]))
            elif argc == 3:
                h.on_sub(decode(parts[1]), decode(parts[2]), decode(parts[3]))
            else:
                raise _arguments_error(line, parts[0])
        elif op == _OP_UNSUB:
            if argc == 1:
                h.on_unsub(decode(parts[1]), 0)
            elif argc == 2:
                # nats-server reads a malformed maximum as "no maximum": remove now.
                raw = parts[2]
                ok = raw.isdigit() and len(raw) <= 9
                h.on_unsub(decode(parts[1]), int(raw) if ok else 0)
            else:
                raise _arguments_error(line, parts[0])
        elif op == _OP_MSG:
            if self.server_side:
                raise ProtocolError(UNKNOWN_OPERATION)
            if argc == 3:
                self._await(_MSG, _size(parts[3]), 0, decode(parts[1]), decode(parts[2]), "")
            elif argc == 4:
                self._await(
                    _MSG, _size(parts[4]), 0, decode(parts[1]), decode(parts[2]), decode(parts[3])
                )
            else:
                raise _arguments_error(line, parts[0])
        elif op == _OP_HMSG:
            if self.server_side:
                raise ProtocolError(UNKNOWN_OPERATION)
            if argc == 4:
                subject, sid, reply, hraw, traw = parts[1], parts[2], b"", parts[3], parts[4]
            elif argc == 5:
                subject, sid, reply, hraw, traw = parts[1], parts[2], parts[3], parts[4], parts[5]
            else:
                raise _arguments_error(line, parts[0])
            hsize, total = _size(hraw), _size(traw)
            if hsize > total:
                raise bad_arguments("header size larger than total size")
            self._await(_HMSG, total, hsize, decode(subject), decode(sid), decode(reply))
        elif op == _OP_PING:
            h.on_ping()
        elif op == _OP_PONG:
            h.on_pong()
        elif op == _OP_CONNECT:
            h.on_connect(line[7:].strip())
        elif op == _OP_INFO:
            h.on_info(line[4:].strip())
        elif op == _OP_OK:
            h.on_ok()
        else:  # _OP_ERR
            if argc == 0:
                raise _arguments_error(line, parts[0])
            h.on_err(_err_text(line[4:].strip()))

    def _unusual_op(self, line: bytes, parts: list[bytes]) -> int:
        """The slow path: mixed-case keywords, ``PINGxyz``, ``CONNECT{…}``, garbage."""
        if line[0] <= 32:
            raise ProtocolError(UNKNOWN_OPERATION)
        found = _classify(line[:8].upper(), True, self.server_side)
        if found is None:
            raise ProtocolError(UNKNOWN_OPERATION)
        keyword, op = found
        if op in _NO_SEPARATOR:
            # The keyword may run into its argument: re-split so parts[0] is the keyword.
            parts[:] = [keyword, *line[len(keyword) :].split()]
        return op

    def _await(self, kind: int, size: int, hsize: int, a: str, b: str, c: str) -> None:
        if size > self.max_payload:
            raise _too_big(size)
        self._kind = kind
        self._need = size + 2
        self._hsize = hsize
        self._args = (a, b, c)


def _err_text(raw: bytes) -> str:
    text = decode(raw)
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        text = text[1:-1]
    return text
