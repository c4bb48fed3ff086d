"""What happens to streams, for whoever follows them (consumers, front doors)."""

from __future__ import annotations

from typing import Protocol

from tether.engine.streams.stream import Stream


class StreamListener(Protocol):
    """Hooks the broker calls after each change; implement the ones you need."""

    def on_stream_changed(self, stream: Stream) -> None: ...
    def on_stream_deleted(self, stream: Stream) -> None: ...
    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None: ...
    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None: ...
