"""Stream configuration: nats-server's JSON shape, defaults, validation and update rules.

The checks follow nats-server's ``checkStreamCfg`` and ``configUpdateCheck`` in the
same order, with the same error codes and texts, so a client sees the same error for
the same mistake (mirrors, sources and subject transforms are checked in
``sourcing``). Features of nats-server that Tether does not implement (republish,
subject delete markers, counters, schedules, atomic batches) are decoded so that
requests carrying their zero values work, and refused with a clear error when actually
asked for. ``allow_msg_ttl`` is accepted (nats-py
sets it on every KV bucket) but a message that carries a TTL is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from tether.engine import errors
from tether.engine.clock import go_duration
from tether.engine.streams import sourcing
from tether.engine.streams.republish import check_republish
from tether.engine.subjects import filters_overlap, is_subset, is_valid_filter

NS = 1_000_000_000
DEFAULT_DUPLICATE_WINDOW = 120 * NS
MIN_DUPLICATE_WINDOW = 100_000_000  # 100 ms
MIN_MAX_AGE = 100_000_000  # 100 ms
MAX_NAME_LEN = 255
MAX_DESCRIPTION_LEN = 4 * 1024
MAX_METADATA_LEN = 128 * 1024
MAX_REPLICAS = 5

Retention = Literal["limits", "interest", "workqueue"]
Discard = Literal["old", "new"]
StorageType = Literal["file", "memory"]
Compression = Literal["none", "s2"]

# Subject spaces a stream may only capture with no_ack (nats-server's rule).
_API_SPACES = ("$JS.>", "$JSC.>", "$NRG.>")
_SYS_SPACE = "$SYS.>"


class StreamConfig(msgspec.Struct, kw_only=True):
    """A stream's configuration with every default filled, as nats-server reports it."""

    name: str = ""
    description: str | None = None
    subjects: list[str] = msgspec.field(default_factory=list)
    retention: Retention = "limits"
    max_consumers: int = -1
    max_msgs: int = -1
    max_bytes: int = -1
    max_age: int = 0
    max_msgs_per_subject: int = -1
    max_msg_size: int = -1
    discard: Discard = "old"
    discard_new_per_subject: bool = False
    storage: StorageType = "file"
    num_replicas: int = 1
    no_ack: bool = False
    duplicate_window: int = 0
    sealed: bool = False
    deny_delete: bool = False
    deny_purge: bool = False
    allow_rollup_hdrs: bool = False
    allow_direct: bool = False
    mirror_direct: bool = False
    compression: Compression = "none"
    first_seq: int = 0
    metadata: dict[str, str] | None = None
    consumer_limits: dict[str, Any] = msgspec.field(default_factory=dict)
    allow_msg_ttl: bool = False
    # nats-server features Tether refuses when set (see _UNSUPPORTED).
    placement: Any = None
    mirror: Any = None
    sources: Any = None
    republish: Any = None
    subject_transform: Any = None
    subject_delete_marker_ttl: int = 0
    allow_msg_counter: bool = False
    allow_atomic: bool = False
    allow_msg_schedules: bool = False
    allow_batched: bool = False
    persist_mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of a stream info, with nats-server's field presence."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.subjects:  # a mirror (or a stream fed only by sources) has none
            out["subjects"] = list(self.subjects)
        out["retention"] = self.retention
        out["max_consumers"] = self.max_consumers
        out["max_msgs"] = self.max_msgs
        out["max_bytes"] = self.max_bytes
        out["max_age"] = self.max_age
        out["max_msgs_per_subject"] = self.max_msgs_per_subject
        out["max_msg_size"] = self.max_msg_size
        out["discard"] = self.discard
        if self.discard_new_per_subject:
            out["discard_new_per_subject"] = True
        out["storage"] = self.storage
        out["num_replicas"] = self.num_replicas
        if self.no_ack:
            out["no_ack"] = True
        if self.duplicate_window:
            out["duplicate_window"] = self.duplicate_window
        if self.mirror:
            out["mirror"] = self.mirror
        if self.sources:
            out["sources"] = self.sources
        if self.subject_transform:
            out["subject_transform"] = self.subject_transform
        out["compression"] = self.compression
        if self.first_seq:
            out["first_seq"] = self.first_seq
        if self.republish:
            out["republish"] = dict(self.republish)
        out["allow_direct"] = self.allow_direct
        out["mirror_direct"] = self.mirror_direct
        out["sealed"] = self.sealed
        out["deny_delete"] = self.deny_delete
        out["deny_purge"] = self.deny_purge
        out["allow_rollup_hdrs"] = self.allow_rollup_hdrs
        out["consumer_limits"] = dict(self.consumer_limits)
        out["allow_msg_ttl"] = self.allow_msg_ttl
        if self.subject_delete_marker_ttl:
            out["subject_delete_marker_ttl"] = self.subject_delete_marker_ttl
        # nats-server leaves these out when off.
        if self.allow_msg_counter:
            out["allow_msg_counter"] = True
        if self.allow_atomic:
            out["allow_atomic"] = True
        if self.allow_msg_schedules:
            out["allow_msg_schedules"] = True
        if self.allow_batched:
            out["allow_batched"] = True
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


