"""Jobs on the stack: apply a manifest, read the job, its pods, their logs and runtime events.

The runtime's facts (resumed, committed, saved on a notice or SIGTERM) are read from the
structured ``rtj-event`` lines in a container's log (``trainer_runtime/events.py``), never from
log wording: the same lines ``kubectl logs`` shows on real nodes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import yaml

from rtj_operator.api import names
from trainer_runtime.events import RuntimeEvent, read_events

from .base import StackBase
from .common import Obj


class JobsPart(StackBase):
    """Reading and applying jobs."""

    def apply(self, manifest: Path, *, name: str | None = None) -> str:
        """``kubectl apply`` a manifest into the stack's namespace (renaming its job); the job."""
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        job = next(d for d in docs if d.get("kind") == names.KIND)
        if name:
            job["metadata"]["name"] = name
        self.kubectl("apply", "-n", self.cfg.namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
        return str(job["metadata"]["name"])

    def end_jobs(self) -> None:
        """Delete every job in the namespace, without waiting for their pods to go (a test that
        failed must not leave a job holding the nodes the next test needs)."""
        self.kubectl("delete", names.PLURAL, "--all", "-n", self.cfg.namespace, "--wait=false")

    def job(self, name: str) -> Obj:
        """The ResumableTrainingJob."""
        return self.kube.request("GET", self.kube.job_path(self.cfg.namespace, name))

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        """The job's pods (of one attempt), by attempt then rank."""
        return sorted(
            self.kube.pods(self.cfg.namespace, job, attempt),
            key=lambda p: (
                int(p["metadata"]["labels"].get(names.LABEL_ATTEMPT, 0)),
                int(p["metadata"]["labels"].get(names.LABEL_RANK, 0)),
            ),
        )

    def pod(self, name: str) -> Obj | None:
        """One pod, or None."""
        return self.kube.pod(self.cfg.namespace, name)

    def pod_log(self, pod: str, container: str = "trainer") -> str:
        """A container's log, from whichever node ran it (the pod runner keeps logs)."""
        pattern = f"logs/{self.cfg.namespace}_{pod}_*/{container}.log"
        texts = [
            p.read_text(errors="replace") for p in sorted(self.workdir.glob(f"nodes/*/{pattern}"))
        ]
        return "".join(texts)

    def runtime_events(
        self, pod: str, kind: str | None = None, container: str = "trainer"
    ) -> list[RuntimeEvent]:
        """The runtime's structured events in a container's log, in order (of one ``kind``)."""
        return read_events(self.pod_log(pod, container), kind)

    def events(self, job: str) -> list[Obj]:
        """Events about the job, oldest first."""
        items = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{self.cfg.namespace}/events",
            params={"fieldSelector": f"involvedObject.name={job}"},
        )["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def diagnostics(self, job: str | None = None) -> str:
        """What to look at when something timed out: job status, pods, operator log."""
        parts = []
        if job:
            with contextlib.suppress(Exception):
                parts.append("job status: " + json.dumps(self.job(job).get("status"), indent=1))
            with contextlib.suppress(Exception):
                parts += [
                    f"pod {p['metadata']['name']} on {p['spec'].get('nodeName')}: "
                    f"{p['status'].get('phase')}"
                    for p in self.pods(job)
                ]
        if self.operator is not None:
            parts.append(f"operator log ({self.operator.log}):\n{self.operator.tail(30)}")
        return "\n".join(parts)
