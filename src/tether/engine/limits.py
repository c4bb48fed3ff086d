"""The server's JetStream limits: nats-server's ``jetstream { }`` sizes and ``limits { }``.

One account on one server, so these are nats-server's server-wide checks as a single
server makes them (``checkBytesLimits``, ``limitsExceeded``, ``setConsumerConfigDefaults``):

* ``max_memory`` / ``max_storage`` bound the streams whose configuration says
  ``storage: "memory"`` / ``"file"``, each counted as nats-server counts that storage
  (``state.bytes``), wherever Tether keeps them. A stream's ``max_bytes`` is reserved
  when it is created or raised (10028 / 10047 once the reservations would pass the
  bound); a publish is refused with 10023 while the streams of its kind already hold
  more than the bound (the message that crosses it is stored, as there).
* the consumer and batch limits cap or replace nats-server's defaults; a stream
  without ``max_consumers`` takes at most ``default_max_consumers`` (1000 unless set).

Sizes a server's configuration leaves unset are nats-server's dynamic defaults
(``dynJetStreamConfig``), worked out once at start: 3/4 of the machine's RAM for
``max_memory`` and 3/4 of the disk space left where the store lives for ``max_storage``
(:func:`default_max_memory`, :func:`default_max_storage`). A server enforces those
exactly as configured bounds. Two differences, both because Tether keeps every stream
in one store: the store's own files count as space left (else each restart of a store
holding data would shrink its bound), and a store kept in RAM gives each unset size
half of nats-server's figure (both kinds of stream live in the same RAM). A
:class:`ServerLimits` built without sizes (an engine on its own) has no bound: -1.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.engine.errors import ApiError

NO_BOUND = -1
# nats-server's defaults (server/jetstream.go): the consumers of a stream without
# max_consumers, the RAM assumed when the machine's cannot be read (256 MiB) and the
# disk assumed when the store's cannot be (1 TiB).
DEFAULT_MAX_CONSUMERS = 1000
FALLBACK_MEMORY = 256 * 1024 * 1024
FALLBACK_STORAGE = 1024**4


def system_memory() -> int:
    """The machine's RAM in bytes (what nats-server reads with sysinfo), 0 when unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf, or no such name here
        return 0


def default_max_memory(memory: int | None = None, memory_only: bool = False) -> int:
    """nats-server's ``max_memory`` when none is set: 3/4 of ``memory`` (the machine's
    RAM unless given), rounded as it rounds (a quarter first); 256 MiB when unknown.
    With ``memory_only`` (a store kept in RAM, holding the "file" streams there too)
    half of it, the other half being ``max_storage``'s: together they stay within
    nats-server's 3/4 of the RAM rather than 1.5 times it."""
    if memory is None:
        memory = system_memory()
    bound = memory // 4 * 3 if memory > 0 else FALLBACK_MEMORY
    return bound // 2 if memory_only else bound


def disk_available(directory: str | os.PathLike[str], own: int = 0) -> int:
    """nats-server's ``diskAvailable``: 3/4 of the bytes an unprivileged writer may
    still put on the file system holding ``directory`` (the nearest existing parent
    when it is not made yet), ``own`` bytes added to them; 1 TiB when that cannot be
    read."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        fs = os.statvfs(path)
    except (AttributeError, OSError):  # no statvfs on this platform, or unreadable
        return FALLBACK_STORAGE
    return (fs.f_bavail * fs.f_bsize + own) // 4 * 3


def files_size(paths: Iterable[str | os.PathLike[str]]) -> int:
    """The bytes the files among ``paths`` take (those missing or unreadable: none)."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


def default_max_storage(
    directory: str | os.PathLike[str] | None,
    memory_only: bool,
    store_files: Iterable[str | os.PathLike[str]] = (),
) -> int:
    """nats-server's ``max_storage`` when none is set, for a store kept in
    ``directory``: :func:`disk_available` there, the ``store_files`` counted as
    available too. nats-server counts only the free space; here the store's own files
    count as well, so that a restart finds the same bound rather than one smaller by
    what the store already holds. A store kept in memory holds the "file" streams in
    RAM: they get the other half of the RAM's share (:func:`default_max_memory`); a
    store elsewhere (no local directory) gets nats-server's 1 TiB guess."""
    if memory_only:
        return default_max_memory(memory_only=True)
    if directory is None:
        return FALLBACK_STORAGE
    return disk_available(directory, files_size(store_files))


def memory_exceeded() -> ApiError:
    return ApiError(500, 10028, "insufficient memory resources available")


def storage_exceeded() -> ApiError:
    return ApiError(500, 10047, "insufficient storage resources available")


def max_ack_pending_excess(limit: int) -> ApiError:
    return ApiError(400, 10121, f"consumer max ack pending exceeds system limit of {limit}")


def max_request_batch_excess(limit: int) -> ApiError:
    return ApiError(400, 10125, f"consumer max request batch exceeds server limit of {limit}")


@dataclass(slots=True)
class ServerLimits:
    """What the server allows beyond each stream's and consumer's own limits."""

    max_memory: int = NO_BOUND  # bytes of "memory" streams
    max_storage: int = NO_BOUND  # bytes of "file" streams
    max_ack_pending: int = 0  # caps a consumer's max_ack_pending (and its default 1000)
    max_request_batch: int = 0  # caps a pull consumer's max_batch (and is its default)
    duplicate_window_ns: int = 0  # caps a stream's duplicate_window (and its default 2m)
    # consumers of a stream without max_consumers (nats-server's 1000); 0 or less: none
    default_max_consumers: int = DEFAULT_MAX_CONSUMERS
    batch_inflight_per_stream: int = 0  # open atomic or fast batches of one stream
    batch_inflight_total: int = 0  # open atomic or fast batches of the server
    batch_max_msgs: int = 0  # messages of an atomic batch
    batch_timeout_ns: int = 0  # idle time that abandons a batch

    def bound(self, storage: str) -> int:
        """The bound of the streams with ``storage`` (-1: none)."""
        return self.max_memory if storage == "memory" else self.max_storage

    @property
    def sized(self) -> bool:
        """Whether either kind of stream is bounded (publishes must be counted)."""
        return self.max_memory >= 0 or self.max_storage >= 0

    def check_reservation(self, storage: str, add: int, reserved: int) -> None:
        """nats-server's ``checkBytesLimits`` for the server: ``add`` more bytes of
        ``max_bytes`` (below 0: one byte, a stream without max_bytes) on top of the
        ``reserved`` max_bytes of the streams with ``storage``."""
        bound = self.bound(storage)
        if bound < 0:
            return
        if add < 0:
            add = 1
        if reserved > bound or add > bound - reserved:
            raise memory_exceeded() if storage == "memory" else storage_exceeded()

    def report(self) -> dict[str, Any]:
        """/varz and /jsz ``limits``: the keys set, as nats-server names them (omitempty;
        ``default_max_consumers`` is its 1000 unless set, -1 when lifted)."""
        fields = (
            ("max_request_batch", self.max_request_batch),
            ("max_ack_pending", self.max_ack_pending),
            ("max_duplicate_window", self.duplicate_window_ns),
            ("max_batch_inflight_per_stream", self.batch_inflight_per_stream),
            ("max_batch_inflight_total", self.batch_inflight_total),
            ("max_batch_size", self.batch_max_msgs),
            ("max_batch_timeout", self.batch_timeout_ns),
            ("default_max_consumers", self.default_max_consumers),
        )
        return {name: value for name, value in fields if value}
