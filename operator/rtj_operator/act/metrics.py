"""Prometheus metrics of the operator.

What an on-call engineer of a spot fleet asks: how often are jobs interrupted and why
(``rtj_interruptions_total{cause,kind}``), how fast does the operator put a gang back
(``rtj_preemption_to_resubmission_seconds``), how many resubmissions happen
(``rtj_resubmissions_total{reason}``), and how many jobs are in each phase (``rtj_jobs{phase}``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..api.status_types import Phase

INTERRUPTIONS = Counter(
    "rtj_interruptions_total",
    "Attempts that ended early, by classified cause.",
    ["cause", "kind"],
)
RESUBMISSIONS = Counter(
    "rtj_resubmissions_total",
    "Gangs created for a new attempt, by why.",
    ["reason"],
)
RESUBMISSION_LATENCY = Histogram(
    "rtj_preemption_to_resubmission_seconds",
    "From the event that revealed a preemption to the next gang's pods all created.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
NOTICES = Counter(
    "rtj_preemption_notices_total",
    "Preemption notices written into rank pods.",
)
QUARANTINES = Counter(
    "rtj_checkpoints_quarantined_total",
    "Checkpoints quarantined after repeated failures.",
)
RECONCILE_SECONDS = Histogram(
    "rtj_reconcile_seconds",
    "Duration of one job reconcile (reads, decision, writes).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
RECONCILE_ERRORS = Counter(
    "rtj_reconcile_errors_total",
    "Reconciles that failed and were retried, by kind.",
    ["kind"],
)


class PhaseBook(Collector):
    """Last seen phase of every job, exported as ``rtj_jobs{phase}``."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str], str] = {}

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        """Record a job's phase (None: not started yet, counted as Pending)."""
        self.phases[key] = phase or Phase.PENDING.value

    def forget(self, key: tuple[str, str]) -> None:
        """The job is gone."""
        self.phases.pop(key, None)

    def clear(self) -> None:
        """This replica stopped serving jobs (a peering pause): it reports none, so that
        summing ``rtj_jobs`` over the replicas a ServiceMonitor scrapes counts each job once."""
        self.phases.clear()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Prometheus collection callback."""
        family = GaugeMetricFamily("rtj_jobs", "ResumableTrainingJobs by phase.", labels=["phase"])
        for phase in Phase:
            family.add_metric(
                [phase.value], sum(1 for p in self.phases.values() if p == phase.value)
            )
        yield family


PHASES = PhaseBook()
REGISTRY.register(PHASES)


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 (a pod serves its metrics)
    """Expose /metrics on a background thread."""
    start_http_server(port, addr=address)
