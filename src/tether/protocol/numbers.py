"""Strict decimal numbers in text: the one parser for ids, sequences, counts and limits.

``str.isdigit()`` is true for ``"²"`` and ``"٣"``, which ``int()`` refuses or reads as
another digit, and ``int()`` itself accepts ``" 7"``, ``"+7"``, ``"7_0"`` and 4,300
digits before it gives up with an error of its own. Values that reach the broker from a
client (HTTP paths and queries, headers, cursors, job ids) go through :func:`parse_uint`
instead: ASCII digits only, bounded length, bounded value, ``None`` when it is not one.
"""

from __future__ import annotations

INT64_MAX = (1 << 63) - 1
_MAX_DIGITS = 19  # len(str(INT64_MAX))


def parse_uint(text: str | bytes, maximum: int = INT64_MAX) -> int | None:
    """``text`` as a non-negative integer ≤ ``maximum``, or None if it is not exactly
    that (empty, signs, spaces, underscores, non-ASCII digits, too long, too large)."""
    if not text or len(text) > _MAX_DIGITS:
        return None
    if isinstance(text, bytes):
        if not (text.isdigit() and text.isascii()):
            return None
    elif not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= maximum else None
