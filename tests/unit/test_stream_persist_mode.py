"""``persist_mode``: ``default`` accepted and not reported; ``async`` checked as
nats-server checks it, then refused (a publish is only acknowledged once durable)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.engine.errors import ApiError
from tether.engine.streams.config import StreamConfig, normalize


def config(**fields: Any) -> StreamConfig:
    return normalize(StreamConfig(name="S", subjects=["s.>"], **fields))


@pytest.mark.parametrize("mode", [None, "", "default"])
def test_default_is_accepted_and_not_reported(mode: str | None) -> None:
    cfg = config(persist_mode=mode)
    assert cfg.persist_mode is None
    assert "persist_mode" not in cfg.to_dict()


@pytest.mark.parametrize(
    ("fields", "code", "text"),
    [
        ({"persist_mode": "bogus"}, 10025, 'invalid JSON: can not unmarshal "\\"bogus\\""'),
        (
            {"persist_mode": "async", "storage": "memory"},
            10052,
            "async persist mode is only supported on file storage",
        ),
        (
            {"persist_mode": "async", "allow_atomic": True},
            10052,
            "async persist mode is not supported with atomic batch publish",
        ),
        (
            {"persist_mode": "async"},
            10052,
            "async persist mode not supported by this server: a publish is acknowledged once "
            "durable",
        ),
    ],
)
def test_other_modes_are_refused(fields: dict[str, Any], code: int, text: str) -> None:
    with pytest.raises(ApiError) as exc:
        config(**fields)
    assert (exc.value.err_code, exc.value.description) == (code, text)
