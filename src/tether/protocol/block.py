"""Message blocks: many stored messages in one reply, laid out column by column.

Tether's bulk stream read (``$TETHER.API.STREAM.READ.<stream>``, see docs/client.md)
answers with blocks rather than one NATS message per stored message: per-message
framing, headers and ack subjects cost far more than the bytes of a 128-byte message.
A block is a msgpack array (msgspec, ``array_like``) of fixed-width little-endian
columns:

* ``seqs`` and ``stamps``: int64 sequence numbers and store times (ns since the epoch);
* ``subjects``, ``headers``, ``data``: the values concatenated, each with an int32
  offsets column of ``count + 1`` entries (value ``i`` is ``buf[off[i]:off[i+1]]``).

That is Apache Arrow's layout for ``int64`` and ``binary``/``string`` arrays, so a
reader with pyarrow wraps the columns without copying them; without pyarrow the
accessors below slice them. Headers are the raw ``NATS/1.0`` blocks as stored (empty
for a message without headers). Both header columns are empty (no offsets at all)
when no message of the block has headers, or when the request said ``no_hdr``.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, pairwise

import msgspec

__all__ = ["MessageBlock", "decode_block", "encode_block"]

_LITTLE = sys.byteorder == "little"


def _pack(kind: str, values: Sequence[int]) -> bytes:
    column = array(kind, values)
    if not _LITTLE:
        column.byteswap()
    return column.tobytes()


def _unpack(kind: str, raw: bytes) -> array[int]:
    column = array(kind)
    column.frombytes(raw)
    if not _LITTLE:
        column.byteswap()
    return column


def _offsets(items: Sequence[bytes]) -> bytes:
    return _pack("i", list(accumulate(map(len, items), initial=0)))


def _slices(offsets: bytes, buf: bytes, count: int) -> list[bytes]:
    if not offsets:
        return [b""] * count
    off = _unpack("i", offsets).tolist()
    return [buf[a:b] for a, b in pairwise(off[: count + 1])]


class MessageBlock(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One reply of a bulk read: ``count`` messages in ascending sequence order."""

    count: int
    seqs: bytes
    stamps: bytes
    subject_offsets: bytes
    subjects: bytes
    header_offsets: bytes
    headers: bytes
    data_offsets: bytes
    data: bytes

    def seq_list(self) -> list[int]:
        return _unpack("q", self.seqs).tolist()

    def stamp_list(self) -> list[int]:
        return _unpack("q", self.stamps).tolist()

    def subject_list(self) -> list[str]:
        return [s.decode() for s in _slices(self.subject_offsets, self.subjects, self.count)]

    def header_list(self) -> list[bytes]:
        return _slices(self.header_offsets, self.headers, self.count)

    def data_list(self) -> list[bytes]:
        return _slices(self.data_offsets, self.data, self.count)

    def rows(self) -> Iterator[tuple[int, str, bytes, bytes, int]]:
        """``(seq, subject, headers, data, stamp_ns)`` per message."""
        return zip(
            self.seq_list(),
            self.subject_list(),
            self.header_list(),
            self.data_list(),
            self.stamp_list(),
            strict=True,
        )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(MessageBlock)


def encode_block(
    seqs: Sequence[int],
    stamps: Sequence[int],
    subjects: Sequence[str],
    headers: Sequence[bytes] | None,
    data: Sequence[bytes],
) -> bytes:
    """The wire form of one block; ``headers=None`` leaves the header columns empty, as
    do headers that are all empty."""
    joined = "".join(subjects)
    subject_buf = joined.encode()
    if len(subject_buf) == len(joined):  # ASCII, the usual case: lengths are byte counts
        subject_offsets = _pack("i", list(accumulate(map(len, subjects), initial=0)))
    else:
        encoded = [s.encode() for s in subjects]
        subject_offsets = _offsets(encoded)
    if headers is None or not any(headers):
        header_offsets = header_buf = b""
    else:
        header_offsets, header_buf = _offsets(headers), b"".join(headers)
    block = MessageBlock(
        count=len(seqs),
        seqs=_pack("q", seqs),
        stamps=_pack("q", stamps),
        subject_offsets=subject_offsets,
        subjects=subject_buf,
        header_offsets=header_offsets,
        headers=header_buf,
        data_offsets=_offsets(data),
        data=b"".join(data),
    )
    return _encoder.encode(block)


def decode_block(payload: bytes) -> MessageBlock:
    """Parse a block; raises :class:`ValueError` when it is not a well-formed one."""
    try:
        block = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a message block: {exc}") from None
    n = block.count
    if (
        n < 0
        or len(block.seqs) != 8 * n
        or len(block.stamps) != 8 * n
        or len(block.subject_offsets) != 4 * (n + 1)
        or len(block.data_offsets) != 4 * (n + 1)
        or len(block.header_offsets) not in (0, 4 * (n + 1))
    ):
        raise ValueError("not a message block: column lengths do not match its count")
    for offsets, buf in (
        (block.subject_offsets, block.subjects),
        (block.header_offsets, block.headers),
        (block.data_offsets, block.data),
    ):
        if offsets and (
            _unpack("i", offsets[:4])[0] != 0 or _unpack("i", offsets[-4:])[0] != len(buf)
        ):
            raise ValueError("not a message block: offsets do not span their values")
    return block
