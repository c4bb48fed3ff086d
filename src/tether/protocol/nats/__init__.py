"""The NATS client protocol: an incremental parser and pure encoders.

Shared by the server and the client SDK; knows nothing about sockets.
"""

from tether.protocol.nats.commands import (
    OK,
    PING,
    PONG,
    encode,
    encode_connect,
    encode_err,
    encode_hmsg,
    encode_hpub,
    encode_info,
    encode_msg,
    encode_pub,
    encode_sub,
    encode_unsub,
)
from tether.protocol.nats.errors import ProtocolError
from tether.protocol.nats.headers import Headers, encode_headers, header_value, parse_headers
from tether.protocol.nats.parser import Handler, Parser, decode

__all__ = [
    "OK",
    "PING",
    "PONG",
    "Handler",
    "Headers",
    "Parser",
    "ProtocolError",
    "decode",
    "encode",
    "encode_connect",
    "encode_err",
    "encode_headers",
    "encode_hmsg",
    "encode_hpub",
    "encode_info",
    "encode_msg",
    "encode_pub",
    "encode_sub",
    "encode_unsub",
    "header_value",
    "parse_headers",
]
