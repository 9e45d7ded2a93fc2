"""CheckpointManager (format version 2) across world sizes, real processes on gloo.

4-rank DDP writes the replicated state once (bytes <= 1.05x one replica); FSDP2 saved at 4
ranks resumes through ``CheckpointManager.resume()`` at 2, 3 and 1 ranks, DDP 4 -> 1 and
1 -> 3, each with every parameter and optimizer state, gathered full, bitwise equal to what
was saved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.multiproc.launch import Gang
from tests.multiproc.sharded_worker import compare
from trainer_runtime import Manifest

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]
WORKER = Path(__file__).with_name("resize_worker.py")
STEPS = 2
WIDE = 512


def run(tmp: Path, mode: str, folder: Path, tag: str, world: int, *, width: int = 64) -> dict:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    args = ["--mode", mode, "--folder", str(folder), "--out", str(out), "--tag", tag]
    args += ["--width", str(width)]
    gang = Gang(WORKER, [*args, "--steps", str(STEPS)], world, tmp / "logs" / tag)
    codes = gang.wait(400)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp / "logs" / tag).glob("*.log")}
    assert codes == [0] * world, (codes, logs)
    info = json.loads((out / f"{tag}.json").read_text())
    info["state"] = torch.load(out / f"{tag}.pt", weights_only=True)
    return info


def replica_bytes(state: dict) -> int:
    total = 0
    stack = [state]
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            total += node.numel() * node.element_size()
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return total


def assert_resumed_bitwise(saved: dict, resumed: dict, world: int) -> None:
    assert resumed["world"] == world
    assert resumed["source"] == "checkpoint", resumed
    assert Path(resumed["resumed_from"]).name == f"ep0-ba{STEPS}"
    assert compare(saved["state"], resumed["state"]) == []


@pytest.fixture(scope="module")
def fsdp_saved_at_4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    folder = tmp / "fsdp"
    saved = run(tmp, "fsdp", folder, "save4", 4)
    assert saved["source"] == "fresh"
    m = Manifest.read(folder / f"ep0-ba{STEPS}")
    assert (m.format_version, m.world_size) == (2, 4)
    assert {f.rank for f in m.files} == {0, 1, 2, 3}  # each rank wrote its own shards
    # Training moved the weights: the comparisons are not between untouched models.
    torch.manual_seed(0)
    assert not torch.equal(saved["state"]["model"]["0.weight"], torch.nn.Linear(64, 64).weight)
    return tmp, folder, saved


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 3, 1])
def test_fsdp2_saved_at_4_resumes_bitwise_at(fsdp_saved_at_4, world):
    tmp, folder, saved = fsdp_saved_at_4
    resumed = run(tmp, "fsdp", folder, f"resume{world}", world)
    assert_resumed_bitwise(saved, resumed, world)


@pytest.mark.timeout(1500)
def test_ddp_writes_one_replica_and_resumes_4_to_1_and_1_to_3(tmp_path):
    # ~9 MiB of model + Adam state: the per-rank small state (RNG, position; a few KiB per
    # rank) and DCP's .metadata are a fixed cost that a tiny model would not amortize.
    folder = tmp_path / "ddp4"
    saved = run(tmp_path, "ddp", folder, "save4", 4, width=WIDE)
    ckpt = folder / f"ep0-ba{STEPS}"
    on_disk = sum(p.stat().st_size for p in ckpt.iterdir() if p.name != "manifest.json")
    replica = replica_bytes(saved["state"])
    ratio = on_disk / replica
    print(f"4-rank DDP checkpoint: {on_disk} bytes on disk, one replica {replica}: {ratio:.3f}x")
    assert ratio <= 1.05, (on_disk, replica)
    m = Manifest.read(ckpt)
    assert sorted({f.rank for f in m.files}) == [0, 1, 2, 3]  # the writing is spread
    assert sum(f.size for f in m.files) == on_disk
    assert_resumed_bitwise(saved, run(tmp_path, "ddp", folder, "resume1", 1, width=WIDE), 1)

    folder1 = tmp_path / "ddp1"
    saved1 = run(tmp_path, "ddp", folder1, "save1", 1)
    assert_resumed_bitwise(saved1, run(tmp_path, "ddp", folder1, "resume3", 3), 3)
