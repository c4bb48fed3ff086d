"""When republished messages go out: once the commit holding the original is durable.

The broker records each message of a stream with ``republish`` as it appends it (the
previous sequence on its subject is known only then); this listener sends the records
of the sequences a commit made durable, in order, through :attr:`Republisher.sink` (the
NATS front door's core routing). Records of a commit that failed are dropped when a
later commit of their stream lands (their sequences are then given again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tether.engine.streams.republish import republished
from tether.engine.streams.stream import Stream

# (subject, header block, payload) to core NATS.
RepublishSink = Callable[[str, bytes, bytes], None]


class Republisher:
    """Pending republishes per stream, sent when their commit is durable."""

    def __init__(self) -> None:
        self.sink: RepublishSink | None = None
        self._pending: dict[str, dict[int, tuple[str, bytes, bytes]]] = {}

    def record(
        self,
        stream: Stream,
        spec: dict[str, Any],
        seq: int,
        subject: str,
        headers: bytes,
        payload: bytes,
        ts: int,
        last_seq: int,
    ) -> None:
        """A message ``stream`` just appended (not durable yet)."""
        if self.sink is None:
            return
        out = republished(spec, stream.name, seq, subject, headers, payload, ts, last_seq)
        if out is not None:
            self._pending.setdefault(stream.name, {})[seq] = out

    # -- StreamListener ---------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        pass

    def on_stream_deleted(self, stream: Stream) -> None:
        self._pending.pop(stream.name, None)

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        pending = self._pending.get(stream.name)
        if not pending:
            return
        sink = self.sink
        top = seqs[-1]
        for seq in seqs:
            out = pending.pop(seq, None)
            if out is not None and sink is not None:
                sink(*out)
        # Commits land in sequence order: anything older left is from a failed one.
        for seq in [s for s in pending if s <= top]:
            del pending[seq]
        if not pending:
            del self._pending[stream.name]

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        pass
