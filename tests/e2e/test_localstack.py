"""The stack's pure parts, without a cluster: reading runtime events and manifests, the
operator's flags, the reference run's command.

The full-story test and the demo draw their facts about the runtime (resume step and source,
the notice's save, the save on SIGTERM) from its structured events (``rtj-event`` lines,
``trainer_runtime/events.py``). These tests feed the readers lines written by the runtime's own
event writer, mixed with log lines, and show that rewording (or dropping) every log line changes
nothing they read.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from tools import localstack
from tools.localstack import (
    LocalStack,
    Narrator,
    StackConfig,
    committed_steps,
    emergency_save,
    fetched_from,
    interval_steps,
    notice_checkpoint,
    resumed_step,
    started_fresh,
    training_command,
)
from tools.localstack import reference as reference_module
from tools.podrunner.__main__ import _image_path
from trainer_runtime import events

from .conftest import MANIFEST

URI = "s3://rtj-checkpoints/runs/notice/ep1-ba16"


class Checkpoint:
    """Just enough of a Manifest for ``events.committed``."""

    def __init__(self, name: str, step: int) -> None:
        self.name, self.world_size, self.save_duration_s, self.files = name, 2, 0.01, []
        self.timestamp = type("T", (), {"batch": step, "epoch": step // 12})()


def runtime_lines(capsys: pytest.CaptureFixture[str], emit: list) -> list[str]:
    """The stderr lines the runtime's event writer produces for ``emit`` (callables)."""
    capsys.readouterr()
    for call in emit:
        call()
    return capsys.readouterr().err.splitlines()


