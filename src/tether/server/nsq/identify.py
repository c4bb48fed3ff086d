"""IDENTIFY: a client's settings, checked against nsqd's ranges, and the features the
server agrees to (its JSON answer when the client asks for feature negotiation).

Settings an NSQ client may change, and their ranges (all milliseconds but sizes):
``heartbeat_interval`` -1 (off) or 1000..max_heartbeat_interval; ``output_buffer_size``
-1, or 64..max_output_buffer_size; ``output_buffer_timeout`` -1 or
25..max_output_buffer_timeout; ``sample_rate`` 0..99; ``msg_timeout`` 1000..max_msg_timeout;
0 keeps the default everywhere. Unknown keys are ignored (clients send ``short_id`` and
``long_id``). ``tls_v1`` is answered true when the server has a certificate for NSQ
clients (see :mod:`tether.server.nsq.tls`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

NSQD_VERSION = "1.3.0"  # the nsqd release whose protocol this front door speaks
MIN_OUTPUT_BUFFER_TIMEOUT_MS = 25
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024


class IdentifyData(msgspec.Struct):
    """The IDENTIFY body; a field of the wrong type fails it, as Go's decoding does."""

    client_id: str = ""
    hostname: str = ""
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    user_agent: str = ""
    msg_timeout: int = 0
    topology_region: str = ""
    topology_zone: str = ""


_decode = msgspec.json.Decoder(IdentifyData).decode
_encode = msgspec.json.Encoder().encode


class IdentifyError(Exception):
    """A setting out of range: ``IDENTIFY <text>`` (E_BAD_BODY, fatal)."""


class NegotiationError(IdentifyError):
    """Features that cannot go together (E_IDENTIFY_FAILED, fatal)."""


@dataclass(slots=True)
class ServerLimits:
    """What the server allows and defaults to (its nsqd-style settings)."""

    max_rdy_count: int = 2500
    msg_timeout_ms: int = 60_000
    max_msg_timeout_ms: int = 900_000
    heartbeat_interval_ms: int = 30_000
    max_heartbeat_interval_ms: int = 60_000
    output_buffer_timeout_ms: int = 250
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout_ms: int = 30_000
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    auth_required: bool = False


@dataclass(slots=True)
class ClientSettings:
    """One connection's settings after IDENTIFY (or the defaults without one)."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval_ms: int = 30_000  # 0: no heartbeats
    output_buffer_size: int = DEFAULT_OUTPUT_BUFFER_SIZE
    output_buffer_timeout_ms: int = 250
    sample_rate: int = 0
    msg_timeout_ms: int = 60_000
    deflate_level: int = 0  # > 0: deflate negotiated
    snappy: bool = False

    @classmethod
    def defaults(cls, limits: ServerLimits) -> ClientSettings:
        return cls(
            heartbeat_interval_ms=limits.heartbeat_interval_ms,
            output_buffer_timeout_ms=limits.output_buffer_timeout_ms,
            msg_timeout_ms=limits.msg_timeout_ms,
        )


def decode(body: bytes) -> IdentifyData:
    """The body as JSON; raises ``msgspec.DecodeError`` / ``ValidationError``."""
    return _decode(body)


def apply(settings: ClientSettings, data: IdentifyData, limits: ServerLimits) -> None:
    """nsqd's ``clientV2.Identify``: each setting checked in its order."""
    settings.client_id = data.client_id
    settings.hostname = data.hostname
    settings.user_agent = data.user_agent
    hb = data.heartbeat_interval
    if hb == -1:
        settings.heartbeat_interval_ms = 0
    elif hb != 0:
        if not 1000 <= hb <= limits.max_heartbeat_interval_ms:
            raise IdentifyError(f"heartbeat interval ({hb}) is invalid")
        settings.heartbeat_interval_ms = hb
    timeout = data.output_buffer_timeout
    if timeout == -1:
        settings.output_buffer_timeout_ms = 0
    elif timeout != 0:
        if not MIN_OUTPUT_BUFFER_TIMEOUT_MS <= timeout <= limits.max_output_buffer_timeout_ms:
            raise IdentifyError(f"output buffer timeout ({timeout}) is invalid")
        settings.output_buffer_timeout_ms = timeout
    size = data.output_buffer_size
    if size == -1:
        settings.output_buffer_size = 1
        settings.output_buffer_timeout_ms = 0
    elif size != 0:
        if not 64 <= size <= limits.max_output_buffer_size:
            raise IdentifyError(f"output buffer size ({size}) is invalid")
        settings.output_buffer_size = size
    if not 0 <= data.sample_rate <= 99:
        raise IdentifyError(f"sample rate ({data.sample_rate}) is invalid")
    settings.sample_rate = data.sample_rate
    msg_timeout = data.msg_timeout
    if msg_timeout != 0:
        if not 1000 <= msg_timeout <= limits.max_msg_timeout_ms:
            raise IdentifyError(f"msg timeout ({msg_timeout}) is invalid")
        settings.msg_timeout_ms = msg_timeout


def negotiate(
    settings: ClientSettings, data: IdentifyData, limits: ServerLimits, *, tls: bool = False
) -> tuple[bytes, str]:
    """The JSON answer (nsqd's keys, in its order) and the compression to switch to
    (``"deflate"``, ``"snappy"`` or ``""``). Raises IdentifyError for both at once."""
    deflate = limits.deflate and data.deflate
    level = 6
    if deflate and data.deflate_level > 0:
        level = data.deflate_level
    level = min(level, limits.max_deflate_level)
    snappy = limits.snappy and data.snappy
    if deflate and snappy:
        raise NegotiationError("cannot enable both deflate and snappy compression")
    answer: dict[str, Any] = {
        "max_rdy_count": limits.max_rdy_count,
        "version": NSQD_VERSION,
        "max_msg_timeout": limits.max_msg_timeout_ms,
        "msg_timeout": settings.msg_timeout_ms,
        "tls_v1": tls,
        "deflate": deflate,
        "deflate_level": level,
        "max_deflate_level": limits.max_deflate_level,
        "snappy": snappy,
        "sample_rate": settings.sample_rate,
        "auth_required": limits.auth_required,
        "output_buffer_size": settings.output_buffer_size,
        "output_buffer_timeout": settings.output_buffer_timeout_ms,
        "topology_region": "",
        "topology_zone": "",
    }
    if deflate:
        settings.deflate_level = max(level, 1)
        return _encode(answer), "deflate"
    if snappy:
        settings.snappy = True
        return _encode(answer), "snappy"
    return _encode(answer), ""