# Settings nats-server has and Tether does not: refused when not at their zero value.
_UNSUPPORTED = (("placement", "placement"),)

_FIELDS = frozenset(StreamConfig.__struct_fields__) | {"pedantic"}
_stored_decoder = msgspec.json.Decoder(StreamConfig)
_encoder = msgspec.json.Encoder()


def decode_config(raw: bytes) -> StreamConfig:
    """Decode a request body like nats-server's strict decoder.

    Bad JSON, wrong types and unknown fields → 10025. An empty body is an empty config.
    """
    if not raw.strip():
        return StreamConfig()
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise errors.invalid_json(str(exc)) from None
    if not isinstance(doc, dict):
        raise errors.invalid_json("cannot unmarshal into a stream configuration")
    for key in doc:
        if key not in _FIELDS:
            raise errors.invalid_json(f'json: unknown field "{key}"')
    # As in Go, a null leaves the field at its default.
    doc = {k: v for k, v in doc.items() if v is not None and k != "pedantic"}
    try:
        return msgspec.convert(doc, StreamConfig)
    except msgspec.ValidationError as exc:
        raise errors.invalid_json(str(exc)) from None


def decode_stored_config(raw: bytes) -> StreamConfig:
    """Decode a configuration this engine persisted (lenient: never refuses old records)."""
    return _stored_decoder.decode(raw)


def encode_config(config: StreamConfig) -> bytes:
    return _encoder.encode(config)


def is_valid_name(name: str) -> bool:
    """nats-server's ``isValidAssetName``: no whitespace, ``.``, ``*``, ``>``, ``/``, ``\\``."""
    return bool(name) and not any(c in name for c in " \t\r\n\f.*>\\/")


def has_path_separators(name: str) -> bool:
    return "/" in name or "\\" in name


