"""A save that runs out of space commits nothing and leaves earlier checkpoints intact.

The disk really fills: a small tmpfs when the suite runs as root (as CI does), and in any case a
child process with RLIMIT_FSIZE, where the kernel fails the write part-way through.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainer_runtime import CheckpointManager, SaveFailedError
from trainer_runtime.run_folder.layout import RunFolder

from ..conftest import require
from .trainkit import make, step


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
        assert "\n" not in str(err.value), "one line: DCP's traceback belongs in the cause"
        assert "OSError: [Errno 28]" in str(err.value)
        assert "Traceback" in str(err.value.__cause__)
        assert_only_first_committed(mnt / "ck")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """A 600 KiB tmpfs and a way to fill it up (``fill()``) and free it (``free()``)."""
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], check=True)
    filler = mnt / "filler"

    def fill() -> None:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)

    try:
        yield mnt, fill, filler.unlink
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def resumed_run(mnt, *, interval: str, async_save: bool):
    """A manager with model, optimizer and scheduler over ``mnt/ck``, resumed (fresh)."""
    model, opt, sched, _ = make()
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=mnt / "ck",
        run_name="r",
        interval=interval,
        async_save=async_save,
    )
    ck.resume()
    return ck, (model, opt, sched)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_that_failed_for_lack_of_space_is_retried(full_disk, async_save):
    """A failed save is not a saved position: once space is freed, ``save()`` and ``close()``
    save it. Until then the pointer and the link name the last committed checkpoint."""
    mnt, fill, free = full_disk
    ck, (model, opt, sched) = resumed_run(mnt, interval="100ba", async_save=async_save)
    step(model, opt, sched)
    ck.batch_end(1)
    ck.save(blocking=True)
    step(model, opt, sched)
    ck.batch_end(1)
    fill()
    with pytest.raises(SaveFailedError, match="No space left on device"):
        ck.save()
        ck.wait()
    assert_only_first_committed(mnt / "ck")
    assert os.readlink(mnt / "ck" / "latest-rank0") == "ep0-ba1"
    with pytest.raises(SaveFailedError, match="No space left on device"):
        ck.save(blocking=True)  # tried again, not taken for saved: the disk is still full
    free()
    ck.close()
    folder = RunFolder(mnt / "ck")
    assert [m.name for m in folder.committed()] == ["ep0-ba2", "ep0-ba1"]
    assert folder.read_pointer()["checkpoint"] == "ep0-ba2"
    assert os.readlink(mnt / "ck" / "latest-rank0") == "ep0-ba2"


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


def test_a_manifest_that_cannot_be_written_commits_nothing(tmp_path, monkeypatch):
    """The disk fills between the data files and the manifest: the save fails like any
    other (no folder left, the pointer still on the last commit) and is retried."""
    model, opt, sched, _ = make()
    ck = CheckpointManager(model=model, optimizer=opt, folder=tmp_path / "ck", run_name="r")
    ck.resume()
    step(model, opt, sched)
    ck.batch_end(1)
    ck.save()
    step(model, opt, sched)
    ck.batch_end(1)
    real_write = RunFolder.write_manifest

    def disk_full(self, manifest):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path(manifest.name)))

    monkeypatch.setattr(RunFolder, "write_manifest", disk_full)
    with pytest.raises(SaveFailedError, match=r"rank 0: OSError: \[Errno 28\] No space left"):
        ck.save()
    assert_only_first_committed(tmp_path / "ck")
    monkeypatch.setattr(RunFolder, "write_manifest", real_write)
    assert ck.save().name == "ep0-ba2"
    ck.close()


def test_overwrite_then_a_failed_save_leaves_no_pointer_to_what_it_uncommitted(full_disk):
    """``overwrite=True`` uncommits the newer checkpoints before the first save; when that save
    then fails, neither latest.json nor the latest link may name them."""
    mnt, fill, _ = full_disk
    comps = make()
    ck = CheckpointManager(model=comps[0], folder=mnt / "ck", run_name="r", interval="2ba")
    ck.resume()
    ck.batch_end(1)
    ck.batch_end(1)
    ck.close()
    assert os.readlink(mnt / "ck" / "latest-rank0") == "ep0-ba2"
    again = CheckpointManager(
        model=comps[0], folder=mnt / "ck", run_name="r", interval="1ba", overwrite=True
    )
    fill()
    with pytest.raises(SaveFailedError, match="No space left on device"):
        again.batch_end(1)
    assert RunFolder(mnt / "ck").committed() == []
    assert not (mnt / "ck" / "latest.json").exists()
    assert not os.path.lexists(mnt / "ck" / "latest-rank0")


def a_failed_background_save(full_disk):
    """An async run whose save of ep0-ba2 failed in the background for lack of space, with
    nothing having collected the error yet, and the space freed again."""
    mnt, fill, free = full_disk
    ck, (model, opt, sched) = resumed_run(mnt, interval="1ba", async_save=True)
    step(model, opt, sched)
    ck.batch_end(1)
    ck.wait()
    step(model, opt, sched)
    fill()
    ck.batch_end(1)  # the async save of ep0-ba2 starts, and fails in the background
    while ck.saver.persisting():
        time.sleep(0.01)
    free()
    return ck, (model, opt, sched)


def test_close_saves_what_a_failed_background_save_left_unsaved(full_disk):
    """An async save fails and nothing collects the error before ``close()``: the final save
    still writes the state once there is space (the failure was logged when it happened)."""
    ck, _ = a_failed_background_save(full_disk)
    ck.close()
    assert [m.name for m in RunFolder(full_disk[0] / "ck").committed()] == ["ep0-ba2", "ep0-ba1"]


def test_sigterm_after_a_failed_background_save_still_saves_and_exits(full_disk, caplog):
    """The failure of an async save reaches ``batch_end`` with SIGTERM pending: the emergency
    save still runs (raising the old failure would skip it and lose every step since)."""
    ck, training = a_failed_background_save(full_disk)
    step(*training)
    os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
    with pytest.raises(SystemExit) as exc:
        ck.batch_end(1)
    assert exc.value.code == 143
    assert [m.name for m in RunFolder(full_disk[0] / "ck").committed()] == ["ep0-ba3", "ep0-ba1"]
    assert "the emergency save retries what a failed save left" in caplog.text


def test_the_batch_that_raises_a_background_failure_is_counted(full_disk):
    """``batch_end`` raises the failed save's error after counting its batch: a loop that
    catches it and goes on saves its next checkpoint at the right position."""
    ck, training = a_failed_background_save(full_disk)
    step(*training)
    with pytest.raises(SaveFailedError):
        ck.batch_end(1)
    assert (ck.timestamp.batch, ck.timestamp.sample) == (3, 3)
    step(*training)
    ck.batch_end(1)
    ck.close()
    names = [m.name for m in RunFolder(full_disk[0] / "ck").committed()]
    assert names == ["ep0-ba4", "ep0-ba1"]


def test_a_pointer_left_behind_by_a_full_disk_keeps_naming_a_committed_checkpoint(tmp_path):
    """The disk fills between the manifest (the commit) and ``latest.json``: the save is
    committed and the pointer stays on the previous checkpoint, which retention must then
    keep, or the pointer would name a deleted one."""
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)

    def free_bytes() -> int:
        st = os.statvfs(mnt)
        return st.f_bavail * st.f_frsize

    def manager(folder, keep):
        model, opt, sched, _ = comps = make(hidden=16)
        ck = CheckpointManager(
            model=model,
            optimizer=opt,
            scheduler=sched,
            folder=folder,
            run_name="r",
            interval="1ba",
            num_checkpoints_to_keep=keep,
        )
        return ck, comps[:3]

    try:
        # What a second save takes on this filesystem: its files and its manifest (the
        # pointer is replaced, so it takes no space once written).
        ck, comps = manager(mnt / "probe", -1)
        step(*comps)
        ck.batch_end(1)
        before = free_bytes()
        step(*comps)
        ck.batch_end(1)
        needed = before - free_bytes()
        ck.close(save=False)
        subprocess.run(["rm", "-rf", str(mnt / "probe")], check=True)

        ck, comps = manager(mnt / "ck", 1)
        step(*comps)
        ck.batch_end(1)
        (mnt / "filler").write_bytes(
            b"\0" * (free_bytes() - needed)
        )  # room for all but latest.json
        step(*comps)
        saved = ck.batch_end(1)
        assert saved is not None and saved.name == "ep0-ba2"
        folder = RunFolder(mnt / "ck")
        assert folder.read_pointer()["checkpoint"] == "ep0-ba1", "the pointer write did not fail"
        assert [m.name for m in folder.committed()] == ["ep0-ba2", "ep0-ba1"]
        assert all(folder.verify(m, None) is None for m in folder.committed())

        (mnt / "filler").unlink()  # space again: the next save moves the pointer, then prunes
        step(*comps)
        ck.batch_end(1)
        ck.close(save=False)
        assert folder.read_pointer()["checkpoint"] == "ep0-ba3"
        assert [m.name for m in folder.committed()] == ["ep0-ba3"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
