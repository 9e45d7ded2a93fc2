"""Backoff, resume point, quarantine, progress parsing and notices: the small pure policies."""

from __future__ import annotations

import json
from datetime import timedelta

from rtj_operator.api.spec_types import ResumePolicy, TaintSelector
from rtj_operator.api.status_types import (
    MAX_KNOWN_CHECKPOINTS,
    Cause,
    CheckpointRecord,
    Interruption,
    ResumeFailures,
    SizeRecord,
)
from rtj_operator.decide.backoff import failure_delay
from rtj_operator.decide.notice import notice_payload, taint_matches, termination_taint
from rtj_operator.decide.progress import (
    comparable_step,
    highest_current_step,
    merge_checkpoints,
    parse_report,
    pod_reports,
    settle_losses,
)
from rtj_operator.decide.resume import after_failure, resume_point, run_root

from .fakes import T0, make_pod, progress


def test_backoff_doubles_and_caps():
    assert [failure_delay(n, 10, 600) for n in range(0, 8)] == [0, 10, 20, 40, 80, 160, 320, 600]
    assert failure_delay(10_000, 10, 600) == 600
    assert failure_delay(3, 0, 600) == 0


def rec(name: str, step: int) -> CheckpointRecord:
    return CheckpointRecord(name=name, step=step)


def test_resume_point_first_attempt_is_empty():
    point = resume_point(0, "s3://b/c", "run", [rec("a", 1)], [])
    assert point.uri == "" and point.checkpoint is None


def test_resume_point_is_newest_known_checkpoint():
    known = [rec("ep0-ba100", 100), rec("ep0-ba300", 300), rec("ep0-ba200", 200)]
    point = resume_point(2, "s3://b/c/", "run", known, [])
    assert point.uri == "s3://b/c/run/ep0-ba300" and point.checkpoint == "ep0-ba300"


def test_resume_point_prefers_the_reported_uri():
    known = [CheckpointRecord(name="x", step=1, uri="file:///elsewhere/x")]
    assert resume_point(1, "/ckpt", "run", known, []).uri == "file:///elsewhere/x"


def test_resume_point_skips_quarantined_and_falls_back_to_root():
    known = [rec("a", 1), rec("b", 2)]
    assert resume_point(1, "/ckpt", "run", known, ["b"]).checkpoint == "a"
    root = resume_point(1, "/ckpt", "run", known, ["a", "b"])
    assert root.uri == run_root("/ckpt", "run") == "/ckpt/run" and root.checkpoint is None
    assert resume_point(1, "/ckpt", "run", [], []).uri == "/ckpt/run"


POLICY = ResumePolicy(quarantine_threshold=2, quarantine_window_seconds=600)


def failure(previous=None, *, resumed="ck", committed=None, after=30.0, policy=POLICY):
    return after_failure(
        policy,
        resumed_from=resumed,
        committed_this_attempt=committed,
        attempt_started=T0,
        failed_at=T0 + timedelta(seconds=after),
        previous=previous,
    )


def test_quarantine_after_threshold_consecutive_early_failures():
    first = failure()
    assert first.quarantine is None
    assert first.resume_failures == ResumeFailures(checkpoint="ck", count=1)
    second = failure(first.resume_failures)
    assert second.quarantine == "ck" and second.resume_failures is None


def test_quarantine_counts_per_checkpoint():
    other = failure(ResumeFailures(checkpoint="older", count=1))
    assert other.quarantine is None and other.resume_failures.count == 1


def test_no_quarantine_for_late_failures_progress_or_fresh_start():
    prev = ResumeFailures(checkpoint="ck", count=1)
    assert failure(prev, after=3600).quarantine is None
    assert failure(prev, committed="newer").quarantine is None
    assert failure(prev, resumed=None).quarantine is None
    disabled = ResumePolicy(quarantine_threshold=0)
    assert failure(prev, policy=disabled).quarantine is None


def test_parse_report_takes_the_last_valid_line():
    text = "some log line\n" + progress("ep0-ba10", 10) + "\nnot json {\n"
    report = parse_report(text)
    assert report.checkpoint == "ep0-ba10" and report.step == 10
    assert report.uri == "s3://bucket/ckpt/train/ep0-ba10"


