"""``load_ignore_keys`` below ``state/optimizers``: one optimizer, its state or its
hyperparameters, left out of a load in both checkpoint formats (docs/runtime.md). What a
pattern leaves out keeps its live value."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer_runtime import CheckpointManager

from .test_load_strict import resume_into
from .test_v1_compat import write_v1
from .trainkit import make, saved_after_one_step, step


def saved_v2(tmp_path):
    return saved_after_one_step(tmp_path)[1].state_dict()


def saved_v1(tmp_path):
    comps = make()
    write_v1(tmp_path / "ck", comps, batch=2)
    return comps[1].state_dict()


def running(seed: int = 5):
    """Another model and optimizer that have trained a step, with a learning rate of their own."""
    model, opt, sched, _ = make(seed=seed)
    step(model, opt, sched)
    for group in opt.param_groups:
        group["lr"] = 0.5
    return model, opt


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[i].keys() == b[i].keys() and all(torch.equal(a[i][k], b[i][k]) for k in a[i]) for i in a
    )


def resume(tmp_path, model, opt, patterns):
    assert resume_into(tmp_path, model, opt, load_ignore_keys=patterns).source == "checkpoint"


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
@pytest.mark.parametrize(
    "pattern", ["state/optimizers", "state/optimizers/*", "state/optimizers/0"]
)
def test_an_ignored_optimizer_keeps_its_state_and_hyperparameters(tmp_path, saved_by, pattern):
    saved_by(tmp_path)
    model, opt = running()
    live = {k: v for k, v in opt.state_dict().items()}
    live_state = {i: {k: v.clone() for k, v in s.items()} for i, s in live["state"].items()}
    resume(tmp_path, model, opt, [pattern])
    after = opt.state_dict()
    assert same_state(after["state"], live_state)
    assert [g["lr"] for g in after["param_groups"]] == [0.5]


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
def test_ignored_hyperparameters_keep_their_live_values_and_the_state_loads(tmp_path, saved_by):
    saved = saved_by(tmp_path)
    model, opt = running()
    resume(tmp_path, model, opt, ["state/optimizers/*/param_groups"])
    after = opt.state_dict()
    assert same_state(after["state"], saved["state"])
    assert [g["lr"] for g in after["param_groups"]] == [0.5]


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
def test_ignored_optimizer_state_keeps_its_live_values_and_the_hyperparameters_load(
    tmp_path, saved_by
):
    saved = saved_by(tmp_path)
    model, opt = running()
    live = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    resume(tmp_path, model, opt, ["state/optimizers/*/state"])
    after = opt.state_dict()
    assert same_state(after["state"], live)
    assert [g["lr"] for g in after["param_groups"]] == [g["lr"] for g in saved["param_groups"]]


@pytest.mark.parametrize("has_state", [False, True], ids=["relaunched", "running"])
def test_one_of_two_optimizers_left_out(tmp_path, has_state):
    def build(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
        opts = {
            "body": torch.optim.AdamW(model[0].parameters(), lr=1e-2),
            "head": torch.optim.SGD(model[1].parameters(), lr=1e-2, momentum=0.9),
        }
        return model, opts

    def train(model, opts):
        model(torch.randn(16, 4)).pow(2).mean().backward()
        for o in opts.values():
            o.step()

    model, opts = build(0)
    train(model, opts)
    ck = CheckpointManager(model=model, optimizer=opts, folder=tmp_path / "ck", run_name="run")
    ck.batch_end(16)
    ck.close()
    saved = {name: o.state_dict() for name, o in opts.items()}

    model, opts = build(3)
    if has_state:
        train(model, opts)
    head_before = opts["head"].state_dict()
    head_state = {i: {k: v.clone() for k, v in s.items()} for i, s in head_before["state"].items()}
    ck = CheckpointManager(
        model=model,
        optimizer=opts,
        folder=tmp_path / "ck",
        run_name="run",
        load_ignore_keys=["state/optimizers/head"],
    )
    assert ck.resume().source == "checkpoint"
    ck.close(save=False)
    assert same_state(opts["body"].state_dict()["state"], saved["body"]["state"])
    assert same_state(opts["head"].state_dict()["state"], head_state)


@pytest.mark.parametrize("saved_by", [saved_v2, saved_v1], ids=["format2", "format1"])
def test_the_whole_model_left_out_keeps_its_weights_and_optimizer_state(tmp_path, saved_by):
    """``state/model`` drops every model key, in both formats; with them the parameters'
    optimizer state, as for any model key left out."""
    saved_by(tmp_path)
    model, opt = running()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    live = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    resume(tmp_path, model, opt, ["state/model"])
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert same_state(opt.state_dict()["state"], live)
