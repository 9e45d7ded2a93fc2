"""``wait_for``: poll until a condition holds, or fail naming what was awaited.

Every harness (the test suites, the demo's local stack, the benchmarks) waits the same way, so
there is one implementation with one signature and one error. The error subclasses
``AssertionError`` so a test that times out reads as a failed test, not a crashed one; tools
catch ``WaitTimeoutError`` by name. The alternative, blocking watches per condition, would need a
watch per kind of object and still a deadline; polling every ``interval`` is simpler and fast
enough on a local API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """The condition did not hold in time; the message names it and its last value."""


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy, and return that.

    ``what`` names the condition in the error; ``on_timeout`` adds context to it (a log tail).
    ``check`` may raise to stop waiting early (for example when the awaited process died).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    extra = f"\n{on_timeout()}" if on_timeout else ""
    raise WaitTimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){extra}"
    )
