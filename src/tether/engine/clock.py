"""Time for the engine: real (the event loop) or fake (tests advance it by hand)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall time in nanoseconds plus timers; the engine's only source of time."""

    def now(self) -> int: ...
    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class LoopClock:
    """The real clock: ``time.time_ns`` and the running event loop's timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    # The C function itself rather than a method wrapping it: the engine asks for the
    # time once per ack and per delivery run, and a Python frame per call shows up there.
    now = staticmethod(time.time_ns)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(max(0.0, delay), callback)


class _FakeTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock tests move forward with :meth:`advance`; due timers fire in order."""

    def __init__(self, start_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start_ns
        self._timers: list[tuple[int, int, _FakeTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> int:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = _FakeTimer()
        due = self._now + max(0, int(delay * 1e9))
        heapq.heappush(self._timers, (due, next(self._seq), timer, callback))
        return timer

    def advance(self, seconds: float) -> None:
        target = self._now + int(seconds * 1e9)
        while self._timers and self._timers[0][0] <= target:
            due, _, timer, callback = heapq.heappop(self._timers)
            self._now = max(self._now, due)
            if not timer.cancelled:
                callback()
        self._now = target


_NS = 1_000_000_000


def go_duration(ns: int) -> str:
    """A non-negative duration the way Go's ``time.Duration.String`` prints it
    (``1.5s``, ``250ms``, ``1m30s``): nats-server writes durations so in headers,
    errors and monitoring."""
    if ns == 0:
        return "0s"
    if ns < _NS:
        for unit, size in (("ms", 10**6), ("µs", 10**3)):
            if ns >= size:
                return _fraction(ns, size) + unit
        return f"{ns}ns"
    hours, rest = divmod(ns, 3600 * _NS)
    minutes, rest = divmod(rest, 60 * _NS)
    secs = _fraction(rest, _NS) + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")
