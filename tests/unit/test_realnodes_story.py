"""The real-node story's plan check (tools/stories/realnodes.py), without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.stories.realnodes import (
    Attempt,
    Interruption,
    StoryResult,
    check_interruptions,
    verdicts,
)
from trainer_runtime.events import RuntimeEvent


@pytest.mark.parametrize("good", [["notice"], ["lost"], ["notice", "lost"], ["notice", "notice"]])
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
    return StoryResult([lost], attempts, status, missing, missing, 1.0)


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