def test_parse_report_rejects_garbage():
    assert parse_report(None) is None
    assert parse_report("") is None
    assert parse_report("[1,2]") is None
    assert parse_report(json.dumps({"checkpoint": "x"})) is None
    assert parse_report(json.dumps({"checkpoint": "", "step": 1})) is None
    assert parse_report(json.dumps({"checkpoint": "x", "step": True})) is None


def test_pod_reports_reads_annotation_and_termination_message():
    pod = make_pod(
        phase="Failed",
        exit_code=1,
        termination_message=progress("ep0-ba20", 20),
        annotations={"resumable.dev/progress": progress("ep0-ba10", 10, current=15)},
    )
    reports = pod_reports(pod, None)
    assert {r.checkpoint for r in reports} == {"ep0-ba10", "ep0-ba20"}
    assert highest_current_step([pod]) == 20


def test_the_current_step_is_read_before_the_attempts_first_commit():
    """Rank 0 sends ``current_step`` alone until its attempt commits: a loss then still counts
    the steps the gang reached (it counted none: the step came only with a commit)."""
    before_commit = make_pod(annotations={"resumable.dev/progress": '{"current_step": 7}'})
    assert highest_current_step([before_commit]) == 7
    assert highest_current_step([make_pod()]) is None


def test_a_step_after_a_resume_at_another_world_size_is_not_subtracted_from_its_commit():
    """The runtime rescales steps when the global batch changes with the world size: before
    the resized gang commits, its step and the last commit's are in different units."""
    four = CheckpointRecord(name="ep0-ba50", step=50, sample=400, world_size=4)
    assert comparable_step(101, four, world_size=2, committed_here=False) is None
    assert comparable_step(101, four, world_size=2, committed_here=True) == 101
    assert comparable_step(57, four, world_size=4, committed_here=False) == 57
    unknown = CheckpointRecord(name="ep0-ba50", step=50)
    assert comparable_step(57, unknown, world_size=2, committed_here=False) == 57
    assert comparable_step(None, four, world_size=2, committed_here=False) is None


def test_merge_checkpoints_dedupes_orders_and_bounds():
    many = [rec(f"c{i}", i) for i in range(MAX_KNOWN_CHECKPOINTS + 5)]
    merged = merge_checkpoints([rec("c3", 3)], [*many, rec("c3", 3)])
    assert len(merged) == MAX_KNOWN_CHECKPOINTS
    assert [m.step for m in merged] == sorted((m.step for m in merged), reverse=True)
    assert len({m.name for m in merged}) == len(merged)


def test_taint_matching_by_key_value_effect():
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert taint_matches(taint, TaintSelector(key="k"))
    assert taint_matches(taint, TaintSelector(key="k", value="v", effect="NoExecute"))
    assert not taint_matches(taint, TaintSelector(key="k", value="other"))
    assert not taint_matches(taint, TaintSelector(key="k", effect="NoSchedule"))
    assert termination_taint([{"key": "x"}, taint], [TaintSelector(key="k")]) == taint


def test_notice_payload_follows_the_contract():
    data = json.loads(notice_payload({"key": "k", "timeAdded": "2030-01-01T00:00:00Z"}, "n1", T0))
    assert data == {"time": "2030-01-01T00:00:00Z", "reason": "k", "node": "n1"}
    data = json.loads(notice_payload({"key": "k"}, "n1", T0))
    assert data["time"] == "2030-01-01T12:00:00.000Z"


def test_checkpoints_are_ordered_by_samples_first_as_the_runtime_orders_them():
    """A relaunch with a larger global batch rescales the step down (160 samples: step 10 at 16
    a step, 5 at 32). Ordered by step, the checkpoints it committed (ep0-ba8, 256 samples) were
    older than the one it resumed from (ep0-ba10, 160 samples): lastCommittedCheckpoint stayed
    behind and the next attempt was told to resume from the older one."""
    before = CheckpointRecord(name="ep0-ba10", step=10, epoch=0, sample=160, attempt=0)
    after = CheckpointRecord(name="ep0-ba8", step=8, epoch=0, sample=256, attempt=1)
    merged = merge_checkpoints([before], [after])
    assert [r.name for r in merged] == ["ep0-ba8", "ep0-ba10"]
    assert resume_point(2, "/ckpt", "run", [before, after], []).checkpoint == "ep0-ba8"
    # A run that counts no samples (all 0) is ordered by its steps, then its epochs.
    steps = [CheckpointRecord(name=f"s{n}", step=n, sample=0) for n in (3, 9, 5)]
    assert [r.name for r in merge_checkpoints([], steps)] == ["s9", "s5", "s3"]
    ends = [
        CheckpointRecord(name="ep7-ba96", step=96, epoch=7, sample=768),
        CheckpointRecord(name="ep8-ba96", step=96, epoch=8, sample=768),
    ]
    assert merge_checkpoints([], ends)[0].name == "ep8-ba96"


