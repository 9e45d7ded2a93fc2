"""The whole ResumableTrainingJob object, as the operator parses it from the API server.

Spec and status live in sibling modules; this one joins them with the metadata the operator
needs (name, uid, generation, resourceVersion) so the rest of the code handles one typed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from .spec_types import ROOT_RULES, ApiModel, JobSpec, enforce
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


class JobMetadata(ApiModel):
    """The metadata the object's root rules read."""

    name: str
    """The job's name."""


class JobObject(ApiModel):
    """The object as one model, so a parse error names its field from the root
    (``spec.resumePolicy``, ``status.conditions``) and the root rules apply."""

    metadata: JobMetadata
    """Name (the rest of the metadata is read as is)."""
    spec: JobSpec
    """Desired state."""
    status: JobStatus = Field(default_factory=JobStatus)
    """Observed state."""

    @model_validator(mode="after")
    def _root_rules(self) -> JobObject:
        enforce(ROOT_RULES, self)
        return self


def job_ref(body: dict[str, Any]) -> JobRef:
    """The metadata of an API object (written by the API server, so it always reads)."""
    meta = body.get("metadata") or {}
    return JobRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def parse_job(body: dict[str, Any]) -> Job:
    """Parse an API object; raises pydantic.ValidationError on a spec the schema should reject."""
    spec = body.get("spec") or {}
    ref = job_ref(body)
    parsed = JobObject.model_validate(
        {"metadata": {"name": ref.name}, "spec": spec, "status": body.get("status") or {}}
    )
    return Job(
        ref=ref,
        spec=parsed.spec,
        status=parsed.status,
        raw_template=spec.get("template") or {},
        raw_status=body.get("status") or {},
    )
