"""Encoders: pure functions returning the bytes of one protocol frame."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

CRLF = b"\r\n"
PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"

_json_encode = msgspec.json.Encoder().encode


def encode(text: str) -> bytes:
    """The inverse of :func:`tether.protocol.nats.parser.decode`."""
    return text.encode("utf-8", "surrogateescape")


def encode_info(info: Mapping[str, Any]) -> bytes:
    # nats-server writes a space before CRLF; some clients match the line that way.
    return b"INFO " + _json_encode(info) + b" \r\n"


def encode_connect(options: Mapping[str, Any]) -> bytes:
    return b"CONNECT " + _json_encode(options) + CRLF


def encode_err(message: str) -> bytes:
    return b"-ERR '" + encode(message) + b"'\r\n"


def encode_pub(subject: str, payload: bytes, reply: str = "") -> bytes:
    head = b"PUB " + encode(subject)
    if reply:
        head += b" " + encode(reply)
    return b"%s %d\r\n%s\r\n" % (head, len(payload), payload)


def encode_hpub(subject: str, headers: bytes, payload: bytes, reply: str = "") -> bytes:
    head = b"HPUB " + encode(subject)
    if reply:
        head += b" " + encode(reply)
    hlen = len(headers)
    return b"%s %d %d\r\n%s%s\r\n" % (head, hlen, hlen + len(payload), headers, payload)


def encode_sub(subject: str, sid: str, queue: str = "") -> bytes:
    if queue:
        return b"SUB %s %s %s\r\n" % (encode(subject), encode(queue), encode(sid))
    return b"SUB %s %s\r\n" % (encode(subject), encode(sid))


def encode_unsub(sid: str, max_msgs: int = 0) -> bytes:
    if max_msgs:
        return b"UNSUB %s %d\r\n" % (encode(sid), max_msgs)
    return b"UNSUB %s\r\n" % encode(sid)


def encode_msg(subject: bytes, sid: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """A MSG frame; arguments are already-encoded bytes (the server's hot path)."""
    if reply:
        return b"MSG %s %s %s %d\r\n%s\r\n" % (subject, sid, reply, len(payload), payload)
    return b"MSG %s %s %d\r\n%s\r\n" % (subject, sid, len(payload), payload)


def encode_hmsg(
    subject: bytes, sid: bytes, headers: bytes, payload: bytes, reply: bytes = b""
) -> bytes:
    hlen = len(headers)
    total = hlen + len(payload)
    if reply:
        return b"HMSG %s %s %s %d %d\r\n%s%s\r\n" % (
            subject,
            sid,
            reply,
            hlen,
            total,
            headers,
            payload,
        )
    return b"HMSG %s %s %d %d\r\n%s%s\r\n" % (subject, sid, hlen, total, headers, payload)
