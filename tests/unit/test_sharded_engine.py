"""The sharded engine in one process: commit, exact round trip, damage detection, safety.

Multi-rank behaviour (dedup, resharding, FSDP2) is in tests/multiproc/test_sharded.py.
"""

from __future__ import annotations

import enum
import gc
import io
import json
import os
import pickle
import random
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint.metadata as dcp_metadata

from trainer_runtime import io_progress
from trainer_runtime.errors import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    SaveFailedError,
)
from trainer_runtime.run import rng
from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.sampler import ResumableSampler
from trainer_runtime.save.commit import write_and_commit
from trainer_runtime.save.manifest import FORMAT_VERSION_SHARDED, Manifest, ManifestError
from trainer_runtime.save.rank_contents import Components
from trainer_runtime.sharded import (
    ShardedCheckpointer,
    ShardedEngine,
    check_files_present,
    optim_target,
)
from trainer_runtime.sharded.staging import HostStager
from trainer_runtime.sharded.storage import read_metadata_bytes
from trainer_runtime.timestamp import Timestamp


def make(width: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = ResumableSampler(1000, num_replicas=1, rank=0, batch_size=4)
    model(torch.randn(4, width)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    engine = ShardedEngine(
        Components(model=model, optimizers={"adam": opt}, stateful={"sampler": sampler}),
        Coordinator(),
    )
    return model, opt, sampler, engine


def snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
    )


def assert_equal_state(model, opt, snap):
    weights, state = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    live = opt.state_dict()["state"]
    assert live.keys() == state.keys()
    for i, s in live.items():
        for k, v in s.items():
            assert torch.equal(v, state[i][k]), (i, k)


def save(tmp_path: Path, engine, name="ep0-ba1", *, asynchronous=False) -> Path:
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    ts = Timestamp(batch=1, sample=4)
    if asynchronous:
        ck.save_async(name, timestamp=ts, latest_link="latest-rank0")
        ck.wait()
    else:
        ck.save(name, timestamp=ts, latest_link="latest-rank0")
    ck.close()
    return tmp_path / name


def test_commit_lists_every_file_with_size_and_digest_and_links_the_folder(tmp_path):
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    m = Manifest.read(folder)
    assert m.format_version == FORMAT_VERSION_SHARDED and m.sharded
    assert sorted(f.path for f in m.files) == [".metadata", "__0_0.distcp"]
    assert RunFolder(tmp_path).verify(m, [0]) is None  # whole-file digests match
    assert check_files_present(folder, m) is None
    assert (tmp_path / "latest-rank0").resolve() == folder.resolve()
    assert json.loads((tmp_path / "latest.json").read_text())["checkpoint"] == "ep0-ba1"


def test_a_save_counts_the_bytes_it_writes(tmp_path):
    """The count a survivor's save reports to the agent while it writes (save/survivor.py)."""
    _, _, _, engine = make()
    before = io_progress.total()
    folder = save(tmp_path, engine)
    assert io_progress.total() - before >= (folder / "__0_0.distcp").stat().st_size > 0


@pytest.mark.parametrize("asynchronous", [False, True])
def test_round_trip_restores_weights_optimizer_sampler_rng_in_place(tmp_path, asynchronous):
    model, opt, sampler, engine = make()
    sampler.advance(12)
    snap = snapshot(model, opt)
    folder = save(tmp_path, engine, asynchronous=asynchronous)
    expected_draw = torch.rand(4)  # the draw right after the save
    expected_py = random.random()
    live_ptrs = [p.data_ptr() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.param_groups[0]["lr"] = 99.0
    sampler.offset = 0
    torch.manual_seed(123)
    saved, report = engine.load(folder, Manifest.read(folder))
    assert report.rng == "restored"
    assert torch.equal(torch.rand(4), expected_draw)
    assert random.random() == expected_py
    assert_equal_state(model, opt, snap)
    assert [p.data_ptr() for p in model.parameters()] == live_ptrs  # copied in place
    assert opt.param_groups[0]["lr"] == 0.01
    assert sampler.offset == 12
    assert saved["timestamp"]["batch"] == 1


def test_a_load_that_ignores_rng_reports_none_and_leaves_the_generators(tmp_path):
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    _, report = engine.load(folder, Manifest.read(folder), ignore_keys=["rng"])
    assert torch.equal(torch.rand(4), expected), "the generators are as they were"
    assert report.rng == "none"
    _, report = engine.load(folder, Manifest.read(folder))
    assert report.rng == "restored"


def test_async_save_writes_the_state_at_the_call_even_if_training_moves_on(tmp_path):
    model, opt, _, engine = make()
    snap = snapshot(model, opt)
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    ck.save_async("ep0-ba1", timestamp=Timestamp(batch=1))
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()  # the pre-step hook holds this until the staging copy is done
    ck.close()
    after_step = snapshot(model, opt)
    _, _, _, other = make(seed=5)
    other.load(tmp_path / "ep0-ba1", Manifest.read(tmp_path / "ep0-ba1"))
    assert_equal_state(other.components.model, other.components.optimizers["adam"], snap)
    assert not torch.equal(next(iter(after_step[0].values())), next(iter(snap[0].values())))


def test_async_save_writes_the_buffers_at_the_call_though_a_forward_pass_changes_them(tmp_path):
    """BatchNorm statistics change in the forward pass, before the step the hook holds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = ShardedEngine(Components(model=model, optimizers={"sgd": opt}), Coordinator())
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    release = threading.Event()
    busy = engine.on_staging_thread(lambda: int(release.wait(30)))  # the copy queues behind it
    ck.save_async("ep0-ba1", timestamp=Timestamp(batch=1))
    model(torch.randn(8, 4) + 5.0)  # the next forward pass, while the copy has not run yet
    assert not torch.equal(model[1].running_mean, at_call["1.running_mean"])
    release.set()
    assert busy.result() == 1
    ck.close()
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt2 = torch.optim.SGD(other.parameters(), lr=0.1)
    ShardedEngine(Components(model=other, optimizers={"sgd": opt2}), Coordinator()).load(
        tmp_path / "ep0-ba1", Manifest.read(tmp_path / "ep0-ba1")
    )
    for k, v in other.state_dict().items():
        assert torch.equal(v, at_call[k]), k


def test_a_later_save_records_hyperparameters_changed_since_the_first(tmp_path):
    model, opt, _, engine = make()
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    ck.save("ep0-ba1", timestamp=Timestamp(batch=1))
    opt.param_groups[0]["lr"] = 0.5  # what a scheduler does between saves
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    snap = snapshot(model, opt)
    ck.save("ep0-ba2", timestamp=Timestamp(batch=2))
    ck.close()
    opt.param_groups[0]["lr"] = 0.0
    engine.load(tmp_path / "ep0-ba2", Manifest.read(tmp_path / "ep0-ba2"))
    assert opt.param_groups[0]["lr"] == 0.5
    assert_equal_state(model, opt, snap)


def test_a_second_async_save_stages_only_what_this_rank_writes_and_refuses_the_rest(tmp_path):
    _, _, _, engine = make()
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    ck.save("ep0-ba1", timestamp=Timestamp(batch=1))
    state = engine.capture(timestamp={}, run_name="run", metrics={}, extras={}, weights_only=False)
    _, keys = engine.stage(state)
    assert keys is not None and "model.0.weight" in keys  # one rank writes everything
    with pytest.raises(SaveFailedError, match="did not stage"):
        write_and_commit(
            engine,
            RunFolder(tmp_path),
            run_name="run",
            state=state,
            name="ep0-ba2",
            timestamp=Timestamp(batch=2),
            weights_only=False,
            latest_link=None,
            started=0.0,
            staged_keys={"model.0.bias"},
        )
    assert not (tmp_path / "ep0-ba2").exists()
    ck.close()


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["start", "end", "metadata", "truncate"])
def test_damage_is_detected_and_live_state_is_left_untouched(tmp_path, where):
    model, opt, _, engine = make()
    folder = save(tmp_path, engine)
    data = folder / "__0_0.distcp"
    if where == "start":
        _flip(data, 0)
    elif where == "end":
        _flip(data, data.stat().st_size - 1)
    elif where == "metadata":
        _flip(folder / ".metadata", 40)
    else:
        os.truncate(data, data.stat().st_size - 100)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    before = snapshot(model, opt)
    with pytest.raises(CorruptCheckpointError) as err:
        engine.load(folder, Manifest.read(folder))
    assert ("metadata" if where == "metadata" else "__0_0.distcp") in str(err.value)
    assert_equal_state(model, opt, before)
    if where == "truncate":
        assert "has" in (check_files_present(folder, Manifest.read(folder)) or "")


def fresh(width: int = 16, seed: int = 1):
    """A relaunched process: a newly built model and an optimizer without state."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    sampler = ResumableSampler(1000, num_replicas=1, rank=0, batch_size=4)
    engine = ShardedEngine(
        Components(model=model, optimizers={"adam": opt}, stateful={"sampler": sampler}),
        Coordinator(),
    )
    return model, opt, sampler, engine


def _file_mappings(folder: Path) -> list[tuple[int, int, str]]:
    """(start, end, path) of every mapping of this process backed by a file under folder."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(str(folder.resolve())):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[5]))
    return out


def _live_tensors(model, opt):
    yield from model.parameters()
    for st in opt.state.values():
        yield from (v for v in st.values() if isinstance(v, torch.Tensor))


def test_a_resume_into_a_fresh_optimizer_is_exact_and_maps_no_checkpoint_file(tmp_path):
    model, opt, sampler, engine = make()
    sampler.advance(8)
    snap = snapshot(model, opt)
    folder = save(tmp_path, engine)
    new_model, new_opt, new_sampler, new_engine = fresh()
    live_ptrs = [p.data_ptr() for p in new_model.parameters()]
    steps = []
    hook = new_opt.register_step_pre_hook(lambda *_: steps.append(1))
    new_engine.load(folder, Manifest.read(folder))
    hook.remove()
    assert not steps, "the load stepped the optimizer to create state it then overwrote"
    assert all(p.grad is None for p in new_model.parameters())
    assert_equal_state(new_model, new_opt, snap)
    assert [p.data_ptr() for p in new_model.parameters()] == live_ptrs  # weights in place
    assert new_opt.param_groups[0]["lr"] == 0.01 and new_sampler.offset == 8
    assert not _file_mappings(folder), "a checkpoint file is mapped into the process"
    staged = {b.data_ptr() for b in new_engine.stager._buffers.values()}
    assert not staged & {t.data_ptr() for t in _live_tensors(new_model, new_opt)}
    # The adopted state trains on like the original, step for step.
    x = torch.randn(4, 16)
    for m, o in ((model, opt), (new_model, new_opt)):
        m(x).square().mean().backward()
        o.step()
    assert_equal_state(new_model, new_opt, snapshot(model, opt))
    # And a later save never stages over the live optimizer state.
    new_engine.stage(
        new_engine.capture(timestamp={}, run_name="run", metrics={}, extras={}, weights_only=False)
    )
    staged = {b.data_ptr() for b in new_engine.stager._buffers.values()}
    assert not staged & {t.data_ptr() for t in _live_tensors(new_model, new_opt)}


def test_a_torch_load_with_mmap_is_what_the_maps_check_catches(tmp_path):
    """The check above can fail: a file-backed load shows up in /proc/self/maps."""
    path = tmp_path / "state.pt"
    torch.save({"w": torch.ones(1 << 16)}, path)
    loaded = torch.load(path, mmap=True, weights_only=True)
    assert _file_mappings(tmp_path)
    del loaded


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_corrupt_chunk_leaves_a_fresh_model_and_empty_optimizer_untouched(tmp_path, where):
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    data = folder / "__0_0.distcp"
    _flip(data, 0 if where == "start" else data.stat().st_size - 1)
    model, opt, _, new_engine = fresh()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp"):
        new_engine.load(folder, Manifest.read(folder))
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert not opt.state, "a failed load left optimizer state behind"
    assert opt.param_groups[0]["lr"] == 0.5


def test_metadata_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    blob = pickle.dumps(Evil())
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        read_metadata_bytes(blob, trusted=False)
    assert not (tmp_path / "pwned").exists()


ENUM_IN_METADATA = dcp_metadata._MEM_FORMAT_ENCODING
"""The Enum DCP's metadata holds (a tensor's memory format)."""


class _EnumsByName(pickle.Pickler):
    """Pickles Enum members as Python 3.11.0-3.11.4 do: ``getattr(cls, name)``."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _pickle_by_name(obj) -> bytes:
    out = io.BytesIO()
    _EnumsByName(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def test_metadata_written_by_a_python_that_pickles_enums_by_name_loads(tmp_path):
    # A checkpoint saved inside a container with Debian 12's python3 (3.11.2): its .metadata
    # refers to builtins.getattr for every Enum member (the write item types).
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    blob = (folder / ".metadata").read_bytes()
    metadata = read_metadata_bytes(blob, trusted=False)
    by_name = _pickle_by_name(metadata)
    assert b"getattr" in by_name and b"getattr" not in blob
    again = read_metadata_bytes(by_name, trusted=False)
    assert again.state_dict_metadata == metadata.state_dict_metadata
    assert again.storage_data == metadata.storage_data


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ((getattr, (torch.Size, "__reduce__")), "only Enum members"),
        ((getattr, (ENUM_IN_METADATA, "__class__")), "not a member"),
        ((getattr, (ENUM_IN_METADATA, 7)), "not a member"),
    ],
)
def test_getattr_in_metadata_reaches_nothing_but_enum_members(target, why):
    class Probe:
        def __reduce__(self):
            return target

    with pytest.raises(pickle.UnpicklingError, match=why):
        read_metadata_bytes(pickle.dumps(Probe()), trusted=False)


