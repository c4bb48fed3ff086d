"""Cursor pagination in webhook-broker's shape.

Lists are newest first, 25 per page. A cursor is base64 of ``"<id>|<createdAt>"`` (RFC
3339 with nanoseconds) naming the item a page starts after (``next``) or ends before
(``previous``). An unreadable cursor is ignored (the first page), as webhook-broker does.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar
from urllib.parse import urlencode

from starlette.requests import Request

from tether.protocol.numbers import parse_uint
from tether.server.http.common import rfc3339

PAGE_SIZE = 25
T = TypeVar("T")


def encode_cursor(item_id: str, created_ns: int) -> str:
    return base64.b64encode(f"{item_id}|{rfc3339(created_ns)}".encode()).decode()


def decode_cursor(raw: str) -> tuple[str, int] | None:
    try:
        text = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, ValueError):
        return None
    parts = text.split("|")
    if len(parts) != 2:
        return None
    item_id, stamp = parts
    try:
        when = datetime.fromisoformat(_trim_nanos(stamp))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    nanos = _nanos(stamp)
    return item_id, int(when.timestamp()) * 1_000_000_000 + nanos


def _trim_nanos(stamp: str) -> str:
    # datetime parses at most microseconds: drop the fraction, _nanos reads it.
    if "." not in stamp:
        return stamp
    head, _, rest = stamp.partition(".")
    i = 0
    while i < len(rest) and "0" <= rest[i] <= "9":
        i += 1
    return head + rest[i:]


def _nanos(stamp: str) -> int:
    if "." not in stamp:
        return 0
    rest = stamp.partition(".")[2]
    digits = ""
    for ch in rest:
        if not "0" <= ch <= "9":
            break
        digits += ch
    return int(digits[:9].ljust(9, "0")) if digits else 0


def paginate(
    request: Request,
    items: Sequence[T],
    key: Callable[[T], tuple[str, int]],
    size: int = PAGE_SIZE,
) -> tuple[list[T], dict[str, str]]:
    """One page of ``items`` (newest first) and its ``Pages`` links."""
    items = sorted(items, key=lambda i: _order(key(i)))
    order = [_order(key(i)) for i in items]
    nxt = decode_cursor(request.query_params.get("next", ""))
    prev = decode_cursor(request.query_params.get("previous", ""))
    if nxt is not None:
        pivot = _order(nxt)
        start = next((i for i, o in enumerate(order) if o > pivot), len(items))
        end = start + size
    elif prev is not None:
        pivot = _order(prev)
        end = next((i for i, o in enumerate(order) if o >= pivot), len(items))
        start = max(0, end - size)
    else:
        start, end = 0, size
    page = list(items[start:end])
    links: dict[str, str] = {}
    path = request.url.path
    if page and end < len(items):
        links["next"] = f"{path}?{urlencode({'next': encode_cursor(*key(page[-1]))})}"
    if page and start > 0:
        links["previous"] = f"{path}?{urlencode({'previous': encode_cursor(*key(page[0]))})}"
    return page, links


def _order(k: tuple[str, int]) -> tuple[int, int]:
    return -k[1], -_rank(k[0])


def seq_page(
    request: Request,
    last_seq: int,
    older: Callable[[int, int], list[int]],
    newer: Callable[[int, int], list[int]],
    ts_of: Callable[[int], int],
) -> tuple[list[int], dict[str, str]]:
    """A page of stream sequences, newest first; cursors carry the sequence as the id.

    ``older(seq, n)``: up to ``n`` live sequences <= seq, descending;
    ``newer(seq, n)``: up to ``n`` live sequences >= seq, ascending.
    """
    nxt = decode_cursor(request.query_params.get("next", ""))
    prev = decode_cursor(request.query_params.get("previous", ""))
    path = request.url.path

    def link(kind: str, seq: int) -> str:
        return f"{path}?{urlencode({kind: encode_cursor(str(seq), ts_of(seq))})}"

    links: dict[str, str] = {}
    prev_seq = parse_uint(prev[0]) if prev is not None else None
    next_seq = parse_uint(nxt[0]) if nxt is not None else None
    if prev_seq is not None and nxt is None:
        up = newer(prev_seq + 1, PAGE_SIZE + 1)
        page = list(reversed(up[:PAGE_SIZE]))
        if page and len(up) > PAGE_SIZE:
            links["previous"] = link("previous", page[0])
        if page:
            links["next"] = link("next", page[-1])
        return page, links
    start = next_seq - 1 if next_seq is not None else last_seq
    down = older(start, PAGE_SIZE + 1)
    page = down[:PAGE_SIZE]
    if page and len(down) > PAGE_SIZE:
        links["next"] = link("next", page[-1])
    if page and start < last_seq:
        links["previous"] = link("previous", page[0])
    return page, links


def _rank(item_id: str) -> int:
    # A stable tie-break for items created in the same nanosecond.
    return int.from_bytes(item_id.encode()[:16].ljust(16, b"\0"), "big")
