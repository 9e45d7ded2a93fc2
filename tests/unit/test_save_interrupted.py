"""Ctrl-C during a save's write: the partial checkpoint goes and the rank it interrupted gets its
``KeyboardInterrupt`` back, not a ``SaveFailedError`` that a script may catch and carry on from.

DCP wraps every rank's error in a ``CheckpointException`` (Ctrl-C included), so the abandon step
decides from the wrapped failures. A real Ctrl-C in the middle of a save is in
``tests/multiproc/test_benchmark_interrupt.py``: the checkpoint benchmark's sync saves are
interrupted there, and it must end with exit status 130 and no traceback.
"""

from __future__ import annotations

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from trainer_runtime import SaveFailedError
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save.commit import _abandon


def partial_checkpoint(tmp_path):
    folder = RunFolder(tmp_path / "run")
    (folder.path("ep0-ba3")).mkdir(parents=True)
    (folder.path("ep0-ba3") / "__0_0.distcp").write_bytes(b"half")
    return folder


def test_the_interrupted_rank_gets_its_keyboard_interrupt_and_nothing_stays(tmp_path):
    folder = partial_checkpoint(tmp_path)
    wrapped = CheckpointException("write failed", {0: (KeyboardInterrupt(), None)})
    with pytest.raises(KeyboardInterrupt, match="ep0-ba3 not committed") as caught:
        _abandon(folder, "ep0-ba3", ["rank 0: KeyboardInterrupt: "], wrapped, rank=0)
    assert isinstance(caught.value.__cause__, SaveFailedError)
    assert "earlier checkpoints are intact" in str(caught.value)
    assert not folder.path("ep0-ba3").exists()


def test_a_keyboard_interrupt_outside_dcp_is_kept_too(tmp_path):
    folder = partial_checkpoint(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _abandon(folder, "ep0-ba3", ["rank 0: KeyboardInterrupt: "], KeyboardInterrupt(), rank=0)
    assert not folder.path("ep0-ba3").exists()


def test_another_ranks_interrupt_is_a_failed_save_here(tmp_path):
    folder = partial_checkpoint(tmp_path)
    wrapped = CheckpointException("write failed", {1: (KeyboardInterrupt(), None)})
    with pytest.raises(SaveFailedError, match="rank 1: KeyboardInterrupt") as caught:
        _abandon(folder, "ep0-ba3", ["rank 1: KeyboardInterrupt: "], wrapped, rank=0)
    assert caught.value.__cause__ is wrapped
    assert not folder.path("ep0-ba3").exists()


def test_any_other_failure_is_a_failed_save(tmp_path):
    folder = partial_checkpoint(tmp_path)
    full = OSError(28, "No space left on device")
    with pytest.raises(SaveFailedError, match="No space left") as caught:
        _abandon(folder, "ep0-ba3", ["rank 0: OSError: No space left on device"], full, rank=0)
    assert caught.value.__cause__ is full
