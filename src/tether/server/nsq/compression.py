"""Stream compression an NSQ client may negotiate in IDENTIFY: deflate or snappy.

Both directions of the connection are compressed from the ``OK`` that follows the
IDENTIFY response on. Deflate is raw DEFLATE (RFC 1951, no zlib header) as Go's
``compress/flate`` writes it, each write ending on a sync flush, from the standard
library's ``zlib``; snappy is the snappy *framing* format (what Go's ``snappy.NewWriter``
and python-snappy's stream classes speak), with ``cramjam``'s codec.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import cramjam


class CompressionError(Exception):
    """The client's compressed stream is corrupt."""


class Codec(Protocol):
    def decompress(self, data: bytes) -> bytes: ...
    def compress(self, data: bytes) -> bytes: ...


class Deflate:
    """Raw deflate both ways; ``compress`` ends each write with a sync flush."""

    def __init__(self, level: int) -> None:
        self._in = zlib.decompressobj(-zlib.MAX_WBITS)
        self._out = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._in.decompress(data)
        except zlib.error as exc:
            raise CompressionError(str(exc)) from None

    def compress(self, data: bytes) -> bytes:
        return self._out.compress(data) + self._out.flush(zlib.Z_SYNC_FLUSH)


_STREAM_ID = 0xFF
_COMPRESSED = 0x00
_UNCOMPRESSED = 0x01
_MAX_CHUNK = 65536 + 4 + 16  # a 64 KiB block, its checksum and some slack


class Snappy:
    """The snappy framing format both ways (checksums are not verified on input)."""

    def __init__(self) -> None:
        self._buf = b""
        self._out = cramjam.snappy.Compressor()

    def decompress(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            kind = buf[pos]
            size = int.from_bytes(buf[pos + 1 : pos + 4], "little")
            if size > _MAX_CHUNK:
                raise CompressionError(f"snappy chunk of {size} bytes")
            end = pos + 4 + size
            if end > n:
                break
            if kind == _COMPRESSED:
                try:
                    out.append(bytes(cramjam.snappy.decompress_raw(buf[pos + 8 : end])))
                except Exception as exc:  # cramjam raises its own DecompressionError
                    raise CompressionError(str(exc)) from None
            elif kind == _UNCOMPRESSED:
                out.append(buf[pos + 8 : end])
            elif kind != _STREAM_ID and kind < 0x80:
                raise CompressionError(f"reserved unskippable snappy chunk 0x{kind:02x}")
            pos = end
        self._buf = buf[pos:]
        return b"".join(out)

    def compress(self, data: bytes) -> bytes:
        self._out.compress(data)
        return bytes(self._out.flush())
