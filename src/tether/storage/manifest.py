"""The manifest: a small file next to the database saying what the store must contain.

``tether.manifest`` is JSON::

    {"format": 1, "streams": {"ORDERS": 200, "EVENTS": 0}, "written_ns": 1700000000000000000}

Each stream named there existed, with its last sequence at least the number given,
in a commit that was durable when the manifest was written. So whatever happens to
the database afterwards, a whole store holds every stream of its manifest with a last
sequence at least as high. One that does not lost data that was acknowledged: the
database file was truncated, emptied or replaced, or its write-ahead log
(``tether.db-wal``, which holds the commits not yet copied into the database file)
was deleted or damaged.

Rules that keep a whole store from ever looking damaged, even after ``kill -9`` or a
power loss:

* a claim is added only after the commit it describes is durable (with
  ``sync="os"``, after fsyncing the write-ahead log first);
* a stream is removed from the manifest *before* the commit that deletes it;
* the file is replaced atomically: written to a temporary file, fsynced, renamed over
  the old one, and the directory fsynced. It holds the old claims or the new ones,
  never a mix.

Claims may lag behind the database (they are refreshed every few hundred
milliseconds under load), never run ahead of it. No manifest at all claims nothing:
a new directory, or a store written by a version of Tether without manifests.

This module knows files only; the SQLite backend decides when to write.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import msgspec

from tether.storage.base import DamagedStore

__all__ = [
    "MANIFEST_FILENAME",
    "Manifest",
    "compare",
    "database_file_problem",
    "fsync_file",
    "read_manifest",
    "remove_manifest",
    "write_manifest",
]

MANIFEST_FILENAME = "tether.manifest"
FORMAT = 1
_SQLITE_MAGIC = b"SQLite format 3\0"
_SQLITE_HEADER = 100


class Manifest(msgspec.Struct, frozen=True):
    """What a store must contain: each stream and the least its last sequence may be."""

    format: int
    streams: dict[str, int]
    written_ns: int = 0


def manifest_path(directory: Path) -> Path:
    return directory / MANIFEST_FILENAME


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of the store in ``directory``, or None when there is none.

    Raises :class:`DamagedStore` when it exists but cannot be read or understood.
    """
    path = manifest_path(directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedStore(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DamagedStore(f"{path} is damaged ({len(raw)} bytes): {exc}") from exc
    if manifest.format != FORMAT:
        raise DamagedStore(
            f"{path} has format {manifest.format}, which this version of tether does not know"
        )
    return manifest


def fsync_file(path: Path) -> None:
    """fsync ``path`` if it exists (any descriptor will do: the kernel flushes the file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, streams: dict[str, int]) -> None:
    """Replace the manifest atomically and durably; raises ``OSError`` on failure
    (the old manifest, if any, is then untouched)."""
    body = msgspec.json.encode(
        Manifest(format=FORMAT, streams=dict(sorted(streams.items())), written_ns=time.time_ns())
    )
    final = manifest_path(directory)
    # Unique per process and thread: two stores on one directory never share it.
    temp = directory / f"{MANIFEST_FILENAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _fsync_directory(directory)


def remove_manifest(directory: Path) -> None:
    """Remove the manifest (no claims at all); raises ``OSError`` on failure."""
    with contextlib.suppress(FileNotFoundError):
        manifest_path(directory).unlink()
    _fsync_directory(directory)


_WAL_HEADER = 32  # a WAL file of this size or less holds no frames


def database_file_problem(path: Path) -> str | None:
    """What makes the SQLite database file ``path`` certainly not whole, judged from its
    size and its header alone, or None.

    The header records the size of the database in pages as of the last write to the
    file; a file shorter than that was truncated (SQLite itself would read the missing
    pages as zeros).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "is missing"
    if size == 0:
        return "is empty (0 bytes)"
    with path.open("rb") as file:
        header = file.read(_SQLITE_HEADER)
    if len(header) < _SQLITE_HEADER or not header.startswith(_SQLITE_MAGIC):
        return f"is damaged: it does not start like a SQLite database ({size} bytes)"
    page_size = int.from_bytes(header[16:18], "big")
    if page_size == 1:
        page_size = 65536
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid only when written by the same change as the counter.
    valid = header[24:28] == header[92:96]
    # A checkpoint cut short (kill -9) can leave the file shorter than its header while
    # the WAL still holds every page it was copying: SQLite reads those from the WAL.
    wal = path.with_name(path.name + "-wal")
    wal_frames = wal.exists() and wal.stat().st_size > _WAL_HEADER
    if valid and pages and size < pages * page_size and not wal_frames:
        return f"is truncated: {size} bytes, where its header says {pages * page_size}"
    return None


def compare(claims: dict[str, int], held: dict[str, int]) -> list[str]:
    """What a store holding ``held`` (stream -> last sequence) lacks of ``claims``, one
    sentence per stream, in stream order."""
    problems: list[str] = []
    for name in sorted(claims):
        want = claims[name]
        if name not in held:
            problems.append(
                f"stream {name!r} is missing"
                + (f" (it held messages up to sequence {want})" if want else "")
            )
        elif held[name] < want:
            problems.append(
                f"stream {name!r} ends at sequence {held[name]}, but messages up to"
                f" {want} were committed"
            )
    return problems
