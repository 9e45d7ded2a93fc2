"""Sharded (format version 2) checkpoints across world sizes and layouts, real gloo processes.

Three checkpoints are saved once per module: FSDP2 at 4 ranks (``fsdp4``), DDP at 4 ranks
(``ddp4``) and one process (``one1``). Gangs of 1, 2 and 3 ranks then load them in other
layouts; every parameter and optimizer state, gathered full, must be bitwise what was saved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from trainer_runtime import Manifest
from trainer_runtime.sharded import check_files_present

from .launch import Gang

pytestmark = pytest.mark.multiproc
WORKER = Path(__file__).with_name("sharded_worker.py")
WIDTH = 512


def gang(base: Path, world: int, jobs: str, tag: str) -> None:
    args = ["--root", str(base / "run"), "--out", str(base / "out"), "--jobs", jobs]
    args += ["--width", str(WIDTH)]
    codes = Gang(WORKER, args, world, base / "logs" / tag).wait(600)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((base / "logs" / tag).glob("*.log")))
    assert codes == [0] * world, f"{tag} exited {codes}:\n{logs}"


def results(base: Path, name: str, layout: str, world: int) -> list[dict]:
    out = base / "out"
    return [
        json.loads((out / f"{name}.{layout}.w{world}.rank{r}.json").read_text())
        for r in range(world)
    ]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("sharded")
    (base / "out").mkdir()
    gang(base, 4, "save:fsdp:fsdp4,save:ddp:ddp4", "save4")
    gang(base, 1, "save:single:one1", "save1")
    return base


def replica_bytes(ref: dict) -> int:
    total = 0

    def walk(obj):
        nonlocal total
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                walk(v)

    walk(ref)
    return total


def test_ddp_checkpoint_is_written_once_spread_over_ranks(saved):
    folder = saved / "run" / "ddp4"
    m = Manifest.read(folder)
    assert m.format_version == 2 and m.world_size == 4
    assert check_files_present(folder, m) is None
    ref = torch.load(saved / "out" / "ddp4.ref.pt", weights_only=True)
    state = replica_bytes(ref)
    total = sum(f.size for f in m.files)
    assert total <= 1.05 * state, f"{total} bytes written for a {state}-byte replica"
    per_rank = [sum(f.size for f in m.files_for_rank(r)) for r in range(4)]
    # Spread over the ranks: nobody writes more than half of it.
    assert max(per_rank) < 0.5 * state, per_rank


def test_latest_links_point_at_the_checkpoint_folder(saved):
    run = saved / "run"
    # ddp4 was the last save of ranks 1-3; rank 0 saved one1 after it.
    assert (run / "latest-rank0").resolve() == (run / "one1").resolve()
    for r in (1, 2, 3):
        assert (run / f"latest-rank{r}").resolve() == (run / "ddp4").resolve()
    assert json.loads((run / "latest.json").read_text())["checkpoint"] == "one1"


@pytest.fixture(scope="module")
def loaded_at_3(saved) -> Path:
    gang(saved, 3, "load:fsdp:fsdp4,load:ddp:one1,load:fsdp:ddp4", "load3")
    return saved


@pytest.fixture(scope="module")
def loaded_at_1(saved) -> Path:
    gang(saved, 1, "load:single:fsdp4,load:single:ddp4", "load1")
    return saved


def torn_copy(base: Path, name: str, suffix: str, damage) -> str:
    src = base / "run" / name
    dst = base / "run" / f"{name}-torn{suffix}"
    shutil.copytree(src, dst)
    damage(dst / "__1_0.distcp")
    return dst.name


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.fixture(scope="module")
def loaded_at_2(saved) -> Path:
    flip = torn_copy(saved, "ddp4", "flip", _flip_last_byte)
    cut = torn_copy(saved, "ddp4", "cut", _truncate)
    jobs = f"load:fsdp:fsdp4,warmload:fsdp:fsdp4,load:ddp:{flip},load:ddp:{cut}"
    gang(saved, 2, jobs, "load2")
    return saved


def assert_bitwise(rows: list[dict]) -> None:
    assert all("error" not in r for r in rows), rows
    assert rows[0]["mismatches"] == []


@pytest.mark.parametrize("world", [2, 3, 1])
def test_fsdp2_saved_at_4_loads_bitwise_at_other_sizes(world, request):
    base = request.getfixturevalue(f"loaded_at_{world}")
    layout = "single" if world == 1 else "fsdp"
    rows = results(base, "fsdp4", layout, world)
    assert_bitwise(rows)
    assert all(r["sampler"] == [0, 3 * 4 * 4] for r in rows)  # global position, re-dealt


def test_a_running_fsdp2_process_takes_the_verified_optimizer_shards(loaded_at_2):
    # Its optimizer already has state: the verified staging shards become that state (no
    # copy), and the stager keeps the old shards; no buffer may stay live (an async save
    # would then stage over the state training changes).
    rows = results(loaded_at_2, "fsdp4", "fsdp-warm", 2)
    assert_bitwise(rows)
    for row in rows:
        assert row["handed_over"] > 0, row
        assert row["aliased"] == 0, row


def test_ddp_4_to_1_and_1_to_3(loaded_at_1, loaded_at_3):
    assert_bitwise(results(loaded_at_1, "ddp4", "single", 1))
    rows = results(loaded_at_3, "one1", "ddp", 3)
    assert_bitwise(rows)
    assert all(r["sampler"] == [0, 3 * 4] for r in rows)


def test_ddp_checkpoint_loads_into_fsdp2(loaded_at_3):
    assert_bitwise(results(loaded_at_3, "ddp4", "fsdp", 3))


def test_rng_rule_on_world_size_change(loaded_at_3):
    """Ranks that existed get their own stream back; new ranks get distinct derived streams."""
    base = loaded_at_3
    shrunk = results(base, "fsdp4", "fsdp", 3)  # 4 -> 3: every rank existed before
    for r, row in enumerate(shrunk):
        saved = torch.load(base / "out" / f"fsdp4.rng{r}.pt", weights_only=True)
        assert row["rng"] == "restored"
        assert row["rng_state"] == saved[:64].tolist()
    grown = results(base, "one1", "ddp", 3)  # 1 -> 3: ranks 1 and 2 are new
    saved0 = torch.load(base / "out" / "one1.rng0.pt", weights_only=True)
    assert [r["rng"] for r in grown] == ["restored", "derived", "derived"]
    assert grown[0]["rng_state"] == saved0[:64].tolist()
    states = [tuple(r["rng_state"]) for r in grown]
    assert len(set(states)) == 3


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_torn_or_corrupt_file_is_detected_and_live_state_untouched(loaded_at_2, damage):
    rows = results(loaded_at_2, f"ddp4-torn{damage}", "ddp", 2)
    for row in rows:
        assert "CorruptCheckpointError" in row.get("error", ""), row
        assert "__1_0.distcp" in row["error"]
    assert rows[0]["unchanged"] is True
