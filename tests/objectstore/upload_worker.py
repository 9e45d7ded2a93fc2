"""A stand-in training process for the kill tests: saves checkpoints and uploads them.

``python upload_worker.py LOCAL_RUN_DIR S3_RUN_URI``: commits a small checkpoint A, waits until
it is uploaded, prints ``A-UPLOADED``, then commits a larger B and prints ``PART n`` as each
part of B is sent (slowed down, so the parent can SIGKILL it mid-upload).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.objectstore.conftest import SMALL_PARTS
from tests.objectstore.helpers import make_checkpoint
from trainer_runtime.objectstore import Backoff, CheckpointUploader, S3Store


def main() -> int:
    run_dir, run_uri = Path(sys.argv[1]), sys.argv[2]
    store = S3Store(transfer=SMALL_PARTS)
    up = CheckpointUploader(store, run_uri, backoff=Backoff(0.1, 0.5))
    folder, _ = make_checkpoint(run_dir, "ep0-ba10", 10)
    up.submit(folder)
    if not up.flush(60):
        return 1
    print("A-UPLOADED", flush=True)
    parts = 0
    lock = threading.Lock()

    def slow_part(**_: object) -> None:
        # Parts upload on several threads: one locked write per line, or two lines interleave
        # ("PART 1PART 2") and the parent never sees the line it waits for.
        nonlocal parts
        with lock:
            parts += 1
            sys.stdout.write(f"PART {parts}\n")
            sys.stdout.flush()
        time.sleep(0.3)

    store.client.meta.events.register("after-call.s3.UploadPart", slow_part)
    folder, _ = make_checkpoint(run_dir, "ep0-ba20", 20, size=24 << 20)
    up.submit(folder)
    up.flush(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
