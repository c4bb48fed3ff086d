"""What ``tether store check`` found and what ``tether store repair`` lost: the reports
both durable backends print, and the checksum test of one stored row.

The SQLite side (integrity.py) and the PostgreSQL side (postgres_integrity.py) each
read their store their own way and fill in the same :class:`StoreReport`, so the two
commands print the same lines and exit with the same codes whatever the backend.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from tether.storage.checksum import checksum, stream_seed
from tether.storage.compression import decompress

__all__ = ["RepairReport", "StoreReport", "StreamReport", "account", "plural", "verifies"]

SHOWN = 20  # damaged sequences listed per stream; the count is always complete


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _sequences(seqs: list[int]) -> str:
    shown = ", ".join(map(str, seqs[:SHOWN]))
    more = f" and {len(seqs) - SHOWN} more" if len(seqs) > SHOWN else ""
    return f"sequence {shown}{more}"


@dataclass
class StreamReport:
    """One stream as found in the store (and in its manifest, where there is one)."""

    name: str
    defined: bool  # its definition (configuration) is there
    last_seq: int  # its high-water mark in the store
    claimed: int | None = None  # the manifest's claim: messages up to this were committed
    messages: int = 0  # rows read
    damaged: list[int] = field(default_factory=list)  # sequences that fail their checksum
    unreadable: list[str] = field(default_factory=list)  # parts that could not be read
    highest: int = 0  # the highest sequence among its messages (damaged ones included)

    @property
    def verified(self) -> int:
        return self.messages - len(self.damaged)

    @property
    def ok(self) -> bool:
        return not (self.damaged or self.unreadable or self.short_by or self.beyond)

    @property
    def short_by(self) -> int:
        """How far the store's last sequence falls short of the manifest's claim."""
        return max(0, (self.claimed or 0) - self.last_seq)

    @property
    def beyond(self) -> int:
        """How far its messages go past its high-water mark (which a write always
        raises with them: a lowered mark would hand their sequences out again)."""
        return max(0, self.highest - self.last_seq)

    def lines(self) -> list[str]:
        what = "" if self.defined else " (no definition: the engine cannot load it)"
        out = [
            f"stream {self.name!r}{what}: {self.messages} messages, {self.verified} verified,"
            f" last sequence {self.last_seq}"
            + (f" (manifest: at least {self.claimed})" if self.claimed is not None else "")
        ]
        if self.damaged:
            out.append(
                f"  {len(self.damaged)} damaged (checksum mismatch): {_sequences(self.damaged)}"
            )
        out.extend(f"  unreadable: {why}" for why in self.unreadable)
        if self.short_by:
            out.append(
                f"  sequences {self.last_seq + 1} to {self.claimed} were committed and are"
                " gone (a deleted or damaged write-ahead log, or a truncated database)"
            )
        if self.beyond:
            out.append(
                f"  messages up to sequence {self.highest} lie beyond the last sequence"
                f" {self.last_seq} (a damaged high-water mark)"
            )
        return out


@dataclass
class StoreReport:
    """What a check found. ``where`` names the store in the report; ``url`` is the
    ``--store`` value that the advice to repair it repeats."""

    where: str
    url: str
    files: list[str] = field(default_factory=list)  # what is there, one line each
    problems: list[str] = field(default_factory=list)  # store-wide problems
    streams: list[StreamReport] = field(default_factory=list)
    consumers: int = 0
    claims: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.streams)

    @property
    def damaged(self) -> int:
        return sum(len(s.damaged) for s in self.streams)

    def lines(self, *, advice: bool = True) -> list[str]:
        out = [f"store {self.where}", *(f"  {line}" for line in self.files)]
        out += [line for s in self.streams for line in s.lines()]
        messages = sum(s.messages for s in self.streams)
        verified = sum(s.verified for s in self.streams)
        out.append(
            f"{plural(len(self.streams), 'stream')}, {messages} messages, {verified} verified,"
            f" {self.damaged} damaged, {self.consumers} consumers"
        )
        out += [f"problem: {p}" for p in self.problems]
        if self.ok:
            out.append("the store is whole")
        elif advice:
            out.append(
                f"the store is damaged: `tether store repair --store {self.url}` keeps what"
                " is intact (stop the server first)"
            )
        return out


@dataclass
class RepairReport:
    """What a repair did: ``moved`` (files renamed aside) and ``done`` (one line each,
    after what was kept and lost) say how the backend went about it."""

    found: StoreReport
    repaired: bool = False
    kept: dict[str, int] = field(default_factory=dict)  # stream -> messages kept
    lost: list[str] = field(default_factory=list)
    moved: list[Path] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if not self.repaired:
            return [*self.found.lines(), "nothing to repair"]
        out = [*self.found.lines(advice=False), "repaired:"]
        out += [f"  moved aside: {path.name}" for path in self.moved]
        out += [
            f"  stream {name!r}: {plural(n, 'message')} kept"
            for name, n in sorted(self.kept.items())
        ]
        out += [f"  lost: {what}" for what in self.lost] or ["  nothing was lost"]
        out += [f"  {line}" for line in self.done]
        return out


def verifies(stream: str, row: tuple[object, ...]) -> bool:
    """Whether ``row`` (seq, subject, headers, data, ts, priority, crc, plain_size) of
    ``stream`` matches its checksum; a payload stored compressed (``plain_size`` not
    None) is decompressed first, and one that does not decompress fails."""
    seq, subject, headers, data, ts, priority, crc, plain_size = row
    try:
        if plain_size is not None:
            data = decompress(data, plain_size)  # type: ignore[arg-type]
        computed = checksum(
            stream_seed(stream),
            seq,  # type: ignore[arg-type]
            subject,  # type: ignore[arg-type]
            headers,  # type: ignore[arg-type]
            data,  # type: ignore[arg-type]
            ts,  # type: ignore[arg-type]
            priority,  # type: ignore[arg-type]
        )
    except (TypeError, ValueError, AttributeError, struct.error):  # values of the wrong type
        return False
    return computed == crc


def account(report: RepairReport, kept: set[str]) -> None:
    """Fill in what the repair kept and lost, from what the check found; ``kept``: the
    streams that came through the repair with their definition."""
    found = report.found
    for stream in found.streams:
        if stream.name not in kept:
            report.lost.append(
                f"stream {stream.name!r}: {plural(stream.messages, 'message')} without a definition"
            )
            continue
        report.kept[stream.name] = stream.verified
        if stream.damaged:
            report.lost.append(
                f"stream {stream.name!r}: {plural(len(stream.damaged), 'damaged message')}"
                f" ({_sequences(stream.damaged)})"
            )
        report.lost += [f"stream {stream.name!r}: unreadable {why}" for why in stream.unreadable]
        if stream.short_by:
            report.lost.append(
                f"stream {stream.name!r}: sequences {stream.last_seq + 1} to {stream.claimed}"
                " (committed, then lost with the write-ahead log or the database's end)"
            )
    present = {s.name for s in found.streams}
    for name, seq in sorted(found.claims.items()):
        if name not in present:
            report.lost.append(
                f"stream {name!r}: the whole stream (definition, consumers and messages"
                f" up to sequence {seq})"
            )