def test_a_model_that_does_not_fit_is_a_clear_error_before_anything_is_copied(tmp_path):
    _, _, _, engine = make(width=16)
    folder = save(tmp_path, engine)
    model, opt, _, other = make(width=8)
    before = snapshot(model, opt)
    with pytest.raises(IncompatibleCheckpointError, match="shape mismatch"):
        other.load(folder, Manifest.read(folder))
    assert_equal_state(model, opt, before)


def test_staging_buffers_are_reused_between_saves():
    stager = HostStager(pin_memory=False)
    state = {"a": torch.ones(4), "b": [torch.zeros(2, 2)], "n": 3}
    first = stager.stage(state)
    state["a"].add_(1)
    second = stager.stage(state)
    assert first["a"].data_ptr() == second["a"].data_ptr()
    assert torch.equal(second["a"], torch.full((4,), 2.0)) and second["n"] == 3
    assert second["a"].data_ptr() != state["a"].data_ptr()


def test_derived_rng_is_reproducible_and_distinct_per_rank():
    saved = {"torch": torch.get_rng_state()}
    a1, a2, b = rng.derived(saved, 1), rng.derived(saved, 1), rng.derived(saved, 2)
    assert torch.equal(a1["torch"], a2["torch"])
    assert not torch.equal(a1["torch"], b["torch"])
    assert not torch.equal(a1["torch"], saved["torch"])


