"""How webhook-broker's message fields are kept in a stream message's headers.

``Nats-Msg-Id`` (the message id), ``Content-Type``, ``Tether-Priority``,
``Tether-Producer`` and the metadata headers listed in ``X-Broker-Metadata-Headers``;
a message published over NATS without ``Nats-Msg-Id`` has the id ``s<seq>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.storage.base import StoredMessage

DEFAULT_CONTENT_TYPE = "application/octet-stream"
METADATA_HEADERS = "X-Broker-Metadata-Headers"


@dataclass(slots=True)
class MessageView:
    """A stored message as the HTTP API shows it."""

    seq: int
    message_id: str
    payload: bytes
    content_type: str
    producer: str
    ts: int
    priority: int
    metadata: dict[str, str]


def parse_headers(block: bytes) -> list[tuple[str, str]]:
    """``NATS/1.0`` header block → (name, value) pairs in order."""
    out: list[tuple[str, str]] = []
    if not block:
        return out
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name:
            out.append((name.strip(), value.strip()))
    return out


def view_of(msg: StoredMessage) -> MessageView:
    """Read the HTTP fields back out of a stored message (from either front door)."""
    pairs = parse_headers(msg.headers)
    lower = {k.lower(): v for k, v in reversed(pairs)}
    metadata: dict[str, str] = {}
    names = lower.get(METADATA_HEADERS.lower(), "")
    for name in (n.strip() for n in names.split(",")):
        if name and name.lower() in lower:
            metadata[name] = lower[name.lower()]
    return MessageView(
        seq=msg.seq,
        message_id=lower.get("nats-msg-id") or f"s{msg.seq}",
        payload=msg.data,
        content_type=lower.get("content-type") or DEFAULT_CONTENT_TYPE,
        producer=lower.get("tether-producer", ""),
        ts=msg.ts,
        priority=msg.priority,
        metadata=metadata,
    )


def encode_headers(
    message_id: str, content_type: str, priority: int, producer: str, metadata: dict[str, str]
) -> bytes:
    lines = [
        "NATS/1.0",
        f"Nats-Msg-Id: {message_id}",
        f"Content-Type: {content_type}",
        f"Tether-Priority: {priority}",
        f"Tether-Producer: {producer}",
    ]
    for name, value in metadata.items():
        lines.append(f"{name}: {value}")
    if metadata:
        lines.append(f"{METADATA_HEADERS}: {','.join(sorted(metadata))}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
