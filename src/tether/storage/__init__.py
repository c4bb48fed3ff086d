"""Storage backends behind one interface, :class:`Store`.

Pick one with :func:`open_store`::

    store = open_store("sqlite:/var/lib/tether")
    await store.open()

Backends are imported only when asked for, so an unused backend costs nothing.
"""

from __future__ import annotations

from typing import Any

from tether.storage.base import (
    FILE_SIZING,
    MEMORY_SIZING,
    ConsumerRecord,
    CorruptMessage,
    DamagedStore,
    MessageColumns,
    MessageMeta,
    Sizing,
    StorageError,
    Store,
    StoredMessage,
    StreamRecord,
    sizing,
    subject_size,
)

__all__ = [
    "FILE_SIZING",
    "MEMORY_SIZING",
    "ConsumerRecord",
    "CorruptMessage",
    "DamagedStore",
    "MessageColumns",
    "MessageMeta",
    "Sizing",
    "StorageError",
    "Store",
    "StoredMessage",
    "StreamRecord",
    "open_store",
    "sizing",
    "subject_size",
]

_VALID_FORMS = "'memory', 'sqlite:DIR', 'sqlite://DIR' or 'postgresql://USER:PASS@HOST/DB'"
_SYNC_MODES = ("always", "os")


def open_store(url: str, *, sync: str = "always", **postgres: Any) -> Store:
    """Build (but do not open) the store that ``url`` names.

    * ``memory``: everything in memory, lost on exit;
    * ``sqlite:DIR`` or ``sqlite://DIR``: a SQLite database in directory ``DIR``
      (``sqlite:///abs/dir`` is the absolute ``/abs/dir``);
    * ``postgresql://user:pass@host/db`` (or ``postgres://``): a PostgreSQL database
      (needs the ``postgres`` extra: ``pip install 'tether[postgres]'``).

    ``sync`` is ``"always"`` (fsync every group commit) or ``"os"`` (leave flushing
    to the OS: survives a process crash, not a power loss); the memory backend
    ignores it; on PostgreSQL ``"os"`` turns ``synchronous_commit`` off for Tether's
    writes (a commit survives Tether crashing, not PostgreSQL crashing)
    and ``"always"`` keeps the server's setting. Raises ``ValueError`` for a malformed
    URL or sync mode, :class:`StorageError` when psycopg is missing. ``postgres`` are
    keyword arguments for :class:`~tether.storage.postgres.PostgresStore` (fencing).
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
        from tether.storage.postgres import PostgresStore

        return PostgresStore(
            url, synchronous_commit=None if sync == "always" else "off", **postgres
        )
    raise ValueError(f"unknown storage URL {url!r}: expected {_VALID_FORMS}")
