"""RDY accounting for a worker that pulls from several servers (NSQ client rules).

Pure logic with an injectable clock and random source, so every rule is unit-testable:

- ``rdy`` of a source is a cap on messages in flight from it (being handled, or
  requested and not yet received); the sum over sources never exceeds
  ``max_in_flight``;
- a new source starts at RDY 1, then gets an even share ``max_in_flight // n``;
- with more sources than ``max_in_flight``, only some get RDY 1 and, periodically,
  RDY held by sources idle for ``low_rdy_idle_timeout`` moves to random others;
- backoff: a failure sets RDY 0 everywhere for ``backoff.delay(level)``; then one
  source gets RDY 1 to test the waters; only that window's first result counts:
  success lowers the level (level 0 resumes full flow), failure raises it;
- ``is_starved()``: some source has in-flight >= 85 % of its last RDY.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tether.client.backoff import Backoff

STARVED_RATIO = 0.85
# Re-pull once what is still owed drops below this share of RDY (NSQ's "~25 %").
REFILL_RATIO = 0.25


class Phase(Enum):
    NORMAL = "normal"
    BACKOFF = "backoff"  # RDY 0 everywhere until the window ends
    TESTING = "testing"  # RDY 1 on one source; waiting for one result


@dataclass(eq=False)
class SourceState:
    """What the controller knows about one source (one server's consumer)."""

    name: str
    rdy: int = 0
    last_rdy: int = 0
    in_flight: int = 0
    owed: int = 0
    last_message: float = 0.0
    rdy_since: float = 0.0
    delivered: int = field(default=0)

    @property
    def credit(self) -> int:
        """How many more messages we may request from this source now."""
        return self.rdy - self.in_flight - self.owed

    def wants_pull(self) -> bool:
        """NSQ refills when the count drops to 0 or below ~25 % of RDY."""
        return self.credit > 0 and self.owed <= self.rdy * REFILL_RATIO

    def over_cap(self) -> bool:
        """More requested than RDY allows: outstanding pulls must be cancelled."""
        return self.owed > 0 and self.owed + self.in_flight > self.rdy


class ReadyController:
    """Decides every source's RDY; the worker applies it (pulls, cancels)."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        backoff: Backoff | None = None,
        low_rdy_idle_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.backoff = backoff
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.clock = clock
        self.rng = rng or random.Random()
        self.sources: list[SourceState] = []
        self.phase = Phase.NORMAL
        self.level = 0
        self.window_ends = 0.0
        self.epoch = 0  # bumped per backoff window; results of older epochs are ignored
        self._test_source: SourceState | None = None

    # -- bookkeeping ----------------------------------------------------------------------

    @property
    def total_rdy(self) -> int:
        return sum(s.rdy for s in self.sources)

    def add_source(self, name: str) -> SourceState:
        src = SourceState(name, rdy_since=self.clock())
        self.sources.append(src)
        if self.phase is Phase.NORMAL:
            self._set(src, 1)  # no-op when the cap is already reached
        return src

    def remove_source(self, src: SourceState) -> None:
        self.sources.remove(src)
        if self._test_source is src:
            self._test_source = None
        self.rebalance()

    def _set(self, src: SourceState, count: int) -> None:
        """Set RDY, never letting the total exceed ``max_in_flight``."""
        others = self.total_rdy - src.rdy
        count = max(0, min(count, self.max_in_flight - others))
        if count != src.rdy:
            src.rdy_since = self.clock()
        src.rdy = count
        if count:
            src.last_rdy = count

    def share(self) -> int:
        """The even per-source RDY: ``max_in_flight // n`` (at least 1)."""
        return max(1, self.max_in_flight // max(1, len(self.sources)))

    # -- events ---------------------------------------------------------------------------

    def on_message(self, src: SourceState) -> None:
        """A message arrived from ``src``."""
        src.in_flight += 1
        src.delivered += 1
        if src.owed:
            src.owed -= 1
        src.last_message = self.clock()

    def on_finished(self, src: SourceState) -> None:
        """A message from ``src`` was handled (whatever the outcome); maybe raise its RDY."""
        src.in_flight = max(0, src.in_flight - 1)
        if self.phase is Phase.NORMAL and src.rdy < self.share():
            # NSQ: after a message, a source below its share (e.g. still at the initial
            # RDY 1) gets the full share, capped so the total stays within bounds.
            self._set(src, self.share())

    def on_result(self, success: bool, epoch: int) -> None:
        """The outcome of one message; drives backoff. ``epoch`` is the one it arrived in."""
        if self.backoff is None:
            return
        if self.phase is Phase.BACKOFF:
            return  # one result per window: the test message's
        if self.phase is Phase.TESTING:
            if epoch != self.epoch:
                return  # delivered before this window: not the test message
            if success:
                self.level -= 1
                if self.level <= 0:
                    self._resume()
                    return
            else:
                self.level += 1
            self._start_window()
            return
        if not success:
            self.level = 1
            self._start_window()

    def _start_window(self) -> None:
        assert self.backoff is not None
        self.phase = Phase.BACKOFF
        self.epoch += 1
        self.window_ends = self.clock() + self.backoff.delay(self.level)
        self._test_source = None
        for src in self.sources:
            self._set(src, 0)

    def window_over(self) -> bool:
        return self.phase is Phase.BACKOFF and self.clock() >= self.window_ends

    def end_window(self) -> SourceState | None:
        """The backoff window ended: RDY 1 on one source to test the waters."""
        if self.phase is not Phase.BACKOFF:
            return None
        self.phase = Phase.TESTING
        self.epoch += 1
        return self._pick_test_source()

    def _pick_test_source(self) -> SourceState | None:
        for src in self.sources:
            self._set(src, 0)
        if not self.sources:
            return None
        # Prefer the source that delivered most recently: it is the likeliest to have work.
        recent = max(self.sources, key=lambda s: s.last_message)
        src = recent if recent.last_message else self.rng.choice(self.sources)
        if self._test_source is not None and len(self.sources) > 1 and src is self._test_source:
            src = self.rng.choice([s for s in self.sources if s is not src])
        self._test_source = src
        self._set(src, 1)
        return src

    def _resume(self) -> None:
        self.phase = Phase.NORMAL
        self.level = 0
        self.epoch += 1
        self._test_source = None
        self.rebalance()

    # -- periodic -------------------------------------------------------------------------

    def rebalance(self) -> None:
        """Even distribution in normal flow; rotation when sources outnumber the cap."""
        if self.phase is Phase.BACKOFF:
            return
        if self.phase is Phase.TESTING:
            src = self._test_source
            idle = src is None or (
                src.in_flight == 0
                and self.clock() - max(src.rdy_since, src.last_message) > self.low_rdy_idle_timeout
            )
            if idle:
                self._pick_test_source()  # the test source has nothing: try another
            return
        if len(self.sources) <= self.max_in_flight:
            share = self.share()
            # Lower first, so raising the others never has to squeeze past the cap.
            for src in self.sources:
                if src.rdy > share:
                    self._set(src, share)
            for src in self.sources:
                if src.rdy < share:
                    self._set(src, share)
            return
        self._rotate()

    def _rotate(self) -> None:
        """More sources than ``max_in_flight``: move RDY from idle sources to random others."""
        now = self.clock()
        for src in self.sources:
            if src.rdy > 1:
                self._set(src, 1)
        holders = [s for s in self.sources if s.rdy]
        for src in holders:
            if (
                src.in_flight == 0
                and now - max(src.rdy_since, src.last_message) > self.low_rdy_idle_timeout
            ):
                self._set(src, 0)
        free = self.max_in_flight - self.total_rdy
        if free <= 0:
            return
        waiting = [s for s in self.sources if not s.rdy and s not in holders]
        if len(waiting) < free:
            waiting += [s for s in self.sources if not s.rdy and s in holders]
        for src in self.rng.sample(waiting, min(free, len(waiting))):
            self._set(src, 1)

    def is_starved(self) -> bool:
        """Whether any source has in-flight >= 85 % of its last RDY (time to flush a batch)."""
        return any(
            s.in_flight > 0 and s.in_flight >= s.last_rdy * STARVED_RATIO for s in self.sources
        )
