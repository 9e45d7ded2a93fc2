"""Exponential backoff with full jitter for retrying whole transfers.

botocore already retries single requests (standard mode); this is the outer loop that survives
longer outages (a server restart, a network partition of minutes) without hammering the store,
and whose waits can be cut short when the process is shutting down.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Delays of ``initial * 2**n`` s capped at ``maximum``, each drawn from [delay/2, delay]."""

    initial: float = 1.0
    maximum: float = 60.0

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0-based)."""
        base = min(self.maximum, self.initial * (2 ** min(attempt, 30)))
        return random.uniform(base / 2, base)


def retry_call(
    fn: Callable[[], T],
    *,
    attempts: int,
    backoff: Backoff,
    retryable: Callable[[BaseException], bool],
    what: str,
    stop: threading.Event | None = None,
) -> T:
    """Call ``fn`` until it succeeds, it raises a non-retryable error, or ``attempts`` are used.

    Waits between attempts end early when ``stop`` is set (the last error is then raised).
    """
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            attempt += 1
            if attempt >= attempts or not retryable(exc) or (stop is not None and stop.is_set()):
                raise
            wait = backoff.delay(attempt - 1)
            log.warning(
                "%s failed (attempt %d/%d, retrying in %.1fs): %s",
                what,
                attempt,
                attempts,
                wait,
                exc,
            )
            if stop is not None:
                if stop.wait(wait):
                    raise
            else:
                threading.Event().wait(wait)
