"""Parsing and validating the data source's options.

Spark hands options over as a case-insensitive mapping of strings (keys lower-cased).
Everything is checked here, once, with errors that name the option, so a typo fails
at ``load()``/``start()`` on the driver instead of deep inside an executor task.
The parsed objects are frozen dataclasses: they are pickled into partitions and
writers and must not carry anything but plain values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

DEFAULT_SERVERS = "nats://127.0.0.1:4222"

# Positions are "the next sequence to read": a start is inclusive, an end exclusive.
EARLIEST = 0  # sentinel: from the first message still in the stream
LATEST = -1  # sentinel: from the end of the stream, resolved on the first trigger


class TetherSparkError(Exception):
    """A configuration or runtime error of the Tether data source (the message says which option)."""


# Canonical spelling of every option, by its lower-cased key (Spark lower-cases them).
_CONNECTION = ("servers", "user", "password", "token", "timeout")
_READ_COMMON = (
    "stream",
    "subjects",
    "startingOffsets",
    "startingTimestamp",
    "includeHeaders",
    "minPartitions",
    "maxRecordsPerPartition",
    "readMethod",
    "fetchBatchSize",
    "fetchMaxBytes",
)
BATCH_READ_OPTIONS = (*_CONNECTION, *_READ_COMMON, "endingOffsets")
STREAM_READ_OPTIONS = (
    *_CONNECTION,
    *_READ_COMMON,
    "failOnDataLoss",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "durable",
)
WRITE_OPTIONS = (*_CONNECTION, "stream", "subject", "maxPendingAcks", "idempotent")
# Keys Spark itself may put into the options (``load(path)``, ``writeStream`` settings).
_SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation", "queryname"})
_ALL_OPTIONS = frozenset(
    k.lower() for k in (*BATCH_READ_OPTIONS, *STREAM_READ_OPTIONS, *WRITE_OPTIONS)
)


def check_known(options: Mapping[str, str], allowed: tuple[str, ...], what: str) -> None:
    """Reject options that are unknown, or known but meaningless for ``what``."""
    allowed_lower = {a.lower() for a in allowed}
    for key in options:
        low = key.lower()
        if low in allowed_lower or low in _SPARK_KEYS:
            continue
        if low in _ALL_OPTIONS:
            canonical = next(
                o for o in (*STREAM_READ_OPTIONS, *BATCH_READ_OPTIONS, *WRITE_OPTIONS)
                if o.lower() == low
            )  # fmt: skip
            raise TetherSparkError(f"option '{canonical}' is not valid for {what}")
        known = ", ".join(sorted(allowed))
        raise TetherSparkError(f"unknown option '{key}' for {what}; known options: {known}")


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        return None
    return str(value).strip()


def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TetherSparkError(f"option '{name}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise TetherSparkError(f"option '{name}' must be >= {minimum}, got {value}")
    return value


def _optional_int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    if _get(options, name) in (None, ""):
        return None
    return _int(options, name, 0, minimum)


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    low = raw.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise TetherSparkError(f"option '{name}' must be true or false, got {raw!r}")


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise TetherSparkError(f"option '{name}' must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise TetherSparkError(f"option '{name}' must be a positive number, got {raw!r}")
    return value


def parse_duration(raw: str, name: str) -> float:
    """Seconds from ``"30s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a bare number of seconds."""
    text = raw.strip().lower().replace(" ", "")
    number, scale = text, 1.0
    # "ms" before "s": the longest matching unit wins.
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    try:
        value = float(number) * scale
    except ValueError:
        raise TetherSparkError(
            f"option '{name}' must be a duration such as '30s' or '5m', got {raw!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise TetherSparkError(f"option '{name}' must be a non-negative duration, got {raw!r}")
    return value


@dataclass(frozen=True)
class ConnectionSpec:
    """How executors and the driver connect; hashable, so it keys the connection pool."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    token: str | None = None
    timeout: float = 30.0

    def describe(self) -> str:
        return ",".join(self.servers)


def connection_spec(options: Mapping[str, str]) -> ConnectionSpec:
    raw = _get(options, "servers") or DEFAULT_SERVERS
    servers = tuple(s.strip() for s in raw.split(",") if s.strip())
    if not servers:
        raise TetherSparkError("option 'servers' must list at least one server URL")
    for server in servers:
        scheme = server.split("://", 1)[0] if "://" in server else "nats"
        if scheme not in ("nats", "tcp"):
            raise TetherSparkError(
                f"option 'servers': unsupported URL {server!r} (use nats://host:port)"
            )
    user, password, token = _get(options, "user"), _get(options, "password"), _get(options, "token")
    if token and (user or password):
        raise TetherSparkError("options 'token' and 'user'/'password' are mutually exclusive")
    if password and not user:
        raise TetherSparkError("option 'password' needs option 'user'")
    return ConnectionSpec(servers, user, password, token, _float(options, "timeout", 30.0))


def _stream_name(options: Mapping[str, str], required: bool) -> str | None:
    name = _get(options, "stream") or _get(options, "path")
    if not name:
        if required:
            raise TetherSparkError("option 'stream' is required (or pass the stream to load())")
        return None
    if any(c in name for c in " .*>\t\r\n"):
        raise TetherSparkError(f"option 'stream': invalid stream name {name!r}")
    return name


def _subjects(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "subjects") or ""
    subjects = tuple(s.strip() for s in raw.split(",") if s.strip())
    for subject in subjects:
        tokens = subject.split(".")
        if any(not t for t in tokens) or any(
            (">" in t and (t != ">" or i != len(tokens) - 1)) or ("*" in t and t != "*")
            for i, t in enumerate(tokens)
        ):
            raise TetherSparkError(f"option 'subjects': invalid subject filter {subject!r}")
    return subjects


def parse_position(raw: str, name: str, stream: str, *, allow_latest: bool) -> int:
    """A start/end position: ``earliest``, ``latest``, a sequence, or offset JSON.

    The JSON is what a streaming checkpoint stores: ``{"stream": "ORDERS", "seq": 42}``
    (a stream-keyed ``{"ORDERS": 42}`` is accepted too). Sequences are "next to read".
    """
    text = raw.strip()
    low = text.lower()
    if low == "earliest":
        return EARLIEST
    if low == "latest":
        if not allow_latest:
            raise TetherSparkError(f"option '{name}': 'latest' is not valid here")
        return LATEST
    if text.lstrip("-").isdigit():
        seq = int(text)
    elif text.startswith("{"):
        seq = _position_from_json(text, name, stream)
    else:
        raise TetherSparkError(
            f"option '{name}' must be 'earliest', 'latest', a sequence or JSON such as "
            f'{{"stream": "{stream}", "seq": 1}}, got {raw!r}'
        )
    if seq < 1:
        raise TetherSparkError(f"option '{name}': sequences start at 1, got {seq}")
    return seq


def _position_from_json(text: str, name: str, stream: str) -> int:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TetherSparkError(f"option '{name}' is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TetherSparkError(f"option '{name}' must be a JSON object, got {text!r}")
    if "seq" in data:
        if data.get("stream", stream) != stream:
            raise TetherSparkError(
                f"option '{name}' is for stream {data.get('stream')!r}, "
                f"but option 'stream' is {stream!r}"
            )
        value = data["seq"]
    elif set(data) == {stream}:
        value = data[stream]
    else:
        raise TetherSparkError(
            f'option \'{name}\' must look like {{"stream": "{stream}", "seq": 1}}, got {text!r}'
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TetherSparkError(f"option '{name}': 'seq' must be an integer, got {value!r}")
    return value


def parse_timestamp(raw: str) -> str:
    """``startingTimestamp`` as RFC 3339 (UTC): epoch milliseconds or an ISO-8601 string."""
    text = raw.strip()
    try:
        if text.lstrip("-").isdigit():
            when = datetime.fromtimestamp(int(text) / 1000, tz=UTC)
        else:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        raise TetherSparkError(
            "option 'startingTimestamp' must be epoch milliseconds or an ISO-8601 time, "
            f"got {raw!r}"
        ) from None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class ReadOptions:
    """Options of a batch or streaming read."""

    conn: ConnectionSpec
    stream: str
    subjects: tuple[str, ...]
    start: int  # EARLIEST, LATEST or a sequence
    starting_timestamp: str | None  # RFC 3339; resolved to a sequence when set
    end: int  # LATEST or an exclusive sequence (batch only)
    include_headers: bool
    min_partitions: int
    max_records_per_partition: int
    read_method: str  # auto | bulk | direct | consumer
    fetch_batch_size: int
    fetch_max_bytes: int
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = 15 * 60.0
    durable: str | None = None


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate the options of a read (``streaming`` selects which are allowed)."""
    what = "streaming reads" if streaming else "batch reads"
    check_known(options, STREAM_READ_OPTIONS if streaming else BATCH_READ_OPTIONS, what)
    conn = connection_spec(options)
    stream = _stream_name(options, required=True)
    assert stream is not None
    starting = _get(options, "startingOffsets")
    stamp = _get(options, "startingTimestamp")
    if starting and stamp:
        raise TetherSparkError(
            "options 'startingOffsets' and 'startingTimestamp' exclude each other"
        )
    start = EARLIEST if streaming is False else LATEST
    if starting:
        start = parse_position(starting, "startingOffsets", stream, allow_latest=streaming)
    end = LATEST
    ending = _get(options, "endingOffsets")
    if ending:
        end = parse_position(ending, "endingOffsets", stream, allow_latest=True)
        if end == EARLIEST:
            raise TetherSparkError("option 'endingOffsets': 'earliest' is not a valid end")
        if start > 0 and end != LATEST and end < start:
            raise TetherSparkError(
                f"option 'endingOffsets' ({end}) is before 'startingOffsets' ({start})"
            )
    method = (_get(options, "readMethod") or "auto").lower()
    if method not in ("auto", "bulk", "direct", "consumer"):
        raise TetherSparkError(
            f"option 'readMethod' must be auto, bulk, direct or consumer, got {method!r}"
        )
    max_rows = _optional_int(options, "maxOffsetsPerTrigger", 1)
    min_rows = _optional_int(options, "minOffsetsPerTrigger", 1)
    if max_rows is not None and min_rows is not None and min_rows > max_rows:
        raise TetherSparkError(
            "option 'minOffsetsPerTrigger' must not exceed 'maxOffsetsPerTrigger'"
        )
    delay_raw = _get(options, "maxTriggerDelay")
    delay = parse_duration(delay_raw, "maxTriggerDelay") if delay_raw else 15 * 60.0
    durable = _get(options, "durable") or None
    if durable is not None and any(c in durable for c in " .*>\t\r\n"):
        raise TetherSparkError(f"option 'durable': invalid consumer name {durable!r}")
    return ReadOptions(
        conn=conn,
        stream=stream,
        subjects=_subjects(options),
        start=start,
        starting_timestamp=parse_timestamp(stamp) if stamp else None,
        end=end,
        include_headers=bool_option(options, "includeHeaders", False),
        min_partitions=_int(options, "minPartitions", 1, 1),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", 250_000, 1),
        read_method=method,
        fetch_batch_size=_int(options, "fetchBatchSize", 25_000, 1),
        fetch_max_bytes=_int(options, "fetchMaxBytes", 16 * 1024 * 1024, 1024),
        fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay=delay,
        durable=durable,
    )


@dataclass(frozen=True)
class WriteOptions:
    """Options of a batch or streaming write."""

    conn: ConnectionSpec
    stream: str | None
    subject: str | None
    max_pending_acks: int
    idempotent: bool


def write_options(options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    check_known(options, WRITE_OPTIONS, "streaming writes" if streaming else "batch writes")
    subject = _get(options, "subject") or None
    if subject is not None and (
        any(c in subject for c in " \t\r\n*>") or any(not t for t in subject.split("."))
    ):
        raise TetherSparkError(f"option 'subject': invalid subject {subject!r}")
    return WriteOptions(
        conn=connection_spec(options),
        stream=_stream_name(options, required=False),
        subject=subject,
        max_pending_acks=_int(options, "maxPendingAcks", 4000, 1),
        idempotent=bool_option(options, "idempotent", True),
    )
