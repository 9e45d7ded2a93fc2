"""The stack's pure parts, without a cluster: reading logs and manifests, the operator's flags.

The full-story test and the demo draw their facts (resume step, notice save, emergency save)
from the runtime's log lines; these tests pin the formats they rely on to the runtime's own
messages, so a reworded log line fails here rather than as a timeout in the e2e.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from tools import localstack
from tools.localstack import (
    EMERGENCY,
    LocalStack,
    StackConfig,
    committed_steps,
    fetched_from,
    interval_steps,
    notice_checkpoint,
    resumed_step,
    training_command,
)
from tools.podrunner.__main__ import _image_path

from .conftest import MANIFEST

LOG = """\
2026-11-22 04:14:09,821 trainer_runtime starting run notice from scratch (no checkpoint to resume)
2026-11-22 04:14:12,282 trainer_runtime committed checkpoint ep0-ba8 in 0.01s
2026-11-22 04:14:14,750 trainer_runtime committed checkpoint ep0-ba12 in 0.01s
2026-11-22 04:14:15,364 trainer_runtime preemption notice: saving now and training on
2026-11-22 04:14:15,381 trainer_runtime committed checkpoint ep1-ba15 in 0.01s
2026-11-22 04:14:16,048 trainer_runtime SIGTERM: saving at batch 16 before exiting
2026-11-22 04:14:16,099 trainer_runtime committed checkpoint ep1-ba16 in 0.01s
2026-11-22 04:14:16,203 trainer_runtime emergency save ep1-ba16 done 0.43s after SIGTERM (grace \
period 20s)
"""
RESUMED = """\
2026-11-22 04:14:26,100 trainer_runtime.objectstore.resolver object store: fetched \
s3://rtj-checkpoints/runs/notice/ep1-ba16 (3 file(s), 9000 bytes downloaded) into /x/ep1-ba16
2026-11-22 04:14:26,200 trainer_runtime resumed run notice from /x/ep1-ba16 at epoch 1 batch 16
"""


def test_log_facts() -> None:
    assert committed_steps(LOG) == [
        ("ep0-ba8", 8),
        ("ep0-ba12", 12),
        ("ep1-ba15", 15),
        ("ep1-ba16", 16),
    ]
    assert notice_checkpoint(LOG) == ("ep1-ba15", 15)
    assert notice_checkpoint(LOG.replace("preemption notice", "x")) is None
    found = EMERGENCY.search(LOG)
    assert found is not None and found.groups() == ("ep1-ba16", "0.43")
    assert resumed_step(LOG) is None and resumed_step(RESUMED) == 16
    assert fetched_from(RESUMED) == "s3://rtj-checkpoints/runs/notice/ep1-ba16"


def test_log_formats_match_the_runtime(caplog: pytest.LogCaptureFixture) -> None:
    """The runtime's own format strings produce lines the parsers read."""
    runtime = localstack.REPO / "trainer_runtime"
    source = "".join(p.read_text() for p in runtime.glob("*.py"))
    for fragment in (
        '"committed checkpoint %s in',
        '"resumed run %s from %s at epoch %d batch %d"',
        '"preemption notice: saving now',
        '"emergency save %s done %.2fs after SIGTERM',
    ):
        assert fragment in source, fragment
    assert '"object store: fetched %s (' in (runtime / "objectstore" / "resolver.py").read_text()
    log = logging.getLogger("check")
    with caplog.at_level(logging.INFO, "check"):
        log.info("resumed run %s from %s at epoch %d batch %d", "r", "/p/ep1-ba16", 1, 16)
        log.info(
            "emergency save %s done %.2fs after SIGTERM (grace period %ss)", "ep1-ba16", 0.4312, 20
        )
    assert resumed_step(caplog.text) == 16
    assert EMERGENCY.search(caplog.text) is not None


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

    monkeypatch.setattr(localstack.subprocess, "Popen", FakePopen)
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
