"""The Kueue story of ``make demo SCENARIO=kueue``: a queued job preempted by a higher-priority
workload saves, waits in the queue, and resumes from that save once the preemptor is done.

On the Kueue bed (``tools/kueuebed.py``): a ClusterQueue with quota for 2 CPUs serving the demo
namespace, a LocalQueue ``queue`` in it, and a WorkloadPriorityClass ``rtj-demo-high``. The job is
the spot story's training (``tests/e2e/manifests/spot-job.yaml``: ``train_deterministic.py``, 2
ranks of 1 CPU, 48 steps, a checkpoint every 4) submitted to the queue; once it has committed a
checkpoint at step ``preempt_after_step``, a 2-CPU pod of the high priority class is submitted to
the same queue. Kueue evicts the job's Workload, the ranks save on SIGTERM, the operator records a
preemption with cause ``KueueEviction``, the next attempt waits behind Kueue's gate, and it runs
once the preemptor has ended, resuming at the step the SIGTERM save committed. The verdicts check
each of those from the job's status and the ranks' own events, and that the final weights equal
an uninterrupted run's, bit for bit.

The same claims are tested in ``tests/cluster/test_kueue.py`` (the preemption test); this module
adds the narration. A separate manifest was rejected: the spot job's command is what the other
demos and the e2e story run, and its uninterrupted reference run is already there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import kueue as kq
from tools.kueuebed import KueueBed, job_body
from tools.localstack.facts import training_command
from tools.stories import Check
from tools.waiting import wait_for
from trainer_runtime import events
from trainer_runtime.events import read_events

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "tests" / "e2e" / "manifests" / "spot-job.yaml"
HIGH = "rtj-demo-high"
PREEMPTOR = "high-priority"

Say = Callable[[str], None]


@dataclass
class KueueResult:
    """What the story saw."""

    job: str
    status: dict[str, Any]
    logs: dict[str, str] = field(default_factory=dict)
    """Rank logs by pod name (``<job>-a<attempt>-r<rank>``)."""
    weights: Path | None = None
    admitted_waiting: str = ""
    """The job's Admitted=False message while its next attempt waited behind the preemptor."""
    seconds: float = 0.0


