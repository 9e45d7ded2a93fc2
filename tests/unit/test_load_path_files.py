"""A ``load_path`` that is one file: plain state_dicts load, anything else is a clear error."""

from __future__ import annotations

import pickle

import pytest
import torch

from trainer_runtime import CheckpointManager, NoCheckpointError
from trainer_runtime.export import export_weights

from .trainkit import make, params, step


def trained(tmp_path):
    """A run with one committed checkpoint; returns the components and the run folder."""
    comps = make()
    src = CheckpointManager(
        model=comps[0], optimizer=comps[1], folder=tmp_path / "src", run_name="src"
    )
    src.resume()
    step(*comps[:3])
    src.batch_end(16)
    src.close()
    return comps, tmp_path / "src"


def fine_tune(tmp_path, load_path, **kw):
    comps = make(seed=7)
    ck = CheckpointManager(
        model=comps[0],
        optimizer=comps[1],
        folder=tmp_path / "ft",
        run_name="ft",
        load_path=str(load_path),
        **kw,
    )
    return comps, ck


def assert_same_weights(a, b):
    assert all(torch.equal(x, y) for x, y in zip(params(a), params(b), strict=True))


def test_an_exported_weights_file_loads_into_the_model(tmp_path):
    source, run = trained(tmp_path)
    out = tmp_path / "weights.pt"
    export_weights(run, out)
    comps, ck = fine_tune(tmp_path, out, load_weights_only=True)
    res = ck.resume()
    assert res.source == "load_path" and ck.timestamp.batch == 0
    assert_same_weights(comps[0], source[0])
    assert comps[1].state_dict()["state"] == {}, "a weights file has no optimizer state"
    ck.close(save=False)


@pytest.mark.parametrize("layout", ["state_dict", "under_model_key"])
def test_a_torch_saved_state_dict_loads_into_the_model(tmp_path, layout):
    source = make(seed=3)
    weights = source[0].state_dict()
    saved = weights if layout == "state_dict" else {"model": weights, "epoch": 4}
    torch.save(saved, tmp_path / "plain.pt")
    comps, ck = fine_tune(tmp_path, tmp_path / "plain.pt")
    assert ck.resume().source == "load_path"
    assert_same_weights(comps[0], source[0])
    assert ck.timestamp.batch == 0
    ck.close(save=False)


def test_a_data_file_of_a_sharded_checkpoint_is_a_clear_error(tmp_path):
    _, run = trained(tmp_path)
    (data,) = run.glob("ep0-ba1/*.distcp")
    comps, ck = fine_tune(tmp_path, data)
    before = params(comps[0])
    with pytest.raises(NoCheckpointError, match=r"load_path .*\.distcp' is not a torch\.save file"):
        ck.resume()
    with pytest.raises(
        NoCheckpointError, match=r"pass the folder.*run folder, a checkpoint folder"
    ):
        ck.load(data)
    assert all(torch.equal(x, y) for x, y in zip(params(comps[0]), before, strict=True))


def test_a_file_without_tensors_is_a_clear_error(tmp_path):
    torch.save({"epoch": 3, "note": "no weights"}, tmp_path / "meta.pt")
    _, ck = fine_tune(tmp_path, tmp_path / "meta.pt", load_weights_only=True)
    with pytest.raises(NoCheckpointError, match=r"load_path .*meta\.pt.*keys: epoch, note"):
        ck.resume()


def test_a_state_dict_of_another_model_never_loads_nothing_silently(tmp_path):
    torch.save({"encoder.weight": torch.ones(2, 2)}, tmp_path / "other.pt")
    _, ck = fine_tune(tmp_path, tmp_path / "other.pt", load_strict=False)
    with pytest.raises(NoCheckpointError, match=r"no key of the model"):
        ck.resume()


class NotAllowed:
    """A class the weights-only unpickler does not know."""

    def __init__(self) -> None:
        self.value = 3


def test_a_file_the_weights_only_unpickler_refuses_names_load_path_and_the_way_out(tmp_path):
    comps = make()
    path = tmp_path / "odd.pt"
    torch.save({**comps[0].state_dict(), "_extra": NotAllowed()}, path)
    before = {k: v.clone() for k, v in make(seed=7)[0].state_dict().items()}
    tuned, ck = fine_tune(tmp_path, path, load_weights_only=True)
    with pytest.raises(pickle.UnpicklingError, match=r"load_path .*odd\.pt.* trusted_pickle=True"):
        ck.resume()
    ck.close(save=False)
    assert all(torch.equal(v, before[k]) for k, v in tuned[0].state_dict().items())
    trusted_comps, trusted = fine_tune(
        tmp_path, path, load_weights_only=True, trusted_pickle=True, load_strict=False
    )
    assert trusted.resume().source == "load_path"
    trusted.close(save=False)
    assert torch.equal(trusted_comps[0][0].weight, comps[0][0].weight)
