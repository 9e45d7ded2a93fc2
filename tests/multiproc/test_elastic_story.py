"""An elastic gang's story in real processes: 4 ranks, shrunk to 2, grown back to 4.

What the operator does to an elastic job (docs/operator.md, Elastic gangs), played with real
gloo ranks of the example trainer and real SIGTERMs: the gang is stopped, and the next gang
starts at the other world size with the same command. The global batch stays 8 samples per
step at both sizes (gradient accumulation), every sample is consumed exactly once over the
whole story, no step is lost beyond the last checkpoint, and at each transition the state the
new gang loaded equals, bit for bit, the state the old gang saved.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from .checks import wait_for_gang
from .launch import Gang
from .test_exact_resume import consumed, trace_len

pytestmark = pytest.mark.multiproc
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_deterministic.py"
SIZE, GLOBAL_BATCH = 96, 8


def args(tmp: Path) -> list[str]:
    return [
        "--folder",
        str(tmp / "ck"),
        "--run-name",
        "elastic",
        "--epochs",
        "1",
        "--dataset-size",
        str(SIZE),
        "--batch-size",
        "2",
        "--global-batch-size",
        str(GLOBAL_BATCH),
        "--elastic",
        "--interval",
        "2ba",
        "--workers",
        "0",
        "--step-sleep",
        "0.1",
        "--trace",
        str(tmp / "trace"),
        "--digests",
        str(tmp / "digests"),
    ]


def digests(tmp: Path, rank: int) -> list[dict]:
    path = Path(f"{tmp / 'digests'}.rank{rank}")
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_until_steps(tmp: Path, world: int, steps: int, logs: str) -> None:
    """Start a gang of ``world`` ranks, let it train ``steps`` more steps, SIGTERM it."""
    before = trace_len(tmp, 0)
    gang = Gang(EXAMPLE, args(tmp), world, tmp / logs)
    wait_for_gang(lambda: trace_len(tmp, 0) >= before + 1 + steps, 600, f"{steps} steps", gang)
    gang.signal(signal.SIGTERM)
    assert gang.wait(120) == [143] * world  # saved, then exited like a killed process


def test_shrink_and_grow_keeps_samples_state_and_global_batch(tmp_path):
    run_until_steps(tmp_path, 4, 3, "logs-4")
    run_until_steps(tmp_path, 2, 3, "logs-2")
    assert Gang(EXAMPLE, args(tmp_path), 4, tmp_path / "logs-4b").wait(600) == [0] * 4

    # Exactly once: the samples every rank consumed, minus the steps a resume rolled back.
    counts: Counter[int] = Counter()
    for rank in range(4):
        for _, ids in consumed(tmp_path, rank):
            counts.update(ids)
    assert sorted(counts) == list(range(SIZE))
    assert set(counts.values()) == {1}, "some sample was skipped or consumed twice"

    # The global batch is constant: one step consumes 8 samples at 4 and at 2 ranks.
    per_step: Counter[int] = Counter()
    for rank in range(4):
        for sample, ids in consumed(tmp_path, rank):
            per_step[sample] += len(ids)
    assert set(per_step.values()) == {GLOBAL_BATCH}

    # Bitwise: each resume loaded exactly what the previous gang saved last, with no step lost.
    log0 = digests(tmp_path, 0)
    resumes = [i for i, e in enumerate(log0) if e["event"] == "resume"]
    assert [log0[i]["world"] for i in resumes] == [4, 2, 4]
    for index in resumes[1:]:
        saved = [e for e in log0[:index] if e["event"] == "save"][-1]
        loaded = log0[index]
        assert loaded["path"].endswith(saved["checkpoint"])
        assert loaded["step"] == saved["step"]
        assert loaded["digest"] == saved["digest"]
    # Ranks that join at 4 load the replicated state too: rank 3's resume equals rank 0's save.
    rank3 = [e for e in digests(tmp_path, 3) if e["event"] == "resume"][-1]
    assert rank3["digest"] == log0[resumes[2]]["digest"]
