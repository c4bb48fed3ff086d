"""NUID: fast unique tokens for inbox subjects (12 random characters + a 10-character counter).

Same shape as the NATS clients' NUIDs, so inboxes look familiar in server traces.
"""

from __future__ import annotations

import secrets

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE = 62
_PREFIX_LEN = 12
_SEQ_LEN = 10
_MAX_SEQ = _BASE**_SEQ_LEN
_MIN_INC = 33
_MAX_INC = 333


class Nuid:
    """Generator of 22-character unique tokens; not thread-safe (one per connection)."""

    __slots__ = ("_inc", "_prefix", "_seq")

    def __init__(self) -> None:
        self._prefix = ""
        self._seq = 0
        self._inc = 0
        self._reset()

    def _reset(self) -> None:
        self._prefix = "".join(secrets.choice(_DIGITS) for _ in range(_PREFIX_LEN))
        self._seq = secrets.randbelow(_MAX_SEQ)
        # A random stride keeps tokens of different generators from lining up.
        self._inc = _MIN_INC + secrets.randbelow(_MAX_INC - _MIN_INC)

    def next(self) -> str:
        """The next token."""
        self._seq += self._inc
        if self._seq >= _MAX_SEQ:
            self._reset()
        seq = self._seq
        out = []
        for _ in range(_SEQ_LEN):
            seq, rem = divmod(seq, _BASE)
            out.append(_DIGITS[rem])
        return self._prefix + "".join(reversed(out))


_GLOBAL = Nuid()


def next_nuid() -> str:
    """A token from a process-wide generator (call from one thread)."""
    return _GLOBAL.next()
