"""One rank of a gang that resumes from a store the parent makes fail (hang, or a full disk).

``python hung_resume_worker.py S3_ROOT OUT_DIR`` (with RANK, WORLD_SIZE, MASTER_* set): builds
the manager (the store still answers; its local folder is ``OUT_DIR/r<rank>``), writes
``OUT_DIR/ready<rank>``, waits for ``OUT_DIR/go`` (the parent may have SIGSTOPped the store by
then), calls ``resume()`` and writes what it raised to ``OUT_DIR/outcome<rank>.json``. The
resume's waits are scaled down (0.5 s per request, short backoff) so that the test takes
seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist

from trainer_runtime import CheckpointManager
from trainer_runtime.objectstore import Backoff
from trainer_runtime.objectstore import backend as backend_module
from trainer_runtime.objectstore import store as store_module


def main() -> int:
    root, out = sys.argv[1], Path(sys.argv[2])
    store_module.RESPONSIVE_READ_TIMEOUT_S = 0.5
    backend_module.RESUME_BACKOFF = Backoff(initial=0.1, maximum=0.2)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 2)
    ck = CheckpointManager(
        model=model, folder=f"{root}/{{run_name}}", run_name="gang", local_folder=out / f"r{rank}"
    )
    (out / f"ready{rank}").touch()
    while not (out / "go").exists():
        time.sleep(0.05)
    outcome: dict[str, str] = {"raised": "nothing"}
    try:
        ck.resume()
    except Exception as exc:
        outcome = {"raised": type(exc).__name__, "message": str(exc)}
    (out / f"outcome{rank}.json").write_text(json.dumps(outcome))
    # Gloo threads alive at interpreter shutdown can abort the process (docs/runtime.md, End
    # of training): close the manager, then end on a collective without tensors of ours.
    ck.close(save=False)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