def test_manifest_reads_version_1_and_2_and_rejects_others(tmp_path):
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    data = json.loads((folder / "manifest.json").read_text())
    for version, ok in [(1, True), (2, True), (3, False)]:
        data["format_version"] = version
        if ok:
            assert Manifest.from_json(json.dumps(data)).format_version == version
        else:
            with pytest.raises(ManifestError, match="format_version 3"):
                Manifest.from_json(json.dumps(data))


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice is Linux's")
def test_every_async_save_copies_at_full_priority_though_persisting_yields(tmp_path):
    """The persisting thread lowers its own priority after the copy and is reused by the next
    save; the copy the next ``optimizer.step()`` waits for must not inherit that."""

    if os.getpriority(os.PRIO_PROCESS, 0) >= 10:
        pytest.skip("the tests run at nice 10 or lower already: no thread can yield further")
    _, _, _, engine = make()
    seen: list[tuple[int, int]] = []
    stage = engine.stager.stage

    def recording_stage(*args, **kwargs):
        tid = threading.get_native_id()
        seen.append((tid, os.getpriority(os.PRIO_PROCESS, tid)))
        return stage(*args, **kwargs)

    engine.stager.stage = recording_stage
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path), run_name="run")
    persisting: list[int] = []
    for batch in (1, 2, 3):
        ck.save_async(f"ep0-ba{batch}", timestamp=Timestamp(batch=batch))
        ck.wait()
        persisting.append(ck.scheduler._executor._threads.copy().pop().native_id)
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    lowered = os.getpriority(os.PRIO_PROCESS, persisting[-1])
    ck.close()
    assert lowered > main, "the persisting thread was expected to yield (the premise)"
    assert [p for _, p in seen] == [main] * 3, seen


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_load_runs_without_cyclic_gc_and_leaves_the_collector_as_it_found_it(
    tmp_path, enabled_before
):
    _, _, _, engine = make()
    folder = save(tmp_path, engine)
    _, _, _, target = make(seed=1)
    seen: list[bool] = []
    empty_like = target.stager.empty_like
    target.stager.empty_like = lambda tree, **kw: (
        seen.append(gc.isenabled()) or empty_like(tree, **kw)
    )
    (gc.enable if enabled_before else gc.disable)()
    try:
        target.load(folder, Manifest.read(folder))
        after = gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False]
    assert after is enabled_before


