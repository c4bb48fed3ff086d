"""The server's JetStream limits: nats-server's ``jetstream { }`` sizes and ``limits { }``.

One account on one server, so these are nats-server's server-wide checks as a single
server makes them (``checkBytesLimits``, ``limitsExceeded``, ``setConsumerConfigDefaults``):

* ``max_memory`` / ``max_storage`` bound the streams whose configuration says
  ``storage: "memory"`` / ``"file"``, each counted as nats-server counts that storage
  (``state.bytes``), wherever Tether keeps them. A stream's ``max_bytes`` is reserved
  when it is created or raised (10028 / 10047 once the reservations would pass the
  bound); a publish is refused with 10023 while the streams of its kind already hold
  more than the bound (the message that crosses it is stored, as there).
* the consumer and batch limits cap or replace nats-server's defaults.

A bound of -1 (sizes) or 0 (the rest) means none: nats-server's defaults apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.engine.errors import ApiError

NO_BOUND = -1


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
    default_max_consumers: int = 0  # consumers of a stream without max_consumers
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
        """/varz and /jsz ``limits``: the keys set, as nats-server names them (omitempty)."""
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
