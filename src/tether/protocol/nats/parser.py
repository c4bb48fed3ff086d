"""An incremental parser for the NATS text protocol, for both directions.

Bytes are fed as they arrive from a socket: a frame may be split across reads at any
byte and one read may hold many frames. Each complete frame is reported to a handler
by calling one method on it, so the hot path allocates no frame objects. Any input
yields either handler calls or a :class:`ProtocolError`, never another exception.
"""

from __future__ import annotations

from typing import Protocol

from tether.protocol.nats.errors import (
    MAX_CONTROL_LINE,
    MAX_PAYLOAD,
    UNKNOWN_OPERATION,
    ProtocolError,
)

DEFAULT_MAX_CONTROL_LINE = 4096
DEFAULT_MAX_PAYLOAD = 1024 * 1024


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


# Payload kinds awaiting their bytes.
_PUB, _HPUB, _MSG, _HMSG = 1, 2, 3, 4


def _size(raw: bytes) -> int:
    # int() accepts "+5", " 5" and "5_0"; the protocol allows only plain digits.
    if not raw.isdigit():
        raise ProtocolError(UNKNOWN_OPERATION)
    return int(raw)


class Parser:
    """Incremental NATS protocol parser.

    ``max_payload`` bounds the size a PUB/HPUB/MSG/HMSG may declare (checked before
    the payload is buffered, so a peer cannot make us hold more than that);
    ``max_control_line`` bounds an op line.
    """

    __slots__ = (
        "_args",
        "_buf",
        "_dead",
        "_handler",
        "_hsize",
        "_kind",
        "_need",
        "max_control_line",
        "max_payload",
    )

    def __init__(
        self,
        handler: Handler,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
    ) -> None:
        self._handler = handler
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self._buf = bytearray()
        self._kind = 0  # payload kind being awaited, 0 when awaiting an op line
        self._need = 0  # payload size + CRLF
        self._hsize = 0
        self._args: tuple[str, str, str] = ("", "", "")
        self._dead = False

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
                return  # still waiting for a payload: do not rescan
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = data
        try:
            pos = self._parse(buf)
        except ProtocolError:
            self._dead = True
            raise
        except (ValueError, IndexError, UnicodeError) as exc:  # defensive: never leak these
            self._dead = True
            raise ProtocolError(UNKNOWN_OPERATION) from exc
        if pos < len(buf):
            self._buf += buf[pos:] if pos else buf

    def _parse(self, buf: bytes) -> int:
        h = self._handler
        n = len(buf)
        pos = 0
        max_line = self.max_control_line
        while pos < n:
            kind = self._kind
            if kind:
                end = pos + self._need
                if end > n:
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
                if n - pos > max_line:
                    raise ProtocolError(MAX_CONTROL_LINE)
                return pos
            if nl - pos > max_line:
                raise ProtocolError(MAX_CONTROL_LINE)
            line = buf[pos : nl - 1] if nl > pos and buf[nl - 1] == 13 else buf[pos:nl]
            pos = nl + 1
            self._op(line, h)
        return pos

    def _op(self, line: bytes, h: Handler) -> None:
        parts = line.split()
        if not parts:
            raise ProtocolError(UNKNOWN_OPERATION)
        op = parts[0].upper()
        argc = len(parts) - 1
        if op == b"PUB":
            if argc == 2:
                self._await(_PUB, _size(parts[2]), 0, decode(parts[1]), "", "")
            elif argc == 3:
                self._await(_PUB, _size(parts[3]), 0, decode(parts[1]), decode(parts[2]), "")
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
        elif op == b"HPUB":
            if argc == 3:
                subject, reply, hraw, traw = parts[1], b"", parts[2], parts[3]
            elif argc == 4:
                subject, reply, hraw, traw = parts[1], parts[2], parts[3], parts[4]
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
            hsize, total = _size(hraw), _size(traw)
            if hsize > total:
                raise ProtocolError(UNKNOWN_OPERATION)
            self._await(_HPUB, total, hsize, decode(subject), decode(reply), "")
        elif op == b"MSG":
            if argc == 3:
                self._await(_MSG, _size(parts[3]), 0, decode(parts[1]), decode(parts[2]), "")
            elif argc == 4:
                self._await(
                    _MSG, _size(parts[4]), 0, decode(parts[1]), decode(parts[2]), decode(parts[3])
                )
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
        elif op == b"HMSG":
            if argc == 4:
                subject, sid, reply, hraw, traw = parts[1], parts[2], b"", parts[3], parts[4]
            elif argc == 5:
                subject, sid, reply, hraw, traw = parts[1], parts[2], parts[3], parts[4], parts[5]
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
            hsize, total = _size(hraw), _size(traw)
            if hsize > total:
                raise ProtocolError(UNKNOWN_OPERATION)
            self._await(_HMSG, total, hsize, decode(subject), decode(sid), decode(reply))
        elif op == b"PING":
            h.on_ping()
        elif op == b"PONG":
            h.on_pong()
        elif op == b"SUB":
            if argc == 2:
                h.on_sub(decode(parts[1]), "", decode(parts[2]))
            elif argc == 3:
                h.on_sub(decode(parts[1]), decode(parts[2]), decode(parts[3]))
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
        elif op == b"UNSUB":
            if argc == 1:
                h.on_unsub(decode(parts[1]), 0)
            elif argc == 2:
                h.on_unsub(decode(parts[1]), _size(parts[2]))
            else:
                raise ProtocolError(UNKNOWN_OPERATION)
        elif op == b"CONNECT":
            h.on_connect(_rest(line, 7))
        elif op == b"INFO":
            h.on_info(_rest(line, 4))
        elif op == b"+OK":
            h.on_ok()
        elif op == b"-ERR":
            h.on_err(_err_text(_rest(line, 4)))
        else:
            raise ProtocolError(UNKNOWN_OPERATION)

    def _await(self, kind: int, size: int, hsize: int, a: str, b: str, c: str) -> None:
        if size > self.max_payload:
            raise ProtocolError(MAX_PAYLOAD)
        self._kind = kind
        self._need = size + 2
        self._hsize = hsize
        self._args = (a, b, c)


def _rest(line: bytes, op_len: int) -> bytes:
    """The argument text after an op keyword (JSON for CONNECT/INFO)."""
    return line[op_len:].strip()


def _err_text(raw: bytes) -> str:
    text = decode(raw)
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        text = text[1:-1]
    return text
