"""The elastic story on the local stack: 4 ranks, 2 nodes lost (it shrinks to 2), 2 nodes back
(it grows to 4), with real training in every pod.

Shared by the e2e test (``tests/e2e/test_elastic_story.py``) and ``make demo`` with
``--scenario elastic`` (``examples/demo_cluster.py``). It lives beside ``tools/localstack.py``
rather than in it: the stack knows how to run the system, a story only drives it, and each story
reads on its own.

The proof is in what the ranks themselves recorded (``examples/train_deterministic.py``
``--trace`` and ``--digests``, on the shared ``rtj-results`` claim), not in the operator's status:

* every sample of every epoch is consumed exactly once over the whole story, once the steps that
  a later resume rolled back are taken out (a rank that sat out a shrunk attempt never saw that
  attempt's resume, so the roll-back is decided over all ranks' files together, by attempt);
* at each transition the new gang resumed at the newest checkpoint any earlier gang saved (the
  runtime takes the newest valid one, an emergency save on SIGTERM included), and the state digest
  it loaded equals, bit for bit, the digest the old gang wrote when it saved that checkpoint.

The alternative, timing the story from the operator's events alone, would pass with a trainer
that silently restarted from scratch; the ranks' own records cannot.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from tools.localstack import (
    REPO,
    LocalStack,
    Narrator,
    Say,
    StackError,
    last_resume,
    resumed_step,
    training_command,
)
from tools.stories import Check
from tools.waiting import wait_for

Obj = dict[str, Any]
T = TypeVar("T")

MANIFEST = REPO / "tests" / "e2e" / "manifests" / "elastic-job.yaml"
SIZE_EVENTS = ("WaitingForCapacity", "Shrunk", "GrowRequested", "Growing", "Grown", "Preempted")


def manifest_args(manifest: Path) -> dict[str, str]:
    """The training command's ``--name=value`` arguments."""
    return dict(
        a.removeprefix("--").split("=", 1)
        for a in training_command(manifest)
        if a.startswith("--") and "=" in a
    )


def elastic_spec(manifest: Path) -> Obj:
    """The job's ``spec`` (replicas and the elastic block)."""
    import yaml  # noqa: PLC0415

    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    return next(d for d in docs if d.get("kind") == "ResumableTrainingJob")["spec"]


class SizeNarrator(Narrator):
    """The stack's narrator, plus the gang size and the elastic events."""

    def __init__(self, stack: LocalStack, job: str, say: Say) -> None:
        super().__init__(stack, job, say)
        self._size: int | None = None
        self._events: set[str] = set()

    def _poll(self) -> None:
        status = self.stack.job(self.job).get("status") or {}
        # The interruptions an elastic job adds (a grow, a re-shrink) are neither preemptions nor
        # failures and have no rank: say them here, so the stack's narrator skips them.
        for item in (status.get("interruptions") or [])[self._interruptions :]:
            if item.get("cause") in ("Grow", "Unschedulable"):
                self.say(
                    f"operator: attempt {item.get('attempt')} ended by the operator "
                    f"({item.get('cause')}: {item.get('message')}); last committed step "
                    f"{item.get('lastCommittedStep')}"
                )
            else:
                self._say_interruption(item, status)
        self._interruptions = len(status.get("interruptions") or [])
        super()._poll()
        size = status.get("gangSize")
        if size and size != self._size:
            self.say(
                f"operator: attempt {status.get('attempt')} runs {size} pods "
                f"(world size {status.get('worldSize')})"
            )
            self._size = size
        for event in self.stack.events(self.job):
            uid = event["metadata"]["uid"] + str(event.get("count", 1))
            if event.get("reason") in SIZE_EVENTS and uid not in self._events:
                self._events.add(uid)
                self.say(f"event {event['reason']}: {event.get('message')}")

    def _say_interruption(self, item: Obj, status: Obj) -> None:
        kind = "preemption" if item.get("preemption") else "failure"
        self.say(
            f"operator: attempt {item.get('attempt')} interrupted: {item.get('cause')} of rank "
            f"{item.get('rank')} on {item.get('node')} ({kind}; {status.get('preemptions', 0)} "
            f"preemption(s), {status.get('failures', 0)} failure(s) so far); last committed "
            f"step {item.get('lastCommittedStep')}, steps lost {item.get('stepsLost')}"
        )


