"""The ``latest-rank{r}`` links after the world size shrinks: one per rank of the gang that
saved last, each naming the newest checkpoint, none left behind by ranks it no longer has."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.multiproc.launch import Gang

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]
WORKER = Path(__file__).with_name("resize_worker.py")


def train(tmp: Path, folder: Path, tag: str, world: int, steps: int) -> None:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    args = ["--mode", "ddp", "--folder", str(folder), "--out", str(out), "--tag", tag]
    args += ["--steps", str(steps), "--keep", "2"]
    gang = Gang(WORKER, args, world, tmp / "logs" / tag)
    codes = gang.wait(300)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp / "logs" / tag).glob("*.log")}
    assert codes == [0] * world, (codes, logs)


def links(folder: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in folder.iterdir() if p.is_symlink()}


@pytest.mark.timeout(600)
def test_a_smaller_gang_leaves_no_link_of_a_rank_it_does_not_have(tmp_path):
    folder = tmp_path / "run"
    train(tmp_path, folder, "three", 3, steps=2)
    assert links(folder) == {f"latest-rank{r}": "ep0-ba2" for r in range(3)}
    (folder / "my-best").symlink_to("ep0-ba1")  # the user's own link is not the runtime's
    (folder / "latest-rank7").symlink_to("ep0-ba1/rank7.pt")  # as earlier releases linked

    train(tmp_path, folder, "one", 1, steps=4)  # retention keeps ep0-ba3 and ep0-ba4
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("ep")) == [
        "ep0-ba3",
        "ep0-ba4",
    ]
    # Before, latest-rank1 and latest-rank2 still named ep0-ba2, deleted by retention, and
    # latest-rank7 a file of ep0-ba1.
    assert links(folder) == {"latest-rank0": "ep0-ba4", "my-best": "ep0-ba1"}
