"""TLS for NATS clients, each case run against Tether and the real nats-server started
with the same configuration file: plaintext INFO then the upgrade, TLS first, client
certificates, and clients that speak the wrong thing (the server keeps serving others)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import nats
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tether.testing import RawClient, run_nats_server, run_server


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def certs(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client@example.com")
    files = {
        "cert": tmp_path / "server-cert.pem",
        "key": tmp_path / "server-key.pem",
        "ca": tmp_path / "ca.pem",
        "client": tmp_path / "client.pem",
    }
    server.cert_chain_pems[0].write_to_path(files["cert"])
    server.private_key_pem.write_to_path(files["key"])
    ca.cert_pem.write_to_path(files["ca"])
    client.private_key_and_cert_chain_pem.write_to_path(files["client"])
    return {name: str(path) for name, path in files.items()}


def _conf(tmp_path: Path, certs: dict[str, str], extra: str = "", tail: str = "") -> str:
    path = tmp_path / "tls.conf"
    path.write_text(
        "tls {\n"
        f'  cert_file: "{certs["cert"]}"\n'
        f'  key_file: "{certs["key"]}"\n'
        "  timeout: 2\n"
        f"{extra}"
        "}\n"
        f"{tail}"
    )
    return str(path)


@contextmanager
def _serve(kind: str, conf: str) -> Iterator[int]:
    if kind == "tether":
        with run_server(store="memory", args=["-c", conf]) as srv:
            yield srv.port
    else:
        with run_nats_server(["-c", conf], jetstream=False) as ns:
            yield ns.port


@contextmanager
def _serve_monitor(kind: str, conf: str) -> Iterator[tuple[int, int]]:
    """The server of ``conf``; yields its client and monitoring ports."""
    if kind == "tether":
        with run_server(store="memory", args=["-c", conf]) as srv:
            yield srv.port, srv.http_port
    else:
        with run_nats_server(["-c", conf], jetstream=False) as ns:
            yield ns.port, ns.http_port


def _client_ctx(ca: trustme.CA, client_pem: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    if client_pem:
        ctx.load_cert_chain(client_pem)
    return ctx


async def _round_trip(nc: nats.NATS) -> bytes:
    sub = await nc.subscribe("tls.check")
    await nc.publish("tls.check", b"secret")
    return (await sub.next_msg(2)).data


async def test_tls_required(
    kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path
) -> None:
    with _serve(kind, _conf(tmp_path, certs)) as port:
        raw = await RawClient.connect("127.0.0.1", port)  # INFO arrives in plain text
        assert raw.info["tls_required"] is True
        assert "tls_verify" not in raw.info
        await raw.close()
        nc = await nats.connect(f"tls://localhost:{port}", tls=_client_ctx(ca))
        assert await _round_trip(nc) == b"secret"
        await nc.close()


async def test_tls_handshake_first(
    kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path
) -> None:
    with _serve(kind, _conf(tmp_path, certs, "  handshake_first: true\n")) as port:
        nc = await nats.connect(
            f"tls://localhost:{port}", tls=_client_ctx(ca), tls_handshake_first=True
        )
        assert await _round_trip(nc) == b"secret"
        await nc.close()
        # Nothing in plain text: a client waiting for INFO reads nothing.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.3)
        writer.close()


async def test_tls_verify(kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path) -> None:
    extra = f'  ca_file: "{certs["ca"]}"\n  verify: true\n'
    with _serve(kind, _conf(tmp_path, certs, extra)) as port:
        raw = await RawClient.connect("127.0.0.1", port)
        assert raw.info["tls_required"] is True
        assert raw.info["tls_verify"] is True
        await raw.close()
        nc = await nats.connect(f"tls://localhost:{port}", tls=_client_ctx(ca, certs["client"]))
        assert await _round_trip(nc) == b"secret"
        await nc.close()
        # Without a client certificate the server never answers (its TLS 1.3 refusal
        # comes after the client's side of the handshake is done).
        assert not await asyncio.to_thread(_pong_without_certificate, port, ca)


def _pong_without_certificate(port: int, ca: trustme.CA) -> bool:
    """Whether a TLS client without a certificate gets a PONG (blocking)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(4096)  # the plaintext INFO
        try:
            with _client_ctx(ca).wrap_socket(sock, server_hostname="localhost") as tls:
                tls.sendall(b"CONNECT {}\r\nPING\r\n")
                return b"PONG" in tls.recv(4096)
        except (ssl.SSLError, OSError):
            return False


async def test_plaintext_client_on_tls_port(
    kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path
) -> None:
    with _serve(kind, _conf(tmp_path, certs)) as port:
        raw = await RawClient.connect("127.0.0.1", port)
        await raw.send(b'CONNECT {"verbose":false}\r\nPING\r\n')
        assert await raw.wait_closed(5)
        assert b"PONG" not in raw.data and b"-ERR" not in raw.data  # no plaintext answer
        await raw.close()
        # Others are still served.
        nc = await nats.connect(f"tls://localhost:{port}", tls=_client_ctx(ca))
        assert await _round_trip(nc) == b"secret"
        await nc.close()


