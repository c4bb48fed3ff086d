"""Fixtures shared by the unit tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tether.engine.clock import FakeClock

# Support modules here (headers_support) are imported by name: pytest's importlib
# mode does not put this directory on the path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand (a module may start it elsewhere)."""
    return FakeClock()
