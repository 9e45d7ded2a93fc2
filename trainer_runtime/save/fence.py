"""The run's fence: a gang of an older membership epoch can no longer commit into the run.

When a gang is re-formed (a lost pod replaced, survivors kept; or a whole new gang), the old
membership's processes do not all die at once: a pod cut off from the API server by a network
partition, or one slow to get its SIGKILL, may still be training, and may try to save. Its
commit would move ``latest.json`` back to its own, older line of training behind the new gang.

So every process of a managed gang knows its membership epoch (``RTJ_MEMBERSHIP_EPOCH``, which
only grows), rank 0 of each gang raises the run's fence to it when it starts (``fence.json`` at
the run's root, written atomically, never lowered), and a save checks the fence twice: before any
byte is written (rank 0 decides and tells every rank, so they stop together) and again right
before the manifest (the commit). A gang whose epoch is below the fence gets a
``StaleMembershipError`` and writes no manifest and no pointer; it removes nothing either, since
a folder of the same name may be the new gang's.

Limits (docs/survivors.md): the fence lives in the run's folder, so it protects a shared folder
(a volume every pod mounts); with node-local folders each node has its own (a run in an object
store has one in the bucket too: ``objectstore/bucket_fence.py``). Raising it is a read then a
write: two gangs that
start at the same moment could each read the other's lower value, but a stale gang is by
definition one that started earlier, so the newest gang's claim is the one that lands last.
(Rejected: a lock or lease in the API server: the runtime talks to no API server for its own
safety, and a lease would need a clock both sides trust.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from . import atomic

log = logging.getLogger(__name__)
FENCE_NAME = "fence.json"


class FenceRules:
    """What a fence means, wherever it is kept: ``epoch`` is this gang's; a subclass reads and
    writes the fence's JSON body (``_read``: None when there is none) and says where it is."""

    epoch: int

    def _read(self) -> str | None:
        raise NotImplementedError

    def _write(self, body: str) -> None:
        raise NotImplementedError

    def where(self) -> str:
        raise NotImplementedError

    def current(self) -> int | None:
        """The fence's epoch, or None when no gang has claimed the run (or the body is bad)."""
        text = self._read()
        if text is None:
            return None
        try:
            body = json.loads(text)
        except ValueError as exc:
            log.warning("%s cannot be read (%s); treated as absent", self.where(), exc)
            return None
        value = body.get("epoch") if isinstance(body, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def claim(self) -> None:
        """Raise the fence to this gang's epoch (never lower it)."""
        current = self.current()
        if current is not None and current >= self.epoch:
            return
        self._write(json.dumps({"epoch": self.epoch}) + "\n")

    def stale(self) -> str | None:
        """Why this gang may not commit (a newer gang claimed the run), or None."""
        current = self.current()
        if current is None or current <= self.epoch:
            return None
        return (
            f"this gang's membership epoch {self.epoch} is older than the run's fence "
            f"{current} ({self.where()}): a newer gang owns the run"
        )


@dataclass(frozen=True)
class Fence(FenceRules):
    """The fence of the run folder ``root`` as seen by a gang of membership ``epoch``."""

    root: Path
    epoch: int

    def where(self) -> str:
        return str(self.root / FENCE_NAME)

    def _read(self) -> str | None:
        try:
            return (self.root / FENCE_NAME).read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("%s cannot be read (%s); treated as absent", self.where(), exc)
            return None

    def _write(self, body: str) -> None:
        atomic.makedirs_durable(self.root)
        atomic.write_bytes_atomic(self.root / FENCE_NAME, body.encode())
