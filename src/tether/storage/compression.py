"""At-rest compression of payloads, for streams whose configuration says ``compression: "s2"``.

nats-server compresses its message blocks with S2. S2 is a superset of Snappy: every
S2 decoder reads the Snappy block format. Tether writes the Snappy block format
(cramjam's ``snappy.compress_raw``), so what it stores for an ``"s2"`` stream is valid
S2 too, though it never uses S2's own extensions (its longer matches, repeat offsets).

Compression works message by message, on the payload alone: the subject and the header
block stay as they are, so a row remains readable column by column and each one
decides for itself whether it is compressed (see the stores' ``plain_size`` column). A
payload is kept compressed only when that saves bytes; small ones never are.

Sizes seen by clients never change: a stream counts each message's uncompressed
bytes (``state.bytes``, ``max_bytes``, ``max_msg_size``), as nats-server does.
"""

from __future__ import annotations

from typing import Final

import cramjam

__all__ = ["CODECS", "MIN_SIZE", "compress", "compressing", "decompress"]

# The values of a stream's ``compression`` setting: the stores compress for ``"s2"``.
CODECS: Final = ("none", "s2")
# Payloads shorter than this are stored as sent: Snappy's tag and length bytes leave
# little to gain below it, and each try would cost a call on the writer thread.
MIN_SIZE: Final = 64

_compress_raw = cramjam.snappy.compress_raw
_decompress_raw = cramjam.snappy.decompress_raw
_decompress_raw_len = cramjam.snappy.decompress_raw_len


def compressing(codec: str) -> bool:
    """Whether a stream with ``compression: codec`` has its payloads compressed."""
    return codec == "s2"


def compress(data: bytes) -> bytes | None:
    """``data`` in the Snappy block format, or None when that would not make it shorter
    (the payload is then stored as sent)."""
    if len(data) < MIN_SIZE:
        return None
    packed = bytes(_compress_raw(data))
    return packed if len(packed) < len(data) else None


def decompress(packed: bytes, size: int) -> bytes:
    """The payload that :func:`compress` turned into ``packed``, ``size`` bytes long.

    Raises ``ValueError`` when ``packed`` is not a Snappy block of that size (damage,
    which the caller reports as such)."""
    try:
        # The block's header says how long it decompresses: checked first, so that a
        # damaged header never makes the decoder allocate what it claims.
        claimed = _decompress_raw_len(packed)
        if claimed != size:
            raise ValueError(f"a Snappy block of {claimed} bytes where {size} were stored")
        return bytes(_decompress_raw(packed))
    except ValueError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise ValueError(f"not a Snappy block: {exc}") from None
