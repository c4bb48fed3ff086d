"""Exponential backoff with jitter, capped: used for reconnects and by the worker."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before attempt ``n`` (1-based): ``initial * multiplier**(n-1)``, capped at
    ``maximum``, then spread by ``jitter`` (a fraction: 0.2 means ±20 %, never above
    ``maximum``). Jitter keeps many clients from retrying in lockstep."""

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.multiplier < 1:
            raise ValueError("backoff needs initial >= 0, maximum >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction between 0 and 1")

    def base(self, attempt: int) -> float:
        """The delay before ``attempt`` without jitter."""
        if attempt <= 0:
            return 0.0
        # Cap the exponent so huge attempt counts cannot overflow a float.
        exponent = min(attempt - 1, 64)
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before ``attempt`` with jitter applied."""
        base = self.base(attempt)
        if not self.jitter or not base:
            return base
        spread = base * self.jitter
        value = base + (rng or random).uniform(-spread, spread)
        return max(0.0, min(self.maximum, value))
