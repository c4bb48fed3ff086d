"""Where a server listens: IPv6 loopback, the unspecified address, a name with several
addresses and nats-server's ``listen: "host:port"`` form, compared with nats-server."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nats
import pytest

from tether.server.app import Tether
from tether.server.config import load_config
from tether.testing import RawClient, run_nats_server, run_server

_IF_INET6 = Path("/proc/net/if_inet6")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def _need_ipv6() -> None:
    if _ipv6_loopback():
        return
    if os.environ.get("CI") and _IF_INET6.exists():
        pytest.fail("the kernel has IPv6 but ::1 cannot be bound: fix the CI machine")
    pytest.skip("no IPv6 loopback on this machine")


@contextmanager
def _serve(kind: str, host: str) -> Iterator[tuple[int, str]]:
    """(port, log) of a server of ``kind`` listening on ``host``."""
    if kind == "tether":
        with run_server(store="memory", host=host) as srv:
            yield srv.port, srv.stderr
    else:
        with run_nats_server(host=host, jetstream=False) as ns:
            yield ns.port, ns.stderr


async def _reaches(host: str, port: int) -> bool:
    try:
        client = await RawClient.connect(host, port, within=2.0)
    except OSError:
        return False
    await client.close()
    return True


async def test_ipv6_loopback(kind: str) -> None:
    _need_ipv6()
    with _serve(kind, "::1") as (port, log):
        assert f"Listening for client connections on [::1]:{port}" in log
        client = await RawClient.connect("::1", port)
        assert client.info["host"] == "::1"
        assert client.info["client_ip"] == "::1"
        await client.close()
        nc = await nats.connect(f"nats://[::1]:{port}")
        sub = await nc.subscribe("greet")
        await nc.publish("greet", b"hello")
        assert (await sub.next_msg(2)).data == b"hello"
        await nc.close()
        assert not await _reaches("127.0.0.1", port)


async def test_the_unspecified_ipv6_address_takes_ipv4_clients_too(kind: str) -> None:
    _need_ipv6()
    with _serve(kind, "::") as (port, log):
        assert f"Listening for client connections on [::]:{port}" in log
        assert await _reaches("::1", port)
        client = await RawClient.connect("127.0.0.1", port)
        assert client.info["host"] == "::"
        await client.close()


async def test_a_name_with_several_addresses_listens_on_one(kind: str) -> None:
    _need_ipv6()
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", 0, socket.AF_UNSPEC)}
    if not {"127.0.0.1", "::1"} <= addresses:
        pytest.skip("localhost does not name both loopback addresses here")
    with _serve(kind, "localhost") as (port, log):
        assert f"Listening for client connections on localhost:{port}" in log
        assert await _reaches("127.0.0.1", port)
        assert not await _reaches("::1", port)


async def test_a_bracketed_host_is_taken_bare() -> None:
    # nats-server refuses `-a [::1]` ("missing port in address"); Tether reads it as ::1.
    _need_ipv6()
    with run_server(store="memory", host="::1", args=["--host", "[::1]"]) as srv:
        assert f"Listening for client connections on [::1]:{srv.port}" in srv.stderr
        client = await RawClient.connect("::1", srv.port)
        assert client.info["host"] == "::1"
        await client.close()


@pytest.mark.parametrize(("listen", "host"), [("[::1]:0", "::1"), ("127.0.0.1:0", "127.0.0.1")])
async def test_listen_in_the_configuration_file(tmp_path: Path, listen: str, host: str) -> None:
    # nats-server's form, in Tether's TOML file (a nats-server file maps to the same).
    if ":" in host:
        _need_ipv6()
    config = tmp_path / "tether.toml"
    config.write_text(f'listen = "{listen}"\nhttp_port = 0\nnsq_port = 0\nstore = "memory"\n')
    app = Tether(load_config(config, {}))
    await app.start()
    try:
        assert app.config.host == host
        client = await RawClient.connect(host, app.nats.port)
        assert client.info["host"] == host
        assert client.info["port"] == app.nats.port
        await client.close()
    finally:
        await app.stop()
