"""JetStream API objects: stream and consumer configs, infos and publish acks.

Durations are seconds (floats) in Python and nanoseconds on the wire; the listed
``_DURATIONS`` fields are converted at the boundary. Unset fields (``None``) are left
out of requests so the server applies its defaults; unknown response fields are
ignored, so newer servers do not break older clients.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import msgspec

T = TypeVar("T", bound="ApiObject")


class RetentionPolicy(StrEnum):
    """When a stream may discard messages: by limits, once all consumers saw them, or once acked."""

    LIMITS = "limits"
    INTEREST = "interest"
    WORK_QUEUE = "workqueue"


class StorageType(StrEnum):
    """Where a stream keeps its messages."""

    FILE = "file"
    MEMORY = "memory"


class DiscardPolicy(StrEnum):
    """What a full stream does with a new message: drop the oldest or refuse the new one."""

    OLD = "old"
    NEW = "new"


class AckPolicy(StrEnum):
    """How a consumer expects acknowledgements: none, cumulative (all) or per message."""

    NONE = "none"
    ALL = "all"
    EXPLICIT = "explicit"


class DeliverPolicy(StrEnum):
    """Where a new consumer starts in its stream."""

    ALL = "all"
    LAST = "last"
    NEW = "new"
    BY_START_SEQUENCE = "by_start_sequence"
    BY_START_TIME = "by_start_time"
    LAST_PER_SUBJECT = "last_per_subject"


class ReplayPolicy(StrEnum):
    """Deliver as fast as possible, or at the pace the messages were stored."""

    INSTANT = "instant"
    ORIGINAL = "original"


class ApiObject(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Base: converts duration fields between seconds and nanoseconds."""

    _DURATIONS: ClassVar[frozenset[str]] = frozenset()
    _NESTED: ClassVar[dict[str, type[ApiObject]]] = {}

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict the server expects (durations in nanoseconds)."""
        raw: dict[str, Any] = msgspec.to_builtins(self)
        for key in self._DURATIONS & raw.keys():
            raw[key] = _to_ns(raw[key])
        for key in self._NESTED:
            value = getattr(self, key, None)
            if isinstance(value, ApiObject):
                raw[key] = value.to_wire()
        return raw

    @classmethod
    def from_wire(cls: type[T], raw: dict[str, Any]) -> T:
        """Build from a server response (durations in nanoseconds)."""
        data = dict(raw)
        for key in cls._DURATIONS & data.keys():
            data[key] = _from_ns(data[key])
        for key, kind in cls._NESTED.items():
            if isinstance(data.get(key), dict):
                data[key] = kind.from_wire(data[key])
        return msgspec.convert(data, cls, strict=False)


def _to_ns(value: Any) -> Any:
    if isinstance(value, list):
        return [_to_ns(v) for v in value]
    if isinstance(value, int | float):
        return round(value * 1_000_000_000)
    return value


def _from_ns(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_ns(v) for v in value]
    if isinstance(value, int | float):
        return value / 1_000_000_000
    return value


class StreamConfig(ApiObject):
    """A stream's configuration; ``name`` is required."""

    _DURATIONS: ClassVar[frozenset[str]] = frozenset({"max_age", "duplicate_window"})

    name: str
    subjects: list[str] | None = None
    description: str | None = None
    retention: RetentionPolicy | None = None
    max_consumers: int | None = None
    max_msgs: int | None = None
    max_bytes: int | None = None
    max_age: float | None = None
    max_msgs_per_subject: int | None = None
    max_msg_size: int | None = None
    storage: StorageType | None = None
    discard: DiscardPolicy | None = None
    num_replicas: int | None = None
    duplicate_window: float | None = None
    no_ack: bool | None = None
    allow_rollup_hdrs: bool | None = None
    deny_delete: bool | None = None
    deny_purge: bool | None = None
    allow_direct: bool | None = None
    metadata: dict[str, str] | None = None


class StreamState(ApiObject):
    """Message counts and sequence range of a stream."""

    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    first_ts: str | None = None
    last_seq: int = 0
    last_ts: str | None = None
    num_subjects: int | None = None
    num_deleted: int | None = None
    consumer_count: int = 0
    subjects: dict[str, int] | None = None


class StreamInfo(ApiObject):
    """A stream's configuration and state, as the server reports them."""

    _NESTED: ClassVar[dict[str, type[ApiObject]]] = {"config": StreamConfig, "state": StreamState}

    config: StreamConfig
    state: StreamState
    created: str | None = None
    did_create: bool | None = None


class ConsumerConfig(ApiObject):
    """A consumer's configuration. Pull consumers leave ``deliver_subject`` unset."""

    _DURATIONS: ClassVar[frozenset[str]] = frozenset(
        {"ack_wait", "max_expires", "inactive_threshold", "idle_heartbeat", "backoff"}
    )

    name: str | None = None
    durable_name: str | None = None
    description: str | None = None
    deliver_policy: DeliverPolicy | None = None
    opt_start_seq: int | None = None
    opt_start_time: str | None = None
    ack_policy: AckPolicy | None = None
    ack_wait: float | None = None
    max_deliver: int | None = None
    backoff: list[float] | None = None
    filter_subject: str | None = None
    filter_subjects: list[str] | None = None
    replay_policy: ReplayPolicy | None = None
    max_waiting: int | None = None
    max_ack_pending: int | None = None
    max_batch: int | None = None
    max_expires: float | None = None
    max_bytes: int | None = None
    inactive_threshold: float | None = None
    deliver_subject: str | None = None
    deliver_group: str | None = None
    flow_control: bool | None = None
    idle_heartbeat: float | None = None
    headers_only: bool | None = None
    mem_storage: bool | None = None
    num_replicas: int | None = None
    metadata: dict[str, str] | None = None


class SequenceInfo(ApiObject):
    """A consumer position: consumer and stream sequence."""

    consumer_seq: int = 0
    stream_seq: int = 0
    last_active: str | None = None


class ConsumerInfo(ApiObject):
    """A consumer's configuration and delivery state, as the server reports them."""

    _NESTED: ClassVar[dict[str, type[ApiObject]]] = {"config": ConsumerConfig}

    stream_name: str
    name: str
    config: ConsumerConfig
    created: str | None = None
    delivered: SequenceInfo | None = None
    ack_floor: SequenceInfo | None = None
    num_ack_pending: int = 0
    num_redelivered: int = 0
    num_waiting: int = 0
    num_pending: int = 0
    push_bound: bool | None = None


class PubAck(msgspec.Struct, frozen=True):
    """The server's acknowledgement of a publish to a stream."""

    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None


class _ErrorBody(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAckResponse(msgspec.Struct):
    """A publish reply: either a PubAck or an error object (decoded in one pass)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: _ErrorBody | None = None
