"""Generated message ids and request ids, and the memory of matched tokens."""

from __future__ import annotations

import re

import pytest

from tether.engine.jobs.registry import hash_token
from tether.server.http import auth, messages
from tether.server.http.auth import new_request_id, verify_token
from tether.server.http.messages import new_message_id


def test_message_ids_are_xid_like_unique_and_sorted_by_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = [new_message_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-v]{20}", i) for i in ids)
    # The same digits as the time, the process's random part and the counter.
    value = int(ids[0], 32)
    assert value >> 64 in range(int(messages.time.time()) - 5, int(messages.time.time()) + 1)
    assert (value >> 25) & (2**39 - 1) == messages._ID_RANDOM
    later = messages.time.time() + 1
    monkeypatch.setattr(messages.time, "time", lambda: later)
    assert new_message_id() > max(ids)


def test_request_ids_are_twenty_hex_digits_and_unique() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(rb"[0-9a-f]{20}", i) for i in ids)


def test_matched_tokens_are_remembered_per_digest() -> None:
    auth._MATCHED.clear()
    stored = hash_token("secret")
    assert not verify_token(None, stored)
    assert not verify_token("wrong", stored)
    assert not auth._MATCHED
    assert verify_token("secret", stored)
    assert (stored, "secret") in auth._MATCHED
    assert verify_token("secret", stored)
    # A new token has a new digest: the remembered match is not used for it.
    changed = hash_token("other")
    assert not verify_token("secret", changed)
    assert verify_token("other", changed)
    assert not verify_token("secret", "malformed digest")


def test_remembered_matches_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    auth._MATCHED.clear()
    monkeypatch.setattr(auth, "_MATCHED_MAX", 3)
    for n in range(10):
        token = f"t{n}"
        assert verify_token(token, hash_token(token))
        assert len(auth._MATCHED) <= 3
