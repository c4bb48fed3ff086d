"""Shared fixtures: a real Tether server (subprocess, free ports, temp store)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tether.testing import RunningServer, run_server


@pytest.fixture
def tether_server() -> Iterator[RunningServer]:
    with run_server() as server:
        yield server


@pytest.fixture
def memory_server() -> Iterator[RunningServer]:
    with run_server(store="memory") as server:
        yield server