def normalize(
    config: StreamConfig,
    lookup: Callable[[str], StreamConfig | None] | None = None,
    duplicates_limit: int = 0,
) -> StreamConfig:
    """Fill defaults and validate, as nats-server's ``checkStreamCfg``; raises ApiError.

    ``lookup`` finds the server's other streams, for the checks of mirrors and sources
    that look at their origins (None: those are skipped). ``duplicates_limit`` is the
    server's largest ``duplicate_window`` in ns (0: none), also the default's cap."""
    cfg = config
    if not is_valid_name(cfg.name):
        raise errors.invalid_stream_name()
    if len(cfg.name) > MAX_NAME_LEN:
        raise errors.invalid_stream_config(
            f"stream name is too long, maximum allowed is {MAX_NAME_LEN}"
        )
    if cfg.description and len(cfg.description) > MAX_DESCRIPTION_LEN:
        raise errors.invalid_stream_config(
            f"stream description is too long, maximum allowed is {MAX_DESCRIPTION_LEN}"
        )
    if cfg.metadata and sum(len(k) + len(v) for k, v in cfg.metadata.items()) > MAX_METADATA_LEN:
        raise errors.invalid_stream_config(
            f"stream metadata exceeds maximum size of {MAX_METADATA_LEN} bytes"
        )
    if cfg.num_replicas == 0:
        cfg.num_replicas = 1
    if cfg.num_replicas > MAX_REPLICAS:
        raise errors.invalid_stream_config(f"maximum replicas is {MAX_REPLICAS}")
    if cfg.num_replicas < 0:
        raise errors.replicas_negative()
    # Zero and anything below -1 mean "unlimited".
    for field in ("max_msgs", "max_msgs_per_subject", "max_bytes", "max_msg_size", "max_consumers"):
        if getattr(cfg, field) == 0 or getattr(cfg, field) < -1:
            setattr(cfg, field, -1)
    if cfg.max_age < 0:
        raise errors.invalid_stream_config("max age can not be negative")
    if 0 < cfg.max_age < MIN_MAX_AGE:
        raise errors.invalid_stream_config("max age needs to be >= 100ms")
    if cfg.duplicate_window == 0 and not cfg.mirror and not cfg.sources:
        window = DEFAULT_DUPLICATE_WINDOW
        if 0 < duplicates_limit < window:
            window = duplicates_limit
        if cfg.max_age and cfg.max_age < window:
            cfg.duplicate_window = cfg.max_age
        else:
            cfg.duplicate_window = window
    if cfg.duplicate_window < 0:
        raise errors.invalid_stream_config("duplicates window can not be negative")
    if cfg.max_age and cfg.duplicate_window > cfg.max_age:
        raise errors.invalid_stream_config("duplicates window can not be larger then max age")
    if duplicates_limit > 0 and cfg.duplicate_window > duplicates_limit:
        raise errors.invalid_stream_config(
            "duplicates window can not be larger then server limit of "
            + go_duration(duplicates_limit)
        )
    if 0 < cfg.duplicate_window < MIN_DUPLICATE_WINDOW:
        raise errors.invalid_stream_config("duplicates window needs to be >= 100ms")
    _check_counters_and_schedules(cfg)
    _check_persist_mode(cfg)
    _check_delete_markers(cfg)
    if cfg.deny_purge and cfg.allow_rollup_hdrs:
        raise errors.invalid_stream_config("roll-ups require the purge permission")
    _check_discard_new_per_subject(cfg)
    sourcing.check_mirror_and_sources(cfg, lookup)
    _check_subjects(cfg)
    sourcing.check_input_transform(cfg)
    if cfg.republish is not None:
        cfg.republish = check_republish(cfg.republish, cfg.subjects)
    for field, feature in _UNSUPPORTED:
        if getattr(cfg, field):
            raise errors.invalid_stream_config(f"{feature} not supported by this server")
    return cfg


def _check_counters_and_schedules(cfg: StreamConfig) -> None:
    """Counters and schedules, with nats-server's refusals; schedules are stored as
    roll-ups of their subject, so enabling them turns on what that needs."""
    if cfg.allow_msg_counter:
        if cfg.allow_msg_ttl:
            raise errors.invalid_stream_config("counter stream cannot use message TTLs")
        if cfg.discard == "new":
            raise errors.invalid_stream_config("counter stream cannot use discard new")
        if cfg.retention != "limits":
            raise errors.invalid_stream_config("counter stream can only use limits retention")
        if cfg.allow_msg_schedules:
            raise errors.invalid_stream_config("counter stream cannot use message schedules")
    if cfg.allow_msg_schedules:
        if cfg.discard == "new":
            raise errors.invalid_stream_config("message scheduling cannot use discard new")
        cfg.allow_rollup_hdrs = True
        cfg.deny_purge = False


def _check_delete_markers(cfg: StreamConfig) -> None:
    """``subject_delete_marker_ttl``: at least a second; markers are messages with a
    TTL that roll up their subject, so nats-server turns on what they need."""
    ttl = cfg.subject_delete_marker_ttl
    if ttl < 0:
        raise errors.invalid_stream_config("subject delete marker TTL must not be negative")
    if ttl:
        if ttl < NS:
            raise errors.invalid_stream_config(
                "subject delete marker TTL must be at least 1 second"
            )
        cfg.allow_msg_ttl = True
        cfg.allow_rollup_hdrs = True
        cfg.deny_purge = False


def _check_persist_mode(cfg: StreamConfig) -> None:
    """``persist_mode``: ``default`` (or ``""``) is what Tether always does, a publish
    acknowledged once its commit is durable, and is reported as nats-server reports it
    (not at all). nats-server's ``async`` (acknowledged before the flush) is checked as
    nats-server checks it, then refused: acknowledging what a crash may lose is not
    something this server does."""
    mode = cfg.persist_mode
    if mode in (None, "", "default"):
        cfg.persist_mode = None
        return
    if mode != "async":
        raise errors.invalid_json(f'can not unmarshal "\\"{mode}\\""')
    if cfg.storage != "file":
        raise errors.invalid_stream_config("async persist mode is only supported on file storage")
    if cfg.num_replicas > 1:
        raise errors.invalid_stream_config(
            "async persist mode is not supported on replicated streams"
        )
    if cfg.allow_atomic:
        raise errors.invalid_stream_config(
            "async persist mode is not supported with atomic batch publish"
        )
    raise errors.invalid_stream_config(
        "async persist mode not supported by this server: a publish is acknowledged once durable"
    )


