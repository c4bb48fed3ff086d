"""What ``tether serve`` says about itself as it starts: version, store, sync mode,
JetStream's size bounds, and progress lines while a large store loads (an operator otherwise sees nothing for
seconds and wonders whether it hangs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tether.engine.broker import LoadProgress
from tether.engine.limits import ServerLimits
from tether.server.config import ServerConfig
from tether.version import NATS_COMPAT_VERSION, __version__

log = logging.getLogger("tether")

SYNC_MODES = {
    "always": "always (every group commit is fsynced before it is confirmed)",
    "os": "os (the operating system flushes: survives a crash of Tether, not a power loss)",
}
# On PostgreSQL a commit is confirmed at its COMMIT: the server's settings decide the rest.
POSTGRES_SYNC_MODES = {
    "always": "always (confirmed at PostgreSQL's COMMIT; its synchronous_commit decides the rest)",
    "os": "os (synchronous_commit = off: survives a crash of Tether, not of PostgreSQL)",
}
PROGRESS_EVERY = 1.0  # seconds between two progress lines


def store_location(url: str) -> str:
    """The store URL as an operator needs it in a log: an SQLite directory made absolute
    (``sqlite:///var/lib/tether``), a database URL without its password."""
    scheme, colon, rest = url.partition(":")
    if url == "memory":
        return "memory (nothing is kept on disk)"
    if colon and scheme == "sqlite":
        directory = Path(rest.removeprefix("//")).expanduser().resolve()
        return f"sqlite://{directory}"
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        user = f"{parts.username}:***@" if parts.username else ":***@"
        parts = parts._replace(netloc=user + host)
    return urlunsplit(parts)


def announce(cfg: ServerConfig) -> None:
    """The first lines: one each for the version, the store and the sync mode."""
    log.info("Starting tether")
    log.info("  Version:  %s (NATS protocol of nats-server %s)", __version__, NATS_COMPAT_VERSION)
    if cfg.jetstream:
        log.info("  Store:    %s", store_location(cfg.store))
        postgres = cfg.store.partition(":")[0] in ("postgres", "postgresql")
        modes = POSTGRES_SYNC_MODES if postgres else SYNC_MODES
        log.info("  Sync:     %s", modes.get(cfg.sync, cfg.sync))
    else:
        log.info("  Store:    none (jetstream = false)")


def friendly_bytes(n: int) -> str:
    """A size as nats-server writes it in its logs (``friendlyBytes``): ``17.66 GB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), 0
    while value >= 1024 and unit < 6:
        value /= 1024
        unit += 1
    return f"{value:.2f} {'KMGTPE'[unit - 1]}B"


def announce_limits(limits: ServerLimits) -> None:
    """The bounds of the streams' sizes, as nats-server's JetStream banner gives them
    (worth a line: unset, they were worked out from this machine)."""
    log.info("  Max Memory:  %s", friendly_bytes(limits.max_memory))
    log.info("  Max Storage: %s", friendly_bytes(limits.max_storage))


def load_progress(loaded: LoadProgress) -> Callable[[], str]:
    """What a progress line says about the streams loaded so far."""

    def say() -> str:
        now = f", reading {loaded.current}" if loaded.current else ""
        return (
            f"{loaded.streams} of {loaded.streams_total} streams, {loaded.messages:,} messages{now}"
        )

    return say


@contextlib.asynccontextmanager
async def loading(what: str, progress: Callable[[], str]) -> AsyncIterator[None]:
    """Around a long load: a line every second saying ``progress()``, then one with the
    time it took. Loads quicker than a second say only the last line."""
    started = time.monotonic()

    async def tick() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            log.info("Loading %s: %s (%.1fs)", what, progress(), time.monotonic() - started)

    ticker = asyncio.ensure_future(tick())
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    log.info("Loaded %s: %s in %.2fs", what, progress(), time.monotonic() - started)
