"""The ``NATS/1.0`` header block: status line, then ``Key: Value`` lines, then a blank line."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tether.protocol.nats.errors import ProtocolError

HEADER_LINE = b"NATS/1.0"
_END = b"\r\n\r\n"


class Headers(msgspec.Struct, frozen=True):
    """A parsed header block. ``status`` is 0 when the block carries no status code."""

    status: int = 0
    description: str = ""
    items: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        """The first value of ``key`` (case-insensitive, like nats-server's lookups)."""
        folded = key.lower()
        for k, v in self.items:
            if k.lower() == folded:
                return v
        return default

    def to_dict(self) -> dict[str, str]:
        return dict(self.items)


def encode_headers(
    items: Iterable[tuple[str, str]], status: int = 0, description: str = ""
) -> bytes:
    """Encode a header block; keys keep their case and may repeat."""
    first = HEADER_LINE
    if status:
        first = b"%s %d" % (HEADER_LINE, status)
        if description:
            first += b" " + description.encode()
    lines = [first]
    for key, value in items:
        lines.append(f"{key}: {value}".encode())
    return b"\r\n".join(lines) + _END


def parse_headers(block: bytes) -> Headers:
    """Parse a header block as carried in HPUB/HMSG (from ``NATS/1.0`` through the blank line)."""
    if not block.startswith(HEADER_LINE):
        raise ProtocolError("Invalid Headers")
    text = block.decode("utf-8", "replace")
    lines = text.split("\r\n")
    first = lines[0][len("NATS/1.0") :].strip()
    status = 0
    description = ""
    if first:
        code, _, rest = first.partition(" ")
        if code.isdigit():
            status = int(code)
            description = rest.strip()
        else:
            description = first
    items: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue  # nats-server ignores malformed header lines rather than failing the message
        items.append((key.strip(), value.strip()))
    return Headers(status, description, tuple(items))


def header_value(block: bytes, key: bytes) -> bytes | None:
    """Fast lookup of one header in a raw block without parsing it all (case-sensitive first,
    then case-insensitive). Used on the publish hot path for ``Nats-Msg-Id`` and friends."""
    if not block:
        return None
    idx = block.find(b"\r\n" + key + b":")
    if idx < 0:
        lowered = block.lower()
        idx = lowered.find(b"\r\n" + key.lower() + b":")
        if idx < 0:
            return None
    start = idx + len(key) + 3
    end = block.find(b"\r\n", start)
    if end < 0:
        end = len(block)
    return block[start:end].strip()
