"""Delay before the attempt that follows a real failure.

Exponential (base, 2x base, 4x base, ...) and capped, like the Job controller's pod failure
backoff, so a crash-looping job stops hammering the scheduler and a transient fault (a flaky
filesystem mount) still gets a quick retry. Preemptions never back off: the cause was outside
the job and every second waiting is a second of lost GPU time.
"""

from __future__ import annotations

_MAX_DOUBLINGS = 62


def failure_delay(failures: int, base_seconds: float, max_seconds: float) -> float:
    """Seconds to wait after the ``failures``-th failure (1-based); 0 when there was none."""
    if failures <= 0 or base_seconds <= 0:
        return 0.0
    doublings = min(failures - 1, _MAX_DOUBLINGS)
    return float(min(max_seconds, base_seconds * (2**doublings)))
