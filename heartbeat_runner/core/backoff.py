"""Exponential back-off: how long to wait after the n-th failure in a row. One formula for every retry in
Heartbeat (a write that lost a commit race, an alert destination that failed, a failed tick in the loop, a
job re-run by the retry policy), so they all grow and stop growing the same way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits ``first_s``, then ``first_s * factor``, ``first_s * factor**2``…, never more than ``max_s``.

    Invariants: the wait never shrinks as failures grow; it is 0 for no failure; it never exceeds ``max_s``.
    """

    first_s: float
    max_s: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.first_s < 0 or self.max_s < 0 or self.factor < 1:
            raise ValueError(f"back-off needs first_s >= 0, max_s >= 0 and factor >= 1, not {self}")

    def after(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row (1 is the first failure)."""
        if failures <= 0:
            return 0.0
        # the exponent is bounded so a long outage cannot overflow the float before the cap applies
        return min(self.max_s, self.first_s * self.factor ** min(failures - 1, 64))
