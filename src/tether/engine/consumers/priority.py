"""Priority groups of a pull consumer (ADR-42), as nats-server 2.14 runs them.

A consumer with ``priority_policy`` other than ``none`` names its groups; every JSON
pull request must name one of them (``group``). The policies:

* ``overflow``: a request with ``min_pending`` / ``min_ack_pending`` is served only
  while the consumer has at least that many messages pending / unacknowledged; until
  then it waits like a request with nothing to deliver.
* ``pinned_client``: one client at a time gets the messages. The first waiting request
  without an ``id`` is given a new pin id; every message carries it in ``Nats-Pin-Id``
  and only requests with that ``id`` are served, the others wait as standbys. A pull
  with the pin id restarts ``priority_timeout``; when it runs out (or an admin sends
  ``CONSUMER.UNPIN``) the pin goes to the next request without an id. A request with
  another id gets ``423``.
* ``prioritized``: waiting requests are served by their ``priority`` (0 first), in
  arrival order within one priority.

Like nats-server, the state of a pin lives in memory only: after a restart the first
request takes a new pin. nats-server keeps one pin per consumer whatever the number of
groups (the state of the first group is reported), and so does this.
"""

from __future__ import annotations

import secrets
import string
from collections import deque
from collections.abc import Callable
from enum import Enum

from tether.engine.clock import Clock, Timer
from tether.engine.consumers.config import ConsumerConfig
from tether.engine.consumers.pull_queue import PullRequest

NS = 1_000_000_000
_PIN_CHARS = string.ascii_letters + string.digits

WRONG_PIN_ID_T = (
    b"NATS/1.0 423 Nats-Wrong-Pin-Id\r\nNats-Pending-Messages: %d\r\nNats-Pending-Bytes: %d\r\n\r\n"
)
PIN_ID_MISMATCH = b"NATS/1.0 423 Nats-Pin-Id mismatch\r\n\r\n"


class Verdict(Enum):
    SERVE = 1  # the next message may go to this request
    SKIP = 2  # not now: look at the next request
    WRONG_PIN = 3  # its pin id is stale: end it with 423


def new_pin_id() -> str:
    """A fresh pin id, 22 characters like nats-server's NUIDs."""
    return "".join(secrets.choice(_PIN_CHARS) for _ in range(22))


def request_error(
    config: ConsumerConfig,
    group: str,
    min_pending: int,
    min_ack_pending: int,
    pin_id: str,
    priority: int,
) -> str:
    """What is wrong with a JSON pull request's priority fields ("" if nothing), in
    nats-server's order; the text follows ``400 Bad Request - ``."""
    policy = config.priority_policy
    if (min_pending or min_ack_pending) and policy != "overflow":
        return "Not a Overflow Priority consumer"
    if pin_id and policy != "pinned_client":
        return "Not a Pinned Client Priority consumer"
    if not 0 <= priority <= 9:
        return "Priority must be between 0 and 9"
    if policy != "none":
        if not group:
            return "Priority Group missing"
        if group not in config.priority_groups:
            return "Invalid Priority Group"
    return ""


class PriorityGroups:
    """The priority state of one pull consumer: its policy and the current pin."""

    def __init__(
        self,
        config: ConsumerConfig,
        clock: Clock,
        on_change: Callable[[str, dict[str, str]], None],
        on_unpinned: Callable[[], None],
    ) -> None:
        self.clock = clock
        # Told about pins: ("PINNED", {group, pinned_id}) / ("UNPINNED", {group, reason}).
        self._on_change = on_change
        # Called after a timeout dropped the pin (the standbys may now be served).
        self._on_unpinned = on_unpinned
        self.pin_id = ""
        self.pinned_ns = 0
        self._timer: Timer | None = None
        self._timer_group = ""
        self.configure(config)

    def configure(self, config: ConsumerConfig) -> None:
        self.policy = config.priority_policy
        self.groups = list(config.priority_groups)
        self.ttl = config.priority_timeout
        self.overflow = self.policy == "overflow"
        self.pinned = self.policy == "pinned_client"
        self.prioritized = self.policy == "prioritized"
        if not self.pinned and self.pin_id:
            self._drop_pin()

    # -- requests ----------------------------------------------------------------------------
    def on_request(self, req: PullRequest) -> bytes | None:
        """A new request of a pinned consumer: its pin id is checked and, if it is the
        current pin, the pin's timeout starts again. A status ends it at once."""
        if self.pinned and self.pin_id and req.has_group:
            if req.pin_id == self.pin_id:
                self._arm(req.group)
            elif req.pin_id:
                return PIN_ID_MISMATCH
        return None

    def verdict(self, req: PullRequest, num_pending: int, ack_pending: int) -> Verdict:
        """May the next message go to ``req``? (nats-server's ``nextWaiting``.)

        ``num_pending`` counts the message about to be sent; ``ack_pending`` the
        deliveries waiting for their acks before it."""
        if self.pinned:
            if not self.pin_id:
                if req.pin_id:
                    return Verdict.WRONG_PIN
                if req.has_group:
                    self.assign(req.group)
                    req.pin_id = self.pin_id  # the rest of its batch is its own
            elif req.pin_id != self.pin_id:
                return Verdict.WRONG_PIN if req.pin_id else Verdict.SKIP
        elif self.overflow and not _overflowing(req, num_pending, ack_pending):
            return Verdict.SKIP
        return Verdict.SERVE

    # -- the pin -------------------------------------------------------------------------------
    def assign(self, group: str) -> None:
        self.pin_id = new_pin_id()
        self.pinned_ns = self.clock.now()
        self._arm(group)
        self._on_change("PINNED", {"group": group, "pinned_id": self.pin_id})

    def release(self) -> None:
        """Give back a pin just assigned to a request that could not take the message
        (nats-server does so without an advisory)."""
        self._drop_pin()

    def unpin(self, group: str, reason: str) -> None:
        """``CONSUMER.UNPIN`` (reason ``admin``) or the timeout (``timeout``); the
        advisory goes out even when nothing was pinned, as on nats-server."""
        self._drop_pin()
        self._on_change("UNPINNED", {"group": group, "reason": reason})

    def _drop_pin(self) -> None:
        self.pin_id = ""
        self.pinned_ns = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, group: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_group = group
        self._timer = self.clock.call_later(self.ttl / NS, self._on_timeout)

    def _on_timeout(self) -> None:
        self._timer = None
        if not self.pin_id:
            return
        self.unpin(self._timer_group, "timeout")
        self._on_unpinned()

    def close(self) -> None:
        self._drop_pin()

    def delivery_header(self) -> bytes:
        """The header every message of a pinned consumer carries."""
        return b"Nats-Pin-Id: %s\r\n" % self.pin_id.encode()

    # -- views ----------------------------------------------------------------------------------
    def state(self) -> tuple[str, str, int] | None:
        """(group, pin id, pinned at) of the first group, which nats-server's consumer
        info reports as ``priority_groups``."""
        if not self.groups:
            return None
        return self.groups[0], self.pin_id, self.pinned_ns


def _overflowing(req: PullRequest, num_pending: int, ack_pending: int) -> bool:
    """Overflow: a request with limits is served once one of them is reached."""
    if req.min_pending <= 0 and req.min_ack_pending <= 0:
        return True
    return (0 < req.min_pending <= num_pending) or (0 < req.min_ack_pending <= ack_pending)


def insert_by_priority(waiting: deque[PullRequest], req: PullRequest) -> None:
    """Queue ``req`` after every request of its priority or a better one."""
    i = len(waiting)
    while i > 0 and waiting[i - 1].priority > req.priority:
        i -= 1
    waiting.insert(i, req)
