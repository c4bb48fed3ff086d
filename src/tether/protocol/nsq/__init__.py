"""The NSQ TCP protocol (V2): an incremental parser of client commands, frame encoders.

Shared by the server and clients; knows nothing about sockets.
"""

from tether.protocol.nsq.commands import MAGIC_V2, Command, DPub, FinRun, MPub, PubRun
from tether.protocol.nsq.errors import NON_FATAL, Failure, go_quote
from tether.protocol.nsq.frames import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    Frame,
    FrameReader,
    Message,
)
from tether.protocol.nsq.names import is_ephemeral, is_valid_name
from tether.protocol.nsq.parser import Limits, Parsed, Parser

__all__ = [
    "CLOSE_WAIT",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "MAGIC_V2",
    "NON_FATAL",
    "OK",
    "Command",
    "DPub",
    "Failure",
    "FinRun",
    "Frame",
    "FrameReader",
    "Limits",
    "MPub",
    "Message",
    "Parsed",
    "Parser",
    "PubRun",
    "go_quote",
    "is_ephemeral",
    "is_valid_name",
]
