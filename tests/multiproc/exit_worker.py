"""A rank that leaves the runtime's coordination group to the end of the program.

``--close`` calls ``Coordinator.close()`` itself; otherwise the program ends with the group open
(as when an exception ends training before ``CheckpointManager.close()``), with the world group
destroyed (``--destroy-world``) or not. A hook registered before the coordinator exists runs
after the runtime's own exit hook (atexit runs in reverse order) and records how many gloo worker
threads are still alive: a gloo group whose threads outlive the interpreter can abort the
process at finalization.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import time
from pathlib import Path

import torch.distributed as dist

from trainer_runtime.run.dist import Coordinator

GLOO_THREAD = "pt_gloo_runloop"


def gloo_threads() -> int:
    tasks = Path("/proc/self/task")
    count = 0
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that finished meanwhile
            count += (task / "comm").read_text().strip() == GLOO_THREAD
    return count


def gloo_threads_settled(at_most: int, within_s: float = 10.0) -> int:
    """The gloo threads left, given a moment to leave ``/proc``: ``pthread_join`` returns
    once a thread has exited, and its task entry can linger for a moment after that on a
    loaded machine (2 s was once too short beside a full test run). A thread that still runs
    does not leave within the moment, so a left thread still fails the test, 10 s later."""
    deadline = time.monotonic() + within_s
    count = gloo_threads()
    while count > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
        count = gloo_threads()
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--close", action="store_true")
    ap.add_argument("--destroy-world", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record: dict[str, int] = {}
    out = Path(args.out) / f"rank{rank}.json"
    expected = 0 if args.destroy_world else None  # None: the world group's own, below

    def write_at_exit() -> None:
        at_most = record["world_only"] if expected is None else expected
        out.write_text(json.dumps({**record, "at_exit": gloo_threads_settled(at_most)}))

    atexit.register(write_at_exit)
    dist.barrier()
    record["world_only"] = gloo_threads()
    coordinator = Coordinator()
    assert coordinator.all_gather(rank) == list(range(dist.get_world_size()))
    record["with_group"] = gloo_threads()
    if args.close:
        coordinator.close()
    if args.destroy_world:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
