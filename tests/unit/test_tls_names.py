"""verify_and_map: how a users name is matched against what a certificate names."""

from __future__ import annotations

import pytest

from tether.server.nats.auth.certificates import _escape, same_name


@pytest.mark.parametrize(
    ("user", "name", "same"),
    [
        ("alice@example.com", "alice@example.com", True),
        ("alice@example.com", "bob@example.com", False),
        ("CN=alice,O=Example", "CN=alice,O=Example", True),
        ("CN=alice, O=Example", "CN=alice,O=Example", True),
        ("cn=alice,o=Example", "CN=alice,O=Example", True),
        ("CN=alice,O=Example", "CN=alice,O=Other", False),
        ("CN=alice", "CN=alice,O=Example", False),
        (r"CN=a\,b,O=x", r"CN=a\,b,O=x", True),
        ("alice", "CN=alice", False),
    ],
)
def test_same_name(user: str, name: str, same: bool) -> None:
    assert same_name(user, name) is same


@pytest.mark.parametrize(
    ("value", "escaped"),
    [("plain", "plain"), ("a,b", r"a\,b"), ("#x", r"\#x"), (" x ", r"\ x\ "), ("a+b", r"a\+b")],
)
def test_rfc2253_escaping(value: str, escaped: str) -> None:
    assert _escape(value) == escaped
