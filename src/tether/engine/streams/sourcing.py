"""Mirrors, sources and the input transform in a stream's configuration: their JSON
shape, nats-server's checks (same order, codes and texts), and the names and header a
sourced message is stamped with.

A mirror copies one origin stream message for message, keeping its sequences and
timestamps; a stream with sources copies from any number of origins into its own
numbering, each copy stamped with a ``Nats-Stream-Source`` header naming where it came
from. That header is also how a stream knows, after a restart, how far each source got.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from tether.engine import errors
from tether.engine.subject_transform import SubjectTransform, TransformError, validate_mapping
from tether.engine.subjects import filters_overlap, is_literal, is_subset, is_valid_filter

__all__ = [
    "STREAM_SOURCE",
    "External",
    "SourceSpec",
    "TransformConfig",
    "check_input_transform",
    "check_mirror_and_sources",
    "go_hash",
    "input_transform",
    "mirror_of",
    "parse_source_header",
    "source_identity",
    "sources_of",
]

# The configuration these functions read and fill is a ``config.StreamConfig``, typed
# loosely here because that module calls into this one.
StreamConfig = Any

STREAM_SOURCE = "Nats-Stream-Source"
JS_API_PREFIX = "$JS.API"


class TransformConfig(msgspec.Struct, forbid_unknown_fields=True):
    src: str = ""
    dest: str = ""


class External(msgspec.Struct, forbid_unknown_fields=True):
    """Where an origin on another server (or domain) answers: its API prefix."""

    api: str = ""
    deliver: str = ""


class SourceSpec(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One ``mirror`` or ``sources[]`` entry, as nats-server reads and echoes it."""

    name: str = ""
    opt_start_seq: int = 0
    opt_start_time: str | None = None
    filter_subject: str = ""
    subject_transforms: list[TransformConfig] | None = None
    external: External | None = None
    consumer: dict[str, Any] | None = None

    def index_name(self) -> str:
        """nats-server's ``composeIName``: ``<name>[:<api hash>] <filters> <dests>``,
        what tells two sources of the same stream apart (and what the header repeats)."""
        name = self.name
        if self.external is not None:
            name += ":" + go_hash(self.external.api)
        if not self.subject_transforms:
            return f"{name} {self.filter_subject or '>'} >"
        srcs = "\f".join(t.src or ">" for t in self.subject_transforms)
        dests = "\f".join(t.dest or ">" for t in self.subject_transforms)
        return f"{name} {srcs} {dests}"

    def filters(self) -> tuple[str, ...]:
        """The origin subjects this source takes (empty: all)."""
        if self.subject_transforms:
            srcs = tuple(t.src or ">" for t in self.subject_transforms)
            return () if ">" in srcs else srcs
        if self.filter_subject and self.filter_subject != ">":
            return (self.filter_subject,)
        return ()

    def transforms(self) -> list[tuple[str, SubjectTransform | None]]:
        """(filter, transform) pairs in order; a None transform keeps the subject."""
        out: list[tuple[str, SubjectTransform | None]] = []
        for t in self.subject_transforms or ():
            out.append((t.src or ">", _cached(t.src, t.dest) if t.dest else None))
        return out

    def start_time_ns(self) -> int:
        return parse_time(self.opt_start_time) if self.opt_start_time else 0


def _spec(raw: Any) -> SourceSpec:
    try:
        spec = msgspec.convert(raw, SourceSpec)
    except msgspec.ValidationError as exc:
        raise errors.invalid_json(str(exc)) from None
    if spec.opt_start_time is not None:
        try:
            parse_time(spec.opt_start_time)
        except ValueError:
            raise errors.invalid_json(
                f"parsing time {spec.opt_start_time!r} as RFC 3339: cannot parse"
            ) from None
    return spec


def mirror_of(cfg: StreamConfig) -> SourceSpec | None:
    return _spec(cfg.mirror) if cfg.mirror else None


def sources_of(cfg: StreamConfig) -> list[SourceSpec]:
    return [_spec(raw) for raw in cfg.sources or ()]


def _to_dict(spec: SourceSpec) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(spec)
    if spec.external is not None:
        # ``api`` and ``deliver`` are always written, even empty.
        out["external"] = {"api": spec.external.api, "deliver": spec.external.deliver}
    return out


# -- checks ---------------------------------------------------------------------------------


def _err(code: int, text: str, status: int = 400) -> errors.ApiError:
    return errors.ApiError(status, code, text)


def _valid_publish_subject(subject: str) -> bool:
    return bool(subject) and is_valid_filter(subject) and is_literal(subject)


def _is_valid_name(name: str) -> bool:
    return bool(name) and not any(c in name for c in " \t\r\n\f.*>\\/")