def first_attempt(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Rank 0 of a gang that started fresh, committed, got a notice, then SIGTERM."""
    c = [Checkpoint(n, s) for n, s in (("ep0-ba8", 8), ("ep0-ba12", 12), ("ep1-ba15", 15))]
    c16 = Checkpoint("ep1-ba16", 16)
    ev = runtime_lines(
        capsys,
        [
            lambda: events.fresh(rank=0, run="notice", world_size=2),
            lambda: events.committed(c[0], "s3://b/ep0-ba8", rank=0, held_s=0.01),
            lambda: events.committed(c[1], "s3://b/ep0-ba12", rank=0, held_s=0.01),
            lambda: events.notice(rank=0, content='{"reason": "spot"}', step=15),
            lambda: events.committed(c[2], "s3://b/ep1-ba15", rank=0, held_s=0.01),
            lambda: events.sigterm(rank=0, step=16, grace_period_s=20),
            lambda: events.committed(c16, "s3://b/ep1-ba16", rank=0, held_s=0.01),
            lambda: events.emergency_saved(
                rank=0, checkpoint="ep1-ba16", step=16, seconds=0.4312, grace_period_s=20
            ),
        ],
    )
    logs = [
        "2026-11-22 04:14:09,821 trainer_runtime starting run notice from scratch",
        "2026-11-22 04:14:12,282 trainer_runtime committed checkpoint ep0-ba8 in 0.01s",
        "2026-11-22 04:14:14,750 trainer_runtime committed checkpoint ep0-ba12 in 0.01s",
        "2026-11-22 04:14:15,364 trainer_runtime preemption notice: saving now and training on",
        "2026-11-22 04:14:15,381 trainer_runtime committed checkpoint ep1-ba15 in 0.01s",
        "2026-11-22 04:14:16,048 trainer_runtime SIGTERM: saving at batch 16 before exiting",
        "2026-11-22 04:14:16,099 trainer_runtime committed checkpoint ep1-ba16 in 0.01s",
        "2026-11-22 04:14:16,203 trainer_runtime emergency save ep1-ba16 done 0.43s after SIGTERM",
    ]
    return [line for pair in zip(logs, ev, strict=True) for line in pair]


def second_attempt(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Rank 0 of the new gang: fetched the checkpoint from the bucket and resumed."""
    ev = runtime_lines(
        capsys,
        [
            lambda: events.resumed(
                rank=0,
                run="notice",
                source="remote",
                path="/x/ep1-ba16",
                uri=URI,
                step=16,
                epoch=1,
                fallbacks=[],
                world_size=2,
            )
        ],
    )
    return [
        f"2026-11-22 04:14:26,100 object store: fetched {URI} (3 file(s)) into /x/ep1-ba16",
        "2026-11-22 04:14:26,200 trainer_runtime resumed run notice from /x at epoch 1 batch 16",
        *ev,
    ]


def facts(first: str, second: str) -> tuple:
    return (
        committed_steps(first),
        notice_checkpoint(first),
        emergency_save(first),
        started_fresh(first),
        resumed_step(first),
        resumed_step(second),
        fetched_from(second),
    )


EXPECTED = (
    [("ep0-ba8", 8), ("ep0-ba12", 12), ("ep1-ba15", 15), ("ep1-ba16", 16)],
    ("ep1-ba15", 15),
    ("ep1-ba16", 0.431),
    True,
    None,
    16,
    URI,
)


def reword(lines: list[str]) -> str:
    """Every line that is not an event reworded, with decoys in the old wording that would give
    other answers to a reader of log text."""
    out = []
    for line in lines:
        if line.startswith(events.PREFIX):
            out.append(line)
        else:
            out.append("INFO something else entirely happened here")
            out.append("committed checkpoint ep9-ba99 in 0.01s")
            out.append("resumed run notice from /y/ep9-ba99 at epoch 9 batch 99")
            out.append("object store: fetched s3://elsewhere/ep9-ba99 (1 file(s))")
            out.append("preemption notice: saving now")
            out.append("emergency save ep9-ba99 done 9.99s after SIGTERM")
    return "\n".join(out)


def test_facts_come_from_runtime_events(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = first_attempt(capsys), second_attempt(capsys)
    assert facts("\n".join(first), "\n".join(second)) == EXPECTED


def test_rewording_log_lines_cannot_change_what_the_story_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = first_attempt(capsys), second_attempt(capsys)
    assert facts(reword(first), reword(second)) == EXPECTED
    # Log wording alone says nothing to the readers.
    plain = [line for line in first + second if not line.startswith(events.PREFIX)]
    text = "\n".join(plain)
    assert facts(text, text) == ([], None, None, False, None, None, None)


def test_narrator_says_the_same_whatever_the_log_wording(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = first_attempt(capsys), second_attempt(capsys)

    def narrate(a0: str, a1: str) -> list[str]:
        said: list[str] = []
        narrator = Narrator(None, "notice", said.append)  # type: ignore[arg-type]
        narrator._from_log(0, a0)
        narrator._from_log(1, a1)
        return [line.split("] ", 1)[1] for line in said]

    told = narrate("\n".join(first), "\n".join(second))
    assert told == [
        "attempt 0: rank 0 started from scratch",
        "attempt 0: rank 0 saved at once on the notice: checkpoint ep1-ba15 at step 15, and "
        "trains on",
        "attempt 0: rank 0 saved on SIGTERM: checkpoint ep1-ba16, 0.43s after the signal, and "
        "exited",
        f"attempt 1: rank 0 resumed at step 16 (fetched {URI})",
    ]
    assert narrate(reword(first), reword(second)) == told


def test_no_regular_expressions_in_the_stack() -> None:
    """The readers parse events only: no module of the package imports ``re``."""
    folder = Path(localstack.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert "re" not in names and "regex" not in names, path


def test_manifest_facts() -> None:
    argv = training_command(MANIFEST)
    assert argv[:2] == ["python", "/app/examples/train_deterministic.py"]
    assert not any(a.startswith("--folder") for a in argv), "the folder comes from the env"
    assert interval_steps(MANIFEST) == 4


def test_operator_runs_with_the_chart_arguments_on_local_ports(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(workdir=tmp_path))
    stack.deployment = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "args": [
                                "--all-namespaces",
                                "--liveness=http://0.0.0.0:8080/healthz",
                                "--metrics-port=9090",
                                "--metrics-address=0.0.0.0",
                                "--peering=rtj-operator",
                                "--workers=8",
                            ]
                        }
                    ]
                }
            }
        }
    }
    args = stack.operator_args()
    assert args[0] == "--all-namespaces" and args[-2:] == ["--peering=rtj-operator", "--workers=8"]
    assert args[1] == f"--liveness={stack.operator_liveness}"
    assert stack.operator_liveness.startswith("http://127.0.0.1:")
    assert args[2] != "--metrics-port=9090" and args[3] == "--metrics-address=127.0.0.1"


