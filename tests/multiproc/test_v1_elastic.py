"""A format-version-1 checkpoint resumed at a larger world size with ``elastic=True``: a rank
the saving run did not have loads another rank's file, but not its random stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.unit.test_v1_compat import write_v1
from tests.unit.trainkit import make

from .launch import Gang

pytestmark = pytest.mark.multiproc
WORKER = Path(__file__).with_name("v1_elastic_worker.py")


def resume_at_three(tmp_path: Path, tag: str) -> list[list[float]]:
    out = tmp_path / tag
    out.mkdir()
    gang = Gang(WORKER, ["--root", str(tmp_path), "--out", str(out)], 3, out / "logs")
    assert gang.wait(180) == [0, 0, 0], f"see the rank logs in {out / 'logs'}"
    found = [json.loads((out / f"draws.rank{r}.json").read_text()) for r in range(3)]
    assert all(f["resumed"].endswith("ep0-ba2") for f in found)
    return [f["draws"] for f in found]


def test_a_new_rank_gets_a_random_stream_of_its_own_reproducibly(tmp_path: Path) -> None:
    comps = make()
    write_v1(tmp_path / "ck", comps, batch=2, world_size=2)
    saved_stream = torch.rand(4).tolist()  # what the saved generator state draws next
    first = resume_at_three(tmp_path, "first")
    # Ranks 0 and 1 continue their own saved streams (the fixture saved one state for both).
    assert first[0] == saved_stream and first[1] == saved_stream
    # Rank 2 loads rank 0's file (2 % 2) but draws a stream of its own, not rank 0's.
    assert first[2] != first[0]
    # The same checkpoint and rank give the same stream again.
    assert resume_at_three(tmp_path, "again") == first