async def test_tls_client_on_plain_port(kind: str, ca: trustme.CA) -> None:
    ctx = _client_ctx(ca)
    cm = run_server(store="memory") if kind == "tether" else run_nats_server(jetstream=False)
    with cm as srv:
        port = srv.port
        # A client starting with TLS gets plaintext back: its handshake fails.
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost"),
                5,
            )
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        assert await _round_trip(nc) == b"secret"
        await nc.close()


def _dn(pem: str) -> str:
    """The certificate's subject as RFC 2253 writes it (the last RDN first)."""
    return x509.load_pem_x509_certificate(Path(pem).read_bytes()).subject.rfc4514_string()


async def test_tls_verify_and_map(
    kind: str,
    ca: trustme.CA,
    certs: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The certificate names the user: by its e-mail address, or by its subject DN; a
    certificate naming nobody in ``users`` is an Authorization Violation."""
    by_dn = ca.issue_cert("dn-only.example", common_name="alice")
    nobody = ca.issue_cert("nobody@example.com")
    pems = {}
    for name, cert in (("by_dn", by_dn), ("nobody", nobody)):
        pems[name] = str(tmp_path / f"{name}.pem")
        cert.private_key_and_cert_chain_pem.write_to_path(pems[name])
    dn = _dn(pems["by_dn"])
    assert dn.startswith("CN=alice,")
    extra = f'  ca_file: "{certs["ca"]}"\n  verify_and_map: true\n'
    users = (
        "authorization {\n  users: [\n"
        '    {user: "client@example.com", permissions: {publish: "tls.>", subscribe: "tls.>"}}\n'
        f'    {{user: "{dn}"}}\n'
        "  ]\n}\n"
    )
    with _serve(kind, _conf(tmp_path, certs, extra, users)) as port:
        raw = await RawClient.connect("127.0.0.1", port)
        assert raw.info["tls_verify"] is True and raw.info["auth_required"] is True
        await raw.close()
        for pem in (certs["client"], pems["by_dn"]):  # by e-mail (permitted: tls.>), by DN
            nc = await nats.connect(
                f"tls://localhost:{port}",
                tls=_client_ctx(ca, pem),
                allow_reconnect=False,
                connect_timeout=5,
            )
            assert await _round_trip(nc) == b"secret"
            await nc.close()
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(
                f"tls://localhost:{port}",
                tls=_client_ctx(ca, pems["nobody"]),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )


async def test_https_monitoring_port(
    kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path
) -> None:
    """``https`` serves the monitoring endpoints over TLS with the ``tls`` block's
    certificate, and /varz names the port ``https_port``."""
    conf = _conf(tmp_path, certs, tail="https: -1\n")
    with _serve_monitor(kind, conf) as (_, http_port):
        assert http_port
        async with httpx.AsyncClient(verify=_client_ctx(ca)) as http:
            varz = (await http.get(f"https://localhost:{http_port}/varz")).json()
            healthz = await http.get(f"https://localhost:{http_port}/healthz")
        assert healthz.status_code == 200
        # nats-server repeats the configured -1; Tether names the port it took.
        assert varz["https_port"] == (http_port if kind == "tether" else -1)
        assert varz["http_port"] == 0
        assert varz["tls_required"] is True
        # Plain HTTP gets Go's net/http answer, byte for byte, then the connection closes.
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        writer.write(b"GET /varz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer == (
            b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
        )


def _client_cert(pem_path: str) -> x509.Certificate:
    pem = Path(pem_path).read_bytes()
    return x509.load_pem_x509_certificate(pem[pem.index(b"-----BEGIN CERTIFICATE") :])


async def test_connz_shows_tls_and_the_user(
    kind: str, ca: trustme.CA, certs: dict[str, str], tmp_path: Path
) -> None:
    """/connz names the TLS version and suite of each connection; with ``auth`` also
    the client's certificate (subject, public-key and certificate SHA-256) and user."""
    extra = f'  ca_file: "{certs["ca"]}"\n  verify: true\n'
    users = "http: -1\nauthorization { users: [ {user: alice, password: pw} ] }\n"
    with _serve_monitor(kind, _conf(tmp_path, certs, extra, users)) as (port, http_port):
        nc = await nats.connect(
            f"tls://alice:pw@localhost:{port}",
            tls=_client_ctx(ca, certs["client"]),
            allow_reconnect=False,
        )
        try:
            async with httpx.AsyncClient() as http:
                plain = (await http.get(f"http://127.0.0.1:{http_port}/connz")).json()
                auth = (await http.get(f"http://127.0.0.1:{http_port}/connz?auth=1")).json()
        finally:
            await nc.close()
    conn = plain["connections"][0]
    assert conn["tls_version"] == "1.3"
    assert conn["tls_cipher_suite"].startswith("TLS_")
    assert "tls_peer_certs" not in conn and "authorized_user" not in conn
    conn = auth["connections"][0]
    assert conn["authorized_user"] == "alice" and conn["name_tag"] == "$G"
    leaf = conn["tls_peer_certs"][0]  # nats-server adds the chain; Python < 3.13 cannot
    cert = _client_cert(certs["client"])
    assert leaf["subject"] == cert.subject.rfc4514_string()
    assert leaf["cert_sha256"] == cert.fingerprint(hashes.SHA256()).hex()
    assert len(leaf["spki_sha256"]) == 64
