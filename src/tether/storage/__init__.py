"""Storage backends behind one interface, :class:`Store`.

Pick one with :func:`open_store`::

    store = open_store("sqlite:/var/lib/tether")
    await store.open()

Backends are imported only when asked for, so an unused backend costs nothing.
"""

from __future__ import annotations

from tether.storage.base import (
    ConsumerRecord,
    CorruptMessage,
    DamagedStore,
    MessageColumns,
    MessageMeta,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
)

__all__ = [
    "ConsumerRecord",
    "CorruptMessage",
    "DamagedStore",
    "MessageColumns",
    "MessageMeta",
    "StorageError",
    "Store",
    "StoredMessage",
    "StreamRecord",
    "open_store",
]

_VALID_FORMS = "'memory', 'sqlite:DIR' or 'sqlite://DIR'"
_SYNC_MODES = ("always", "os")


def open_store(url: str, *, sync: str = "always") -> Store:
    """Build (but do not open) the store that ``url`` names.

    * ``memory``: everything in memory, lost on exit;
    * ``sqlite:DIR`` or ``sqlite://DIR``: a SQLite database in directory ``DIR``
      (``sqlite:///abs/dir`` is the absolute ``/abs/dir``).

    ``sync`` is ``"always"`` (fsync every group commit) or ``"os"`` (leave flushing
    to the OS: survives a process crash, not a power loss); the memory backend
    ignores it. Raises ``ValueError`` for a malformed URL or sync mode.
    """
    if sync not in _SYNC_MODES:
        raise ValueError(f"unknown sync mode {sync!r}: expected 'always' or 'os'")
    scheme, colon, rest = url.partition(":")
    if url == "memory":
        from tether.storage.memory import MemoryStore

        return MemoryStore()
    if colon and scheme == "sqlite":
        directory = rest[2:] if rest.startswith("//") else rest
        if not directory:
            raise ValueError(f"storage URL {url!r} names no directory: expected {_VALID_FORMS}")
        from tether.storage.sqlite import SqliteStore

        return SqliteStore(directory, sync="always" if sync == "always" else "os")
    if colon and scheme in ("postgres", "postgresql"):
        raise StorageError("the postgres backend is not available yet")
    raise ValueError(f"unknown storage URL {url!r}: expected {_VALID_FORMS}")
