"""The story: one job from submission to Succeeded, with one spot node lost midway.

The demo (``examples/demo_cluster.py``) and the e2e suite (``tests/e2e/test_full_story.py``) run
this same code, so what the demo shows is what CI checks. Its facts about the runtime (the save
on the notice, the resume) come from runtime events (``facts.py``), not log wording.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tools.waiting import wait_for

from .common import REPO, Obj, Say, StackError, _quiet
from .facts import notice_checkpoint
from .narrator import Narrator
from .stack import LocalStack

T = TypeVar("T")


@dataclass
class StoryResult:
    """What happened to one job, for the demo's summary and the e2e's assertions."""

    job: str
    status: Obj
    lost_node: str
    rank_pods: dict[int, Obj]
    """Rank 0's pod of every attempt, by attempt."""
    logs: dict[int, str]
    """Rank 0's log of every attempt, by attempt."""
    committed_before_loss: int
    """lastCommittedCheckpoint.step when the node was lost."""
    weights: Path
    seconds: float
    status_at_loss: Obj = field(default_factory=dict)
    """The job's status just before the node went (after the notice's save, if any)."""
    notice: tuple[str, int] | None = None


class Story:
    """One job on the stack, from submission to Succeeded, with one node lost midway.

    ``lose`` is ``reclaim`` (the Node deleted and its processes SIGKILLed, no notice) or
    ``notice`` (a termination taint first: the runtime saves at once; then the node shuts down
    gracefully and its Node is deleted).
    """

    TAINT = "cloud.google.com/impending-node-termination"

    def __init__(
        self,
        stack: LocalStack,
        manifest: Path,
        job: str,
        *,
        say: Say = _quiet,
        lose_after_step: int = 12,
        notice_delay_s: float = 1.0,
        timeout: float = 240,
    ) -> None:
        self.stack, self.manifest, self.job = stack, manifest, job
        self.notice_delay_s = notice_delay_s
        self.say_out, self.lose_after_step, self.timeout = say, lose_after_step, timeout
        self.narrator = Narrator(stack, job, say)
        self._at_loss: Obj = {}

    def _status(self) -> Obj:
        return self.stack.job(self.job).get("status") or {}

    def _wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        return wait_for(
            what, check, timeout, interval=0.2, on_timeout=lambda: self.stack.diagnostics(self.job)
        )

    def run(self, lose: str = "reclaim") -> StoryResult:
        """Submit, lose the node of rank 1 after a few checkpoints, wait for success."""
        if lose not in ("reclaim", "notice"):
            raise ValueError(f"lose={lose!r}: expected reclaim or notice")
        start = time.monotonic()
        self.stack.apply(self.manifest, name=self.job)
        with self.narrator as n:
            n.say(f"job {self.job} submitted (kubectl apply -f {self.manifest.relative_to(REPO)})")
            self._wait(
                f"a checkpoint at step {self.lose_after_step} or later",
                lambda: (
                    (self._status().get("lastCommittedCheckpoint") or {}).get("step", -1)
                    >= self.lose_after_step
                ),
                self.timeout,
            )
            rank1 = self.stack.pod(f"{self.job}-a0-r1") or {}
            node = rank1.get("spec", {}).get("nodeName")
            if not node:
                raise StackError(f"rank 1 of attempt 0 has no node:\n{self.stack.diagnostics()}")
            n.poll()  # say what led here before saying what is done
            notice = None
            if lose == "notice":
                notice = self._notice_then_shutdown(node)
                at_loss = self._at_loss
            else:
                at_loss = self._status()
                n.say(
                    f">>> spot reclaim of {node} (rank 1): its Node is deleted and every "
                    "process on it SIGKILLed, without notice"
                )
                self.stack.reclaim_node(node)
            self._wait("attempt 1", lambda: self._status().get("attempt", 0) >= 1, 60)
            final = self._wait(
                "the job to end",
                lambda: self._status().get("phase") in ("Succeeded", "Failed") and self._status(),
                self.timeout,
            )
            if final.get("phase") != "Succeeded":
                raise StackError(
                    f"job {self.job} ended {final.get('phase')}:\n"
                    f"{self.stack.diagnostics(self.job)}"
                )
        status = self._status()
        attempts = int(status.get("attempt", 0))
        rank_pods = {a: self.stack.pod(f"{self.job}-a{a}-r0") or {} for a in range(attempts + 1)}
        logs = {a: self.stack.pod_log(f"{self.job}-a{a}-r0") for a in range(attempts + 1)}
        weights = self.stack.results_dir / f"{self.job}.pt"
        self._wait(f"the final weights {weights}", weights.exists, 10)
        committed = int(at_loss["lastCommittedCheckpoint"]["step"])
        return StoryResult(
            self.job,
            status,
            node,
            rank_pods,
            logs,
            committed,
            weights,
            time.monotonic() - start,
            at_loss,
            notice,
        )

    def _notice_then_shutdown(self, node: str) -> tuple[str, int]:
        n = self.narrator
        # Between two interval checkpoints, so the notice's own save is easy to tell apart.
        time.sleep(self.notice_delay_s)
        n.say(
            f">>> termination notice: node {node} (rank 1) is tainted {self.TAINT}:NoSchedule "
            "(what GKE's node termination handler does ~30 s before a spot VM goes)"
        )
        self.stack.taint_node(node, self.TAINT, "NoSchedule", "true")
        log = lambda: self.stack.pod_log(f"{self.job}-a0-r0")  # noqa: E731
        name, step = self._wait(
            "the runtime's save on the notice", lambda: notice_checkpoint(log()), 60
        )
        self._wait(
            f"checkpoint {name} in status",
            lambda: any(
                k.get("name") == name for k in self._status().get("knownCheckpoints") or []
            ),
            30,
        )
        self._at_loss = self._status()
        n.say(
            f">>> node {node} shuts down: its pods get SIGTERM and their grace period, then "
            "the machine is gone and its Node deleted"
        )
        self.stack.shut_down_node(node)
        return name, step
