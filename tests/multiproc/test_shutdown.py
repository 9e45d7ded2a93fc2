"""How a real training process ends: SIGTERM to its whole process group (DataLoader workers
included), and the end of training (a final save, so a re-run of a finished job trains nothing).

The trainer is the example job (examples/train_deterministic.py) with DataLoader workers.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from trainer_runtime.save.manifest import Manifest

from .checks import committed_and_valid, wait_for_gang
from .launch import Gang

pytestmark = pytest.mark.multiproc
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_deterministic.py"


def job_args(tmp: Path, *extra: str) -> list[str]:
    return [
        "--folder",
        str(tmp / "ck"),
        "--run-name",
        "end",
        "--dataset-size",
        "64",
        "--batch-size",
        "4",
        "--workers",
        "2",
        "--trace",
        str(tmp / "trace"),
        "--out",
        str(tmp / "final.pt"),
        *extra,
    ]


def trace(tmp: Path, rank: int = 0) -> list[dict]:
    p = Path(f"{tmp / 'trace'}.rank{rank}")
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def test_sigterm_to_the_process_group_with_dataloader_workers_still_saves(tmp_path):
    grace = 20.0
    gang = Gang(
        EXAMPLE,
        job_args(tmp_path, "--epochs", "50", "--step-sleep", "0.05", "--interval", "1000ba"),
        2,
        tmp_path / "logs",
        env={"RTJ_GRACE_PERIOD_SECONDS": str(grace)},
        own_process_group=True,
    )
    wait_for_gang(lambda: len(trace(tmp_path)) > 5, 180, "training progress", gang)
    t0 = time.monotonic()
    gang.signal_group(signal.SIGTERM)
    codes = gang.wait(grace)
    elapsed = time.monotonic() - t0
    logs = [(tmp_path / "logs" / f"rank{r}.log").read_text() for r in range(2)]
    assert codes == [143, 143], f"exit codes {codes}; rank 0 log tail:\n{logs[0][-3000:]}"
    assert elapsed < grace
    names = committed_and_valid(tmp_path / "ck" / "end")
    assert len(names) == 1, "the emergency save is the only checkpoint (interval is 1000ba)"
    saved_at = Manifest.read(tmp_path / "ck" / "end" / names[0]).timestamp.batch
    last_step = trace(tmp_path)[-1]["batch"]
    assert saved_at >= last_step - 1 and saved_at >= 5, (saved_at, last_step)
    assert "emergency save" in logs[0]
    assert not any("Traceback" in log for log in logs), logs[0][-3000:]


def test_a_finished_job_ends_with_a_final_save_and_a_rerun_trains_no_step(tmp_path):
    # 16 steps; the interval saves at 5, 10 and 15; only the final save holds step 16.
    args = job_args(tmp_path, "--epochs", "1", "--interval", "5ba")
    assert Gang(EXAMPLE, args, 1, tmp_path / "logs").wait(300) == [0]
    first = trace(tmp_path)
    assert [r["batch"] for r in first if "batch" in r] == list(range(1, 17))
    names = committed_and_valid(tmp_path / "ck" / "end")
    final = Manifest.read(tmp_path / "ck" / "end" / names[0]).timestamp
    assert (final.epoch, final.batch) == (1, 16), names
    weights = torch.load(tmp_path / "final.pt", weights_only=True)

    assert Gang(EXAMPLE, args, 1, tmp_path / "logs2").wait(300) == [0]
    rerun = trace(tmp_path)[len(first) :]
    assert rerun == [{"resumed_at_sample": 64, "world": 1}], "the re-run trained a step"
    assert committed_and_valid(tmp_path / "ck" / "end") == names  # and saved nothing new
    again = torch.load(tmp_path / "final.pt", weights_only=True)
    assert all(torch.equal(weights[k], again[k]) for k in weights)