def test_a_commit_of_the_interrupted_attempt_after_its_interruption_settles_its_loss():
    """The save on SIGTERM commits after the operator saw the interruption: the steps it
    committed were not lost (the annotation said 7 lost where the ranks lost none)."""
    gone = Interruption(
        time=T0, attempt=1, cause=Cause.NODE_DELETED, preemption=True,
        last_committed_step=40, steps_lost=7,
    )  # fmt: skip
    later = [
        CheckpointRecord(name="ep0-ba47", step=47, attempt=1),
        CheckpointRecord(name="ep0-ba90", step=90, attempt=2),  # another attempt: other units
    ]
    settle_losses([gone], later)
    assert (gone.last_committed_step, gone.steps_lost) == (47, 0)
    partial = Interruption(
        time=T0, attempt=1, cause=Cause.NODE_DELETED, preemption=True,
        last_committed_step=40, steps_lost=7,
    )  # fmt: skip
    settle_losses([partial], [CheckpointRecord(name="ep0-ba44", step=44, attempt=1)])
    assert (partial.last_committed_step, partial.steps_lost) == (44, 3)
    settle_losses([partial], [CheckpointRecord(name="ep0-ba30", step=30, attempt=1)])
    assert partial.steps_lost == 3, "an older commit changes nothing"


def test_a_settled_loss_settles_the_size_history_entry_that_copied_it():
    """The next attempt's size record copied ``stepsLost`` when it started (a kept survivor's
    save of the last finished step is reported later): it is settled with the interruption."""
    gone = Interruption(
        time=T0, attempt=0, cause=Cause.NODE_DELETED, preemption=True,
        last_committed_step=90, steps_lost=8,
    )  # fmt: skip
    history = [
        SizeRecord(size=4, world_size=4, reason="FullSize", attempt=0, start_time=T0),
        SizeRecord(size=2, world_size=2, reason="Shrunk", attempt=1, start_time=T0, steps_lost=8),
        SizeRecord(size=3, world_size=3, reason="Grown", attempt=2, start_time=T0, steps_lost=0),
    ]
    settle_losses([gone], [CheckpointRecord(name="ep0-ba98", step=98, attempt=0)], history)
    assert gone.steps_lost == 0
    assert [h.steps_lost for h in history] == [None, 0, 0]
    later = Interruption(
        time=T0, attempt=1, cause=Cause.NODE_DELETED, preemption=True,
        last_committed_step=98, steps_lost=5,
    )  # fmt: skip
    settle_losses([later], [CheckpointRecord(name="ep0-ba100", step=100, attempt=1)], history)
    assert later.steps_lost == 3
    assert history[2].steps_lost == 0, "a grow's entry says 0 whatever came before"


def test_a_report_that_names_its_attempt_counts_for_it_on_a_relabelled_pod():
    """A kept pod is relabelled into the next attempt while its old worker still commits (the
    save from a survivor's memory): the report's own attempt wins over the pod's label, so the
    commit settles the interrupted attempt's loss."""
    line = json.dumps({"checkpoint": "ep0-ba26", "step": 26, "attempt": 0, "world_size": 3})
    report = parse_report(line)
    assert report is not None and report.of_attempt(1) == 0
    assert report.record(1).attempt == 0 and report.record(1).world_size == 3
    plain = parse_report(json.dumps({"checkpoint": "ep0-ba26", "step": 26}))
    assert plain is not None and plain.record(1).attempt == 1  # an older runtime: the label
    gone = Interruption(
        time=T0, attempt=0, cause=Cause.NODE_DELETED, preemption=True,
        last_committed_step=20, steps_lost=6,
    )  # fmt: skip
    settle_losses([gone], [report.record(1)])
    assert (gone.last_committed_step, gone.steps_lost) == (26, 0)
