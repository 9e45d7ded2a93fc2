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
    assert sorted((f.rank, f.path) for f in m.files) == [(r, f"rank{r}.pt") for r in range(world)]
    assert m.timestamp.sample == 3 * 8 * world
    for r in range(world):
        link = tmp_path / "ck" / f"latest-rank{r}"
        assert link.resolve() == (tmp_path / "ck" / "ep0-ba3" / f"rank{r}.pt").resolve()


def test_a_missing_rank_file_makes_every_rank_fall_back(tmp_path):
    assert run(tmp_path, 2, 3) == [0, 0]
    (tmp_path / "ck" / "ep0-ba3" / "rank1.pt").unlink()
    assert run(tmp_path, 2, 4) == [0, 0]
    for r in range(2):
        resumed = [e for e in read_events(tmp_path / "events", r) if e["event"] == "resumed"]
        assert Path(resumed[-1]["path"]).name == "ep0-ba2"
    log0 = (tmp_path / "logs" / "rank0.log").read_text()
    assert "not resuming from ep0-ba3: rank1.pt (rank 1) is missing" in log0


def test_resuming_with_another_world_size_is_a_clear_error(tmp_path):
    assert run(tmp_path, 2, 2) == [0, 0]
    codes = run(tmp_path, 1, 3)
    assert codes != [0]
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert "WorldSizeMismatchError" in log
    assert "was saved by 2 rank(s) but 1 are resuming it" in log
