"""A client-side front end to :class:`Parser` with an inlined MSG/HMSG fast path.

A client receives mostly ``MSG``/``HMSG`` frames (pulled messages, publish acks).
:class:`ClientReader` decodes well-formed ones in one tight loop and hands every
other complete line (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``) to the shared
:class:`Parser`, which stays the authority on the grammar: the first frame the fast
path does not recognise (odd spacing aside, e.g. lower-case keywords, bad sizes,
garbage) switches the reader to the shared parser for the rest of the connection,
so errors are exactly the shared parser's. Handler calls are the same either way.
"""

from __future__ import annotations

from tether.protocol.nats.parser import (
    DEFAULT_MAX_CONTROL_LINE,
    DEFAULT_MAX_PAYLOAD,
    Handler,
    Parser,
    decode,
)

# Complete lines the shared parser can take one at a time (no payload follows them).
_LINE_OPS = (b"PING", b"PONG", b"+OK", b"-ERR", b"INFO")
_MAX_DIGITS = 9
_CACHE_MAX = 4096
# Sizes seen recently, so the hot path skips isdigit() and int(); bounded.
_SIZES: dict[bytes, int] = {}


class ClientReader:
    """Feed it server-to-client bytes as they arrive; frames go to ``handler``."""

    __slots__ = (
        "_buf",
        "_chunks",
        "_fallback",
        "_handler",
        "_have",
        "_need",
        "_parser",
        "_sids",
        "max_payload",
    )

    def __init__(self, handler: Handler, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._handler = handler
        self._parser = Parser(handler, max_payload=max_payload)
        self.max_payload = max_payload
        self._buf = b""
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0  # bytes a buffered, incomplete frame needs in total (0: unknown)
        self._fallback = False
        self._sids: dict[bytes, str] = {}

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises :class:`~tether.protocol.nats.errors.ProtocolError` like
        :meth:`Parser.feed`."""
        if self._fallback:
            self._parser.feed(data)
            return
        if self._need:
            # A large frame is arriving: collect chunks instead of re-joining each time.
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            data = self._buf + b"".join(self._chunks)
            self._chunks.clear()
            self._have = self._need = 0
            self._buf = b""
        elif self._buf:
            data = self._buf + data
            self._buf = b""
        pos = self._scan(data)
        if pos < len(data):
            rest = data[pos:] if pos else data
            if self._need:
                self._have = len(rest)
            elif len(rest) > DEFAULT_MAX_CONTROL_LINE + 64 and rest.find(b"\n") < 0:
                # A line this long without its end: let the shared parser judge it now,
                # rather than buffer whatever a broken server keeps sending.
                self._give_up(rest)
                return
            self._buf = rest

    def _give_up(self, rest: bytes) -> None:
        self._fallback = True
        self._need = 0
        self._buf = b""
        self._parser.feed(rest)

    def _scan(self, data: bytes) -> int:
        h = self._handler
        n = len(data)
        pos = 0
        max_payload = self.max_payload
        sizes = _SIZES
        sids = self._sids
        while pos < n:
            nl = data.find(b"\n", pos)
            if nl < 0:
                return pos
            first = data[pos]
            if first == 77 or first == 72:  # "M" or "H"
                end = nl - 1 if data[nl - 1] == 13 else nl
                parts = data[pos:end].split()
                argc = len(parts)
                start = nl + 1
                if parts[0] == b"MSG" and (argc == 4 or argc == 5):
                    size = sizes.get(parts[argc - 1])
                    if size is None:
                        size = _size(parts[argc - 1])
                        if size < 0:
                            break
                    if size > max_payload:
                        break
                    stop = start + size
                    if stop + 2 > n:
                        self._need = stop + 2 - pos
                        return pos
                    if data[stop : stop + 2] != b"\r\n":
                        break
                    sid = sids.get(parts[2])
                    if sid is None:
                        sid = self._sid(parts[2])
                    h.on_msg(
                        parts[1].decode("utf-8", "surrogateescape"),
                        sid,
                        parts[3].decode("utf-8", "surrogateescape") if argc == 5 else "",
                        data[start:stop],
                    )
                    pos = stop + 2
                    continue
                if parts[0] == b"HMSG" and (argc == 5 or argc == 6):
                    hsize = _size(parts[argc - 2])
                    total = _size(parts[argc - 1])
                    if hsize < 0 or total < 0 or hsize > total or total > max_payload:
                        break
                    split = start + hsize
                    stop = start + total
                    if stop + 2 > n:
                        self._need = stop + 2 - pos
                        return pos
                    if data[stop : stop + 2] != b"\r\n":
                        break
                    h.on_hmsg(
                        decode(parts[1]),
                        self._sid(parts[2]),
                        decode(parts[3]) if argc == 6 else "",
                        data[start:split],
                        data[split:stop],
                    )
                    pos = stop + 2
                    continue
                break
            if data.startswith(_LINE_OPS, pos):
                self._parser.feed(data[pos : nl + 1])
                pos = nl + 1
                continue
            break
        if pos < n:
            # Not ours to judge: the shared parser takes over from this frame on.
            self._give_up(data[pos:])
            return n
        return pos

    def _sid(self, raw: bytes) -> str:
        sid = self._sids.get(raw)
        if sid is None:
            sid = decode(raw)
            if len(self._sids) < _CACHE_MAX:  # sids repeat: decode each one once
                self._sids[raw] = sid
        return sid


def _size(raw: bytes) -> int:
    """A size field (plain digits, at most 9 of them), or -1."""
    if not raw.isdigit() or len(raw) > _MAX_DIGITS:
        return -1
    size = int(raw)
    if len(_SIZES) < _CACHE_MAX:
        _SIZES[raw] = size
    return size
