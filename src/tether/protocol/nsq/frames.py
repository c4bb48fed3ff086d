"""Frames from nsqd to a client: ``[size int32][frame type int32][data]``, big-endian,
where size counts the type and the data. Encoders for the server, a reader for clients.

A message frame's data is ``[timestamp int64 ns][attempts uint16][id: 16 ASCII bytes]
[body]``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

MSG_ID_LENGTH = 16
_HEAD = struct.Struct(">ii")
_MESSAGE_HEAD = struct.Struct(">iiqH")
_MESSAGE_FIELDS = struct.Struct(">qH")


def frame(frame_type: int, data: bytes) -> bytes:
    return _HEAD.pack(len(data) + 4, frame_type) + data


def response(data: bytes) -> bytes:
    return frame(FRAME_RESPONSE, data)


def error(data: bytes) -> bytes:
    return frame(FRAME_ERROR, data)


OK = response(b"OK")
HEARTBEAT = response(b"_heartbeat_")
CLOSE_WAIT = response(b"CLOSE_WAIT")

_pack_message_head = _MESSAGE_HEAD.pack


def message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """One message frame (``msg_id`` is 16 bytes)."""
    return _pack_message_head(len(body) + 30, FRAME_MESSAGE, timestamp, attempts) + msg_id + body


def message_head(size_of_body: int, timestamp: int, attempts: int) -> bytes:
    """A message frame up to its id: the hot path joins head, id and body itself."""
    return _pack_message_head(size_of_body + 30, FRAME_MESSAGE, timestamp, attempts)


class Message(NamedTuple):
    """A message frame as a client reads it."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class Frame(NamedTuple):
    frame_type: int
    data: bytes

    def message(self) -> Message:
        """The data of a message frame, split into its fields."""
        ts, attempts = _MESSAGE_FIELDS.unpack_from(self.data)
        return Message(ts, attempts, self.data[10:26], self.data[26:])


class FrameError(Exception):
    """The server sent something that is not a frame (a size below 4)."""


class FrameReader:
    """Client side: bytes as they arrive from nsqd in, complete frames out."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf + data if self._buf else data
        out: list[Frame] = []
        pos = 0
        n = len(buf)
        while n - pos >= 8:
            size, frame_type = _HEAD.unpack_from(buf, pos)
            if size < 4:
                raise FrameError(f"frame size {size} is below 4")
            end = pos + 4 + size
            if end > n:
                break
            out.append(Frame(frame_type, buf[pos + 8 : end]))
            pos = end
        self._buf = buf[pos:]
        return out
