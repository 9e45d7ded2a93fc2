"""The in-process re-form prototype that ``inplace_restart.py --mechanisms`` measures
(benchmarks/reform_worker.py), with real processes and a real SIGKILL: the two survivors of a
3-process DDP gang go on as 2 in the same processes, from the step after the last one either of
them finished, so no finished step is lost and none is trained twice by the new group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import inplace_restart

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]


def steps(out: Path, epoch: int, rank: int) -> list[int]:
    path = out / f"steps-{epoch}-{rank}.txt"
    return [int(line.split()[1]) for line in path.read_text().splitlines()]


def test_survivors_re_form_in_their_processes_and_go_on_from_the_furthest_step(tmp_path) -> None:
    seconds = inplace_restart.one_in_process(tmp_path)
    assert seconds > 0
    out = tmp_path / "out"
    before = [steps(out, 1, r) for r in range(2)]
    after = [steps(out, 2, r) for r in range(2)]
    for trained in before:
        assert trained == list(range(len(trained)))  # one line of training, no step twice
    furthest = max(trained[-1] for trained in before)
    # both survivors go on from the same step, the one after the furthest finished step
    assert [trained[0] for trained in after] == [furthest + 1, furthest + 1]
    # the harness starts each process once, so epoch 2's steps come from the processes that
    # trained epoch 1; neither ended in an error on the way
    for r in range(2):
        log = (tmp_path / f"reform{r}.log").read_text()
        assert "Traceback" not in log, log[-2000:]
