"""How the FSDP2 test workers end, once everything they report is written."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def end_fsdp_rank() -> None:
    """Leave the world group and exit at once, without interpreter finalization.

    With FSDP2 the sharded modules keep the world group alive after
    ``dist.destroy_process_group()``, and its gloo threads may still be running while the
    interpreter finalizes; one that then needs the GIL aborts the process with SIGABRT
    (docs/runtime.md, "Why this matters": torch's race, not the runtime's). These workers test
    what they wrote before this point (checkpoints, gathered state), so they skip finalization
    instead of reporting that race as their failure. ``tests/multiproc/test_exit.py`` tests
    exits themselves.
    """
    dist.barrier()  # the last collective holds no tensor of ours (docs/runtime.md)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
