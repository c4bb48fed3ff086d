"""What the connection tells the parts that live as long as it does."""

from __future__ import annotations

from typing import Protocol


class Listener(Protocol):
    """Internal components that must act on connection events (re-issue pulls, fail waits)."""

    def _on_disconnected(self) -> None: ...
    def _on_reconnected(self) -> None: ...
    def _on_closed(self) -> None: ...
