"""The spot story: one job from submission to its end, with spot nodes going midway.

One story for every cluster it runs on (``tools/spotcluster.py``): the local stack's pod-runner
nodes (``make demo``, ``tests/e2e/test_full_story.py``, ``tests/e2e/test_torchrun_story.py``) and
real nodes (``make demo NODES=real``, ``tests/realnodes/test_job_story.py``, set up by
``tools/stories/realnodes.py``). It submits the job, then for each interruption:

1. waits for a checkpoint committed at ``lose_after_step`` or later (and after the last one
   seen), and takes the node of rank ``rank`` of the running attempt;
2. loses that node, one of three ways:

   * ``notice``: a termination notice (a taint) first; the operator passes it on and the runtime
     saves at once; once that checkpoint is in the job's status, the node's pods end gracefully
     (SIGTERM, the grace period: a last save at the step reached);
   * ``shutdown``: the graceful end without the notice: SIGTERM is the only warning;
   * ``lost``: the node's processes are SIGKILLed and its Node deleted, without notice; a lost
     node does not come back, so ``lost`` can only be the last interruption;

3. waits for the next attempt to be placed and reads how its rank 0 started (``resumed`` or
   ``fresh``); a fresh start ends the interruptions (going on would show nothing).

It then waits for the job to end and collects what the suites and the demo check: the status,
what each interruption saw, each attempt's start and rank 0's log. What it knows of the runtime
comes from its structured events (``trainer_runtime.events``), never log wording.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rtj_operator.api import names
from tools.localstack.common import REPO
from tools.localstack.facts import notice_checkpoint
from tools.spotcluster import LOST, NOTICE, SHUTDOWN, Narration, SpotCluster, node_of
from tools.waiting import wait_for
from trainer_runtime import events
from trainer_runtime.events import RuntimeEvent, read_events

T = TypeVar("T")
Obj = dict[str, Any]
KINDS = (NOTICE, SHUTDOWN, LOST)


def _quiet(_line: str) -> None:
    return None


def _shown(path: Path) -> str:
    """A manifest's path as the reader knows it: relative to the repository where it is in it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def check_interruptions(interruptions: Sequence[str]) -> None:
    """ValueError unless every item is one of ``KINDS`` and ``lost`` comes last only."""
    unknown = [i for i in interruptions if i not in KINDS]
    if unknown:
        raise ValueError(f"interruptions: {unknown}: expected each of {list(KINDS)}")
    if LOST in interruptions[:-1]:
        raise ValueError("interruptions: 'lost' must be the last one (a lost node is gone)")


@dataclass
class Attempt:
    """One gang of the job: where the story's rank ran, and how rank 0 started (its
    ``resumed`` or ``fresh`` event)."""

    number: int
    node: str
    """The node of the rank the story loses (``SpotStory.rank``)."""
    pod: str
    """Rank 0's pod, whose log the story reads."""
    start: RuntimeEvent | None = None

    @property
    def resumed_step(self) -> int | None:
        """The step it resumed at; None when it started fresh (or was not seen starting)."""
        return (
            self.start["step"] if self.start is not None and self.start.type == "resumed" else None
        )


def describe(attempt: Attempt) -> str:
    """How an attempt started, in words, from its event."""
    if attempt.start is None:
        return "not seen starting"
    if attempt.start.type == "fresh":
        return "started FRESH, from step 0"
    return f"resumed at step {attempt.start['step']} ({attempt.start['checkpoint']})"


@dataclass
class Interruption:
    """What one interruption did, as the story saw it."""

    kind: str
    node: str
    committed_before: int
    """The job's last committed step when the node went (after the notice's save, if any)."""
    status_before: Obj = field(default_factory=dict)
    """The job's status just before the node went (after the notice's save, if any)."""
    notice: tuple[str, int] | None = None
    """``notice``: the checkpoint the runtime committed on it, (name, step)."""
    notice_events: list[RuntimeEvent] = field(default_factory=list)
    """``notice``: the runtime's ``notice`` and ``committed`` events in rank 0's log."""


@dataclass
class StoryResult:
    """What happened to the job: for the suites' assertions and the demo's summary."""

    job: str
    status: Obj
    interruptions: list[Interruption]
    attempts: list[Attempt]
    logs: dict[int, str]
    """Rank 0's log of every attempt, by attempt (``""`` where the cluster kept none)."""
    weights: Path
    seconds: float
    reference: Path | None = None
    """The uninterrupted run's final weights, where the story's runner waited for them."""
    diagnostics: str = ""
    """What the cluster showed when the job did not succeed."""

    @property
    def lost_node(self) -> str:
        """The node of the first interruption."""
        return self.interruptions[0].node


