"""Protocol errors with the exact texts nats-server sends in ``-ERR '…'``."""

from __future__ import annotations


class ProtocolError(Exception):
    """The byte stream violates the NATS protocol.

    ``message`` is the text a server sends back as ``-ERR '<message>'``; ``fatal`` says
    whether the connection must be closed afterwards (the parser's state is unknown).
    ``silent`` errors are ones nats-server answers by closing the connection without
    any ``-ERR`` (malformed arguments of a known operation); ``message`` then only
    describes the problem for logs.
    """

    def __init__(self, message: str, *, fatal: bool = True, silent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.fatal = fatal
        self.silent = silent


UNKNOWN_OPERATION = "Unknown Protocol Operation"
MAX_CONTROL_LINE = "maximum control line exceeded"
MAX_PAYLOAD = "Maximum Payload Violation"
INVALID_PUBLISH_SUBJECT = "Invalid Publish Subject"
INVALID_SUBJECT = "Invalid Subject"
AUTH_VIOLATION = "Authorization Violation"
AUTH_TIMEOUT = "Authentication Timeout"
SLOW_CONSUMER = "Slow Consumer"
STALE_CONNECTION = "Stale Connection"
MAX_CONNECTIONS = "maximum connections exceeded"
SECURE_REQUIRED = "Secure Connection - TLS Required"
BAD_CLIENT_PROTOCOL = "invalid client protocol"
NO_RESPONDERS_REQUIRES_HEADERS = "no responders requires headers support"


def bad_arguments(what: str) -> ProtocolError:
    """Malformed arguments of a known op: nats-server closes the connection silently."""
    return ProtocolError(what, silent=True)
