"""Go's time.Time JSON form, as the HTTP API answers deadlines and status times."""

from __future__ import annotations

from tether.server.http.common import rfc3339

BASE = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z


def test_zero_time_is_gos_zero_value() -> None:
    assert rfc3339(0) == "0001-01-01T00:00:00Z"


def test_fraction_keeps_nanoseconds_without_trailing_zeros() -> None:
    assert rfc3339(BASE) == "2023-11-14T22:13:20Z"
    assert rfc3339(BASE + 500_000_000) == "2023-11-14T22:13:20.5Z"
    assert rfc3339(BASE + 123_456_789) == "2023-11-14T22:13:20.123456789Z"
    assert rfc3339(BASE + 1_000_000_010) == "2023-11-14T22:13:21.00000001Z"


def test_same_second_then_another_second() -> None:
    # Consecutive calls reuse the formatted second; a new second must not.
    assert rfc3339(BASE + 1) == "2023-11-14T22:13:20.000000001Z"
    assert rfc3339(BASE + 2) == "2023-11-14T22:13:20.000000002Z"
    assert rfc3339(BASE + 86_400 * 10**9) == "2023-11-15T22:13:20Z"
    assert rfc3339(BASE - 1) == "2023-11-14T22:13:19.999999999Z"
