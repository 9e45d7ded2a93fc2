"""The spot story (tools/stories/spot.py) without a cluster: its plan check, its logic over a fake
``SpotCluster`` (tools/spotcluster.py), and the real-node verdicts (tools/stories/realnodes.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tools.spotcluster import (
    LOST,
    NOTICE,
    SHUTDOWN,
    Narration,
    PlainNarration,
    PodRunnerCluster,
    RealNodeCluster,
    SpotCluster,
)
from tools.stories.realnodes import verdicts
from tools.stories.spot import (
    Attempt,
    Interruption,
    SpotStory,
    StoryResult,
    check_interruptions,
    describe,
)
from trainer_runtime.events import (
    COMMITTED,
    FRESH,
    PREFIX,
    RESUMED,
    SCHEMA_VERSION,
    RuntimeEvent,
)


@pytest.mark.parametrize(
    "good",
    [
        ["notice"],
        ["lost"],
        ["shutdown"],
        ["notice", "lost"],
        ["notice", "notice"],
        ["shutdown", "lost"],
    ],
)
def test_a_possible_story_is_accepted(good: list[str]) -> None:
    check_interruptions(good)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (["lost", "notice"], "must be the last"),
        (["notice", "lost", "lost"], "must be the last"),
        (["reclaim"], "expected each of"),
    ],
)
def test_an_impossible_story_is_refused_before_anything_runs(bad: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_interruptions(bad)


def _story(start: RuntimeEvent, tmp_path: Path) -> StoryResult:
    lost = Interruption("lost", "node-a", committed_before=8)
    status = {
        "phase": "Succeeded",
        "preemptions": 1,
        "failures": 0,
        "lastCommittedCheckpoint": {"step": 48},
        "interruptions": [{"preemption": True, "node": "node-a"}],
    }
    attempts = [Attempt(0, "node-a", "p0"), Attempt(1, "node-b", "p1", start)]
    missing = tmp_path / "final.pt"
    return StoryResult("story", status, [lost], attempts, {}, missing, 1.0, reference=missing)


def _event(kind: str, **fields: object) -> RuntimeEvent:
    return RuntimeEvent(kind, 0, "2026-01-01T00:00:00Z", dict(fields))


def test_verdicts_pass_a_resume_at_the_last_commit_and_fail_missing_weights(tmp_path: Path) -> None:
    checks = verdicts(_story(_event("resumed", step=8, checkpoint="ep0-ba8"), tmp_path))
    failed = {c.name for c in checks if not c.ok}
    assert failed == {"final weights equal an uninterrupted run"}


def test_verdicts_call_a_fresh_start_what_it_is(tmp_path: Path) -> None:
    checks = verdicts(_story(_event("fresh", run="story", world_size=1), tmp_path))
    resumed = next(c for c in checks if c.name.startswith("attempt 1"))
    assert not resumed.ok and "started FRESH" in resumed.detail


def test_verdicts_fail_a_resume_behind_the_last_commit(tmp_path: Path) -> None:
    checks = verdicts(_story(_event("resumed", step=4, checkpoint="ep0-ba4"), tmp_path))
    resumed = next(c for c in checks if c.name.startswith("attempt 1"))
    assert not resumed.ok and "resumed at step 4" in resumed.detail


def _members(cls: type) -> set[str]:
    return {m for m in vars(cls) if not m.startswith("_")} | set(cls.__annotations__)


@pytest.mark.parametrize("adapter", [PodRunnerCluster, RealNodeCluster])
def test_both_adapters_have_every_verb_of_the_cluster_interface(adapter: type) -> None:
    missing = _members(SpotCluster) - set(dir(adapter))
    assert not missing, f"{adapter.__name__} lacks {sorted(missing)}"


class FakeCluster:
    """A ``SpotCluster`` whose job advances 4 steps a poll: the story's logic, without nodes.

    Each attempt places rank ``r`` on ``nodes[(attempt + r) % 3]``; a node that goes ends the
    attempt, and the next one resumes at the last commit (or, with ``fresh``, from step 0).
    """

    poll_s = 0.0
    TOTAL = 48

    def __init__(self, tmp_path: Path, *, fresh: bool = False) -> None:
        self.nodes = ["n0", "n1", "n2"]
        self.attempt, self.step, self.phase = 0, 0, "Running"
        self.known: list[dict] = []
        self.conditions: list[dict] = []
        self.logs: dict[str, list[str]] = {"story-a0-r0": [_line(FRESH, run="story", world_size=2)]}
        self.fresh, self.gone, self.done = fresh, [], []
        self.weights_path = tmp_path / "final.pt"
        self.noticed = False

    def _commit(self, step: int) -> None:
        self.step = step
        self.known.append({"name": f"ep0-ba{step}", "step": step})
        self.logs[f"story-a{self.attempt}-r0"].append(
            _line(COMMITTED, checkpoint=f"ep0-ba{step}", step=step)
        )

    def submit(self, manifest: object, job: str) -> None:
        self.done.append(("submit", job))

    def status(self, job: str) -> dict:
        if self.phase == "Running" and not self.noticed:
            self._commit(min(self.step + 4, self.TOTAL))
            if self.step >= self.TOTAL:
                self.phase = "Succeeded"
                self.weights_path.write_bytes(b"w")
        return {
            "phase": self.phase,
            "attempt": self.attempt,
            "lastCommittedCheckpoint": {"step": self.step, "name": f"ep0-ba{self.step}"},
            "knownCheckpoints": list(self.known),
            "conditions": list(self.conditions),
        }

    def pods(self, job: str, attempt: int | None = None) -> list[dict]:
        return []

    def pod(self, job: str, attempt: int, rank: int) -> dict | None:
        if attempt > self.attempt:
            return None
        return {"spec": {"nodeName": self.nodes[(attempt + rank) % 3]}}

    def pod_log(self, pod: str) -> str:
        return "\n".join(self.logs.get(pod, []))

    def events(self, job: str) -> list[dict]:
        return []

    def make_room(self, node: str) -> None:
        self.done.append(("make_room", node))

    def notice(self, node: str) -> None:
        self.done.append(("notice", node))
        self.conditions = [{"type": "PreemptionNotice", "status": "True"}]
        self.logs[f"story-a{self.attempt}-r0"].append(_line(NOTICE, reason="x", step=self.step))
        self._commit(self.step + 1)
        self.noticed = True

    def _next(self, node: str) -> None:
        self.gone.append(node)
        self.attempt += 1
        self.noticed, self.conditions = False, []
        start = (
            _line(FRESH, run="story", world_size=2)
            if self.fresh
            else _line(RESUMED, step=self.step, checkpoint=f"ep0-ba{self.step}")
        )
        self.logs[f"story-a{self.attempt}-r0"] = [start]

    def shut_down(self, job: str, node: str) -> None:
        self.done.append(("shut_down", node))
        self._next(node)

    def lose(self, node: str) -> None:
        self.done.append(("lose", node))
        self._next(node)

    def restore(self, node: str) -> None:
        self.done.append(("restore", node))

    def weights(self, job: str) -> Path:
        return self.weights_path

    def explain(self, kind: str, node: str) -> str:
        return f"{kind} {node}"

    def narration(self, job: str, say: Callable[[str], None]) -> Narration:
        return PlainNarration(say)

    def diagnostics(self, job: str) -> str:
        return "fake"


def _line(kind: str, **fields: object) -> str:
    body = {"v": SCHEMA_VERSION, "type": kind, "rank": 0, "time": "t", **fields}
    return PREFIX + json.dumps(body)


def test_the_fake_cluster_has_every_verb_of_the_cluster_interface() -> None:
    assert not _members(SpotCluster) - set(dir(FakeCluster))


def test_the_story_loses_the_node_of_its_rank_after_the_step_and_sees_the_resume(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster(tmp_path)
    result = SpotStory(cluster, {}, "story", rank=1, lose_after_step=12).run([LOST])
    (loss,) = result.interruptions
    assert (loss.kind, loss.node) == (LOST, "n1")  # rank 1 of attempt 0
    assert loss.committed_before >= 12 and loss.status_before["attempt"] == 0
    assert [a.node for a in result.attempts] == ["n1", "n2"]
    assert result.attempts[1].resumed_step == loss.committed_before
    assert result.status["phase"] == "Succeeded" and result.weights.exists()
    assert set(result.logs) == {0, 1} and result.lost_node == "n1"
    assert ("make_room", "n1") in cluster.done and ("restore", "n1") not in cluster.done


def test_a_notice_waits_for_its_save_then_ends_the_node_gracefully(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path)
    story = SpotStory(cluster, {}, "story", rank=0, lose_after_step=0, notice_delay_s=0)
    result = story.run([NOTICE, LOST])
    first, second = result.interruptions
    assert first.kind == NOTICE and first.notice is not None
    name, step = first.notice
    assert step == first.committed_before and step % 4 == 1  # the notice's own save
    assert name in {k["name"] for k in first.status_before["knownCheckpoints"]}
    assert [e.type for e in first.notice_events][-2:] == [NOTICE, COMMITTED]
    assert result.attempts[1].resumed_step == step
    assert cluster.done.index(("notice", "n0")) < cluster.done.index(("shut_down", "n0"))
    assert ("restore", "n0") in cluster.done
    assert second.kind == LOST and second.node == "n1" and len(result.attempts) == 3


def test_a_fresh_start_ends_the_interruptions(tmp_path: Path) -> None:
    cluster = FakeCluster(tmp_path, fresh=True)
    story = SpotStory(cluster, {}, "story", rank=0, lose_after_step=0, notice_delay_s=0)
    result = story.run([SHUTDOWN, LOST])
    assert [i.kind for i in result.interruptions] == [SHUTDOWN]
    assert describe(result.attempts[1]) == "started FRESH, from step 0"
