"""torch.distributed (gloo on CPU) with 1 to 4 ranks: commit, links, agreement on resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_runtime import Manifest

from .checks import committed_and_valid, read_events
from .launch import Gang

pytestmark = pytest.mark.multiproc
WORKER = Path(__file__).with_name("save_worker.py")


def run(tmp_path: Path, world: int, steps: int, *extra: str) -> list[int]:
    args = [
        "--folder",
        str(tmp_path / "ck"),
        "--steps",
        str(steps),
        "--width",
        "64",
        "--events",
        str(tmp_path / "events"),
        *extra,
    ]
    return Gang(WORKER, args, world, tmp_path / "logs").wait(240)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_rank_file_is_committed_by_one_manifest(tmp_path, world):
    assert run(tmp_path, world, 3) == [0] * world
    names = committed_and_valid(tmp_path / "ck")
    assert names == ["ep0-ba3", "ep0-ba2", "ep0-ba1"]
    m = Manifest.read(tmp_path / "ck" / "ep0-ba3")
    assert m.world_size == world
    assert m.format_version == 2
    expected = [(0, ".metadata")] + [(r, f"__{r}_0.distcp") for r in range(world)]
    assert sorted((f.rank, f.path) for f in m.files) == sorted(expected)
    assert m.timestamp.sample == 3 * 8 * world
    for r in range(world):  # version 2: the links name the checkpoint folder
        link = tmp_path / "ck" / f"latest-rank{r}"
        assert link.resolve() == (tmp_path / "ck" / "ep0-ba3").resolve()


def test_a_missing_rank_file_makes_every_rank_fall_back(tmp_path):
    assert run(tmp_path, 2, 3) == [0, 0]
    (tmp_path / "ck" / "ep0-ba3" / "__1_0.distcp").unlink()
    assert run(tmp_path, 2, 4) == [0, 0]
    for r in range(2):
        resumed = [e for e in read_events(tmp_path / "events", r) if e["event"] == "resumed"]
        assert Path(resumed[-1]["path"]).name == "ep0-ba2"
    log0 = (tmp_path / "logs" / "rank0.log").read_text()
    # every rank names the file it lacks (shared folder: both lack it)
    assert "not resuming from ep0-ba3: on rank 0, __1_0.distcp (rank 1) is missing" in log0


def test_resuming_with_another_world_size_continues_the_run(tmp_path):
    """Version 2 loads at any world size: no WorldSizeMismatchError (that stays for v1)."""
    assert run(tmp_path, 2, 2) == [0, 0]
    assert run(tmp_path, 1, 3) == [0]
    resumed = [e for e in read_events(tmp_path / "events", 0) if e["event"] == "resumed"]
    assert Path(resumed[-1]["path"]).name == "ep0-ba2"
    assert Manifest.read(tmp_path / "ck" / "ep0-ba3").world_size == 1


def test_every_rank_skips_the_same_async_saves(tmp_path):
    """``async_policy="skip"`` with rank 0's background save ending last (its commit report is
    slowed): each rank used to decide from its own save alone, so rank 1 saved while rank 0
    skipped, and the two ranks' collectives belonged to different checkpoints."""
    codes = run(
        tmp_path, 2, 8, "--async-save", "--async-policy", "skip", "--slow-commit-report-s", "0.3"
    )
    assert codes == [0, 0]
    done = [
        [e for e in read_events(tmp_path / "events", r) if e["event"] == "done"][-1]
        for r in range(2)
    ]
    assert done[0]["skipped"] == done[1]["skipped"] > 0
    names = committed_and_valid(tmp_path / "ck")
    assert names[0] == "ep0-ba8"  # close()'s final save
    for name in names:
        m = Manifest.read(tmp_path / "ck" / name)
        assert m.world_size == 2
        assert name == f"ep0-ba{m.timestamp.batch}"
