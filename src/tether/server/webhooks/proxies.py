"""Which proxy a callback URL goes through, from the environment.

Push deliveries honour ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY``
as Go's default transport (webhook-broker) does. aiohttp's ``trust_env`` would read the
environment and parse ``~/.netrc`` (in a thread) on every request; a consumer posts to
one callback, so the answer is worked out once per URL instead.
"""

from __future__ import annotations

import urllib.request
from urllib.parse import urlsplit

# Callbacks change rarely; the cache is only cleared so it cannot grow without bound.
_MAX_URLS = 64


class ProxyChoice:
    """The proxy of each callback URL (None: connect directly), read once per URL."""

    def __init__(self) -> None:
        # {"http": url, "https": url, "all": url, "no": "a,b"}, from the *_proxy variables.
        self._proxies = urllib.request.getproxies()
        self._by_url: dict[str, str | None] = {}

    def for_url(self, url: str) -> str | None:
        try:
            return self._by_url[url]
        except KeyError:
            pass
        proxy: str | None = None
        if self._proxies:
            parts = urlsplit(url)
            # proxy_bypass reads NO_PROXY (and on some platforms system settings).
            if not urllib.request.proxy_bypass(parts.hostname or ""):
                proxy = self._proxies.get(parts.scheme) or self._proxies.get("all") or None
        if len(self._by_url) >= _MAX_URLS:
            self._by_url.clear()
        self._by_url[url] = proxy
        return proxy
