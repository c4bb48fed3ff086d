"""The strict decimal parser every front door uses for numbers in text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tether.protocol.numbers import INT64_MAX, parse_uint


def test_plain_digits() -> None:
    assert parse_uint("0") == 0
    assert parse_uint("42") == 42
    assert parse_uint(b"42") == 42
    assert parse_uint(str(INT64_MAX)) == INT64_MAX


def test_refuses_what_int_accepts_or_isdigit_allows() -> None:
    for bad in ["", " 7", "7 ", "+7", "-7", "7_0", "²", "٣", "7\n", "1e3", "0x10"]:
        assert parse_uint(bad) is None, bad
    assert parse_uint(str(INT64_MAX + 1)) is None
    assert parse_uint("9" * 400) is None
    assert parse_uint("11", maximum=10) is None


@given(st.text())
def test_never_raises_and_agrees_with_int(text: str) -> None:
    value = parse_uint(text)
    if value is not None:
        assert str(value) == text.lstrip("0") or (value == 0 and set(text) == {"0"})
