"""The runtime's coordination group never outlives the interpreter, closed or not.

A gloo group whose worker threads are still alive when Python finalizes can abort the process
(SIGABRT, "terminate called without an active exception"): a worker freeing a finished
collective's tensors needs the GIL after it is gone. ``Coordinator.close()`` destroys the group;
an exit hook closes a coordinator that the program never closed (training ended by an
exception, or no ``CheckpointManager.close()``), before finalization.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.multiproc.launch import Gang

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo threads are read from /proc"),
]
WORKER = Path(__file__).with_name("exit_worker.py")


def run(tmp: Path, *flags: str) -> list[dict[str, int]]:
    out = tmp / "out"
    out.mkdir()
    codes = Gang(WORKER, ["--out", str(out), *flags], 2, tmp / "logs").wait(120)
    assert codes == [0, 0], [p.read_text()[-2000:] for p in (tmp / "logs").glob("*.log")]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize(
    "flags",
    [("--close", "--destroy-world"), ("--destroy-world",), ()],
    ids=["closed", "world-destroyed-only", "nothing-closed"],
)
def test_no_coordination_thread_is_left_at_exit(tmp_path, flags):
    for rank in run(tmp_path, *flags):
        assert rank["with_group"] > rank["world_only"]  # the group's own threads ran
        # What is left at exit is the world group's threads at most (zero once destroyed).
        expected = 0 if "--destroy-world" in flags else rank["world_only"]
        assert rank["at_exit"] == expected, rank
