"""Consumer configuration: nats-server's JSON shape, defaults, validation and update rules.

Field names, defaults and error codes follow nats-server (``consumer.go``:
``setConsumerConfigDefaults``, ``checkConsumerCfg``, ``checkNewConsumerConfig``) so a
client sees the same replies. Durations are nanoseconds, as on the wire.

Tether extension: ``priority_order: true`` delivers the highest ``Tether-Priority``
first (oldest first among equals) instead of stream order.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from tether.engine import errors
from tether.engine.errors import ApiError
from tether.engine.limits import ServerLimits, max_ack_pending_excess, max_request_batch_excess
from tether.engine.streams.config import StreamConfig, is_valid_name
from tether.engine.subjects import is_literal, is_subset, is_valid_filter, is_valid_subject
from tether.protocol.numbers import parse_uint

NS = 1_000_000_000
DEFAULT_ACK_WAIT = 30 * NS
DEFAULT_MAX_ACK_PENDING = 1000
DEFAULT_MAX_WAITING = 512
DEFAULT_INACTIVE_THRESHOLD = 5 * NS
MIN_HEARTBEAT = 100_000_000  # 100 ms

DeliverPolicy = Literal[
    "all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"
]
AckPolicy = Literal["none", "all", "explicit", "flow_control"]
ReplayPolicy = Literal["instant", "original"]
PriorityPolicy = Literal["none", "overflow", "pinned_client", "prioritized"]
DEFAULT_PINNED_TTL = 120 * NS  # nats-server's JsDefaultPinnedTTL
MAX_METADATA = 128 * 1024  # JSMaxMetadataLen: keys plus values
# nats-server's validGroupName: 1 to 16 of these, nothing else.
GROUP_NAME = re.compile(r"[a-zA-Z0-9/_=-]{1,16}")


class ConsumerConfig(msgspec.Struct, kw_only=True):
    """A consumer's configuration. Zero values mean "not set", as in nats-server."""

    durable_name: str = ""
    name: str = ""
    description: str = ""
    deliver_policy: DeliverPolicy = "all"
    opt_start_seq: int = 0
    opt_start_time: str | None = None
    # nats-server's zero value: a create request without ack_policy gets "none".
    ack_policy: AckPolicy = "none"
    ack_wait: int = 0
    max_deliver: int = 0
    backoff: list[int] = msgspec.field(default_factory=list)
    filter_subject: str = ""
    filter_subjects: list[str] = msgspec.field(default_factory=list)
    replay_policy: ReplayPolicy = "instant"
    rate_limit_bps: int = 0
    sample_freq: str = ""
    max_waiting: int = 0
    max_ack_pending: int = 0
    flow_control: bool = False
    headers_only: bool = False
    max_batch: int = 0
    max_expires: int = 0
    max_bytes: int = 0
    deliver_subject: str = ""
    deliver_group: str = ""
    idle_heartbeat: int = 0
    inactive_threshold: int = 0
    num_replicas: int = 0
    mem_storage: bool = False
    direct: bool = False
    metadata: dict[str, str] | None = None
    pause_until: str | None = None
    sourcing: bool = False
    priority_groups: list[str] = msgspec.field(default_factory=list)
    priority_policy: PriorityPolicy = "none"
    priority_timeout: int = 0
    priority_order: bool = False

    @property
    def is_pull(self) -> bool:
        return not self.deliver_subject

    @property
    def is_durable(self) -> bool:
        return bool(self.durable_name)

    @property
    def filters(self) -> tuple[str, ...]:
        if self.filter_subject:
            return (self.filter_subject,)
        return tuple(self.filter_subjects)

    def to_dict(self) -> dict[str, Any]:
        """The reply shape: zero values omitted like Go's ``omitempty``."""
        out: dict[str, Any] = {}
        for field in self.__struct_fields__:
            value = getattr(self, field)
            if field in _ALWAYS or (value and value != "none"):
                out[field] = value if not isinstance(value, list) else list(value)
        return out

    @property
    def has_priority_groups(self) -> bool:
        return self.priority_policy != "none"


# Fields nats-server writes even when zero.
_ALWAYS = frozenset({"deliver_policy", "ack_policy", "replay_policy", "num_replicas"})


class CreateRequest(msgspec.Struct):
    """Body of ``CONSUMER.CREATE``: ``{"stream_name", "config", "action"}``."""

    stream_name: str = ""
    config: ConsumerConfig = msgspec.field(default_factory=ConsumerConfig)
    action: str = ""
    pedantic: bool = False