def _check_discard_new_per_subject(cfg: StreamConfig) -> None:
    if cfg.discard_new_per_subject:
        if cfg.discard != "new":
            raise errors.invalid_stream_config(
                "discard new per subject requires discard new policy to be set"
            )
        if cfg.max_msgs_per_subject <= 0:
            raise errors.invalid_stream_config(
                "discard new per subject requires max msgs per subject > 0"
            )


def _check_subjects(cfg: StreamConfig) -> None:
    if not cfg.subjects:
        # A stream without subjects captures its own name, unless it is fed by a
        # mirror or sources.
        if not cfg.mirror and not cfg.sources:
            cfg.subjects = [cfg.name]
        return
    seen: set[str] = set()
    for i, subject in enumerate(cfg.subjects):
        if not is_valid_filter(subject):
            raise errors.invalid_stream_config("invalid subject")
        if subject in seen:
            raise errors.invalid_stream_config("duplicate subjects detected")
        if subject == ">" and not cfg.no_ack:
            raise errors.invalid_stream_config("capturing all subjects requires no-ack to be true")
        if not cfg.no_ack:
            for space in _API_SPACES:
                if filters_overlap(subject, space) and not is_subset(subject, "$JS.EVENT.>"):
                    raise errors.invalid_stream_config(
                        "subjects that overlap with jetstream api require no-ack to be true"
                    )
            if filters_overlap(subject, _SYS_SPACE) and not is_subset(subject, "$SYS.ACCOUNT.>"):
                raise errors.invalid_stream_config(
                    "subjects that overlap with system api require no-ack to be true"
                )
        for other in cfg.subjects[i + 1 :]:
            if filters_overlap(other, subject):
                raise errors.invalid_stream_config(f'subject "{subject}" overlaps with "{other}"')
        seen.add(subject)


def check_create(subject_name: str, config: StreamConfig) -> None:
    """STREAM.CREATE checks nats-server makes before ``checkStreamCfg``."""
    if config.name != subject_name:
        raise errors.stream_name_mismatch()
    if has_path_separators(subject_name):
        raise errors.stream_name_has_path_separators()
    if config.sealed:
        raise errors.invalid_stream_config("stream configuration for create can not be sealed")
    if config.mirror_direct and not config.mirror:
        raise errors.invalid_stream_config("stream has no mirror but does have mirror direct")


def check_update(old: StreamConfig, new: StreamConfig) -> None:
    """The changes nats-server refuses on STREAM.UPDATE (``new`` is normalized).

    Also applies what sealing implies, as nats-server does.
    """
    if new.name != old.name:
        raise errors.invalid_stream_config("stream configuration name must match original")
    if new.num_replicas > 1:
        raise errors.replicas_not_supported()
    if new.storage != old.storage:
        raise errors.invalid_stream_config(
            "stream configuration update can not change storage type"
        )
    if new.retention != old.retention and "workqueue" in (old.retention, new.retention):
        raise errors.invalid_stream_config(
            "stream configuration update can not change retention policy to/from workqueue"
        )
    if old.sealed and not new.sealed:
        raise errors.invalid_stream_config(
            "stream configuration update can not unseal a sealed stream"
        )
    if old.deny_delete and not new.deny_delete:
        raise errors.invalid_stream_config(
            "stream configuration update can not cancel deny message deletes"
        )
    if old.deny_purge and not new.deny_purge:
        raise errors.invalid_stream_config("stream configuration update can not cancel deny purge")
    sourcing.check_mirror_update(old, new)
    _check_discard_new_per_subject(new)
    if old.allow_msg_ttl and not new.allow_msg_ttl:
        raise errors.invalid_stream_config("message TTL status can not be disabled")
    if old.allow_msg_counter != new.allow_msg_counter:
        raise errors.invalid_stream_config(
            "stream configuration update can not change message counter setting"
        )
    if old.allow_msg_schedules and not new.allow_msg_schedules:
        raise errors.invalid_stream_config("message schedules can not be disabled")
    if new.sealed:
        new.max_age = 0
        new.discard = "new"
        new.deny_delete = True
        new.deny_purge = True
        new.allow_rollup_hdrs = False
