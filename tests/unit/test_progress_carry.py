"""A kept pod's next worker carries the commit its previous worker reported (pod/progress.py).

A survivor saves the last finished step just before its worker ends; the agent's next worker
then reports its own progress on the same annotation. Without the carry it overwrites the
survivor's commit before the operator may have read it, and the loss stays counted from an
older commit. The HTTP calls are replaced: what is tested is what the reporter sends, and that
the operator's parser reads both the carried commit and the new worker's step from it.
"""

from __future__ import annotations

import json
from typing import Any

from rtj_operator.decide.progress import highest_current_step, parse_report, pod_reports
from trainer_runtime import envvars
from trainer_runtime.pod.progress import carried_commit

from .test_progress_cadence import Recording

SURVIVOR = {
    "checkpoint": "ep0-ba97",
    "uri": "s3://b/run/ep0-ba97",
    "step": 97,
    "epoch": 0,
    "sample": 1164,
    "time": "2026-12-06T21:00:00Z",
    "world_size": 4,
    "attempt": 0,
    "current_step": 97,
    "reported_at": "2026-12-06T21:00:01+00:00",
}


class Reporter(Recording):
    """A reporter of attempt 1 whose pod's annotation already holds ``earlier``; ``texts``:
    the annotations it sent, as sent."""

    def __init__(self, tmp_path, earlier: str | None) -> None:
        super().__init__(tmp_path, interval_s=60, **{envvars.ATTEMPT: "1"})
        self.earlier = earlier
        self.reads = 0
        self.texts: list[str] = []
        self.own_pod.annotations = self._annotations  # type: ignore[method-assign]

    def _annotations(self) -> dict[str, str]:
        self.reads += 1
        return {} if self.earlier is None else {envvars.PROGRESS_ANNOTATION: self.earlier}

    def _send(self, annotations: dict[str, str]) -> None:
        self.texts.append(annotations[envvars.PROGRESS_ANNOTATION])


def as_pod(annotation: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {envvars.PROGRESS_ANNOTATION: annotation}}}


def test_the_commit_of_an_earlier_attempt_is_carried_as_its_commit_fields_only():
    carried = carried_commit(json.dumps(SURVIVOR), attempt=1)
    assert carried is not None
    data = json.loads(carried)
    assert data["checkpoint"] == "ep0-ba97" and data["attempt"] == 0 and data["step"] == 97
    assert "current_step" not in data and "reported_at" not in data


def test_nothing_is_carried_from_the_same_attempt_or_an_unknown_one():
    assert carried_commit(json.dumps(SURVIVOR), attempt=0) is None  # its own: nothing to carry
    assert carried_commit(json.dumps(SURVIVOR), attempt=None) is None
    unknown = {k: v for k, v in SURVIVOR.items() if k != "attempt"}
    assert carried_commit(json.dumps(unknown), attempt=1) is None
    assert carried_commit(json.dumps({"current_step": 5, "attempt": 0}), attempt=1) is None
    assert carried_commit("not json\n[1, 2]", attempt=1) is None
    assert carried_commit(None, attempt=1) is None


def test_the_newest_commit_line_of_a_carried_annotation_is_the_one_carried():
    older = dict(SURVIVOR, checkpoint="ep0-ba90", step=90)
    two = f"{json.dumps(older)}\n{json.dumps({'current_step': 99, 'attempt': 0})}"
    assert json.loads(carried_commit(two, attempt=1) or "{}")["checkpoint"] == "ep0-ba90"
    three = f"{json.dumps(older)}\n{json.dumps(SURVIVOR)}\n{json.dumps({'current_step': 99})}"
    assert json.loads(carried_commit(three, attempt=2) or "{}")["checkpoint"] == "ep0-ba97"


def test_the_next_worker_sends_its_steps_under_the_carried_commit_until_it_commits(tmp_path):
    reporter = Reporter(tmp_path, json.dumps(SURVIVOR))
    reporter.step(98)
    reporter.flush()
    reporter.step(99)
    reporter.flush()
    assert reporter.reads == 1, "the pod is read once"
    first = as_pod(reporter.texts[-1])
    report = parse_report(reporter.texts[-1])
    assert report is not None and (report.checkpoint, report.attempt) == ("ep0-ba97", 0)
    assert [r.checkpoint for r in pod_reports(first, None)] == ["ep0-ba97"]
    assert highest_current_step([first]) == 99  # the new worker's step, not the carried one
    assert json.loads(reporter.texts[-1].splitlines()[-1])["attempt"] == 1
    reporter.committed({"checkpoint": "ep0-ba100", "step": 100, "attempt": 1})
    reporter.flush()
    own = reporter.texts[-1]
    assert len(own.splitlines()) == 1, "its own commit replaces the carried one"
    assert parse_report(own) is not None and parse_report(own).checkpoint == "ep0-ba100"


def test_a_pod_without_an_earlier_commit_sends_its_state_alone(tmp_path):
    reporter = Reporter(tmp_path, json.dumps({"current_step": 40, "attempt": 0}))
    reporter.step(3)
    reporter.flush()
    assert len(reporter.texts[-1].splitlines()) == 1
    assert json.loads(reporter.texts[-1]) == {
        "current_step": 3,
        "attempt": 1,
        "reported_at": json.loads(reporter.texts[-1])["reported_at"],
    }
