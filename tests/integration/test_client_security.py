"""The SDK's secure connections, against ``tether serve`` and the real nats-server started
with the same configuration file: TLS (upgrade after INFO, ``tls://``, handshake first,
client certificates), nkey users (a seed file) and operator-mode users (a ``.creds`` file)."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nkeys
import pytest
import trustme

from tether.client import AuthorizationError, ClientError, Connection, CredentialsError, connect
from tether.testing import run_nats_server, run_server


@contextmanager
def serving(kind: str, conf: Path) -> Iterator[int]:
    if kind == "tether":
        with run_server(store="memory", args=["-c", str(conf)]) as srv:
            yield srv.port
    else:
        with run_nats_server(["-c", str(conf)], jetstream=False) as peer:
            yield peer.port


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def pki(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    """Server certificate and key, the CA, a client certificate and its key."""
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client@example.com")
    paths = {k: tmp_path / f"{k}.pem" for k in ("cert", "key", "ca", "ccert", "ckey")}
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    client.cert_chain_pems[0].write_to_path(paths["ccert"])
    client.private_key_pem.write_to_path(paths["ckey"])
    return {k: str(v) for k, v in paths.items()}


def tls_conf(tmp_path: Path, pki: dict[str, str], extra: str = "") -> Path:
    path = tmp_path / "tls.conf"
    path.write_text(
        f'tls {{\n  cert_file: "{pki["cert"]}"\n  key_file: "{pki["key"]}"\n  timeout: 2\n'
        f"{extra}}}\n"
    )
    return path


def trusting(pki: dict[str, str], *, client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if client_cert:
        ctx.load_cert_chain(pki["ccert"], pki["ckey"])
    return ctx


async def round_trip(nc: Connection) -> bytes:
    sub = await nc.subscribe("secure.check")
    await nc.publish("secure.check", b"secret")
    got = (await sub.next_msg(5)).data
    await nc.close()
    return got


async def test_tls_upgrade_when_info_asks(kind: str, pki: dict[str, str], tmp_path: Path) -> None:
    with serving(kind, tls_conf(tmp_path, pki)) as port:
        # A nats:// URL: INFO says tls_required, the client upgrades with the context given.
        nc = await connect(f"nats://localhost:{port}", tls=trusting(pki))
        assert await round_trip(nc) == b"secret"
        nc = await connect(f"tls://127.0.0.1:{port}", tls=trusting(pki))
        assert await round_trip(nc) == b"secret"
        # Without the CA the server's certificate is not trusted: a clear failure.
        with pytest.raises(ClientError, match="CERTIFICATE_VERIFY_FAILED"):
            await connect(f"tls://localhost:{port}", allow_reconnect=False, connect_timeout=5)


async def test_tls_handshake_first(kind: str, pki: dict[str, str], tmp_path: Path) -> None:
    with serving(kind, tls_conf(tmp_path, pki, "  handshake_first: true\n")) as port:
        nc = await connect(f"tls://localhost:{port}", tls=trusting(pki), tls_handshake_first=True)
        assert await round_trip(nc) == b"secret"


async def test_tls_client_certificate(kind: str, pki: dict[str, str], tmp_path: Path) -> None:
    conf = tls_conf(tmp_path, pki, f'  ca_file: "{pki["ca"]}"\n  verify: true\n')
    with serving(kind, conf) as port:
        nc = await connect(f"tls://localhost:{port}", tls=trusting(pki, client_cert=True))
        assert await round_trip(nc) == b"secret"


def new_key(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), prefix))


async def test_nkey_user(kind: str, tmp_path: Path) -> None:
    user, stranger = new_key(nkeys.PREFIX_BYTE_USER), new_key(nkeys.PREFIX_BYTE_USER)
    conf = tmp_path / "nkey.conf"
    conf.write_text(f"authorization {{ users: [ {{nkey: {user.public_key.decode()}}} ] }}\n")
    good, bad = tmp_path / "user.nk", tmp_path / "stranger.nk"
    good.write_bytes(user.seed + b"\n")
    bad.write_bytes(stranger.seed + b"\n")
    with serving(kind, conf) as port:
        url = f"nats://127.0.0.1:{port}"
        assert await round_trip(await connect(url, nkeys_seed=str(good))) == b"secret"
        seed = user.seed.decode()
        assert await round_trip(await connect(url, nkeys_seed_str=seed)) == b"secret"
        with pytest.raises(AuthorizationError):
            await connect(url, nkeys_seed=str(bad), allow_reconnect=False)
    with pytest.raises(CredentialsError, match="no nkey seed"):
        await connect(url, nkeys_seed=str(conf))


def _jwt(signer: Any, subject: str, kind: str, claims: dict[str, Any]) -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = {
        "jti": secrets.token_hex(16).upper(),
        "iat": int(time.time()),
        "iss": signer.public_key.decode(),
        "sub": subject,
        "name": kind,
        "nats": {**claims, "type": kind, "version": 2},
    }
    payload = b64(json.dumps(body).encode())
    return f"{head}.{payload}.{b64(signer.sign(f'{head}.{payload}'.encode()))}"


async def test_creds_file(kind: str, tmp_path: Path) -> None:
    op = new_key(nkeys.PREFIX_BYTE_OPERATOR)
    acc, sys_acc = new_key(nkeys.PREFIX_BYTE_ACCOUNT), new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    user = new_key(nkeys.PREFIX_BYTE_USER)
    op_pub, acc_pub, sys_pub = (k.public_key.decode() for k in (op, acc, sys_acc))
    unlimited = dict.fromkeys(("subs", "conn", "leaf", "imports", "exports", "data", "payload"), -1)
    (tmp_path / "op.jwt").write_text(_jwt(op, op_pub, "operator", {"system_account": sys_pub}))
    conf = tmp_path / "op.conf"
    conf.write_text(
        f'operator: "{tmp_path / "op.jwt"}"\nresolver: MEMORY\nresolver_preload: {{\n'
        f'  {acc_pub}: "{_jwt(op, acc_pub, "account", {"limits": unlimited})}"\n'
        f'  {sys_pub}: "{_jwt(op, sys_pub, "account", {})}"\n}}\n'
    )
    claims = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}
    user_jwt = _jwt(acc, user.public_key.decode(), "user", claims)
    creds = tmp_path / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )
    broken = tmp_path / "broken.creds"
    broken.write_text(creds.read_text().replace(user.seed.decode(), "SUNOTASEED"))
    with serving(kind, conf) as port:
        url = f"nats://127.0.0.1:{port}"
        assert await round_trip(await connect(url, user_credentials=str(creds))) == b"secret"
        with pytest.raises(AuthorizationError):
            await connect(url, allow_reconnect=False)
    with pytest.raises(CredentialsError, match=r"invalid nkey seed|no nkey seed"):
        await connect(url, user_credentials=str(broken))
    with pytest.raises(CredentialsError, match="cannot read"):
        await connect(url, user_credentials=str(tmp_path / "missing.creds"))
