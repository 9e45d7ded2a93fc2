"""Checkpoints in format version 1 (one ``rank{r}.pt`` per rank) still resume and load.

The fixture writes a v1 checkpoint with the v1 format code the runtime keeps
(``rank_contents.capture`` + ``rank_file.save_rank_file`` + a version-1 manifest), as a run of an
earlier release left it; the manager writes version 2 from then on.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import torch

from trainer_runtime import ConfigError, Manifest, WorldSizeMismatchError
from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save import rank_contents as state_mod
from trainer_runtime.save.manifest import FORMAT_VERSION_PER_RANK
from trainer_runtime.save.rank_file import save_rank_file
from trainer_runtime.sharded import ShardedEngine
from trainer_runtime.timestamp import Timestamp

from .trainkit import make, manager, params, step


def write_v1(root, comps, *, batch: int, world_size: int = 1, extras=None):
    model, opt, sched, scaler = comps[:4]
    for _ in range(batch):
        step(model, opt, sched)
    ts = Timestamp(batch=batch, batch_in_epoch=batch, sample=8 * batch, sample_in_epoch=8 * batch)
    data = state_mod.capture(
        state_mod.Components(
            model=model,
            optimizers=state_mod.named(opt, "optimizer"),
            schedulers=state_mod.named(sched, "scheduler"),
            scaler=scaler,
        ),
        timestamp=ts.to_dict(),
        run_name="run",
        metrics={"loss": 0.5},
        extras=extras or {},
        weights_only=False,
    )
    name = f"ep0-ba{batch}"
    (root / name).mkdir(parents=True)
    entries = [  # data-parallel: every rank's file holds the same replicated state
        save_rank_file(data, root / name / f"rank{r}.pt", rank=r, rel_path=f"rank{r}.pt")
        for r in range(world_size)
    ]
    manifest = Manifest(
        name=name,
        run_name="run",
        world_size=world_size,
        timestamp=ts,
        files=entries,
        created_at=datetime.now(UTC).isoformat(),
        format_version=FORMAT_VERSION_PER_RANK,
    )
    RunFolder(root).write_manifest(manifest)
    RunFolder(root).write_pointer(manifest)
    return params(model)


def test_a_v1_checkpoint_resumes_and_the_next_save_is_v2(tmp_path):
    saved = write_v1(tmp_path / "ck", make(), batch=3)
    comps = make(seed=7)
    ck = manager(tmp_path, comps)
    res = ck.resume()
    assert res.source == "checkpoint" and res.path.endswith("ep0-ba3")
    assert ck.timestamp.batch == 3 and ck.metrics == {"loss": 0.5}
    assert all(torch.equal(a, b) for a, b in zip(params(comps[0]), saved, strict=True))
    assert comps[1].state_dict()["state"], "the optimizer state was restored"
    step(*comps[:3])
    ck.batch_end(8)
    ck.close()
    assert Manifest.read(tmp_path / "ck" / "ep0-ba4").format_version == 2
    assert Manifest.read(tmp_path / "ck" / "ep0-ba3").format_version == 1


def test_the_sharded_engine_refuses_a_v1_checkpoint_naming_its_format_not_as_corrupt(tmp_path):
    write_v1(tmp_path / "ck", make(), batch=2)
    model, opt = make(seed=7)[:2]
    before = params(model)
    engine = ShardedEngine(state_mod.Components(model=model, optimizers={"0": opt}), Coordinator())
    folder = tmp_path / "ck" / "ep0-ba2"
    with pytest.raises(ConfigError, match=r"format_version 1 .*CheckpointManager\.load\(\)"):
        engine.load(folder, Manifest.read(folder))
    assert all(torch.equal(a, b) for a, b in zip(params(model), before, strict=True))


class NotPlain:
    """Pickles, but the weights-only unpickler refuses it."""


def test_a_v1_checkpoint_the_unpickler_refuses_is_passed_over(tmp_path):
    saved = write_v1(tmp_path / "ck", make(), batch=2)
    write_v1(tmp_path / "ck", make(), batch=3, extras={"obj": NotPlain()})
    comps = make(seed=7)
    ck = manager(tmp_path, comps)
    res = ck.resume()
    assert res.path.endswith("ep0-ba2") and ck.timestamp.batch == 2
    assert "NotPlain" in res.fallbacks[0] and "refuses" in res.fallbacks[0]
    assert all(torch.equal(a, b) for a, b in zip(params(comps[0]), saved, strict=True))
    ck.close()


def test_a_v1_checkpoint_from_another_world_size_needs_elastic(tmp_path):
    write_v1(tmp_path / "ck", make(), batch=2, world_size=2)  # as if saved by 2 ranks
    with pytest.raises(WorldSizeMismatchError, match=r"saved by 2 rank.*pass elastic=True"):
        manager(tmp_path, make(seed=7)).resume()


def test_a_v1_checkpoint_loads_into_a_model_that_gained_a_layer_with_load_strict_false(
    tmp_path, caplog
):
    """Format 1 keeps optimizer state by position: when the groups no longer match, the
    optimizer is left as it is, with a warning naming it, instead of a raw ValueError."""
    saved = write_v1(tmp_path / "ck", make(), batch=3)
    model, _, sched, scaler = make(seed=7)
    model.add_module("gained", torch.nn.Linear(1, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ck = manager(tmp_path, (model, opt, sched, scaler), load_strict=False)
    with caplog.at_level("WARNING", logger="trainer_runtime"):
        res = ck.resume()
    assert res.path.endswith("ep0-ba3") and ck.timestamp.batch == 3
    assert "parameter groups hold [6] parameters, the live optimizer's [8]" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(params(model), saved, strict=False))
    assert not opt.state, "the optimizer kept its (empty) state"
    step(model, opt, sched)
    assert len(opt.state) == 8
    ck.close(save=False)