class KueueStory:
    """Drive and narrate the story on a bed that is up."""

    def __init__(
        self,
        bed: KueueBed,
        namespace: str,
        job: str,
        *,
        say: Say,
        preempt_after_step: int = 8,
    ) -> None:
        self.bed = bed
        self.kube = bed.kube
        self.ns = namespace
        self.job = job
        self.say = say
        self.preempt_after_step = preempt_after_step
        self.out = bed.workdir / "out"
        self._seen: dict[str, Any] = {}

    # -- reading -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.kube.status(self.ns, self.job)

    def condition(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == kind), {})

    def pod(self, name: str) -> dict[str, Any]:
        return self.kube.pod(self.ns, name) or {}

    def pods(self, attempt: int) -> list[dict[str, Any]]:
        return self.kube.pods(self.ns, self.job, attempt)

    def log(self, attempt: int, rank: int) -> str:
        return self.bed.pod_log(self.ns, f"{self.job}-a{attempt}-r{rank}")

    def narrate(self) -> None:
        """One line per change of the job's phase, attempt or last committed step."""
        st = self.status()
        last = st.get("lastCommittedCheckpoint") or {}
        now = {
            "phase": st.get("phase"),
            "attempt": st.get("attempt", 0),
            "step": last.get("step"),
        }
        if now == self._seen:
            return
        if now["step"] is not None and now["step"] != self._seen.get("step"):
            self.say(
                f"  checkpoint {last.get('name')} committed at step {now['step']} "
                f"(attempt {last.get('attempt')})"
            )
        if (now["phase"], now["attempt"]) != (self._seen.get("phase"), self._seen.get("attempt")):
            self.say(f"  job {self.job}: phase {now['phase']}, attempt {now['attempt']}")
        self._seen = now

    def wait(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        """Wait for ``check``, narrating progress meanwhile."""

        def step() -> Any:
            self.narrate()
            return check()

        return wait_for(what, step, timeout, interval=1.0, on_timeout=self.diagnostics)

    def diagnostics(self) -> str:
        lines = [f"status: {self.status()}"]
        for wl in kq.workloads(self.kube, self.ns):
            conds = {c["type"]: c["status"] for c in (wl.get("status") or {}).get("conditions", [])}
            lines.append(f"workload {wl['metadata']['name']}: {conds}")
        if self.bed.operator is not None:
            lines += ["operator:", self.bed.operator.tail(15)]
        return "\n".join(lines)

    # -- the story -----------------------------------------------------------------------------

    def setup_queue(self) -> None:
        cq, lq = kq.ensure_queue(self.kube, self.ns, {"cpu": "2"})
        kq.apply(self.kube, kq.workload_priority_class(HIGH, 1000))
        self.say(
            f"ClusterQueue {cq}: quota 2 CPUs (one 2-rank gang); LocalQueue {lq} in {self.ns}; "
            f"WorkloadPriorityClass {HIGH} (value 1000)"
        )

    def submit_job(self) -> None:
        command = [
            a for a in training_command(MANIFEST) if not a.startswith(("--out=", "--step-sleep="))
        ]
        self.out.mkdir(parents=True, exist_ok=True)
        template = {
            "nodeSelector": {self.bed.pool_label: self.bed.pool},
            "terminationGracePeriodSeconds": 20,
            "containers": [
                {
                    "name": "trainer",
                    "image": "rtj-train:0.1.0",
                    "workingDir": "/app",
                    "command": [*command, "--step-sleep=0.5", f"--out={self.out}/{self.job}.pt"],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        }
        body = job_body(
            self.job,
            self.ns,
            2,
            template,
            queueName="queue",
            checkpoint={"dir": str(self.bed.workdir / "checkpoints")},
        )
        self.kube.create_job(body)
        self.say(f"submitted {self.job}: 2 ranks of 1 CPU to LocalQueue queue (priority 0)")

    def submit_preemptor(self) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": PREEMPTOR,
                "labels": {
                    "kueue.x-k8s.io/queue-name": "queue",
                    "kueue.x-k8s.io/priority-class": HIGH,
                },
            },
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "nodeSelector": {self.bed.pool_label: self.bed.pool},
                "containers": [
                    {
                        "name": "work",
                        "image": "rtj-train:0.1.0",
                        "command": ["python", "-c", "import time; time.sleep(15)"],
                        "resources": {"requests": {"cpu": "2"}},
                    }
                ],
            },
        }
        self.kube.request("POST", f"/api/v1/namespaces/{self.ns}/pods", body=pod)
        self.say(
            f"submitted pod {PREEMPTOR}: 2 CPUs, priority class {HIGH}, to the same queue; it "
            "runs 15 s"
        )

    def run(self) -> KueueResult:
        """The whole story; the result for ``verdicts``."""
        started = time.monotonic()
        self.setup_queue()
        self.submit_job()
        self.wait(
            "the gang admitted and running",
            lambda: self._running(0),
            120,
        )
        self.say(f"  {self.condition('Admitted').get('message', 'admitted')}")
        self.wait(
            f"a checkpoint at step {self.preempt_after_step} or later",
            lambda: (
                (self.status().get("lastCommittedCheckpoint") or {}).get("step", -1)
                >= self.preempt_after_step
            ),
            300,
        )
        self.submit_preemptor()
        status = self.wait(
            "the preemption recorded",
            lambda: s if (s := self.status()).get("interruptions") else None,
            120,
        )
        last = status["interruptions"][-1]
        self.say(
            f"  interruption of attempt {last['attempt']}: cause {last['cause']}, preemption "
            f"{last['preemption']}; failures {status.get('failures', 0)}"
        )
        self.say(f"  {last['message']}")
        for rank in (0, 1):
            saved = self.wait(
                f"rank {rank}'s save on SIGTERM in its log",
                lambda r=rank: read_events(self.log(0, r), events.EMERGENCY_SAVED),
                60,
            )
            self.say(
                f"  rank {rank} saved on SIGTERM: checkpoint {saved[-1].get('checkpoint')} "
                f"at step {saved[-1].get('step')}"
            )
        waiting = self.wait(
            "the next attempt waiting in the queue",
            lambda: (
                c
                if (c := self.condition("Admitted")).get("status") == "False"
                and f"{self.job}-a1" in c.get("message", "")
                else None
            ),
            60,
        )
        self.say(f"  requeued: {waiting['message']}")
        self.wait(
            f"pod {PREEMPTOR} done",
            lambda: self.pod(PREEMPTOR).get("status", {}).get("phase") in ("Succeeded", "Failed"),
            120,
        )
        self.say(f"  pod {PREEMPTOR} finished: its quota goes back to the queue")
        self.wait("attempt 1 running", lambda: self._running(1), 120)
        self.say(f"  {self.condition('Admitted').get('message', 'admitted')}")
        resumed = self.wait(
            "rank 0 of attempt 1 resumed",
            lambda: read_events(self.log(1, 0), events.RESUMED),
            120,
        )
        self.say(f"  attempt 1: rank 0 resumed at step {resumed[-1]['step']}")
        final = self.wait(
            f"{self.job} done",
            lambda: s if (s := self.status()).get("phase") in ("Succeeded", "Failed") else None,
            300,
        )
        self.narrate()
        logs = {
            f"{self.job}-a{a}-r{r}": self.log(a, r)
            for a in range(final.get("attempt", 0) + 1)
            for r in (0, 1)
        }
        return KueueResult(
            self.job,
            final,
            logs,
            self.out / f"{self.job}.pt",
            waiting["message"],
            time.monotonic() - started,
        )

    def _running(self, attempt: int) -> bool:
        pods = self.pods(attempt)
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)


