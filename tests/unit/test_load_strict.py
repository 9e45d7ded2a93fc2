"""``load_strict=False`` loads the model keys that fit and skips those whose shape changed
(docs/runtime.md), in both checkpoint formats; training goes on from there."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from trainer_runtime import CheckpointManager, IncompatibleCheckpointError

from .test_v1_compat import write_v1
from .trainkit import make, saved_after_one_step


def with_new_head(seed: int = 7):
    """``make()``'s model with a two-output last layer, and a fresh optimizer over it."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def saved_v2(tmp_path):
    comps = saved_after_one_step(tmp_path)
    return {k: v.clone() for k, v in comps[0].state_dict().items()}


def saved_v1(tmp_path):
    comps = make()
    write_v1(tmp_path / "ck", comps, batch=2)
    return {k: v.clone() for k, v in comps[0].state_dict().items()}


def resume_into(tmp_path, model, opt, **kw):
    ck = CheckpointManager(model=model, optimizer=opt, folder=tmp_path / "ck", run_name="run", **kw)
    res = ck.resume()
    ck.close(save=False)
    return res


def train_one_step(model, opt):
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
@pytest.mark.parametrize("optimizer_has_state", [False, True])
def test_keys_that_fit_load_and_the_changed_layer_is_skipped(
    tmp_path, caplog, saved_by, optimizer_has_state
):
    saved = saved_by(tmp_path)
    model, opt = with_new_head()
    if optimizer_has_state:
        train_one_step(model, opt)
    head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("3.")}
    head_moments = {k: v.clone() for k, v in opt.state.get(model[3].weight, {}).items()}
    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        assert resume_into(tmp_path, model, opt, load_strict=False).source == "checkpoint"
    for key, value in model.state_dict().items():
        expected = head[key] if key.startswith("3.") else saved[key]
        assert torch.equal(value, expected), key
    assert "3.weight: checkpoint (1, 8) vs model (2, 8)" in caplog.text
    # The loaded parameters got their optimizer state; the skipped ones kept theirs (or none).
    loaded_state = opt.state[model[0].weight]
    assert loaded_state and loaded_state["exp_avg"].shape == (8, 4)
    kept = opt.state.get(model[3].weight, {})
    assert kept.keys() == head_moments.keys()
    assert all(torch.equal(kept[k], v) for k, v in head_moments.items())
    train_one_step(model, opt)  # no optimizer state of the wrong shape


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
def test_strict_load_still_refuses_a_changed_layer(tmp_path, saved_by):
    saved_by(tmp_path)
    model, opt = with_new_head()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(IncompatibleCheckpointError, match=r"3\.weight.*load_strict=False") as exc:
        resume_into(tmp_path, model, opt)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # It names the checkpoint that does not fit, once (the keys alone did not say which).
    (checkpoint,) = [p for p in (tmp_path / "ck").iterdir() if p.name.startswith("ep")]
    assert str(exc.value).count(str(checkpoint)) == 1, exc.value


def with_extra_layer(seed: int = 7):
    """``make()``'s model with one more layer at the end (keys the checkpoint lacks), and an
    AdamW over it."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1), nn.Linear(1, 1)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
def test_a_layer_the_checkpoint_lacks_keeps_its_weights_and_optimizer_state(tmp_path, saved_by):
    # A running process (its optimizer has state for every parameter); the checkpoint holds
    # no state for the extra layer, so the load must leave that state as it is. It got the
    # unread staging buffer's contents instead (a step count of 1e22, moments of 1e25).
    saved = saved_by(tmp_path)
    model, opt = with_extra_layer()
    train_one_step(model, opt)
    extra = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("4.")}
    moments = {
        name: {k: v.clone() for k, v in opt.state[p].items()}
        for name, p in model.named_parameters()
        if name.startswith("4.")
    }
    assert resume_into(tmp_path, model, opt, load_strict=False).source == "checkpoint"
    for key, value in model.state_dict().items():
        assert torch.equal(value, extra[key] if key.startswith("4.") else saved[key]), key
    for name, p in model.named_parameters():
        if name.startswith("4."):
            kept = opt.state[p]
            assert kept.keys() == moments[name].keys()
            assert all(torch.equal(kept[k], v) for k, v in moments[name].items()), name
    assert opt.state[model[0].weight]["exp_avg"].shape == (8, 4)
    train_one_step(model, opt)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
@pytest.mark.parametrize("optimizer_has_state", [False, True])
def test_an_ignored_layer_keeps_its_weights_and_its_optimizer_state(
    tmp_path, saved_by, optimizer_has_state
):
    """A head re-initialised with a new shape, left out with ``load_ignore_keys``: its moments
    in the checkpoint belong to the weights that were left out, so they are left out too."""
    saved = saved_by(tmp_path)
    model, opt = with_new_head()
    if optimizer_has_state:
        train_one_step(model, opt)
    head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("3.")}
    head_moments = {
        name: {k: v.clone() for k, v in opt.state.get(p, {}).items()}
        for name, p in (("weight", model[3].weight), ("bias", model[3].bias))
    }
    res = resume_into(tmp_path, model, opt, load_ignore_keys=["state/model/3.*"])
    assert res.source == "checkpoint"
    for key, value in model.state_dict().items():
        expected = head[key] if key.startswith("3.") else saved[key]
        assert torch.equal(value, expected), key
    assert opt.state[model[0].weight]["exp_avg"].shape == (8, 4)  # the rest got theirs
    for name, p in (("weight", model[3].weight), ("bias", model[3].bias)):
        kept = opt.state.get(p, {})
        assert kept.keys() == head_moments[name].keys(), name
        assert all(torch.equal(kept[k], v) for k, v in head_moments[name].items()), name
    train_one_step(model, opt)
    assert all(torch.isfinite(p).all() for p in model.parameters())


class _Moments(torch.optim.Optimizer):
    """Keeps one state tensor per parameter whose length is set at construction."""

    def __init__(self, params, length: int):
        super().__init__(params, {"lr": 0.1})
        self.length = length

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["m"] = torch.full((self.length,), float(self.length))
                    p.sub_(group["lr"] * p.grad)


def test_optimizer_state_that_does_not_fit_is_an_error_and_the_checkpoint_stays(tmp_path):
    """The checkpoint is sound and the live state differs from it: an error naming the key,
    never a checkpoint moved aside as damaged and a run started over."""
    model, *_ = make()
    opt = _Moments(model.parameters(), length=3)
    ck = CheckpointManager(model=model, optimizer=opt, folder=tmp_path / "ck", run_name="run")
    train_one_step(model, opt)
    ck.batch_end(16)
    ck.close()
    model, *_ = make()
    opt = _Moments(model.parameters(), length=5)
    train_one_step(model, opt)  # a running process whose optimizer has state of another shape
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(IncompatibleCheckpointError, match=r"does not fit.*Size mismatch.*\.m"):
        resume_into(tmp_path, model, opt)
    assert (tmp_path / "ck" / "ep0-ba1").is_dir() and not (tmp_path / "ck" / "rejected").exists()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(s["m"], torch.full((5,), 5.0)) for s in opt.state.values())
