"""The runtime on a CUDA device: pinned staging, CUDA RNG per device, resume onto the GPU, and
FSDP2 shards saved from a GPU and loaded at another world size on CPUs.

Deselected where there is no CUDA device (tests/gpu/conftest.py); ``make test-gpu`` runs it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.multiproc.launch import Gang
from tests.multiproc.sharded_worker import compare
from trainer_runtime import CheckpointManager
from trainer_runtime.run import rng
from trainer_runtime.save.survivor import host_copy
from trainer_runtime.sharded.staging import HostStager

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)
FSDP_WORKER = Path(__file__).parents[1] / "multiproc" / "fsdp_manager_worker.py"


def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 8))
    model.to(CUDA)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model: nn.Module, opt: torch.optim.Optimizer, ckpt: CheckpointManager, n: int) -> None:
    """``n`` steps whose dropout masks and inputs come from the CUDA generator."""
    for _ in range(n):
        x = torch.randn(32, 64, device=CUDA)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=32)


def manager(folder: Path, model: nn.Module, opt: torch.optim.Optimizer, **kw) -> CheckpointManager:
    return CheckpointManager(
        model=model, optimizer=opt, folder=str(folder), run_name="gpu", handle_sigterm=False, **kw
    )


def snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for t in model.state_dict().values()]
    for state in opt.state.values():
        tensors += [v.detach().clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def test_async_save_stages_cuda_tensors_in_pinned_buffers_and_resumes_onto_the_gpu(tmp_path):
    model, opt = make_model(0)
    ckpt = manager(tmp_path, model, opt, interval="3ba", async_save=True)
    train(model, opt, ckpt, 3)  # step 3's save persists in the background
    at_save = snapshot(model, opt)  # batch_end changes no tensor: this is what was saved
    train(model, opt, ckpt, 1)  # changes the live tensors while the save may still persist
    ckpt.wait()
    buffers = ckpt.engine.stager._buffers
    pinned = {path for path, b in buffers.items() if b.is_pinned()}
    on_gpu = [t for t in at_save if t.is_cuda]
    # Every tensor on the GPU went through pinned memory; Adam's step counts live on the CPU
    # and get ordinary buffers.
    assert len(pinned) == len(on_gpu), sorted(buffers)
    assert all(path.endswith("/step") for path in set(buffers) - pinned), sorted(buffers)
    ckpt.close(save=False)

    fresh, fresh_opt = make_model(1)
    resumed = manager(tmp_path, fresh, fresh_opt, interval="3ba")
    result = resumed.resume()
    assert result.path is not None and result.path.rstrip("/").endswith("ep0-ba3"), result
    assert all(t.device == CUDA for t in fresh.state_dict().values())
    assert_resumed_on_the_gpu(fresh, fresh_opt, resumed, at_save)


def assert_resumed_on_the_gpu(
    model: nn.Module, opt: torch.optim.Optimizer, ckpt: CheckpointManager, at_save: list
) -> None:
    """The optimizer's state lives on the GPU and, with the model, equals ``at_save`` bitwise
    (closes ``ckpt``)."""
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert value.device == CUDA, (key, value.device)
    got = snapshot(model, opt)
    ckpt.close(save=False)
    assert len(got) == len(at_save)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, at_save, strict=True))


def test_cuda_generator_state_is_saved_per_device_and_restored_by_resume(tmp_path):
    model, opt = make_model(0)
    ckpt = manager(tmp_path, model, opt, interval="2ba")
    train(model, opt, ckpt, 2)  # the save at step 2 records the CUDA generator after it
    ckpt.wait()
    want = torch.rand(1000, device=CUDA)
    ckpt.close(save=False)

    fresh, fresh_opt = make_model(1)
    torch.cuda.manual_seed_all(999)
    resumed = manager(tmp_path, fresh, fresh_opt, interval="2ba")
    resumed.resume()
    got = torch.rand(1000, device=CUDA)
    resumed.close(save=False)
    assert torch.equal(got, want)


def test_a_run_killed_and_resumed_on_the_gpu_ends_bitwise_like_an_uninterrupted_one(tmp_path):
    """Dropout draws from the CUDA generator, so this holds only if its state is restored."""
    model, opt = make_model(0)
    ckpt = manager(tmp_path / "whole", model, opt, interval="1ba")
    train(model, opt, ckpt, 6)
    whole = snapshot(model, opt)
    ckpt.close(save=False)

    model, opt = make_model(0)
    ckpt = manager(tmp_path / "cut", model, opt, interval="1ba")
    train(model, opt, ckpt, 3)
    ckpt.wait()
    ckpt.close(save=False)  # the process "dies" here; the next one starts from scratch
    torch.cuda.manual_seed_all(7)
    model, opt = make_model(1)
    ckpt = manager(tmp_path / "cut", model, opt, interval="1ba")
    assert ckpt.resume().path.rstrip("/").endswith("ep0-ba3")
    train(model, opt, ckpt, 3)
    cut = snapshot(model, opt)
    ckpt.close(save=False)
    assert all(torch.equal(a, b) for a, b in zip(whole, cut, strict=True))


def run_fsdp(tmp: Path, folder: Path, tag: str, world: int, *args: str) -> dict:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    gang = Gang(
        FSDP_WORKER,
        ["--folder", str(folder), "--out", str(out), "--tag", tag, *args],
        world,
        tmp / "logs" / tag,
        env=env,
    )
    codes = gang.wait(300)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp / "logs" / tag).glob("*.log")}
    assert codes == [0] * world, (codes, logs)
    return json.loads((out / f"{tag}.rank0.json").read_text())


def full_state(tmp: Path, tag: str) -> dict:
    return torch.load(tmp / "out" / f"{tag}.rank0.pt", weights_only=True)


@pytest.mark.skipif(os.name != "posix", reason="NCCL and gloo processes")
def test_fsdp2_shards_saved_on_the_gpu_resume_bitwise_on_the_gpu_and_on_two_cpu_ranks(tmp_path):
    folder = tmp_path / "ckpt"
    gpu = run_fsdp(tmp_path, folder, "gpu", 1, "--steps", "4", "--device", "cuda")
    assert gpu["saved"] == ["ep0-ba1", "ep0-ba2", "ep0-ba3", "ep0-ba4"]
    again = run_fsdp(
        tmp_path,
        tmp_path / "again",
        "again",
        1,
        "--steps",
        "4",
        "--device",
        "cuda",
        "--load-path",
        str(folder / "ep0-ba2"),
    )
    assert again["resumed_from"] == str(folder / "ep0-ba2")
    assert compare(full_state(tmp_path, "gpu"), full_state(tmp_path, "again")) == []
    # The GPU's checkpoint, resumed by 2 CPU ranks at the same step: every parameter and
    # every optimizer state, gathered full (on rank 0: cpu_offload), is the GPU's bit for bit.
    cpu = run_fsdp(tmp_path, folder, "cpu2", 2, "--steps", "4")
    assert cpu["resumed_from"].rstrip("/").endswith("ep0-ba4"), cpu
    assert compare(full_state(tmp_path, "gpu"), full_state(tmp_path, "cpu2")) == []


def test_a_rank_new_after_a_resize_gets_cuda_generators_of_its_own_reproducibly():
    torch.cuda.manual_seed_all(0)
    torch.rand(1, device=CUDA)  # CUDA initialised: capture() records its generators
    saved = rng.capture()
    assert len(saved["cuda"]) == torch.cuda.device_count()

    def draws(state: dict) -> torch.Tensor:
        rng.restore(state)
        return torch.rand(1000, device=CUDA)

    first, again, other = rng.derived(saved, 2), rng.derived(saved, 2), rng.derived(saved, 3)
    assert len(first["cuda"]) == torch.cuda.device_count()
    assert torch.equal(draws(first), draws(again))
    assert not torch.equal(draws(first), draws(other))
    assert not torch.equal(draws(first), draws(saved))


def big_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.Linear(2048, 2048)).to(CUDA)  # 32 MiB
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def saved_big_run(folder: Path) -> list[torch.Tensor]:
    """A run of ``big_model`` saved at step 2; returns its model and optimizer tensors."""
    model, opt = big_model(0)
    ckpt = manager(folder, model, opt, interval="2ba")
    for _ in range(2):
        model(torch.randn(16, 2048, device=CUDA)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=16)
    ckpt.wait()
    at_save = snapshot(model, opt)
    ckpt.close(save=False)
    return at_save


def test_a_resume_reads_gpu_tensors_straight_onto_the_gpu_through_a_few_pinned_slots(
    tmp_path, caplog
):
    at_save = saved_big_run(tmp_path)
    fresh, fresh_opt = big_model(1)
    resumed = manager(tmp_path, fresh, fresh_opt, interval="2ba")
    with caplog.at_level("INFO", logger="trainer_runtime"):
        result = resumed.resume()
    assert result.path is not None and result.path.rstrip("/").endswith("ep0-ba2"), result
    assert "straight onto the GPU" in caplog.text
    # No host copy of the state: the load made no staging buffer (the ring's slots are 16 MiB
    # in all, against 96 MiB of state here).
    assert resumed.engine.stager.nbytes == 0
    assert_resumed_on_the_gpu(fresh, fresh_opt, resumed, at_save)


def test_a_gpu_without_room_for_a_copy_of_the_model_loads_it_through_host_memory(tmp_path, caplog):
    at_save = saved_big_run(tmp_path)
    fresh, fresh_opt = big_model(1)
    resumed = manager(tmp_path, fresh, fresh_opt, interval="2ba")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(CUDA).total_memory
    # Room for 8 MiB more than the process holds: not for a 32 MiB copy of the model.
    room = torch.cuda.memory_reserved(CUDA) + (8 << 20)
    torch.cuda.set_per_process_memory_fraction(room / total)
    try:
        with caplog.at_level("INFO", logger="trainer_runtime"):
            resumed.load(tmp_path / "ep0-ba2", weights_only=True)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert "do not fit on the GPU" in caplog.text
    assert "straight onto the GPU" not in caplog.text
    got = [t.detach().cpu() for t in fresh.state_dict().values()]
    resumed.close(save=False)
    want = at_save[: len(got)]
    assert all(torch.equal(a, b.cpu()) for a, b in zip(got, want, strict=True))


def test_staging_copies_wait_for_the_work_queued_before_the_save_and_not_after():
    stager = HostStager()
    live = {"w": torch.zeros(1 << 20, device=CUDA)}
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time queued before the save point
    live["w"].add_(1)  # queued before it too: the copy must see it
    stager.mark_save_point(live)
    torch.cuda._sleep(4_000_000_000)  # about 2 s queued after it: the copy must not wait
    staged = stager.stage(live)
    stager.synchronize()
    still_running = not torch.cuda.current_stream(CUDA).query()
    torch.cuda.synchronize(CUDA)
    assert torch.equal(staged["w"], torch.ones(1 << 20)) and staged["w"].is_pinned()
    assert still_running, "staging waited for work queued after the save point"


def test_a_survivors_copy_does_not_wait_behind_a_stuck_default_stream() -> None:
    """The save from a survivor's memory copies the weights on a stream of its own that waits
    only for the boundary's event: behind a collective that never ends (NCCL waits for a lost
    peer), emulated by a long sleep kernel on the default stream, it still finishes."""
    weights = {"model": {"w": torch.randn(4096, 4096, device=CUDA)}, "step": 7}
    ready = torch.cuda.Event()
    ready.record()
    torch.cuda._sleep(30_000_000_000)  # tens of seconds of a busy default stream
    began = time.monotonic()
    host = host_copy(weights, ready)
    took = time.monotonic() - began
    assert took < 5.0, took
    assert host["step"] == 7 and host["model"]["w"].device.type == "cpu"
    torch.cuda.synchronize()
    assert torch.equal(host["model"]["w"], weights["model"]["w"].cpu())
