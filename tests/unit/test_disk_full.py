"""A save that runs out of space commits nothing and leaves earlier checkpoints intact.

The disk really fills: a small tmpfs when the suite runs as root (as CI does), and in any case a
child process with RLIMIT_FSIZE, where the kernel fails the write part-way through.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from trainer_runtime import CheckpointManager, SaveFailedError
from trainer_runtime.layout import RunFolder

from ..conftest import require
from .trainkit import make


def assert_only_first_committed(run_dir):
    folder = RunFolder(run_dir)
    assert [m.name for m in folder.committed()] == ["ep0-ba1"]
    assert folder.verify(folder.committed()[0], [0]) is None
    assert folder.read_pointer()["checkpoint"] == "ep0-ba1"
    assert not (run_dir / "ep0-ba2").exists(), "the failed checkpoint left a folder behind"


def test_disk_full_on_a_real_small_filesystem(tmp_path):
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], check=True)
    try:
        model = make(hidden=16)[0]
        ck = CheckpointManager(model=model, folder=mnt / "ck", run_name="r", interval="1ba")
        ck.batch_end(1)
        model.add_module("big", torch_linear(512))  # the next checkpoint no longer fits
        ck.components.model = model
        with pytest.raises(SaveFailedError, match="No space left on device") as err:
            ck.batch_end(1)
        assert "earlier checkpoints are intact" in str(err.value)
        assert_only_first_committed(mnt / "ck")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def torch_linear(n):
    import torch

    return torch.nn.Linear(n, n)


def test_file_size_limit_mid_write(tmp_path):
    script = textwrap.dedent(
        f"""
        import resource, signal, sys, torch
        from trainer_runtime import CheckpointManager, SaveFailedError
        sys.path.insert(0, {str(os.getcwd())!r})
        from tests.unit.trainkit import make
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        model = make()[0]
        ck = CheckpointManager(model=model, folder={str(tmp_path / "ck")!r}, run_name="r",
                               interval="1ba")
        ck.batch_end(1)
        model.add_module("big", torch.nn.Linear(300, 300))
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            ck.batch_end(1)
        except SaveFailedError as exc:
            print("FAILED-AS-EXPECTED", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert "FAILED-AS-EXPECTED" in out.stdout, out.stderr
    assert "File too large" in out.stdout
    assert_only_first_committed(tmp_path / "ck")