class SpotStory:
    """One job on a ``SpotCluster``, from submission to its end, through ``interruptions``.

    ``rank``: the rank whose node goes. ``lose_after_step``: no node goes before a checkpoint at
    that step is committed. ``notice_delay_s``: a pause before a notice, so its save falls
    between two interval checkpoints and is easy to tell apart.
    """

    def __init__(
        self,
        cluster: SpotCluster,
        manifest: Path | Obj,
        job: str,
        *,
        rank: int = 1,
        say: Callable[[str], None] = _quiet,
        lose_after_step: int = 12,
        notice_delay_s: float = 1.0,
        timeout: float = 240,
    ) -> None:
        self.cluster, self.manifest, self.job, self.rank = cluster, manifest, job, rank
        self.say_out, self.lose_after_step = say, lose_after_step
        self.notice_delay_s, self.timeout = notice_delay_s, timeout
        self.narrator: Narration = cluster.narration(job, say)

    def status(self) -> Obj:
        return self.cluster.status(self.job)

    def committed_step(self) -> int:
        return int((self.status().get("lastCommittedCheckpoint") or {}).get("step") or 0)

    def _wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        return wait_for(
            what,
            check,
            timeout,
            interval=self.cluster.poll_s,
            on_timeout=lambda: self.cluster.diagnostics(self.job),
        )

    def _condition(self, kind: str) -> Obj | None:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == kind), None)

    def _placed(self, attempt: int) -> Attempt | None:
        """The attempt once the operator runs it and the story's rank has a node."""
        if int(self.status().get("attempt", 0)) < attempt:
            return None
        node = node_of(self.cluster.pod(self.job, attempt, self.rank))
        return Attempt(attempt, node, names.pod_name(self.job, attempt, 0)) if node else None

    def _started(self, attempt: Attempt) -> RuntimeEvent:
        """How the attempt's rank 0 started, ``resumed`` or ``fresh``: its first such event."""

        def first_start() -> RuntimeEvent | None:
            found = read_events(self.cluster.pod_log(attempt.pod))
            return next((e for e in found if e.type in (events.RESUMED, events.FRESH)), None)

        what = f"attempt {attempt.number}'s resumed (or fresh) event in rank 0's log"
        return self._wait(what, first_start, max(120, self.timeout))

    def run(self, interruptions: Sequence[str] = (LOST,)) -> StoryResult:
        """Submit, take nodes away as ``interruptions`` say, wait for the job's end."""
        check_interruptions(interruptions)
        start = time.monotonic()
        done: list[Interruption] = []
        self.cluster.submit(self.manifest, self.job)
        with self.narrator as n:
            where = (
                f" (kubectl apply -f {_shown(self.manifest)})"
                if isinstance(self.manifest, Path)
                else ""
            )
            n.say(f"job {self.job} submitted{where}")
            current = self._wait("attempt 0 placed", lambda: self._placed(0), self.timeout)
            attempts = [current]
            n.say(f"attempt 0: rank {self.rank} on {current.node}")
            for kind in interruptions:
                after = max(self.lose_after_step, self.committed_step() + 1)
                self._wait(
                    f"a checkpoint at step {after} or later",
                    lambda after=after: self.committed_step() >= after,
                    self.timeout,
                )
                n.poll()  # say what led here before saying what is done
                self.cluster.make_room(current.node)
                done.append(self._interrupt(kind, current))
                current = self._wait(
                    f"attempt {current.number + 1}",
                    lambda number=current.number + 1: self._placed(number),
                    max(60, self.timeout),
                )
                current.start = self._started(current)
                attempts.append(current)
                n.say(f"attempt {current.number} runs on {current.node}: {describe(current)}")
                if kind != LOST:
                    self.cluster.restore(done[-1].node)
                if current.resumed_step is None:
                    break  # a fresh start: the checks say so; interrupting on shows nothing
            final = self._wait(
                "the job to end",
                lambda: self.status().get("phase") in ("Succeeded", "Failed") and self.status(),
                self.timeout,
            )
            n.say(f"job {self.job}: {final.get('phase')}")
        status = self.status()
        count = int(status.get("attempt", 0)) + 1
        logs = {a: self.cluster.pod_log(names.pod_name(self.job, a, 0)) for a in range(count)}
        weights = self.cluster.weights(self.job)
        diagnostics = ""
        if status.get("phase") == "Succeeded":
            # Rank 0 writes them before it exits; the volume may show them a moment later.
            deadline = time.monotonic() + 10
            while not weights.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            diagnostics = self.cluster.diagnostics(self.job)
        return StoryResult(
            self.job,
            status,
            done,
            attempts,
            logs,
            weights,
            time.monotonic() - start,
            diagnostics=diagnostics,
        )

    def _interrupt(self, kind: str, current: Attempt) -> Interruption:
        n, node = self.narrator, current.node
        if kind != NOTICE:
            before = self.status()
            n.say(f">>> {self.cluster.explain(kind, f'{node} (rank {self.rank})')}")
            if kind == LOST:
                self.cluster.lose(node)
            else:
                self.cluster.shut_down(self.job, node)
            step = int((before.get("lastCommittedCheckpoint") or {}).get("step") or 0)
            return Interruption(kind, node, step, before)
        time.sleep(self.notice_delay_s)
        n.say(f">>> {self.cluster.explain(NOTICE, f'{node} (rank {self.rank})')}")
        self.cluster.notice(node)
        name, step = self._wait(
            "the runtime's save on the notice",
            lambda: notice_checkpoint(self.cluster.pod_log(current.pod)),
            60,
        )
        self._wait(
            f"checkpoint {name} in status",
            lambda: any(k.get("name") == name for k in self.status().get("knownCheckpoints") or []),
            30,
        )
        self._wait(
            "the PreemptionNotice condition",
            lambda: (c := self._condition("PreemptionNotice")) and c["status"] == "True",
            60,
        )
        n.say(f"the runtime saved at once on the notice: checkpoint {name}, step {step}")
        before = self.status()
        saved = read_events(self.cluster.pod_log(current.pod))
        notice_events = [e for e in saved if e.type in (events.NOTICE, events.COMMITTED)]
        n.say(f">>> {self.cluster.explain(SHUTDOWN, node)}")
        self.cluster.shut_down(self.job, node)
        committed = int((before.get("lastCommittedCheckpoint") or {}).get("step") or 0)
        return Interruption(NOTICE, node, committed, before, (name, step), notice_events)