def verdicts(result: KueueResult, equal: bool, why: str) -> list[Check]:
    """The story's claims, from the job's status and the ranks' own events."""
    st = result.status
    interruption = (st.get("interruptions") or [{}])[0]
    job = result.job
    saves = [
        read_events(result.logs.get(f"{job}-a0-r{r}", ""), events.EMERGENCY_SAVED) for r in (0, 1)
    ]
    saved = {s[-1]["checkpoint"] for s in saves if s}
    committed = {
        e["checkpoint"]: int(e["step"])
        for e in read_events(result.logs.get(f"{job}-a0-r0", ""), events.COMMITTED)
    }
    resumed = read_events(result.logs.get(f"{job}-a1-r0", ""), events.RESUMED)
    saved_step = committed.get(next(iter(saved))) if len(saved) == 1 else None
    resumed_step = int(resumed[-1]["step"]) if resumed else None
    return [
        Check(
            "preempted by Kueue",
            interruption.get("cause") == "KueueEviction" and interruption.get("preemption") is True,
            f"cause {interruption.get('cause')}, preemption {interruption.get('preemption')}",
        ),
        Check(
            "no failure counted",
            st.get("failures", 0) == 0 and st.get("preemptions") == 1,
            f"failures {st.get('failures', 0)}, preemptions {st.get('preemptions')}",
        ),
        Check(
            "saved on SIGTERM",
            len(saved) == 1 and all(saves),
            f"both ranks committed {', '.join(sorted(saved)) or 'nothing'}"
            + (f" at step {saved_step}" if saved_step is not None else ""),
        ),
        Check(
            "requeued behind the preemptor",
            "waits in Kueue queue" in result.admitted_waiting,
            result.admitted_waiting.split(": ", 1)[0] or "no Admitted=False seen",
        ),
        Check(
            "resumed from that save",
            resumed_step is not None and resumed_step == saved_step,
            f"attempt 1 resumed at step {resumed_step}",
        ),
        Check(
            "finished",
            st.get("phase") == "Succeeded" and st.get("attempt") == 1,
            f"{st.get('phase')} after {st.get('attempt', 0) + 1} attempts",
        ),
        Check(
            "final weights",
            equal,
            f"{'bitwise equal to' if equal else 'DIFFERENT from'} an uninterrupted run ({why})",
        ),
    ]