def check_mirror_and_sources(
    cfg: StreamConfig, lookup: Callable[[str], StreamConfig | None] | None
) -> None:
    """nats-server's mirror and source checks, in its order; normalizes the entries to
    the shape nats-server echoes. ``lookup`` finds other streams of this server (None:
    skip the checks that need them)."""
    find = lookup or (lambda name: None)
    stream_subjects: list[str] = []
    deliver_prefixes: list[str] = []
    api_prefixes: list[str] = []
    mirror = mirror_of(cfg)
    if mirror is not None:
        if cfg.first_seq > 0:
            raise _err(10143, "stream mirrors can not have first sequence configured")
        if cfg.subjects:
            raise _err(10034, "stream mirrors can not contain subjects")
        if cfg.sources:
            raise _err(10031, "stream mirrors can not also contain other sources")
        if cfg.allow_msg_counter:
            raise _err(10173, "stream mirrors can not also calculate counters")
        if cfg.allow_atomic:
            raise _err(10198, "stream mirrors can not also use atomic publishing")
        if cfg.allow_batched:
            raise _err(10209, "stream mirrors can not also use batch publishing")
        if cfg.allow_msg_schedules:
            raise _err(10186, "stream mirrors can not also schedule messages")
        if mirror.consumer is not None:
            raise errors.invalid_stream_config("durable sourcing consumers not supported")
        if mirror.filter_subject and mirror.subject_transforms:
            raise _err(
                10150,
                "mirror with multiple subject transforms cannot also have a single subject filter",
            )
        if cfg.subject_delete_marker_ttl > 0:
            raise errors.invalid_stream_config("subject delete markers forbidden on mirrors")
        transforms = mirror.subject_transforms or []
        for i, t in enumerate(transforms):
            if t.src and not is_valid_filter(t.src):
                raise _err(10151, f"mirror transform source: invalid subject {t.src}")
            try:
                validate_mapping(t.src, t.dest)
            except TransformError as exc:
                raise _err(10154, f"mirror transform: {exc}") from None
            for j, other in enumerate(transforms):
                if i != j and filters_overlap(t.src or ">", other.src or ">"):
                    raise _err(10152, "mirror subject filters can not overlap")
        if mirror.external is None:
            if not _is_valid_name(mirror.name):
                raise _err(10142, "mirrored stream name is invalid")
            origin = find(mirror.name)
            if origin is not None:
                stream_subjects += origin.subjects
                if 0 < cfg.max_msg_size < origin.max_msg_size:
                    raise _err(10030, "stream mirror must have max message size >= source")
                cfg.mirror_direct = origin.allow_direct
        else:
            if mirror.external.deliver:
                deliver_prefixes.append(mirror.external.deliver)
            if mirror.external.api:
                api_prefixes.append(mirror.external.api)
        cfg.mirror = _to_dict(mirror)
    sources = sources_of(cfg)
    if sources and cfg.allow_msg_schedules:
        raise _err(10187, "stream source can not also schedule messages")
    seen: set[str] = set()
    for src in sources:
        if not _is_valid_name(src.name):
            raise _err(10141, "sourced stream name is invalid")
        iname = src.index_name()
        if iname in seen:
            raise _err(10140, "duplicate source configuration detected")
        seen.add(iname)
        if src.filter_subject and src.subject_transforms:
            raise _err(
                10144,
                "source with multiple subject transforms cannot also have a single subject filter",
            )
        transforms = src.subject_transforms or []
        for t in transforms:
            if t.src and not is_valid_filter(t.src):
                raise _err(10145, f"source transform source: invalid subject {t.src}")
            try:
                validate_mapping(t.src, t.dest)
            except TransformError as exc:
                raise _err(10146, f"source transform: {exc}") from None
        for i, t in enumerate(transforms):
            for j, other in enumerate(transforms):
                if i != j and is_subset(t.src or ">", other.src or ">"):
                    raise _err(10147, "source filters can not overlap")
        if src.consumer is not None:
            raise errors.invalid_stream_config("durable sourcing consumers not supported")
        if src.external is None:
            origin = find(src.name)
            if origin is not None:
                stream_subjects += origin.subjects
                if 0 < cfg.max_msg_size < origin.max_msg_size:
                    raise _err(10046, "stream source must have max message size >= target")
        else:
            if src.external.deliver:
                deliver_prefixes.append(src.external.deliver)
            if src.external.api:
                api_prefixes.append(src.external.api)
    if cfg.sources is not None:
        cfg.sources = [_to_dict(src) for src in sources] or None
    for prefix in deliver_prefixes:
        if not _valid_publish_subject(prefix):
            raise _err(
                10024, f"stream external delivery prefix {prefix} must not contain wildcards"
            )
        for subject in stream_subjects:
            if filters_overlap(subject, f"{prefix}.{subject}"):
                raise _err(
                    10022,
                    f"stream external delivery prefix {prefix} overlaps with stream subject {subject}",
                )
    for prefix in api_prefixes:
        if not _valid_publish_subject(prefix):
            raise errors.invalid_stream_config(
                f'stream external api prefix "{prefix}" must be a valid subject without wildcards'
            )
        if filters_overlap(prefix, JS_API_PREFIX):
            raise _err(
                10021, f"stream external api prefix {prefix} must not overlap with {JS_API_PREFIX}"
            )
    if lookup is not None:
        _check_cycles(cfg, find)


