"""Pull requests on the wire and what their statuses mean to the caller.

Shared by :mod:`.pull` (fetch), :mod:`.consume` (continuous consumption) and
:mod:`.worker`.
"""

from __future__ import annotations

from tether.client.errors import ClientError, ConsumerDeleted, NoResponders, PullError
from tether.client.message import STATUS_CONFLICT, STATUS_NO_RESPONDERS
from tether.protocol.nats import header_value

# The server should expire a lingering pull this much before the client gives up,
# so its 408 arrives while we still listen (ADR: "100ms before the client side timeout").
EXPIRES_MARGIN = 0.1


def expires_ns(timeout: float) -> int:
    """``expires`` for a pull the client waits ``timeout`` seconds for."""
    return round((timeout - min(EXPIRES_MARGIN, timeout / 2)) * 1_000_000_000)


def no_wait_request(batch: int) -> bytes:
    return b'{"batch":%d,"no_wait":true}' % batch


def long_request(batch: int, expires: int, heartbeat: float | None = None) -> bytes:
    if heartbeat:
        return b'{"batch":%d,"expires":%d,"idle_heartbeat":%d}' % (
            batch,
            expires,
            round(heartbeat * 1_000_000_000),
        )
    return b'{"batch":%d,"expires":%d}' % (batch, expires)


def pending_messages(hdr: bytes) -> int:
    """``Nats-Pending-Messages`` of a 408/409 status: how many of a request were not sent."""
    raw = header_value(hdr, b"Nats-Pending-Messages")
    return int(raw) if raw and raw.isdigit() else 0


def status_error(status: int, description: str) -> ClientError:
    """The error a terminating pull status means for the caller."""
    if status == STATUS_NO_RESPONDERS:
        return NoResponders(f"pull reached no consumer ({status} {description})".strip())
    if status == STATUS_CONFLICT and "deleted" in description.lower():
        return ConsumerDeleted(status, description)
    return PullError(status, description)
