"""nsqd's error codes, and the fatal error that ends a connection.

An error frame carries ``<CODE> <description>`` (``E_INVALID invalid command FOO``).
Only ``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` leave the connection
open; after any other error nsqd closes it, and so do we.
"""

from __future__ import annotations

from typing import NamedTuple

E_INVALID = b"E_INVALID"
E_BAD_PROTOCOL = b"E_BAD_PROTOCOL"
E_BAD_BODY = b"E_BAD_BODY"
E_BAD_TOPIC = b"E_BAD_TOPIC"
E_BAD_CHANNEL = b"E_BAD_CHANNEL"
E_BAD_MESSAGE = b"E_BAD_MESSAGE"
E_PUB_FAILED = b"E_PUB_FAILED"
E_MPUB_FAILED = b"E_MPUB_FAILED"
E_DPUB_FAILED = b"E_DPUB_FAILED"
E_SUB_FAILED = b"E_SUB_FAILED"
E_FIN_FAILED = b"E_FIN_FAILED"
E_REQ_FAILED = b"E_REQ_FAILED"
E_TOUCH_FAILED = b"E_TOUCH_FAILED"
E_IDENTIFY_FAILED = b"E_IDENTIFY_FAILED"
E_AUTH_DISABLED = b"E_AUTH_DISABLED"
E_AUTH_FAILED = b"E_AUTH_FAILED"
E_AUTH_FIRST = b"E_AUTH_FIRST"
E_UNAUTHORIZED = b"E_UNAUTHORIZED"

NON_FATAL = frozenset((E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED))


class Failure(NamedTuple):
    """A fatal protocol error: the error frame to send (none when ``code`` is empty: the
    connection just closes, as nsqd does when it cannot read a command at all)."""

    code: bytes
    text: bytes

    @property
    def data(self) -> bytes:
        """The error frame's payload: ``CODE text`` (or the bare code)."""
        return self.code + b" " + self.text if self.text else self.code


def go_quote(raw: bytes) -> bytes:
    """Go's ``%q`` of a string: double-quoted, with Go's escapes (nsqd quotes names so)."""
    out = ['"']
    text = raw.decode("utf-8", "surrogateescape")
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out).encode("utf-8", "surrogateescape")


_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}