def _pointers(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_a_running_process_takes_the_verified_optimizer_buffers_and_no_buffer_stays_live(
    tmp_path,
):
    model, opt, _, engine = make()
    snap = snapshot(model, opt)
    folder = save(tmp_path / "a", engine)
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()  # the live state moves on from the checkpoint
    before = {id(v) for s in opt.state.values() for v in s.values()}
    param_ptrs = [p.data_ptr() for p in model.parameters()]
    engine.load(folder, Manifest.read(folder))
    assert_equal_state(model, opt, snap)
    after = {id(v) for s in opt.state.values() for v in s.values()}
    assert not before & after  # every state tensor (step counts too) was handed over
    assert [p.data_ptr() for p in model.parameters()] == param_ptrs  # the model is copied
    buffers = _pointers(engine.stager._buffers.values())
    assert len(buffers) == len(engine.stager._buffers)
    assert not buffers & _pointers(_live_tensors(model, opt))
    # An async save after the exchange stages a copy: training on does not reach the file.
    at_save = snapshot(model, opt)
    ck = ShardedCheckpointer(engine, RunFolder(tmp_path / "b"), run_name="run")
    ck.save_async("ep0-ba2", timestamp=Timestamp(batch=2))
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    ck.close()
    _, _, _, other = make(seed=5)
    other.load(tmp_path / "b" / "ep0-ba2", Manifest.read(tmp_path / "b" / "ep0-ba2"))
    assert_equal_state(other.components.model, other.components.optimizers["adam"], at_save)
    engine.load(folder, Manifest.read(folder))  # and back again, from the swapped buffers
    assert_equal_state(model, opt, snap)
    assert not _pointers(engine.stager._buffers.values()) & _pointers(_live_tensors(model, opt))


def test_optimizer_state_that_is_a_view_is_copied_into_not_handed_over():
    stager = HostStager()
    flat = torch.zeros(8)
    view = flat[:4]
    stager.empty_like({"optim": {"a": {"state": {"w": {"exp_avg": view}}}}})
    path = "/optim/a/state/w/exp_avg"
    buffer = stager._buffers[path]
    assert stager.holds(path, buffer) and not stager.holds(path, torch.zeros(4))
    held = optim_target._exchangeable(view, buffer, view, path, stager.holds)
    assert held is None  # another object (flat) sees this memory: it is copied into
    whole = torch.zeros(4)
    assert optim_target._exchangeable(whole, buffer, whole, path, stager.holds) is whole
    assert optim_target._exchangeable(whole, buffer, whole.clone(), path, stager.holds) is None