def _check_cycles(cfg: StreamConfig, find: Callable[[str], StreamConfig | None]) -> None:
    """nats-server's cycle check: following local sources (and mirrors) back to this
    stream, where the subjects really loop, is refused."""

    def overlaps(subjects: list[str], filter_: str) -> bool:
        return not filter_ or any(filters_overlap(s, filter_) for s in subjects)

    to_visit = [cfg]
    visited: set[str] = set()
    while to_visit:
        current = to_visit.pop(0)
        visited.add(current.name)
        for src in sources_of(current):
            if src.external is not None:
                continue
            if src.name in visited:
                if overlaps(current.subjects, src.filter_subject):
                    raise errors.invalid_stream_config("detected cycle")
            else:
                other = find(src.name)
                if other is not None:
                    to_visit.append(other)
        mirror = mirror_of(current)
        if mirror is not None and mirror.external is None:
            if mirror.name in visited:
                raise errors.invalid_stream_config("detected cycle")
            other = find(mirror.name)
            if other is not None:
                to_visit.append(other)


def check_input_transform(cfg: StreamConfig) -> None:
    """The stream's own ``subject_transform`` (10155 / 10156), normalized to
    ``{src, dest}``."""
    if cfg.subject_transform is None:
        return
    try:
        t = msgspec.convert(cfg.subject_transform, TransformConfig)
    except msgspec.ValidationError as exc:
        raise errors.invalid_json(str(exc)) from None
    if t.src and not is_valid_filter(t.src):
        raise _err(10155, f"stream transform source: invalid subject {t.src}")
    try:
        validate_mapping(t.src, t.dest)
    except TransformError as exc:
        raise _err(10156, f"stream transform: {exc}") from None
    cfg.subject_transform = {"src": t.src, "dest": t.dest}


def check_mirror_update(old: StreamConfig, new: StreamConfig) -> None:
    """A mirror stays as it was; removing it (promoting the stream) is allowed."""
    if new.mirror and new.mirror != old.mirror:
        raise _err(10055, "stream mirror configuration can not be updated")


# -- applying ---------------------------------------------------------------------------------

_transforms: dict[tuple[str, str], SubjectTransform] = {}


def _cached(src: str, dest: str) -> SubjectTransform:
    key = (src, dest)
    found = _transforms.get(key)
    if found is None:
        if len(_transforms) > 1024:
            _transforms.clear()
        found = _transforms[key] = SubjectTransform(src, dest)
    return found


def input_transform(cfg: StreamConfig) -> SubjectTransform | None:
    """The transform a stream applies to every subject it stores, if any."""
    raw = cfg.subject_transform
    if not raw:
        return None
    dest = raw.get("dest", "")
    if not dest:
        return None
    return _cached(raw.get("src", ""), dest)


_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def go_hash(text: str, size: int = 8) -> str:
    """nats-server's ``getHash``: the first bytes of sha256, each as a base-62 digit."""
    digest = hashlib.sha256(text.encode()).digest()
    return "".join(_DIGITS[b % 62] for b in digest[:size])


def format_time(ns: int) -> str:
    """Go's RFC3339Nano in UTC: trailing zeros of the fraction dropped."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        base += "." + f"{frac:09d}".rstrip("0")
    return base + "Z"


def stream_identity(created_ns: int) -> str:
    """What nats-server 2.15 calls a stream's identity: a hash of its creation time,
    the last field of the headers it stamps (a re-created origin differs)."""
    return go_hash(format_time(created_ns))


_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_time(text: str) -> int:
    """RFC 3339 with up to nanoseconds, as Go parses ``time.Time`` in JSON; ns."""
    m = _TIME.fullmatch(text)
    if m is None:
        raise ValueError(text)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    base = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    ns = int(base.timestamp()) * 1_000_000_000
    if m.group(7):
        ns += int(m.group(7).ljust(9, "0"))
    if m.group(9):
        offset = (int(m.group(10)) * 60 + int(m.group(11))) * 60 * 1_000_000_000
        ns -= offset if m.group(9) == "+" else -offset
    return ns


def source_header(iname: str, seq: int, subject: str, identity: str) -> str:
    """The ``Nats-Stream-Source`` value nats-server 2.15 writes:
    ``<name>[:hash] <origin seq> <filters> <dests> <original subject> [<identity>]``."""
    name, filters, dests = iname.split(" ")
    value = f"{name} {seq} {filters} {dests} {subject}"
    return f"{value} {identity}" if identity else value


def source_identity(value: str) -> str:
    """The origin identity a ``Nats-Stream-Source`` value ends with ("" if none)."""
    fields = value.split(" ")
    return fields[5] if len(fields) >= 6 else ""


def parse_source_header(value: str) -> tuple[str, int] | None:
    """(index name, origin sequence) of a ``Nats-Stream-Source`` value, or None."""
    fields = value.split(" ")
    if len(fields) < 4:
        return None
    try:
        seq = int(fields[1])
    except ValueError:
        return None
    return f"{fields[0]} {fields[2]} {fields[3]}", seq
