"""Commands from a client to nsqd: what the parser yields, and pure encoders for clients.

A command is a line ``VERB param param\\n``; ``IDENTIFY``, ``AUTH``, ``PUB`` and
``DPUB`` are followed by ``[size int32][body]``, ``MPUB`` by ``[size int32][count
int32]`` and ``[size int32][body]`` per message. The parser hands over runs: consecutive
``PUB`` s to one topic as one :class:`PubRun`, consecutive ``FIN`` s as one
:class:`FinRun`, so a connection does its per-command work once per run.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgspec

MAGIC_V2 = b"  V2"

_SIZE = struct.Struct(">i")
_encode_json = msgspec.json.Encoder().encode


class Command(NamedTuple):
    """A command line, with the body ``IDENTIFY`` and ``AUTH`` carry (empty otherwise).
    ``params`` are the space-separated words after the verb, unchecked."""

    verb: bytes
    params: list[bytes]
    body: bytes = b""


class PubRun(NamedTuple):
    """One or more consecutive ``PUB`` s to one (valid) topic, in order."""

    topic: bytes
    bodies: list[bytes]


class MPub(NamedTuple):
    """An ``MPUB``: its messages, every one checked for size."""

    topic: bytes
    bodies: list[bytes]


class DPub(NamedTuple):
    """A ``DPUB`` with its defer time, checked against ``max_req_timeout``."""

    topic: bytes
    defer_ms: int
    body: bytes


class FinRun(NamedTuple):
    """One or more consecutive ``FIN`` s, each with a 16-byte message id."""

    ids: list[bytes]


# -- encoders (client → server) ---------------------------------------------------------------


def identify(data: dict[str, Any]) -> bytes:
    body = _encode_json(data)
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def auth(secret: bytes) -> bytes:
    return b"AUTH\n" + _SIZE.pack(len(secret)) + secret


def sub(topic: str, channel: str) -> bytes:
    return b"SUB %s %s\n" % (topic.encode(), channel.encode())


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, delay_ms)


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB %s\n" % topic.encode() + _SIZE.pack(len(body)) + body


def dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return b"DPUB %s %d\n" % (topic.encode(), delay_ms) + _SIZE.pack(len(body)) + body


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    pack = _SIZE.pack
    parts = [pack(len(bodies))]
    for body in bodies:
        parts.append(pack(len(body)))
        parts.append(body)
    payload = b"".join(parts)
    return b"MPUB %s\n" % topic.encode() + pack(len(payload)) + payload
