"""An incremental parser for what NSQ clients send to nsqd (protocol V2).

Bytes are fed as they arrive: a command may be split across reads at any byte and one
read may hold many commands. :meth:`Parser.feed` returns the complete commands found
(see :mod:`tether.protocol.nsq.commands`); any input yields commands, possibly ending
with one :class:`~tether.protocol.nsq.errors.Failure`, never an exception. After a
failure the parser takes nothing more (every such error is fatal in nsqd).

The parser checks what nsqd checks before it reads a body, in nsqd's order and with its
texts: the magic, the verb, the parameters of the commands with a body (count, topic
name, ``DPUB``'s defer time) and the declared sizes against ``max_body_size`` and
``max_msg_size``, so a peer can never make us buffer more than those limits allow. The
checks that depend on the connection's state (``SUB`` before ``RDY``, ...) and the
parameters of body-less commands are the connection's.

Differences from nsqd, where nsqd's behaviour follows from reading the socket without
bounds: a command line longer than :data:`MAX_LINE` closes the connection silently (nsqd
does the same past its 16 KiB read buffer); ``MPUB``'s messages must fit in the body
size it declared (``E_BAD_MESSAGE``), and bytes it declared but its messages left over
are read as the next command, which is what nsqd does with them.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from tether.protocol.nsq.commands import MAGIC_V2, Command, DPub, FinRun, MPub, PubRun
from tether.protocol.nsq.errors import (
    E_BAD_BODY,
    E_BAD_MESSAGE,
    E_BAD_PROTOCOL,
    E_BAD_TOPIC,
    E_INVALID,
    Failure,
    go_quote,
)
from tether.protocol.nsq.frames import MSG_ID_LENGTH
from tether.protocol.nsq.names import is_valid_name

MAX_LINE = 16 * 1024
_INT32 = struct.Struct(">i")
_unpack_from = _INT32.unpack_from

Parsed = Command | PubRun | MPub | DPub | FinRun | Failure

_NO_BODY = frozenset((b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS", b"NOP"))


class Limits(NamedTuple):
    """nsqd's limits that bound what a client may send (its defaults)."""

    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_req_timeout_ms: int = 3_600_000