_request_decoder = msgspec.json.Decoder(CreateRequest)
_config_decoder = msgspec.json.Decoder(ConsumerConfig)
_encoder = msgspec.json.Encoder()


def decode_request(raw: bytes) -> CreateRequest:
    """Decode a create request; bad JSON or wrong types give 10025."""
    try:
        return _request_decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise errors.invalid_json(str(exc)) from None


def decode_config(raw: bytes) -> ConsumerConfig:
    return _config_decoder.decode(raw)


def encode_config(config: ConsumerConfig) -> bytes:
    return _encoder.encode(config)


# -- errors (nats-server's errors.json) -----------------------------------------------------


def _e(code: int, err_code: int, description: str) -> ApiError:
    return ApiError(code, err_code, description)


def consumer_exists() -> ApiError:
    return _e(400, 10148, "consumer already exists")


def consumer_does_not_exist() -> ApiError:
    return _e(400, 10149, "consumer does not exist")


def consumer_name_in_use() -> ApiError:
    return _e(400, 10013, "consumer name already in use")


def durable_mismatch() -> ApiError:
    return _e(400, 10017, "consumer name in subject does not match durable name in request")


def durable_not_set() -> ApiError:
    return _e(400, 10018, "consumer expected to be durable but a durable name was not set")


def ephemeral_with_durable() -> ApiError:
    return _e(400, 10020, "consumer expected to be ephemeral but a durable name was set in request")


def filter_mismatch() -> ApiError:
    return _e(
        400, 10131, "Consumer create request did not match filtered subject from create subject"
    )


def path_separators() -> ApiError:
    return _e(400, 10127, "Consumer name can not contain path separators")


def update_refused(description: str) -> ApiError:
    return _e(500, 10012, description)


def wq_requires_explicit_ack() -> ApiError:
    return _e(400, 10098, "workqueue stream requires explicit ack")


def wq_multiple_unfiltered() -> ApiError:
    return _e(400, 10099, "multiple non-filtered consumers not allowed on workqueue stream")


def wq_not_unique() -> ApiError:
    return _e(400, 10100, "filtered consumer not unique on workqueue stream")


def wq_not_deliver_all() -> ApiError:
    return _e(400, 10101, "consumer must be deliver all on workqueue stream")


# -- time helpers --------------------------------------------------------------------------------

# ASCII digits only (``\d`` would take "٣" too), matched in full.
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(Z|z|[+-][0-9]{2}:[0-9]{2})"
)


def format_rfc3339(ns: int) -> str:
    """ns since the epoch → Go's RFC3339Nano in UTC (fraction trimmed), as nats-server."""
    if ns <= 0:
        return "0001-01-01T00:00:00Z"
    secs, frac = divmod(ns, NS)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}".rstrip("0").rstrip(".") + "Z"


