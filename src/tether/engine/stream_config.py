"""Stream configuration: nats-server's JSON shape, defaults, validation and update rules."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tether.engine import errors
from tether.engine.subjects import filters_overlap, is_valid_filter

NS = 1_000_000_000
DEFAULT_DUPLICATE_WINDOW = 120 * NS
MIN_DUPLICATE_WINDOW = 100_000_000  # 100 ms

Retention = Literal["limits", "interest", "workqueue"]
Discard = Literal["old", "new"]
StorageType = Literal["file", "memory"]


class StreamConfig(msgspec.Struct, kw_only=True, omit_defaults=False):
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
    compression: str = "none"
    first_seq: int = 0
    metadata: dict[str, str] | None = None
    consumer_limits: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        assert isinstance(out, dict)
        for key in ("description", "metadata"):
            if out.get(key) is None:
                out.pop(key, None)
        if not out.get("discard_new_per_subject"):
            out.pop("discard_new_per_subject", None)
        if not out.get("first_seq"):
            out.pop("first_seq", None)
        return out


_decoder = msgspec.json.Decoder(StreamConfig)
_encoder = msgspec.json.Encoder()


def decode_config(raw: bytes) -> StreamConfig:
    """Decode a request body; bad JSON or wrong types → 10025."""
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise errors.invalid_json(str(exc)) from None
    except msgspec.DecodeError:
        raise errors.invalid_json() from None


def encode_config(config: StreamConfig) -> bytes:
    return _encoder.encode(config)


def is_valid_name(name: str) -> bool:
    """Stream and consumer names: no whitespace, ``.``, ``*``, ``>``, path separators."""
    if not name or len(name) > 255:
        return False
    return not any(c in name for c in " \t\r\n.*>/\\") and name.isprintable()


def normalize(config: StreamConfig) -> StreamConfig:
    """Fill defaults the way nats-server does and validate; raises :class:`ApiError`."""
    if not is_valid_name(config.name):
        raise errors.invalid_stream_name()
    if not config.subjects:
        # A stream without subjects captures its own name.
        config.subjects = [config.name]
    seen: set[str] = set()
    for subject in config.subjects:
        if not is_valid_filter(subject):
            raise errors.stream_config_invalid("invalid subject")
        if subject in seen:
            raise errors.stream_config_invalid("duplicate subjects detected")
        seen.add(subject)
    for i, a in enumerate(config.subjects):
        for b in config.subjects[i + 1 :]:
            if filters_overlap(a, b):
                raise errors.stream_config_invalid("subjects overlap")
    for field in ("max_consumers", "max_msgs", "max_bytes", "max_msgs_per_subject"):
        if getattr(config, field) == 0:
            setattr(config, field, -1)
    if config.max_msg_size == 0:
        config.max_msg_size = -1
    if config.max_age < 0:
        raise errors.stream_config_invalid("max age needs to be >= 0")
    if config.duplicate_window < 0:
        raise errors.stream_config_invalid("duplicates window can not be negative")
    if config.duplicate_window == 0:
        config.duplicate_window = DEFAULT_DUPLICATE_WINDOW
        if config.max_age and config.max_age < config.duplicate_window:
            config.duplicate_window = config.max_age
    elif config.max_age and config.duplicate_window > config.max_age:
        raise errors.stream_config_invalid("duplicates window can not be larger then max age")
    if config.duplicate_window < MIN_DUPLICATE_WINDOW:
        config.duplicate_window = MIN_DUPLICATE_WINDOW
    if config.num_replicas == 0:
        config.num_replicas = 1
    if config.num_replicas > 1:
        raise errors.stream_config_invalid("replicas > 1 not supported in non-clustered mode")
    if config.discard_new_per_subject and (
        config.discard != "new" or config.max_msgs_per_subject <= 0
    ):
        raise errors.stream_config_invalid(
            "discard new per subject requires discard new policy to be set"
        )
    if config.max_msgs_per_subject > 0 and config.retention == "workqueue":
        pass
    return config


def check_update(old: StreamConfig, new: StreamConfig) -> None:
    """The changes nats-server refuses on STREAM.UPDATE."""
    if new.storage != old.storage:
        raise errors.stream_config_invalid(
            "stream configuration update can not change storage type"
        )
    if new.retention != old.retention:
        raise errors.stream_config_invalid(
            "stream configuration update can not change retention policy"
        )
    if old.sealed and not new.sealed:
        raise errors.stream_config_invalid(
            "stream configuration update can not unseal a sealed stream"
        )
    if old.deny_delete and not new.deny_delete:
        raise errors.stream_config_invalid(
            "stream configuration update can not cancel deny message deletes"
        )
    if old.deny_purge and not new.deny_purge:
        raise errors.stream_config_invalid("stream configuration update can not cancel deny purge")
    if old.allow_rollup_hdrs and not new.allow_rollup_hdrs:
        raise errors.stream_config_invalid(
            "stream configuration update can not cancel rollup headers"
        )
