"""Bitwise-exact resume of the example job under real kills, and world-size changes.

The example (examples/train_deterministic.py) runs on 2 gloo ranks with DataLoader workers.
One run is never interrupted; another is killed at random moments with SIGKILL and SIGTERM
(some during saves) and relaunched with the same command until it completes. Both must end
with the same weights, bit for bit, having consumed the same samples in the same order.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from .checks import committed_and_valid, wait_for_gang
from .launch import Gang

pytestmark = pytest.mark.multiproc
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_deterministic.py"
EPOCHS, SIZE, BATCH = 3, 96, 4


def job_args(tmp: Path, *extra: str) -> list[str]:
    return [
        "--folder",
        str(tmp / "ck"),
        "--run-name",
        "exact",
        "--epochs",
        str(EPOCHS),
        "--dataset-size",
        str(SIZE),
        "--batch-size",
        str(BATCH),
        "--interval",
        "3ba",
        "--trace",
        str(tmp / "trace"),
        "--out",
        str(tmp / "final.pt"),
        *extra,
    ]


def consumed(tmp: Path, rank: int) -> list[tuple[int, list[int]]]:
    """(global sample count after the step, ids) actually consumed, without the steps that a
    later resume rolled back (those after the checkpoint it resumed from)."""
    steps: list[tuple[int, list[int]]] = []
    for line in Path(f"{tmp / 'trace'}.rank{rank}").read_text().splitlines():
        rec = json.loads(line)
        if "resumed_at_sample" in rec:
            steps = [s for s in steps if s[0] <= rec["resumed_at_sample"]]
        else:
            steps.append((rec["sample"], rec["ids"]))
    return steps


def trace_len(tmp: Path, rank: int) -> int:
    p = Path(f"{tmp / 'trace'}.rank{rank}")
    return len(p.read_text().splitlines()) if p.exists() else 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    assert Gang(EXAMPLE, job_args(tmp), 2, tmp / "logs").wait(300) == [0, 0]
    return tmp


def test_killed_and_relaunched_run_matches_the_uninterrupted_one(tmp_path, reference):
    rng = random.Random(7)
    kills = [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM]
    codes_seen = []
    for sig in [*kills, None]:
        before = trace_len(tmp_path, 0)
        gang = Gang(
            EXAMPLE,
            job_args(tmp_path, "--step-sleep", "0.05", "--async-save"),
            2,
            tmp_path / "logs",
        )
        if sig is None:
            assert gang.wait(300) == [0, 0]
            break
        wait_for_gang(
            lambda b=before: trace_len(tmp_path, 0) > b + rng.randint(2, 10),
            120,
            "training progress",
            gang,
        )
        gang.signal(sig)
        codes = gang.wait(60)
        codes_seen.append((sig, codes))
        if sig == signal.SIGTERM:
            assert codes == [143, 143], f"SIGTERM should exit 143 after saving, got {codes}"
        committed_and_valid(tmp_path / "ck" / "exact", settled=sig == signal.SIGTERM)
    ref_w = torch.load(reference / "final.pt")
    got_w = torch.load(tmp_path / "final.pt")
    assert ref_w.keys() == got_w.keys()
    for k in ref_w:
        assert torch.equal(ref_w[k], got_w[k]), f"{k} differs from the uninterrupted run"
    for rank in range(2):
        assert consumed(tmp_path, rank) == consumed(reference, rank)
    assert len(consumed(reference, 0)) == EPOCHS * SIZE // (2 * BATCH)


@pytest.mark.parametrize(
    ("first", "second", "sig", "interval"),
    [
        (2, 1, signal.SIGTERM, "100ba"),  # emergency save at whatever step SIGTERM lands on
        # SIGKILL: resume from an interval checkpoint every 3 steps of 4 samples, so the rest
        # of the epoch divides evenly into 3 ranks and no padding sample is needed.
        (1, 3, signal.SIGKILL, "3ba"),
    ],
)
def test_world_size_change_keeps_every_sample_exactly_once(tmp_path, first, second, sig, interval):
    args = job_args(
        tmp_path, "--epochs", "1", "--elastic", "--step-sleep", "0.05", "--interval", interval
    )
    gang = Gang(EXAMPLE, args, first, tmp_path / "logs")
    wait_for_gang(lambda: trace_len(tmp_path, 0) > 1 + 4, 120, "some training", gang)
    gang.signal(sig)  # mid-epoch
    codes = gang.wait(60)
    if sig == signal.SIGTERM:
        assert codes == [143] * first
    assert Gang(EXAMPLE, args, second, tmp_path / "logs2").wait(300) == [0] * second
    counts = Counter()
    for r in range(max(first, second)):
        p = Path(f"{tmp_path / 'trace'}.rank{r}")
        if not p.exists():
            continue
        for _, ids in consumed(tmp_path, r):
            counts.update(ids)
    assert sorted(counts) == list(range(SIZE)), "some sample was skipped"
    assert set(counts.values()) == {1}, "some sample was consumed twice"
    log = (tmp_path / "logs2" / "rank0.log").read_text()
    assert f"data position re-dealt from {first} to {second} ranks" in log


def test_sigterm_saves_and_exits_well_inside_the_grace_period(tmp_path):
    grace = 20.0
    # Without DataLoader workers: this test is about the emergency save's time, and every fork
    # of a worker is a chance of CPython 3.11's fork hang (docs/runtime.md); tests/multiproc/
    # test_shutdown.py covers a SIGTERM with workers.
    gang = Gang(
        EXAMPLE,
        job_args(tmp_path, "--step-sleep", "0.05", "--interval", "1000ba", "--workers", "0"),
        2,
        tmp_path / "logs",
        env={"RTJ_GRACE_PERIOD_SECONDS": str(grace)},
    )
    wait_for_gang(lambda: trace_len(tmp_path, 0) > 4, 120, "training progress", gang)
    t0 = time.monotonic()
    gang.signal(signal.SIGTERM)
    codes = gang.wait(grace)
    elapsed = time.monotonic() - t0
    assert codes == [143, 143]
    assert elapsed < grace / 2, f"took {elapsed:.1f}s of a {grace:.0f}s grace period"
    names = committed_and_valid(tmp_path / "ck" / "exact")
    assert len(names) == 1, "the emergency save is the only checkpoint (interval is 1000ba)"
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert "emergency save" in log and "after SIGTERM (grace period 20s)" in log
