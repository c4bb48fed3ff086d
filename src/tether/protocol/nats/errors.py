"""Protocol errors with the exact texts nats-server sends in ``-ERR '…'``."""

from __future__ import annotations


class ProtocolError(Exception):
    """The byte stream violates the NATS protocol.

    ``message`` is the text a server sends back as ``-ERR '<message>'``; ``fatal`` says
    whether the connection must be closed afterwards (the parser's state is unknown).
    """

    def __init__(self, message: str, *, fatal: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.fatal = fatal


UNKNOWN_OPERATION = "Unknown Protocol Operation"
MAX_CONTROL_LINE = "Maximum Control Line Exceeded"
MAX_PAYLOAD = "Maximum Payload Violation"
INVALID_PUBLISH_SUBJECT = "Invalid Publish Subject"
INVALID_SUBJECT = "Invalid Subject"
AUTH_VIOLATION = "Authorization Violation"
AUTH_TIMEOUT = "Authentication Timeout"
SLOW_CONSUMER = "Slow Consumer"
STALE_CONNECTION = "Stale Connection"
MAX_CONNECTIONS = "maximum connections exceeded"
SECURE_REQUIRED = "Secure Connection - TLS Required"