@dataclass
class ElasticResult:
    """What happened, for the test's assertions and the demo's summary."""

    job: str
    status: Obj
    events: list[Obj]
    start_nodes: list[str]
    lost_nodes: list[str]
    added_nodes: list[str]
    committed_before_loss: int
    shrink_running_s: float
    """Both Nodes deleted -> every rank of the 2-pod gang Running."""
    shrink_resumed_s: float | None
    """Both Nodes deleted -> rank 0 of the 2-pod gang logged its resume (wall clocks)."""
    grow_running_s: float
    """The 2 new Nodes Ready -> every rank of the 4-pod gang Running."""
    grow_resumed_s: float | None
    logs: dict[int, str]
    """Rank 0's log of every attempt."""
    placements: dict[int, list[str | None]]
    """The node of every rank, by attempt (the pods still there at the end)."""
    seconds: float
    lines: list[str] = field(default_factory=list)


def _resumed_at(log: str) -> float | None:
    """Wall-clock time (epoch seconds) of the trainer's ``resumed`` event."""
    event = last_resume(log)
    return None if event is None else datetime.fromisoformat(event.time).timestamp()


class ElasticStory:
    """Submit the elastic job on exactly 4 nodes, lose 2, add 2, wait for Succeeded."""

    def __init__(
        self,
        stack: LocalStack,
        job: str,
        *,
        manifest: Path = MANIFEST,
        say: Say = print,
        lose_after_step: int = 8,
        timeout: float = 300,
    ) -> None:
        self.stack, self.job, self.manifest = stack, job, manifest
        self.lose_after_step, self.timeout = lose_after_step, timeout
        self.narrator = SizeNarrator(stack, job, say)

    def _status(self) -> Obj:
        return self.stack.job(self.job).get("status") or {}

    def _wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        return wait_for(
            what, check, timeout, interval=0.1, on_timeout=lambda: self.stack.diagnostics(self.job)
        )

    def _gang_running(self, attempt: int, size: int) -> bool:
        st = self._status()
        return (
            st.get("attempt") == attempt
            and st.get("gangSize") == size
            and st.get("phase") == "Running"
        )

    def _placement(self, attempt: int) -> list[str | None]:
        """The node of each rank of an attempt, by rank (read while that gang runs: an ended
        attempt's pods are deleted)."""
        return [p["spec"].get("nodeName") for p in self.stack.pods(self.job, attempt)]

    def _resumed_after(self, attempt: int, start_wall: float) -> float | None:
        when = _resumed_at(self.stack.pod_log(f"{self.job}-a{attempt}-r0"))
        return None if when is None else when - start_wall

    def run(self) -> ElasticResult:
        """The whole story; raises ``StackError`` or ``WaitTimeoutError`` when it goes wrong."""
        replicas = int(elastic_spec(self.manifest)["replicas"])
        minimum = int(elastic_spec(self.manifest)["elastic"]["minReplicas"])
        live = self.stack.live_nodes()
        if len(live) != replicas:
            raise StackError(f"the story needs exactly {replicas} nodes, found {live}")
        start = time.monotonic()
        self.stack.apply(self.manifest, name=self.job)
        n = self.narrator
        with n:
            n.say(f"job {self.job} submitted: {replicas} ranks, minReplicas {minimum}")
            self._wait(
                f"attempt 0 at {replicas} ranks with a checkpoint at step {self.lose_after_step}",
                lambda: (
                    self._gang_running(0, replicas)
                    and (self._status().get("lastCommittedCheckpoint") or {}).get("step", -1)
                    >= self.lose_after_step
                ),
                self.timeout,
            )
            committed = int(self._status()["lastCommittedCheckpoint"]["step"])
            placements = {0: self._placement(0)}
            doomed = [
                (self.stack.pod(f"{self.job}-a0-r{r}") or {}).get("spec", {}).get("nodeName")
                for r in range(minimum, replicas)
            ]
            if not all(doomed):
                raise StackError(f"ranks {minimum}.. have no node:\n{self.stack.diagnostics()}")
            n.poll()
            n.say(
                f">>> spot reclaim of {', '.join(doomed)} (ranks {minimum}..{replicas - 1}): "
                f"Nodes deleted, processes SIGKILLed, no spare node left"
            )
            lost_wall, lost = time.time(), time.monotonic()
            for node in doomed:
                self.stack.reclaim_node(node)
            self._wait(
                f"attempt 1 Running at {minimum} ranks",
                lambda: self._gang_running(1, minimum),
                self.timeout,
            )
            shrink_running = time.monotonic() - lost
            placements[1] = self._placement(1)
            n.say(f"shrunk: {minimum} ranks Running {shrink_running:.1f}s after the loss")
            self._wait(
                "attempt 1's rank 0 resumed",
                lambda: self._resumed_after(1, lost_wall) is not None,
                120,
            )
            shrink_resumed = self._resumed_after(1, lost_wall)
            self._wait(
                "a checkpoint committed at the smaller size",
                lambda: (self._status().get("lastCommittedCheckpoint") or {}).get("attempt") == 1,
                self.timeout,
            )
            n.poll()
            n.say(f">>> capacity is back: {replicas - minimum} new spot nodes join")
            added = [self.stack.add_node(wait=False) for _ in doomed]
            for name in added:
                self._wait(
                    f"node {name} Ready", lambda name=name: self.stack.kube.node_ready(name), 60
                )
            back_wall, back = time.time(), time.monotonic()
            self._wait(
                f"attempt 2 Running at {replicas} ranks",
                lambda: self._gang_running(2, replicas),
                self.timeout,
            )
            grow_running = time.monotonic() - back
            placements[2] = self._placement(2)
            n.say(f"grown: {replicas} ranks Running {grow_running:.1f}s after the nodes were Ready")
            final = self._wait(
                "the job to end",
                lambda: self._status().get("phase") in ("Succeeded", "Failed") and self._status(),
                self.timeout,
            )
            if final.get("phase") != "Succeeded":
                raise StackError(f"job {self.job} ended {final.get('phase')}:\n{final}")
        status = self._status()
        attempts = int(status.get("attempt", 0))
        logs = {a: self.stack.pod_log(f"{self.job}-a{a}-r0") for a in range(attempts + 1)}
        return ElasticResult(
            job=self.job,
            status=status,
            events=self.stack.events(self.job),
            start_nodes=live,
            lost_nodes=[str(d) for d in doomed],
            added_nodes=added,
            committed_before_loss=committed,
            shrink_running_s=shrink_running,
            shrink_resumed_s=shrink_resumed,
            grow_running_s=grow_running,
            grow_resumed_s=self._resumed_after(2, back_wall),
            logs=logs,
            placements=placements,
            seconds=time.monotonic() - start,
            lines=list(n.lines),
        )


