"""The WebSocket listener's Origin rules (nats-server's checkOrigin)."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers

from tether.server.nats.websocket import OriginCheck


def _headers(**values: str) -> Headers:
    return Headers({key.replace("_", "-"): value for key, value in values.items()})


@pytest.mark.parametrize(
    ("origin", "why"),
    [
        (None, None),
        ("https://app.example", None),
        ("https://APP.example:443", None),
        ("http://app.example", "not in the allowed list"),
        ("https://app.example:8443", "not in the allowed list"),
        ("https://other.example", "not in the allowed list"),
        ("not a url", "invalid origin"),
    ],
)
def test_allowed_origins(origin: str | None, why: str | None) -> None:
    check = OriginCheck(False, ["https://app.example"], tls=False)
    headers = _headers(Host="broker:8080") if origin is None else _headers(Origin=origin)
    assert check.refuses(headers) == why


@pytest.mark.parametrize(
    ("host", "origin", "tls", "why"),
    [
        ("broker:8080", "http://broker:8080", False, None),
        ("broker", "http://broker", False, None),
        ("broker", "https://broker", True, None),
        ("broker:8080", "http://broker:9090", False, "not same origin"),
        ("broker:8080", "http://elsewhere:8080", False, "not same origin"),
    ],
)
def test_same_origin(host: str, origin: str, tls: bool, why: str | None) -> None:
    assert OriginCheck(True, [], tls=tls).refuses(_headers(Host=host, Origin=origin)) == why


def test_no_rules_let_everyone_in() -> None:
    assert OriginCheck(False, [], tls=False).refuses(_headers(Origin="http://x")) is None