def test_reference_run_uses_the_manifest_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []

    class FakePopen:
        def __init__(self, argv: list[str], **kw: object) -> None:
            started.append(argv)

    monkeypatch.setattr(reference_module.subprocess, "Popen", FakePopen)
    run = localstack.start_reference_run(MANIFEST, tmp_path)
    assert len(run.procs) == 2 and len(started) == 2
    argv = started[0]
    assert argv[1] == str(localstack.REPO / "examples" / "train_deterministic.py")
    assert "--interval=4ba" in argv and "--epochs=4" in argv
    assert not any(a.startswith(("--step-sleep", "--out=")) for a in argv)
    assert argv[-2:] == ["--out", str(tmp_path / "reference.pt")]


def test_image_path_option() -> None:
    image, local = _image_path("/app=.")
    assert image == "/app" and local == str(Path(".").resolve())
    for bad in ("app=.", "/app", "/app="):
        with pytest.raises(argparse.ArgumentTypeError):
            _image_path(bad)


class JobStatusSequence:
    """Just enough of a LocalStack for ``Narrator.poll``: the job's successive statuses."""

    def __init__(self, statuses: list[dict]) -> None:
        self.statuses = statuses

    def job(self, name: str) -> dict:
        return {"spec": {"replicas": 2}, "status": self.statuses.pop(0)}

    def pods(self, job: str, attempt: int) -> list:
        return []

    def pod_log(self, pod: str) -> str:
        return ""


def narration(statuses: list[dict]) -> list[str]:
    """What the narrator says over one poll per status, without its time stamps."""
    said: list[str] = []
    narrator = Narrator(JobStatusSequence(list(statuses)), "spot-demo", said.append)  # type: ignore[arg-type]
    for _ in statuses:
        narrator.poll()
    return [line.split("] ", 1)[1] for line in said]


def test_narrator_says_restarting_when_the_new_gang_runs_between_two_polls() -> None:
    """The pod runner starts a new gang in well under a poll's interval: the job is already
    Running again when the narrator sees attempt 1, and its Restarting condition (False by then)
    is what records that it restarted."""
    resume = "s3://rtj-checkpoints/runs/spot-demo/ep0-ba12"
    running = {"type": "Running", "status": "True"}
    restarted = {"type": "Restarting", "status": "False", "reason": "Running"}
    assert narration(
        [
            {"phase": "Running", "attempt": 0, "conditions": [running]},
            {
                "phase": "Running",
                "attempt": 1,
                "resumeFrom": resume,
                "conditions": [running, restarted],
            },
            {"phase": "Succeeded", "attempt": 1, "conditions": [restarted]},
        ]
    ) == [
        "job phase: Running",
        f"operator: attempt 1 submitted with RTJ_RESUME_FROM={resume}",
        "job phase: Restarting",
        "job phase: Running",
        "job phase: Succeeded",
    ]


def test_narrator_says_restarting_once_when_it_sees_it() -> None:
    resume = "s3://rtj-checkpoints/runs/spot-demo/ep0-ba12"
    restarting = {"type": "Restarting", "status": "True"}
    assert narration(
        [
            {"phase": "Running", "attempt": 0},
            {"phase": "Restarting", "attempt": 1, "resumeFrom": resume, "conditions": [restarting]},
            {"phase": "Running", "attempt": 1, "conditions": [{**restarting, "status": "False"}]},
        ]
    ) == [
        "job phase: Running",
        f"operator: attempt 1 submitted with RTJ_RESUME_FROM={resume}",
        "job phase: Restarting",
        "job phase: Running",
    ]
