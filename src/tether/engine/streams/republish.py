"""Republish: a stream's ``republish {src, dest, headers_only}``, checked as nats-server
checks it, and the message it sends to core NATS once a message is stored.

A stored message whose subject matches ``src`` is sent again to ``dest`` (a subject
transform of its subject) with the headers nats-server adds: ``Nats-Stream``,
``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp`` and ``Nats-Last-Sequence``
(the previous message on the same subject), plus ``Nats-Msg-Size`` and no payload
with ``headers_only``. Who receives it is core NATS's business: see
:mod:`tether.engine.streams.republisher` for when it is sent.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from tether.engine import errors
from tether.engine.subject_transform import SubjectTransform, TransformError
from tether.engine.subjects import filters_overlap, is_valid_filter

_FIELDS = ("src", "dest", "headers_only")


def check_republish(raw: Any, subjects: list[str]) -> dict[str, Any] | None:
    """The ``republish`` object of a stream configuration, validated and with its
    defaults (``src`` ``>``), in nats-server's field presence; raises ApiError."""
    if not isinstance(raw, dict):
        raise errors.invalid_json("cannot unmarshal republish into a configuration")
    for key in raw:
        if key not in _FIELDS:
            raise errors.invalid_json(f'json: unknown field "{key}"')
    src = raw.get("src") or ""
    dest = raw.get("dest") or ""
    headers_only = raw.get("headers_only") or False
    if not isinstance(src, str) or not isinstance(dest, str):
        raise errors.invalid_json("republish src and dest must be strings")
    if not isinstance(headers_only, bool):
        raise errors.invalid_json("republish headers_only must be a boolean")
    src = src or ">"
    if dest and is_valid_filter(dest) and any(filters_overlap(dest, s) for s in subjects):
        raise errors.invalid_stream_config(
            "stream configuration for republish destination forms a cycle"
        )
    if dest:
        try:
            transform(src, dest)
        except TransformError:
            raise errors.invalid_stream_config(
                f"stream configuration for republish with transform from '{src}' to "
                f"'{dest}' not valid"
            ) from None
    out: dict[str, Any] = {"src": src, "dest": dest}
    if headers_only:
        out["headers_only"] = True
    return out


@lru_cache(maxsize=256)
def transform(src: str, dest: str) -> SubjectTransform:
    """The parsed transform of a republish (configurations change rarely: cached)."""
    return SubjectTransform(src, dest)


def republished(
    spec: dict[str, Any],
    stream: str,
    seq: int,
    subject: str,
    headers: bytes,
    payload: bytes,
    ts: int,
    last_seq: int,
) -> tuple[str, bytes, bytes] | None:
    """What a stored message is republished as: (subject, header block, payload), or
    None when its subject is not one ``src`` takes."""
    dest = spec.get("dest")
    if not dest:
        return None
    target = transform(spec.get("src") or ">", dest).apply(subject)
    if target is None:
        return None
    base = headers[:-2] if headers else b"NATS/1.0\r\n"
    block = (
        b"%sNats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\n"
        b"Nats-Time-Stamp: %s\r\nNats-Last-Sequence: %d\r\n"
        % (base, stream.encode(), _bytes(subject), seq, rfc3339(ts).encode(), last_seq)
    )
    if spec.get("headers_only"):
        return target, block + b"Nats-Msg-Size: %d\r\n\r\n" % len(payload), b""
    return target, block + b"\r\n", payload


def rfc3339(ns: int) -> str:
    """Go's RFC3339Nano in UTC, trailing zeros of the fraction trimmed."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if not frac:
        return base + "Z"
    return f"{base}.{frac:09d}".rstrip("0") + "Z"


def _bytes(subject: str) -> bytes:
    # Subjects are read off the wire with surrogateescape: give back the same bytes.
    return subject.encode("utf-8", "surrogateescape")
