"""A format-version-1 checkpoint (full, replicated tensors in each ``rank{r}.pt``, from
earlier releases) resumed by an FSDP2 (``fully_shard``) gang: the model and its Adam state
arrive sharded, bitwise equal to what was saved, and the next save is format version 2."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from tests.multiproc.launch import Gang
from tests.multiproc.sharded_worker import compare
from trainer_runtime import Manifest
from trainer_runtime.export import export_weights
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save import rank_contents as state_mod
from trainer_runtime.save.manifest import FORMAT_VERSION_PER_RANK
from trainer_runtime.save.rank_file import save_rank_file
from trainer_runtime.timestamp import Timestamp

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]
WORKER = Path(__file__).with_name("resize_worker.py")
WIDTH = 64


def write_v1_of_resize_worker(folder: Path, *, world: int, batch: int) -> dict:
    """The resize worker's model and Adam after ``batch`` steps, as a version-1 checkpoint
    saved by ``world`` data-parallel ranks; returns the saved state, keyed by name."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(3)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(batch):
        model(torch.randn(8, WIDTH)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    ts = Timestamp(batch=batch, batch_in_epoch=batch, sample=8 * batch, sample_in_epoch=8 * batch)
    data = state_mod.capture(
        state_mod.Components(model=model, optimizers={"0": opt}),
        timestamp=ts.to_dict(),
        run_name="resize",
        metrics={},
        extras={},
        weights_only=False,
    )
    name = f"ep0-ba{batch}"
    (folder / name).mkdir(parents=True)
    entries = [
        save_rank_file(data, folder / name / f"rank{r}.pt", rank=r, rel_path=f"rank{r}.pt")
        for r in range(world)
    ]
    manifest = Manifest(
        name=name,
        run_name="resize",
        world_size=world,
        timestamp=ts,
        files=entries,
        created_at=datetime.now(UTC).isoformat(),
        format_version=FORMAT_VERSION_PER_RANK,
    )
    RunFolder(folder).write_manifest(manifest)
    RunFolder(folder).write_pointer(manifest)
    names = [n for n, _ in model.named_parameters()]
    optim = opt.state_dict()
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optim": {
            names[i]: {k: v.clone() for k, v in s.items()} for i, s in optim["state"].items()
        },
    }


def resume_fsdp(tmp_path: Path, folder: Path, tag: str, steps: int, *more: str) -> dict:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    args = ["--mode", "fsdp", "--folder", str(folder), "--out", str(out), "--tag", tag]
    args += ["--steps", str(steps), "--width", str(WIDTH), *more]
    gang = Gang(WORKER, args, 2, tmp_path / "logs" / tag)
    codes = gang.wait(400)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "logs" / tag).glob("*.log")}
    # Before, every rank ended in torch's "got mixed torch.Tensor and DTensor" RuntimeError.
    assert codes == [0, 0], (codes, logs)
    info = json.loads((out / f"{tag}.json").read_text())
    info["state"] = torch.load(out / f"{tag}.pt", weights_only=True)
    return info


@pytest.mark.timeout(900)
def test_a_v1_checkpoint_resumes_into_fsdp2_shards(tmp_path):
    folder = tmp_path / "run"
    saved = write_v1_of_resize_worker(folder, world=2, batch=2)

    resumed = resume_fsdp(tmp_path, folder, "resume", steps=2)  # resumes, trains nothing
    assert Path(resumed["resumed_from"]).name == "ep0-ba2", resumed
    got = resumed["state"]
    assert compare(saved["model"], got["model"]) == []
    assert compare(saved["optim"], got["optim"]["state"]) == []

    trained = resume_fsdp(tmp_path, folder, "train", steps=3)  # and one step further
    assert Path(trained["resumed_from"]).name == "ep0-ba2", trained
    assert Manifest.read(folder / "ep0-ba3").format_version == 2


@pytest.mark.timeout(600)
def test_exported_weights_load_into_fsdp2_as_a_load_path(tmp_path):
    """``rtj-checkpoints export`` writes full tensors, which "load back as a load_path"."""
    saved = write_v1_of_resize_worker(tmp_path / "old", world=1, batch=2)
    weights = tmp_path / "weights.pt"
    export_weights(tmp_path / "old", weights)
    args = ("--load-path", str(weights))
    loaded = resume_fsdp(tmp_path, tmp_path / "new", "load", 0, *args)
    assert loaded["source"] == "load_path", loaded
    assert compare(saved["model"], loaded["state"]["model"]) == []
