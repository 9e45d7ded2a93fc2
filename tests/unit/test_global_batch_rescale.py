"""A relaunch with another ``global_batch_size``: the step is rescaled from the sample count,
and the checkpoints saved after it are newer than the ones saved before it, whatever their
step numbers."""

from __future__ import annotations

from trainer_runtime import CheckpointManager, Manifest

from .trainkit import make, step


def attempt(tmp_path, global_batch_size: int, interval: str = "1ba"):
    model, opt, sched = make()[:3]
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=tmp_path,
        run_name="r",
        interval=interval,
        global_batch_size=global_batch_size,
    )
    return ck, (model, opt, sched)


def train(ck: CheckpointManager, comps, batches: int, global_batch: int) -> None:
    for _ in range(batches):
        step(*comps)
        ck.batch_end(global_batch)


def test_saves_after_a_larger_global_batch_are_newer_than_the_checkpoint_resumed_from(tmp_path):
    """16 -> 32 samples a step: the resumed step is 160 // 32 = 5, below the checkpoint's 10.
    The first save after it raised OverwriteError naming the checkpoint it had resumed from,
    since progress was ordered by step first."""
    ck, comps = attempt(tmp_path, 16, interval="5ba")
    train(ck, comps, 10, 16)
    ck.close()
    ck, comps = attempt(tmp_path, 32)
    assert ck.resume().path.endswith("ep0-ba10")
    assert (ck.timestamp.batch, ck.timestamp.sample) == (5, 160)
    train(ck, comps, 3, 32)  # ep0-ba6 .. ep0-ba8, samples 192 .. 256
    ck.close()
    ck, comps = attempt(tmp_path, 32)
    assert ck.resume().path.endswith("ep0-ba8")
    assert (ck.timestamp.batch, ck.timestamp.sample) == (8, 256)
    ck.close(save=False)


def test_a_step_name_an_older_checkpoint_has_is_not_written_into(tmp_path):
    """After the rescale the steps count again from 5: step 10 (sample 320) renders the name
    of the first attempt's step 10 (sample 160). It was written into that committed
    checkpoint's folder, destroying it before the new one committed; it gets another name."""
    ck, comps = attempt(tmp_path, 16, interval="10ba")
    train(ck, comps, 10, 16)
    ck.close()
    old = Manifest.read(tmp_path / "ep0-ba10")
    ck, comps = attempt(tmp_path, 32, interval="10ba")
    ck.resume()
    train(ck, comps, 5, 32)
    assert [s.name for s in ck.saved] == ["ep0-ba10-ba10"]
    ck.close()
    kept = Manifest.read(tmp_path / "ep0-ba10")
    assert (kept.timestamp.sample, kept.created_at) == (160, old.created_at)
    assert Manifest.read(tmp_path / "ep0-ba10-ba10").timestamp.sample == 320
    ck, _ = attempt(tmp_path, 32)
    assert ck.resume().path.endswith("ep0-ba10-ba10")
    assert ck.timestamp.sample == 320
    ck.close(save=False)
