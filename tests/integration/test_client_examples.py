"""The examples in examples/client/ (also shown in docs/client.md) run to completion."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.client.testing import PeerServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "client"


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def server(request: pytest.FixtureRequest) -> Iterator[PeerServer]:
    with PeerServer(request.param) as srv:
        yield srv


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(server: PeerServer, example: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env={**os.environ, "NATS_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
