"""The whole ResumableTrainingJob object, as the operator parses it from the API server.

Spec and status live in sibling modules; this one joins them with the metadata the operator
needs (name, uid, generation, resourceVersion) so the rest of the code handles one typed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spec_types import JobSpec
from .status_types import JobStatus


@dataclass(frozen=True)
class JobRef:
    """What the operator needs from a job's metadata."""

    name: str
    namespace: str
    uid: str
    generation: int
    resource_version: str
    deleting: bool = False


@dataclass(frozen=True)
class Job:
    """A parsed ResumableTrainingJob."""

    ref: JobRef
    spec: JobSpec
    status: JobStatus
    raw_template: dict[str, Any]
    """The pod template exactly as written (every PodSpec field, not only the modelled ones)."""
    raw_status: dict[str, Any]
    """The status exactly as stored: what a status patch is computed against."""

    @property
    def run_name(self) -> str:
        """Stable run name: recorded in status once, else spec.runName, else the job's name."""
        return self.status.run_name or self.spec.run_name or self.ref.name


def parse_job(body: dict[str, Any]) -> Job:
    """Parse an API object; raises pydantic.ValidationError on a spec the schema should reject."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    ref = JobRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )
    return Job(
        ref=ref,
        spec=JobSpec.model_validate(spec),
        status=JobStatus.model_validate(body.get("status") or {}),
        raw_template=spec.get("template") or {},
        raw_status=body.get("status") or {},
    )
