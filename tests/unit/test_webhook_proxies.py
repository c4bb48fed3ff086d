"""The proxy a push callback goes through, from the *_PROXY environment variables."""

from __future__ import annotations

import pytest

from tether.server.webhooks.proxies import ProxyChoice

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_no_proxy_configured_connects_directly() -> None:
    assert ProxyChoice().for_url("http://hooks.example/a") is None


def test_proxy_per_scheme_then_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy:3128")
    monkeypatch.setenv("ALL_PROXY", "http://any-proxy:3128")
    choice = ProxyChoice()
    assert choice.for_url("http://hooks.example/a") == "http://plain-proxy:3128"
    assert choice.for_url("https://hooks.example/a") == "http://any-proxy:3128"


def test_no_proxy_hosts_bypass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example,127.0.0.1")
    choice = ProxyChoice()
    assert choice.for_url("http://internal.example/hook") is None
    assert choice.for_url("http://127.0.0.1:8080/hook") is None
    assert choice.for_url("http://outside.example/hook") == "http://plain-proxy:3128"


def test_the_environment_is_read_when_the_choice_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    choice = ProxyChoice()
    monkeypatch.setenv("HTTP_PROXY", "http://late-proxy:3128")
    # Read once per worker: a variable set later applies to workers started later.
    assert choice.for_url("http://hooks.example/a") is None
    assert ProxyChoice().for_url("http://hooks.example/a") == "http://late-proxy:3128"
