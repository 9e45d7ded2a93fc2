"""How many bytes this process has written to checkpoint files and sent to the object store.

One counter for the whole process, advanced by the checkpoint writer (``sharded/storage.py``) and
the uploader (``objectstore/transfers.py``) after each block they move. It is a sign of life, not
an account: a long save that keeps moving bytes is still working, one whose count stands still is
stuck. The survivor's save reports it to the in-pod agent, which waits for a save as long as the
count grows (``save/survivor.py``, ``agent/supervisor.py``).
"""

from __future__ import annotations

import threading


class _Meter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes = 0


_meter = _Meter()


def moved(n: int) -> None:
    """``n`` more bytes landed in a file or the store."""
    with _meter.lock:
        _meter.bytes += n


def total() -> int:
    """Bytes moved by this process since it started."""
    with _meter.lock:
        return _meter.bytes


class Stall:
    """How long a byte count (this process's ``total``, or a saver's as the agent reads it)
    has stood still."""

    def __init__(self, count: int, now: float) -> None:
        self.count, self.since = count, now

    def seconds(self, count: int, now: float) -> float:
        """Seconds since the count last grew, ``count`` being its value at ``now``."""
        if count > self.count:
            self.count, self.since = count, now
        return now - self.since