# ------------------------------------------------------------------ what the ranks recorded


def _records(path: Path) -> list[Obj]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Ledger:
    """Every step the ranks recorded, with the attempt it ran in, and the resume points."""

    steps: list[tuple[int, int, int, list[int]]]
    """(attempt, rank, global sample count after the step, sample ids)."""
    resumed_at: dict[int, int]
    """attempt -> global sample count it resumed at."""
    worlds: dict[int, int]
    """attempt -> world size."""

    def kept(self) -> list[tuple[int, int, int, list[int]]]:
        """Steps no later attempt rolled back (a later resume started at or past them)."""
        return [
            step
            for step in self.steps
            if all(step[2] <= at for a, at in self.resumed_at.items() if a > step[0])
        ]

    def consumption(self, dataset_size: int) -> Counter[tuple[int, int]]:
        """How often each (epoch, sample id) was consumed by the kept steps."""
        counts: Counter[tuple[int, int]] = Counter()
        for _, _, sample, ids in self.kept():
            epoch = (sample - 1) // dataset_size
            counts.update((epoch, i) for i in ids)
        return counts

    def samples_per_step(self) -> Counter[int]:
        """Samples each kept global step consumed over all ranks, by global sample count."""
        per: Counter[int] = Counter()
        for _, _, sample, ids in self.kept():
            per[sample] += len(ids)
        return per


def read_ledger(folder: Path, run: str, ranks: int) -> Ledger:
    """Parse ``<run>.trace.rank<r>`` for every rank."""
    steps: list[tuple[int, int, int, list[int]]] = []
    resumed_at: dict[int, int] = {}
    worlds: dict[int, int] = {}
    for rank in range(ranks):
        attempt = -1
        for rec in _records(folder / f"{run}.trace.rank{rank}"):
            if "resumed_at_sample" in rec:
                attempt = int(rec["attempt"])
                resumed_at[attempt] = int(rec["resumed_at_sample"])
                worlds[attempt] = int(rec["world"])
            else:
                steps.append((attempt, rank, int(rec["sample"]), list(rec["ids"])))
    return Ledger(steps, resumed_at, worlds)


@dataclass
class Transition:
    """One resume of a later attempt, with the save it loaded."""

    attempt: int
    rank: int
    world: int
    resumed_step: int
    resumed_path: str
    loaded_digest: str
    saved: Obj | None
    """An earlier attempt's save of that checkpoint (rank 0), or None if none matches."""
    newest_saved_step: int
    """The step of the newest checkpoint any earlier attempt saved (rank 0's record)."""


