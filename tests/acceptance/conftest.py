"""Options of the acceptance tests: ``--rounds N`` runs the mixed-load crash test as a soak.

python -m pytest tests/acceptance/test_crash_mixed.py --rounds 50
"""

from __future__ import annotations

import pytest

DEFAULT_ROUNDS = 3
# Per-test time limit when --rounds is given: a fixed part plus this much per round.
SECONDS_PER_ROUND = 30


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rounds",
        type=int,
        default=None,
        metavar="N",
        help=f"kill -9 rounds of tests/acceptance/test_crash_mixed.py (default {DEFAULT_ROUNDS})",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A soak outlasts the default per-test timeout: give it time in proportion."""
    rounds = config.getoption("--rounds")
    if not rounds:
        return
    for item in items:
        if "crash_rounds" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(120 + SECONDS_PER_ROUND * rounds))


@pytest.fixture
def crash_rounds(request: pytest.FixtureRequest) -> int:
    rounds = request.config.getoption("--rounds")
    if rounds is None:
        return DEFAULT_ROUNDS
    if rounds < 1:
        raise pytest.UsageError("--rounds must be at least 1")
    return int(rounds)
