"""Loading a rank file with one read: a damaged file is refused before any byte is unpickled,
the loaded tensors live in anonymous memory, and giving back the unused pages never changes a
tensor that is still alive."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer_runtime import CheckpointManager, NoCheckpointError
from trainer_runtime.resume.verified_read import read_verified
from trainer_runtime.save.rank_file import save_rank_file

from .trainkit import make, params, step


def saved_adam(tmp_path: Path, width: int = 512):
    model = nn.Linear(width, width)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    tree = {"state": {"model": model.state_dict(), "optimizer": opt.state_dict()}}
    entry = save_rank_file(tree, tmp_path / "rank0.pt", rank=0, rel_path="rank0.pt")
    return model, opt, entry


def test_a_file_that_fails_its_checksum_is_refused_before_unpickling(tmp_path, monkeypatch):
    _, _, entry = saved_adam(tmp_path)
    path = tmp_path / "rank0.pt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    unpickled: list[object] = []
    monkeypatch.setattr(torch.serialization, "_load", lambda *a, **k: unpickled.append(a))

    assert read_verified(tmp_path, entry) == "rank0.pt (rank 0) fails its checksum"
    path.write_bytes(bytes(raw[:-1]))
    assert "has" in str(read_verified(tmp_path, entry))
    path.unlink()
    assert read_verified(tmp_path, entry) == "rank0.pt (rank 0) is missing"
    assert unpickled == []


def test_released_pages_are_only_those_no_live_tensor_uses(tmp_path):
    model, opt, entry = saved_adam(tmp_path, width=128)  # records small enough to share pages
    verified = read_verified(tmp_path, entry)
    assert not isinstance(verified, str)
    data = verified.load(trusted=False)
    model2 = nn.Linear(128, 128)
    opt2 = torch.optim.Adam(model2.parameters())
    model2.load_state_dict(data["state"]["model"])
    opt2.load_state_dict(data["state"]["optimizer"])
    kept_weight = data["state"]["model"]["bias"]  # a tensor the caller still holds
    del data

    released = verified.release_unused()
    weight_bytes = model.weight.numel() * 4
    assert released >= weight_bytes - 2 * 4096  # the weight matrix's pages went back
    assert released < entry.size - 2 * weight_bytes  # the two Adam moments stayed
    assert torch.equal(kept_weight, model.bias)
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], opt2.state[q][key])


def test_resume_refuses_a_checkpoint_damaged_after_its_manifest_and_keeps_live_state(tmp_path):
    comps = make()
    ck = CheckpointManager(
        model=comps[0], optimizer=comps[1], folder=tmp_path / "ck", run_name="r", interval="1ba"
    )
    step(*comps[:3])
    ck.batch_end(16)
    ck.close(save=False)
    data_file = next((tmp_path / "ck").glob("ep*/__0_0.distcp"))
    raw = bytearray(data_file.read_bytes())
    raw[-100] ^= 0x01
    data_file.write_bytes(bytes(raw))

    fresh = make(seed=1)
    before = [p.clone() for p in params(fresh[0])]
    ck2 = CheckpointManager(
        model=fresh[0], optimizer=fresh[1], folder=tmp_path / "ck", run_name="r"
    )
    with pytest.raises(NoCheckpointError, match="fail their checksum"):
        ck2.load(data_file.parent)
    assert all(torch.equal(a, b) for a, b in zip(before, params(fresh[0]), strict=True))
    assert fresh[1].state_dict()["state"] == {}
    ck2.close(save=False)


def test_large_records_get_storages_of_their_own_that_die_with_their_tensors(tmp_path):
    model, opt, entry = saved_adam(tmp_path, width=1024)  # 4 MiB matrices
    verified = read_verified(tmp_path, entry)
    assert not isinstance(verified, str)
    data = verified.load(trusted=False)
    weight = data["state"]["model"]["weight"]
    moment = data["state"]["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(weight, model.weight) and torch.equal(
        moment, opt.state[model.weight]["exp_avg"]
    )
    assert weight.untyped_storage().nbytes() == weight.nbytes  # not a slice of one big buffer
    gone = weakref.ref(weight)
    del data, weight
    assert gone() is None
    assert verified.release_unused() < 64 * 1024  # its bytes never were in the shared buffer
    assert torch.equal(moment, opt.state[model.weight]["exp_avg"])


def test_the_copying_fallback_reassembles_records_read_into_their_own_storages(tmp_path):
    """The path taken on a torch without the private zero-copy loader."""
    model, opt, entry = saved_adam(tmp_path, width=1024)  # large records in storages of their own
    verified = read_verified(tmp_path, entry)
    assert not isinstance(verified, str)
    data = verified._load_copying(trusted=False)
    assert torch.equal(data["state"]["model"]["weight"], model.weight)
    assert torch.equal(
        data["state"]["optimizer"]["state"][0]["exp_avg_sq"], opt.state[model.weight]["exp_avg_sq"]
    )