def read_transitions(folder: Path, run: str, ranks: int) -> list[Transition]:
    """Every resume after the first attempt, with the save of the checkpoint it loaded.

    Every rank that resumed is checked against rank 0's save of the same checkpoint (replicated
    state: a rank joining at the larger size loads what rank 0 saved)."""
    saves = [e for e in _records(folder / f"{run}.digests.rank0") if e["event"] == "save"]
    found = []
    for rank in range(ranks):
        path = folder / f"{run}.digests.rank{rank}"
        if not path.exists():
            continue
        for entry in _records(path):
            if entry["event"] != "resume" or int(entry.get("attempt", 0)) == 0:
                continue
            name = str(entry["path"]).rstrip("/").rsplit("/", 1)[-1]
            earlier = [s for s in saves if int(s.get("attempt", 0)) < int(entry["attempt"])]
            match = next((s for s in reversed(earlier) if s["checkpoint"] == name), None)
            found.append(
                Transition(
                    attempt=int(entry["attempt"]),
                    rank=rank,
                    world=int(entry["world"]),
                    resumed_step=int(entry["step"]),
                    resumed_path=str(entry["path"]),
                    loaded_digest=str(entry["digest"]),
                    saved=match,
                    newest_saved_step=max((int(s["step"]) for s in earlier), default=-1),
                )
            )
    return found


def resumed_steps(result: ElasticResult) -> dict[int, int | None]:
    """The step rank 0 of each attempt resumed at, from its log."""
    return {a: resumed_step(log) for a, log in result.logs.items()}


def verdicts(result: ElasticResult, folder: Path, manifest: Path = MANIFEST) -> list[Check]:
    """The story's claims, each checked from the ranks' records (the demo's summary; the e2e test
    asserts the same facts one by one)."""
    spec, args = elastic_spec(manifest), manifest_args(manifest)
    replicas, minimum = int(spec["replicas"]), int(spec["elastic"]["minReplicas"])
    wait = float(spec["elastic"]["shrinkAfterSeconds"])
    dataset, epochs = int(args["dataset-size"]), int(args["epochs"])
    ledger = read_ledger(folder, result.job, replicas)
    counts = ledger.consumption(dataset)
    expected = {(e, i) for e in range(epochs) for i in range(dataset)}
    twice = sum(1 for v in counts.values() if v > 1)
    sizes = [h["size"] for h in result.status.get("sizeHistory") or []]
    checks = [
        Check(
            "sizes",
            sizes == [replicas, minimum, replicas],
            " -> ".join(str(s) for s in sizes) + " pods",
        ),
        Check(
            "shrink",
            result.shrink_running_s <= wait + 5,
            f"{minimum} ranks Running {result.shrink_running_s:.1f}s after the loss "
            f"(limit: shrinkAfterSeconds {wait:.0f} + 5 s); rank 0 resumed after "
            f"{result.shrink_resumed_s or float('nan'):.1f}s",
        ),
        Check(
            "grow",
            result.status.get("gangSize") == replicas,
            f"{replicas} ranks Running {result.grow_running_s:.1f}s after the nodes were Ready "
            f"(notice, checkpoint, resubmission); rank 0 resumed after "
            f"{result.grow_resumed_s or float('nan'):.1f}s",
        ),
        Check(
            "samples",
            set(counts) == expected and twice == 0,
            f"{len(counts)} of {len(expected)} (epoch, sample) pairs consumed, "
            f"{len(expected - set(counts))} missed, {twice} twice",
        ),
        Check(
            "global batch",
            set(ledger.samples_per_step().values()) == {int(args["global-batch-size"])},
            "samples per step: "
            + ", ".join(str(v) for v in sorted(set(ledger.samples_per_step().values()))),
        ),
    ]
    for item in read_transitions(folder, result.job, replicas):
        if item.rank != 0:
            continue
        same = item.saved is not None and item.saved["digest"] == item.loaded_digest
        newest = item.resumed_step == item.newest_saved_step
        checks.append(
            Check(
                f"attempt {item.attempt}",
                same and newest,
                f"resumed at {item.world} ranks at step {item.resumed_step} (newest checkpoint "
                f"saved before: step {item.newest_saved_step}); state loaded "
                + ("== saved, bitwise" if same else "!= saved"),
            )
        )
    return checks
