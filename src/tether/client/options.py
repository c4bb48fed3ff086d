"""Connection options and the pool of servers to (re)connect to."""

from __future__ import annotations

import random
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from tether.client.backoff import Backoff

ErrorCallback = Callable[[Exception], "Awaitable[None] | None"]
EventCallback = Callable[[], "Awaitable[None] | None"]

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PORT = 4222


@dataclass(frozen=True)
class Options:
    """How to connect and how to behave when the connection breaks.

    Reconnect delays follow ``reconnect_backoff`` (exponential, capped, with jitter),
    counted per reconnect episode; ``max_reconnect_attempts`` < 0 retries forever.
    While reconnecting, publishes are buffered up to ``reconnect_buffer_size`` bytes
    (:class:`~tether.client.errors.OutboundBufferFull` beyond). A connection that
    leaves ``max_outstanding_pings`` PINGs unanswered is stale and gets replaced.
    """

    servers: Sequence[str] = (DEFAULT_URL,)
    name: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    randomize: bool = True
    connect_timeout: float = 2.0
    allow_reconnect: bool = True
    max_reconnect_attempts: int = 60
    reconnect_backoff: Backoff = field(default_factory=lambda: Backoff(0.05, 2.0, 2.0, 0.2))
    reconnect_buffer_size: int = 8 * 1024 * 1024
    # TLS: the context to use (``tls://`` URLs and servers whose INFO says tls_required
    # without one get ssl's default context); TLS before INFO when the server expects it.
    tls: ssl.SSLContext | None = None
    tls_hostname: str | None = None
    tls_handshake_first: bool = False
    # Keys: a .creds file (user JWT + seed), an nkey seed file, or a seed string.
    user_credentials: str | None = None
    nkeys_seed: str | None = None
    nkeys_seed_str: str | None = None
    ping_interval: float = 120.0
    max_outstanding_pings: int = 2
    write_high_water: int = 4 * 1024 * 1024
    flush_timeout: float = 10.0
    drain_timeout: float = 30.0
    echo: bool = True
    inbox_prefix: str = "_INBOX"
    error_cb: ErrorCallback | None = None
    disconnected_cb: EventCallback | None = None
    reconnected_cb: EventCallback | None = None
    closed_cb: EventCallback | None = None


@dataclass
class Server:
    """One server address, with what we learned connecting to it."""

    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls: bool = False  # a tls:// URL: TLS even if INFO does not ask for it
    discovered: bool = False
    failures: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_url(url: str) -> Server:
    """``nats://[user:pass@|token@]host[:port]`` (or ``tls://``); a bare ``host:port`` too."""
    if "://" not in url:
        url = "nats://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tcp", "tls"):
        raise ValueError(f"unsupported scheme {parts.scheme!r} in {url!r} (nats://, tls://)")
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    token = None
    if user is not None and password is None:
        token, user = user, None  # nats://token@host
    return Server(host, port, user, password, token, tls=parts.scheme == "tls")


class ServerPool:
    """The servers to try, in a (by default random) order; learns servers from INFO."""

    def __init__(self, urls: Sequence[str], randomize: bool, rng: random.Random | None = None):
        if isinstance(urls, str):
            urls = [urls]
        self._servers = [parse_url(u) for u in urls] or [parse_url(DEFAULT_URL)]
        self._randomize = randomize
        self._rng = rng or random.Random()
        if randomize:
            self._rng.shuffle(self._servers)
        self._index = 0

    def __len__(self) -> int:
        return len(self._servers)

    @property
    def servers(self) -> list[Server]:
        return list(self._servers)

    def next(self) -> Server:
        """The next server, round robin."""
        server = self._servers[self._index % len(self._servers)]
        self._index = (self._index + 1) % len(self._servers)
        return server

    def mark_current(self, server: Server) -> None:
        """Reconnects start with the server after the one we were connected to."""
        if server in self._servers:
            self._index = (self._servers.index(server) + 1) % len(self._servers)

    def add_discovered(self, urls: Sequence[str]) -> None:
        """Add ``connect_urls`` from INFO that we do not know yet."""
        known = {s.address for s in self._servers}
        fresh = []
        for url in urls:
            try:
                server = parse_url(url)
            except ValueError:
                continue
            if server.address not in known:
                server.discovered = True
                known.add(server.address)
                fresh.append(server)
        if self._randomize:
            self._rng.shuffle(fresh)
        self._servers.extend(fresh)
