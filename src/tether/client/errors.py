"""Typed errors of the client SDK.

Every error the SDK raises derives from :class:`ClientError`. Errors that mean "this
took too long" also derive from the built-in :class:`TimeoutError`, so code written
against asyncio keeps working. JetStream API failures are :class:`ApiError` (or a
subclass picked by ``err_code``) carrying the server's ``code``, ``err_code`` and
``description`` unchanged.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base class of every error raised by ``tether.client``."""


# -- connection ---------------------------------------------------------------------


class ConnectionClosed(ClientError):
    """The connection is closed (by :meth:`Connection.close`, or reconnecting gave up)."""


class NoServersAvailable(ConnectionClosed):
    """No server in the list accepted a connection."""


class AuthorizationError(ClientError):
    """The server refused our credentials (``-ERR 'Authorization Violation'``)."""


class StaleConnection(ClientError):
    """The server stopped answering PINGs; the connection was dropped and is being replaced."""


class ProtocolViolation(ClientError):
    """The server sent bytes that are not the NATS protocol (the connection is dropped)."""


class ServerError(ClientError):
    """The server sent ``-ERR`` with this message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PermissionsViolation(ServerError):
    """The server refused a publish or subscribe for lack of permission (connection stays)."""


class OutboundBufferFull(ClientError):
    """Too much data is waiting for a connection that is being re-established."""


class MaxPayloadExceeded(ClientError):
    """A message is larger than the server's ``max_payload``."""


class SlowConsumer(ClientError):
    """A subscription's pending queue overflowed and messages were dropped."""

    def __init__(self, subject: str, sid: str) -> None:
        super().__init__(f"slow consumer on {subject!r} (sid {sid}): messages dropped")
        self.subject = subject
        self.sid = sid


class BadSubscription(ClientError):
    """The subscription is closed or cannot be used this way."""


# -- requests -----------------------------------------------------------------------


class Timeout(ClientError, TimeoutError):
    """An operation did not complete in time."""


class FlushTimeout(Timeout):
    """The server did not answer a PING within the flush timeout."""


class NoResponders(ClientError):
    """A request reached no subscriber (the server answered with status 503)."""


class PublishStalled(Timeout):
    """``publish_async`` could not get a slot: too many publishes await their ack."""


# -- JetStream ----------------------------------------------------------------------


class JetStreamError(ClientError):
    """Base of JetStream-specific failures."""


class NotJetStreamMessage(JetStreamError):
    """The message has no JetStream ack subject (cannot be acked, no metadata)."""


class MsgAlreadyAcked(JetStreamError):
    """The message has already been acked, naked or terminated."""


class NoStreamResponse(NoResponders, JetStreamError):
    """A publish reached no stream: no stream captures the subject, or JetStream is off."""


class PullError(JetStreamError):
    """A pull request ended with a status the caller must hear about (e.g. 409, 400)."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(f"{status} {description}".strip())
        self.status = status
        self.description = description


class ConsumerDeleted(PullError):
    """The consumer was deleted while a pull request waited (status 409)."""


class HeartbeatMissed(JetStreamError):
    """No message and no idle heartbeat arrived for two heartbeat intervals: the pull is dead."""


class ApiError(JetStreamError):
    """The JetStream API answered with an error object."""

    def __init__(self, code: int = 0, err_code: int = 0, description: str = "") -> None:
        super().__init__(f"{description} (code={code}, err_code={err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description

    @classmethod
    def from_response(cls, error: dict[str, Any]) -> ApiError:
        """Build the most specific subclass for an ``{"error": {...}}`` object."""
        code = int(error.get("code") or 0)
        err_code = int(error.get("err_code") or 0)
        description = str(error.get("description") or "")
        kind = _BY_ERR_CODE.get(err_code) or _BY_CODE.get(code, ApiError)
        return kind(code, err_code, description)


class BadRequest(ApiError):
    """HTTP-like 400 from the JetStream API."""


class NotFound(ApiError):
    """HTTP-like 404 from the JetStream API."""


class StreamNotFound(NotFound):
    """err_code 10059."""


class ConsumerNotFound(NotFound):
    """err_code 10014."""


class NoMessageFound(NotFound):
    """err_code 10037."""


class ServiceUnavailable(ApiError):
    """HTTP-like 503 from the JetStream API (JetStream disabled, limits reached)."""


class ServerApiError(ApiError):
    """HTTP-like 500 from the JetStream API."""


class WrongLastSequence(BadRequest):
    """err_code 10071: an expected-last-sequence check failed."""


class WrongLastMsgId(BadRequest):
    """err_code 10070: an expected-last-msg-id check failed."""


class StreamNameInUse(BadRequest):
    """err_code 10058: the stream exists with a different configuration."""


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    404: NotFound,
    500: ServerApiError,
    503: ServiceUnavailable,
}
_BY_ERR_CODE: dict[int, type[ApiError]] = {
    10059: StreamNotFound,
    10014: ConsumerNotFound,
    10037: NoMessageFound,
    10071: WrongLastSequence,
    10070: WrongLastMsgId,
    10058: StreamNameInUse,
}
