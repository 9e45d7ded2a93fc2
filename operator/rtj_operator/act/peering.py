"""Whether kopf peering pauses this operator, and whether that pause is still expected.

kopf pauses an operator while the peering object holds a live record (``lastseen + lifetime`` in
the future) of another operator with the same or a higher priority. Two things made that pause
silent and long: a restarted process got a new random identity, so its own previous record
blocked it until the record expired; and kopf's liveness endpoint kept answering 200 the whole
time. The first is fixed by a stable identity (``--id``, the pod name in the chart). This module
is the second: the liveness probe mirrors kopf's rule from the peering object and reports the
operator unhealthy when it has been paused for longer than expected.

Expected means: a standby replica paused by an active one is healthy for as long as the active
one keeps refreshing its record; a pause by records that nobody refreshes should end when they
expire, so one that lasts longer than ``max_pause`` is reported. The alternative of watching
kopf's internal pause toggles was rejected: they are private, and the peering object is what
kopf itself decides from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

DEFAULT_LIFETIME = 60
"""kopf assumes this lifetime for records that do not state one."""


@dataclass(frozen=True)
class PeerRecord:
    """One operator's entry in a kopf peering object's status."""

    identity: str
    priority: int
    lifetime: float
    lastseen: datetime | None

    def alive(self, now: datetime) -> bool:
        """Whether kopf still counts the record (a record without lastseen counts as fresh)."""
        if self.lastseen is None:
            return True
        return self.lastseen + timedelta(seconds=self.lifetime) > now


def parse_records(status: Mapping[str, Any] | None) -> list[PeerRecord]:
    """The records of a peering object's status (malformed entries are skipped)."""
    records = []
    for identity, info in (status or {}).items():
        if not isinstance(info, Mapping):
            continue
        try:
            lastseen = info.get("lastseen")
            records.append(
                PeerRecord(
                    identity=str(identity),
                    priority=int(info.get("priority", 0)),
                    lifetime=float(info.get("lifetime", DEFAULT_LIFETIME)),
                    lastseen=datetime.fromisoformat(lastseen) if lastseen else None,
                )
            )
        except (TypeError, ValueError):
            continue
    return records


def blockers(
    records: list[PeerRecord], own_id: str, own_priority: int, now: datetime
) -> list[PeerRecord]:
    """The live records of other operators that pause this one (kopf's rule)."""
    return [
        r for r in records if r.identity != own_id and r.priority >= own_priority and r.alive(now)
    ]


@dataclass
class PauseWatch:
    """Remembers since when the operator is paused and when a blocker last showed life."""

    max_pause: float
    priority: int | None = None
    """This replica's priority. A refreshing record of the *same* priority does not make the
    pause expected: kopf pauses every replica of a tie, and a tie never ends by itself (two
    replicas given one ``--priority``), so all of them would stand by, healthy, forever."""
    paused_since: datetime | None = None
    last_refresh: datetime | None = None
    seen: dict[str, datetime | None] = field(default_factory=dict)

    def observe(self, blocking: list[PeerRecord], now: datetime) -> float | None:
        """Record what the peering object shows now; seconds of an unexpected pause (no
        blocker refreshed its record for longer than ``max_pause``), else None."""
        if not blocking:
            self.paused_since = self.last_refresh = None
            self.seen = {}
            return None
        current = {
            r.identity: r.lastseen
            for r in blocking
            if self.priority is None or r.priority > self.priority
        }
        if self.paused_since is None:
            self.paused_since = self.last_refresh = now
        elif any(self.seen.get(i) != seen for i, seen in current.items()):
            self.last_refresh = now  # an active peer is alive: a standby's pause is expected
        self.seen = current
        assert self.last_refresh is not None
        silent = (now - self.last_refresh).total_seconds()
        if self.max_pause > 0 and silent > self.max_pause:
            return silent
        return None


def peering_path(name: str, namespace: str | None) -> str:
    """API path of the ClusterKopfPeering (namespace None) or a namespace's KopfPeering."""
    if namespace is None:
        return f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}"
    return f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}"