def parse_rfc3339(text: str) -> int:
    """RFC 3339 (nanosecond precision) → ns since the epoch; ``ValueError`` if malformed."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"invalid time {text!r}")
    date, clock, frac, zone = m.groups()
    if date.startswith("0000"):
        return 0  # before Go's zero time (year 1), which reads as "not set"
    tz = "+00:00" if zone in ("Z", "z") else zone
    base = datetime.fromisoformat(f"{date}T{clock}{tz}")
    if base.year <= 1:
        return 0
    secs = int((base - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    nanos = int((frac or "0").ljust(9, "0"))
    return secs * NS + nanos


# -- defaults and validation -------------------------------------------------------------------


def pedantic_error(detail: str) -> ApiError:
    return _e(400, 10157, f"pedantic mode: {detail}")


def apply_defaults(
    config: ConsumerConfig,
    stream: StreamConfig,
    pedantic: bool = False,
    server: ServerLimits | None = None,
) -> ConsumerConfig:
    """Fill defaults exactly as nats-server's ``setConsumerConfigDefaults``.

    With ``pedantic`` (the create request's flag) every value nats-server would quietly
    fix is refused instead, with its 10157 texts. ``server``'s ``max_ack_pending``
    caps the default one; its ``max_request_batch`` is a pull consumer's default.
    """
    if config.max_deliver == 0 or config.max_deliver < -1:
        if pedantic and config.max_deliver < -1:
            raise pedantic_error("max_deliver must be set to -1")
        config.max_deliver = -1
    if config.max_ack_pending < -1 and pedantic:
        raise pedantic_error("max_ack_pending must be set to -1")
    for field, name in _NOT_NEGATIVE:
        if getattr(config, field) < 0:
            if pedantic:
                raise pedantic_error(f"{name} must not be negative")
            setattr(config, field, 0)
    if config.max_ack_pending < -1:
        config.max_ack_pending = -1
    if not config.deliver_subject and config.max_waiting == 0:
        config.max_waiting = DEFAULT_MAX_WAITING
    if config.ack_wait == 0 and config.ack_policy in ("explicit", "all"):
        config.ack_wait = DEFAULT_ACK_WAIT
    if config.backoff:
        if pedantic and config.ack_wait != config.backoff[0]:
            raise pedantic_error("first backoff value has to equal batch AckWait")
        config.ack_wait = config.backoff[0]
    limits = stream.consumer_limits or {}
    if config.max_ack_pending == 0:
        limit = int(limits.get("max_ack_pending") or 0)
        if pedantic and limit > 0:
            raise pedantic_error("max_ack_pending must be set if it's configured in stream limits")
        config.max_ack_pending = limit
    if config.inactive_threshold == 0:
        limit = int(limits.get("inactive_threshold") or 0)
        if pedantic and limit > 0:
            raise pedantic_error(
                "inactive_threshold must be set if it's configured in stream limits"
            )
        config.inactive_threshold = limit
    if config.max_ack_pending == 0 and config.ack_policy != "none":
        config.max_ack_pending = DEFAULT_MAX_ACK_PENDING
        if server is not None and 0 < server.max_ack_pending < DEFAULT_MAX_ACK_PENDING:
            config.max_ack_pending = server.max_ack_pending
    if (
        server is not None
        and server.max_request_batch > 0
        and not config.deliver_subject
        and config.max_batch == 0
    ):
        if pedantic:
            raise pedantic_error("max_request_batch must be set if it's JetStream limits are set")
        config.max_batch = server.max_request_batch
    if not config.durable_name and config.inactive_threshold == 0:
        config.inactive_threshold = DEFAULT_INACTIVE_THRESHOLD
    if config.priority_policy == "pinned_client" and config.priority_timeout == 0:
        config.priority_timeout = DEFAULT_PINNED_TTL
    if config.ack_policy == "flow_control" and not pedantic:
        # Acks come with the answers to flow control, which needs heartbeats of 1 s.
        config.flow_control = True
        config.idle_heartbeat = NS
    return config


# Fields nats-server sets to 0 when negative (in its order), with their names in its
# pedantic errors.
_NOT_NEGATIVE = (
    ("max_waiting", "max_waiting"),
    ("max_batch", "max_batch"),
    ("max_expires", "max_expires"),
    ("max_bytes", "max_bytes"),
    ("idle_heartbeat", "idle_heartbeat"),
    ("inactive_threshold", "inactive_threshold"),
    ("priority_timeout", "priority_timeout"),
)


def validate(
    config: ConsumerConfig, stream: StreamConfig, server: ServerLimits | None = None
) -> None:
    """nats-server's ``checkConsumerCfg``: raise the first problem as an :class:`ApiError`
    (``server``: the server's limits on max_batch and max_ack_pending)."""
    if config.name and not is_valid_name(config.name):
        raise errors.invalid_stream_config("consumer name can not contain '.', '*', '>', '\\', '/'")
    if config.durable_name and not is_valid_name(config.durable_name):
        raise errors.invalid_stream_config(
            "consumer durable name can not contain '.', '*', '>', '\\', '/'"
        )
    if config.num_replicas < 0:
        raise _e(400, 10133, "replicas count cannot be negative")
    if config.num_replicas > max(stream.num_replicas, 1):
        raise _e(400, 10126, "consumer config replica count exceeds parent stream")
    if any(b < 0 for b in config.backoff):
        raise _e(400, 10184, "consumer backoff needs to be positive")
    if config.ack_wait < 0:
        raise _e(400, 10183, "consumer ack wait needs to be positive")
    if config.ack_policy == "flow_control":
        _validate_ack_flow_control(config)
    if config.backoff and config.max_deliver != -1 and len(config.backoff) > config.max_deliver:
        raise _e(400, 10116, "max deliver is required to be > length of backoff values")
    if len(config.description) > 4096:
        raise _e(400, 10107, "consumer description is too long, maximum allowed is 4096")
    if config.deliver_subject:
        _validate_push(config, stream)
    else:
        _validate_pull(config, stream)
        if server is not None and 0 < server.max_request_batch < config.max_batch:
            raise max_request_batch_excess(server.max_request_batch)
    if server is not None and 0 < server.max_ack_pending < config.max_ack_pending:
        raise max_ack_pending_excess(server.max_ack_pending)
    # The stream's consumer_limits bound it the same way (the same error, its "system").
    stream_limit = int((stream.consumer_limits or {}).get("max_ack_pending") or 0)
    if 0 < stream_limit < config.max_ack_pending:
        raise max_ack_pending_excess(stream_limit)
    if config.filter_subject and config.filter_subjects:
        raise _e(400, 10136, "consumer cannot have both FilterSubject and FilterSubjects specified")
    if any(f == "" for f in config.filter_subjects):
        raise _e(400, 10139, "consumer filter in FilterSubjects cannot be empty")
    if config.direct:
        if not config.deliver_subject:
            raise _e(400, 10090, "consumer direct requires a push based consumer")
        if config.durable_name:
            raise _e(400, 10091, "consumer direct requires an ephemeral consumer")
    filters = config.filters
    for i, f in enumerate(filters):
        if not is_valid_filter(f):
            raise errors.invalid_stream_config("invalid subject")
        for j, g in enumerate(filters):
            if i != j and is_subset(f, g):
                raise _e(400, 10138, "consumer subject filters cannot overlap")
    _validate_start(config)
    if config.sample_freq:
        freq = config.sample_freq.removesuffix("%")
        if parse_uint(freq) is None:  # strconv.Atoi: ASCII digits that fit an int
            raise _e(
                400,
                10095,
                f"failed to parse consumer sampling configuration: invalid value {freq!r}",
            )
    if config.flow_control and config.idle_heartbeat == 0:
        raise _e(400, 10108, "consumer with flow control also needs heartbeats")
    if config.durable_name and config.name and config.name != config.durable_name:
        raise _e(400, 10132, "Consumer Durable and Name have to be equal if both are provided")
    if config.metadata and sum(len(k) + len(v) for k, v in config.metadata.items()) > MAX_METADATA:
        raise _e(400, 10135, "consumer metadata exceeds maximum size of 128KB")
    _validate_priority(config)
    for field in ("opt_start_time", "pause_until"):
        value = getattr(config, field)
        if value is not None:
            try:
                parse_rfc3339(value)
            except ValueError:
                raise errors.invalid_json(f"parsing time {value!r}") from None
    _refuse_unsupported(config)


def _validate_ack_flow_control(config: ConsumerConfig) -> None:
    """``ack_policy: flow_control`` (2.14): a push consumer acknowledged by its answers
    to flow control requests, checked as nats-server checks it."""
    if not config.deliver_subject:
        raise _e(400, 10218, "flow control ack policy requires a push based consumer")
    if not config.flow_control:
        raise _e(400, 10219, "flow control ack policy requires flow control")
    if config.idle_heartbeat != NS:
        raise errors.invalid_stream_config("flow control ack policy heartbeat needs to be 1s")
    if config.max_ack_pending <= 0:
        raise _e(400, 10220, "flow control ack policy requires max ack pending")
    if config.ack_wait != 0 or config.backoff:
        raise _e(400, 10221, "flow control ack policy requires unset ack wait")
    if config.max_deliver > 0:
        raise _e(400, 10222, "flow control ack policy requires unset max deliver")


def _validate_priority(config: ConsumerConfig) -> None:
    """Priority groups (ADR-42), checked as nats-server's ``checkConsumerCfg``."""
    if config.priority_policy != "none":
        if config.deliver_subject:
            raise _e(400, 10178, "priority groups can not be used with push consumers")
        if not config.priority_groups:
            raise _e(
                400, 10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set"
            )
        for group in config.priority_groups:
            if not group:
                raise _e(400, 10161, "Group name cannot be an empty string")
            if not GROUP_NAME.fullmatch(group):
                raise invalid_group_name()
    else:
        if config.priority_groups:
            raise _e(400, 10196, "consumer can not have priority groups when policy is none")
        if config.priority_timeout > 0:
            raise _e(400, 10197, "PinnedTTL cannot be set when PriorityPolicy is none")


def invalid_group_name() -> ApiError:
    return _e(
        400,
        10162,
        "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed "
        "16 characters",
    )


def _refuse_unsupported(config: ConsumerConfig) -> None:
    """What nats-server accepts but Tether does not do: refused, never dropped.

    ``sourcing`` is refused as invalid JSON (10025) on purpose: that is the answer on
    which a nats-server mirror or source retries its consumer without the flag.
    """
    if config.sourcing:
        raise errors.invalid_json("sourcing consumers are not supported by this server")


def _validate_push(config: ConsumerConfig, stream: StreamConfig) -> None:
    subject = config.deliver_subject
    if not is_literal(subject) and is_valid_filter(subject):
        raise _e(400, 10079, "consumer deliver subject has wildcards")
    if not is_valid_subject(subject):
        raise _e(400, 10112, "invalid push consumer deliver subject")
    if any(is_subset(subject, s) for s in stream.subjects):
        raise _e(400, 10081, "consumer deliver subject forms a cycle")
    if config.max_waiting != 0:
        raise _e(400, 10080, "consumer in push mode can not set max waiting")
    if config.max_ack_pending > 0 and config.ack_policy == "none":
        raise _e(400, 10082, "consumer requires ack policy for max ack pending")
    if 0 < config.idle_heartbeat < MIN_HEARTBEAT:
        raise _e(400, 10083, "consumer idle heartbeat needs to be >= 100ms")


def _validate_pull(config: ConsumerConfig, stream: StreamConfig) -> None:
    if config.ack_policy == "none" and stream.retention == "workqueue":
        raise _e(
            400, 10084, "consumer in pull mode requires explicit ack policy on workqueue stream"
        )
    if config.rate_limit_bps > 0:
        raise _e(400, 10086, "consumer in pull mode can not have rate limit set")
    if config.idle_heartbeat > 0:
        raise _e(400, 10088, "consumer idle heartbeat requires a push based consumer")
    if config.flow_control:
        raise _e(400, 10089, "consumer flow control requires a push based consumer")
    if config.max_expires and config.max_expires < 1_000_000:
        raise _e(400, 10115, "consumer max request expires needs to be >= 1ms")


def _validate_start(config: ConsumerConfig) -> None:
    policy = config.deliver_policy
    words = {
        "all": "all",
        "last": "last",
        "last_per_subject": "last per subject",
        "new": "new",
        "by_start_sequence": "by start sequence",
        "by_start_time": "by start time",
    }[policy]

    def bad(start: str) -> ApiError:
        return _e(
            400,
            10094,
            f"consumer delivery policy is deliver {words}, but optional start {start} is also set",
        )

    def missing(what: str) -> ApiError:
        return _e(
            400,
            10094,
            f"consumer delivery policy is deliver {words}, but optional {what} is not set",
        )

    if policy in ("all", "last", "last_per_subject", "new"):
        if config.opt_start_seq > 0:
            raise bad("sequence")
        if config.opt_start_time is not None:
            raise bad("time")
        if policy == "last_per_subject" and not config.filters:
            raise missing("filter subject")
    elif policy == "by_start_sequence":
        if config.opt_start_seq == 0:
            raise missing("start sequence")
        if config.opt_start_time is not None:
            raise bad("time")
    else:
        if config.opt_start_time is None:
            raise missing("start time")
        if config.opt_start_seq != 0:
            raise bad("start sequence")


def check_update(old: ConsumerConfig, new: ConsumerConfig, deliver_bound: bool) -> None:
    """What ``CONSUMER.CREATE`` may change on an existing consumer (``checkNewConsumerConfig``).

    ``deliver_bound`` tells whether the old deliver subject has interest.
    """
    if old == new:
        return
    same = [
        ("deliver_policy", "deliver policy can not be updated"),
        ("mem_storage", "storage type can not be updated"),
        ("direct", "direct can not be updated"),
        ("opt_start_seq", "start sequence can not be updated"),
        ("opt_start_time", "start time can not be updated"),
        ("ack_policy", "ack policy can not be updated"),
        ("replay_policy", "replay policy can not be updated"),
        ("idle_heartbeat", "heart beats can not be updated"),
        ("flow_control", "flow control can not be updated"),
        ("priority_order", "priority order can not be updated"),
    ]
    for field, message in same:
        if getattr(old, field) != getattr(new, field):
            raise update_refused(message)
    if old.deliver_subject != new.deliver_subject:
        if not old.deliver_subject:
            raise update_refused("can not update pull consumer to push based")
        if not new.deliver_subject:
            raise update_refused("can not update push consumer to pull based")
        if deliver_bound:
            raise consumer_name_in_use()
    if old.max_waiting != new.max_waiting:
        raise update_refused("max waiting can not be updated")
    if new.backoff and new.max_deliver != -1 and len(new.backoff) > new.max_deliver:
        raise _e(400, 10116, "max deliver is required to be > length of backoff values")