def _digits(raw: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: plain decimal digits, nothing else."""
    if not raw.isdigit() or not raw.isascii():
        return None
    return int(raw)


class Parser:
    """Incremental parser of one client connection's input."""

    __slots__ = ("_buf", "_dead", "_have", "_limits", "_magic", "_need", "_parts")

    def __init__(self, limits: Limits | None = None, *, magic: bool = True) -> None:
        self._limits = limits or Limits()
        self._magic = not magic  # True once the magic was read
        self._buf = b""
        self._dead = False
        # While a large body arrives: the reads so far and how many bytes are needed.
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0

    @property
    def pending(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._buf) + self._have

    def feed(self, data: bytes) -> list[Parsed]:
        if self._dead:
            return []
        if self._need:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(self._parts)
            self._parts = []
            self._have = self._need = 0
            buf = data
        else:
            buf = self._buf + data if self._buf else data
        out: list[Parsed] = []
        pos = 0
        if not self._magic:
            if len(buf) < 4:
                if not MAGIC_V2.startswith(buf):
                    return self._fail(out, Failure(E_BAD_PROTOCOL, b""))
                self._buf = buf
                return out
            if buf[:4] != MAGIC_V2:
                return self._fail(out, Failure(E_BAD_PROTOCOL, b""))
            self._magic = True
            pos = 4
        limits = self._limits
        n = len(buf)
        find = buf.find
        while pos < n:
            nl = find(b"\n", pos)
            if nl < 0:
                if n - pos > MAX_LINE:
                    return self._fail(out, Failure(b"", b""))
                break
            end = nl
            if end > pos and buf[end - 1] == 0x0D:
                end -= 1
            params = buf[pos:end].split(b" ")
            verb = params[0]
            if verb in _NO_BODY:
                pos = nl + 1
                if verb == b"FIN" and len(params) > 1 and len(params[1]) == MSG_ID_LENGTH:
                    last = out[-1] if out else None
                    if type(last) is FinRun:
                        last.ids.append(params[1])
                    else:
                        out.append(FinRun([params[1]]))
                    continue
                out.append(Command(verb, params[1:]))
                continue
            failure = _check_head(verb, params, limits)
            if failure is not None:
                return self._fail(out, failure)
            if nl + 5 > n:
                break  # the body size has not arrived yet
            size = _unpack_from(buf, nl + 1)[0]
            failure = _check_size(verb, size, limits)
            if failure is not None:
                return self._fail(out, failure)
            start = nl + 5
            stop = start + size
            if stop > n:
                # Wait for the rest without re-parsing the line at each read.
                self._parts = [buf[pos:]]
                self._have = n - pos
                self._need = stop - pos
                self._buf = b""
                return out
            body = buf[start:stop]
            pos = stop
            if verb == b"PUB":
                topic = params[1]
                last = out[-1] if out else None
                if type(last) is PubRun and last.topic == topic:
                    last.bodies.append(body)
                else:
                    out.append(PubRun(topic, [body]))
            elif verb == b"MPUB":
                parsed = _mpub(params[1], body, limits)
                if isinstance(parsed, Failure):
                    return self._fail(out, parsed)
                bodies, used = parsed
                out.append(MPub(params[1], bodies))
                pos = start + used  # bytes declared but not used are the next command's
            elif verb == b"DPUB":
                out.append(DPub(params[1], int(params[2]), body))
            else:
                out.append(Command(verb, params[1:], body))
                if verb == b"IDENTIFY":
                    break  # what follows may be compressed: see rest()
        self._buf = buf[pos:] if pos < n else b""
        return out

    def rest(self) -> bytes:
        """Take the bytes received after an ``IDENTIFY`` and not parsed yet.

        The parser stops after each IDENTIFY: if it switches the connection to a
        compressed stream, what follows must be decompressed before it is parsed
        (``feed(decompress(rest()))``); otherwise ``feed(b"")`` goes on with them.
        """
        if self._need:
            data = b"".join(self._parts)
            self._parts = []
            self._have = self._need = 0
            return data
        data, self._buf = self._buf, b""
        return data

    def _fail(self, out: list[Parsed], failure: Failure) -> list[Parsed]:
        self._dead = True
        self._buf = b""
        self._parts = []
        self._have = self._need = 0
        out.append(failure)
        return out


def _check_head(verb: bytes, params: list[bytes], limits: Limits) -> Failure | None:
    """What nsqd checks of a body command before it reads the body size."""
    if verb == b"PUB":
        if len(params) < 2:
            return Failure(E_INVALID, b"PUB insufficient number of parameters")
        if not is_valid_name(params[1]):
            return Failure(E_BAD_TOPIC, b"PUB topic name %s is not valid" % go_quote(params[1]))
        return None
    if verb == b"MPUB":
        if len(params) < 2:
            return Failure(E_INVALID, b"MPUB insufficient number of parameters")
        if not is_valid_name(params[1]):
            # nsqd repeats the code in the text of this one.
            text = b"E_BAD_TOPIC MPUB topic name %s is not valid" % go_quote(params[1])
            return Failure(E_BAD_TOPIC, text)
        return None
    if verb == b"DPUB":
        if len(params) < 3:
            return Failure(E_INVALID, b"DPUB insufficient number of parameters")
        if not is_valid_name(params[1]):
            return Failure(E_BAD_TOPIC, b"DPUB topic name %s is not valid" % go_quote(params[1]))
        ms = _digits(params[2])
        if ms is None:
            return Failure(E_INVALID, b"DPUB could not parse timeout %s" % params[2])
        if ms > limits.max_req_timeout_ms:
            return Failure(
                E_INVALID, b"DPUB timeout %d out of range 0-%d" % (ms, limits.max_req_timeout_ms)
            )
        return None
    if verb == b"IDENTIFY":
        return None
    if verb == b"AUTH":
        if len(params) != 1:
            return Failure(E_INVALID, b"AUTH invalid number of parameters")
        return None
    return Failure(E_INVALID, b"invalid command " + verb)


def _check_size(verb: bytes, size: int, limits: Limits) -> Failure | None:
    if verb in (b"PUB", b"DPUB"):
        if size <= 0:
            return Failure(E_BAD_MESSAGE, b"%s invalid message body size %d" % (verb, size))
        if size > limits.max_msg_size:
            return Failure(
                E_BAD_MESSAGE, b"%s message too big %d > %d" % (verb, size, limits.max_msg_size)
            )
        return None
    # IDENTIFY and AUTH compare with the limit first; MPUB checks the sign first.
    if verb == b"MPUB" and size <= 0:
        return Failure(E_BAD_BODY, b"MPUB invalid body size %d" % size)
    if size > limits.max_body_size:
        return Failure(E_BAD_BODY, b"%s body too big %d > %d" % (verb, size, limits.max_body_size))
    if size <= 0:
        return Failure(E_BAD_BODY, b"%s invalid body size %d" % (verb, size))
    return None


def _mpub(topic: bytes, body: bytes, limits: Limits) -> tuple[list[bytes], int] | Failure:
    """An MPUB body's messages and how many of its bytes they used."""
    n = len(body)
    if n < 4:
        return Failure(E_BAD_BODY, b"MPUB failed to read message count")
    count = _unpack_from(body, 0)[0]
    if count <= 0 or count > (limits.max_body_size - 4) // 5:
        return Failure(E_BAD_BODY, b"MPUB invalid message count %d" % count)
    max_msg = limits.max_msg_size
    bodies: list[bytes] = []
    append = bodies.append
    pos = 4
    for i in range(count):
        if pos + 4 > n:
            return Failure(E_BAD_MESSAGE, b"MPUB failed to read message(%d) body size" % i)
        size = _unpack_from(body, pos)[0]
        if size <= 0:
            return Failure(E_BAD_MESSAGE, b"MPUB invalid message(%d) body size %d" % (i, size))
        if size > max_msg:
            return Failure(E_BAD_MESSAGE, b"MPUB message too big %d > %d" % (size, max_msg))
        pos += 4
        if pos + size > n:
            return Failure(E_BAD_MESSAGE, b"MPUB failed to read message body")
        append(body[pos : pos + size])
        pos += size
    return bodies, pos
