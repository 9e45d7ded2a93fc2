"""CheckpointManager on 2-rank FSDP2 (``fully_shard``) models, real processes on gloo.

Async save stages DTensor shards (their local part) and the relaunch resumes bitwise; close()
destroys the manager's two coordination groups, so a run exits 0 every time (an abort at
interpreter exit, from groups left to interpreter shutdown, was seen in about 1 of 14 runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.multiproc.launch import Gang
from tests.multiproc.sharded_worker import compare

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux")

WORKER = Path(__file__).with_name("fsdp_manager_worker.py")
WORLD = 2
EXIT_RUNS = 4


def run(tmp: Path, folder: Path, tag: str, *args: str) -> list[dict]:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    gang = Gang(
        WORKER,
        ["--folder", str(folder), "--out", str(out), "--tag", tag, *args],
        WORLD,
        tmp / "logs" / tag,
    )
    codes = gang.wait(240)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp / "logs" / tag).glob("*.log")}
    assert codes == [0] * WORLD, (codes, logs)
    return [json.loads((out / f"{tag}.rank{r}.json").read_text()) for r in range(WORLD)]


def state(tmp: Path, tag: str, rank: int) -> dict:
    return torch.load(tmp / "out" / f"{tag}.rank{rank}.pt", weights_only=True)


def test_fsdp2_async_save_commits_and_resumes_bitwise(tmp_path):
    folder = tmp_path / "ckpt"
    full = run(tmp_path, folder, "full", "--steps", "4", "--async-save")
    for info in full:
        assert info["saved"] == ["ep0-ba1", "ep0-ba2", "ep0-ba3", "ep0-ba4"]
        assert info["groups_released"] is True
    # ep0-ba2 was staged in the background while batches 3 and 4 trained: resuming from it
    # and training them again must reproduce the uninterrupted run bit for bit.
    again = run(
        tmp_path,
        tmp_path / "again",
        "again",
        "--steps",
        "4",
        "--async-save",
        "--load-path",
        str(folder / "ep0-ba2"),
    )
    for rank, info in enumerate(again):
        assert info["resumed_from"] == str(folder / "ep0-ba2"), info
        assert info["saved"] == ["ep0-ba3", "ep0-ba4"]
        assert compare(state(tmp_path, "full", rank), state(tmp_path, "again", rank)) == []
    # A relaunch resumes the last async checkpoint and trains nothing: the same state.
    last = run(tmp_path, folder, "last", "--steps", "4", "--async-save")
    for rank, info in enumerate(last):
        assert info["resumed_from"].rstrip("/").endswith("ep0-ba4"), info
        assert compare(state(tmp_path, "full", rank), state(tmp_path, "last", rank)) == []
    # Training moved the weights: the comparison above is not between untouched models.
    torch.manual_seed(0)
    fresh = torch.nn.Linear(64, 64).weight
    assert not torch.equal(state(tmp_path, "full", 0)["model"]["0.weight"], fresh)


def test_two_rank_fsdp2_runs_exit_zero_repeatedly(tmp_path):
    for i in range(EXIT_RUNS):
        infos = run(tmp_path, tmp_path / f"ckpt{i}", f"r{i}", "--steps", "1", "--async-save")
        assert all(info["groups_released"] for info in infos)
