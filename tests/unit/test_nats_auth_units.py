"""The pieces of NATS authorization on their own: permission matching as nats-server's
subscription list does it, Go's %q quoting in -ERR texts, nkey checks, JWT decoding of
hostile input, and the settings refused at start."""

from __future__ import annotations

import base64
import secrets
import time

import bcrypt
import nkeys
import pytest

from tether.server.config import Permissions, ResponseRules, ServerConfig, SubjectRules, UserEntry
from tether.server.nats.auth import keys
from tether.server.nats.auth.jwt import JwtError, decode
from tether.server.nats.auth.permissions import Replies, UserPermissions, go_quote
from tether.server.nats.auth.users import Authenticator


def perms(**kwargs: object) -> UserPermissions:
    return UserPermissions(Permissions(**kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rules", "subject", "allowed"),
    [
        (["a.>"], "a.b", True),
        (["a.>"], "a", False),
        (["a.*"], "a.b.c", False),
        (SubjectRules(allow=["a.>"], deny=["a.secret"]), "a.secret", False),
        (SubjectRules(deny=["a.secret"]), "anything.else", True),
        ([], "a", False),  # an empty allow list allows nothing
        ("$JS.API.>", "$JS.API.STREAM.CREATE.S", True),
    ],
)
def test_publish(rules: object, subject: str, allowed: bool) -> None:
    p = perms(publish=rules)
    assert p.may_publish(subject) is allowed
    assert p.pub_cache[subject] is allowed  # remembered for the next publish


@pytest.mark.parametrize(
    ("rules", "subject", "queue", "allowed"),
    [
        (["a.*"], "a.*", "", True),  # the SUB's tokens are taken literally
        (["a.*"], "a.>", "", True),  # as nats-server's sublist: * matches the token ">"
        (["a.b"], "a.*", "", False),
        (["q.* workers"], "q.x", "workers", True),
        (["q.* workers"], "q.x", "others", False),
        (["q.* workers"], "q.x", "", False),
        (["q.*", "q.* workers"], "q.x", "", True),
        (SubjectRules(allow=[">"], deny=["q.x workers"]), "q.x", "workers", False),
        (SubjectRules(allow=[">"], deny=["q.x workers"]), "q.x", "", True),
        (["q.* w.*"], "q.x", "w.1", True),  # a wildcard queue name
    ],
)
def test_subscribe(rules: object, subject: str, queue: str, allowed: bool) -> None:
    assert perms(subscribe=rules).may_subscribe(subject, queue) is allowed


def test_a_wildcard_overlapping_a_deny_is_checked_on_delivery() -> None:
    p = perms(subscribe=SubjectRules(allow=["a.>"], deny=["a.secret"]))
    assert p.needs_delivery_check("a.>", "")
    assert not p.needs_delivery_check("a.b", "")
    assert not p.needs_delivery_check("b.>", "")
    assert p.delivery_denied("a.secret", "") and not p.delivery_denied("a.open", "")


def test_allow_responses_alone_allows_replies_only() -> None:
    p = perms(allow_responses=True)
    assert p.responses == (1, 120.0)
    assert not p.may_publish("anything")
    replies = Replies(*p.responses)
    replies.received("_INBOX.x")
    assert replies.use("_INBOX.x") and not replies.use("_INBOX.x")  # once


def test_responses_expire() -> None:
    p = perms(allow_responses=ResponseRules(max=-1, expires=0.01))
    replies = Replies(*p.responses)  # type: ignore[misc]
    replies.received("r")
    assert replies.use("r") and replies.use("r")  # no maximum
    time.sleep(0.02)
    assert not replies.use("r")


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("a.b", '"a.b"'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("é.ü", '"é.ü"'),
        ("a\x01", '"a\\x01"'),
        (b"a\xff".decode("utf-8", "surrogateescape"), '"a\\xff"'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_invalid_permission_subjects_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="not a valid subject"):
        perms(publish=["a..b"])
    with pytest.raises(ValueError, match="not a valid queue"):
        perms(subscribe=["a b..c"])


# -- nkeys ----------------------------------------------------------------------------------------


def user_key() -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))


def test_nonce_is_fifteen_characters() -> None:
    assert len(keys.new_nonce()) == 15


def test_a_public_key_must_be_of_its_role_with_its_checksum() -> None:
    pub = user_key().public_key.decode()
    assert keys.public_key(pub, keys.USER) is not None
    assert keys.public_key(pub, keys.ACCOUNT) is None
    broken = pub[:-1] + ("A" if pub[-1] != "A" else "B")
    assert keys.public_key(broken, keys.USER) is None
    assert keys.public_key("U" + "A" * 55, keys.USER) is None
    assert keys.public_key("not a key", keys.USER) is None


def test_signatures_in_both_encodings() -> None:
    kp = user_key()
    pub = kp.public_key.decode()
    sig = kp.sign(b"nonce")
    std = base64.b64encode(sig).decode()
    url = base64.urlsafe_b64encode(sig).rstrip(b"=").decode()
    assert keys.verify(pub, keys.USER, b"nonce", std)
    assert keys.verify(pub, keys.USER, b"nonce", url)
    assert not keys.verify(pub, keys.USER, b"other", std)
    assert not keys.verify(pub, keys.USER, b"nonce", "garbage!")
    assert not keys.verify(pub, keys.USER, b"nonce", "")


# -- JWTs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["", "a.b", "a.b.c", "eyJ.eyJ.x", "....", "e30.e30.AAAA", "e30=.e30.AAAA", "x" * 10_000],
)
def test_garbage_jwts_are_refused(token: str) -> None:
    with pytest.raises(JwtError):
        decode(token, "user", (keys.ACCOUNT,))


# -- settings refused at start ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            ServerConfig(users=[UserEntry(user="a"), UserEntry(user="a")]),
            'duplicate user "a"',
        ),
        (ServerConfig(users=[UserEntry(nkey="UNOPE")]), "not a valid public nkey"),
        (ServerConfig(users=[UserEntry(user="a")], no_auth_user="b"), "not present"),
        (ServerConfig(auth_token="t", users=[UserEntry(user="a")]), "token"),
        (ServerConfig(operator="eyJ.x.y"), "require an account resolver"),
        (ServerConfig(operator="eyJ.x.y", resolver="URL(http://x)"), "MEMORY"),
        (ServerConfig(resolver="MEMORY"), "need an operator"),
    ],
)
def test_settings_that_cannot_work_are_refused(cfg: ServerConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Authenticator(cfg)


def test_passwords_plain_and_bcrypt_and_names_compared_whole() -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    auth = Authenticator(
        ServerConfig(
            users=[UserEntry(user="plain", password="pw"), UserEntry(user="h", password=hashed)]
        )
    )

    def login(user: str, password: str) -> bool:
        found = auth.authenticate(
            user=user, password=password, token=None, nkey=None, jwt=None, sig=None, nonce=""
        )
        return found is not None

    assert login("plain", "pw") and not login("plain", "p") and not login("plai", "pw")
    assert login("h", "pw") and login("h", "pw")  # the second from the verified cache
    assert not login("h", "nope") and not login("h", hashed)
