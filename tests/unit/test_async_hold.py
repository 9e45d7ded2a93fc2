"""How long an async save holds training, as recorded per save, and staging memory prepared
after the first step (``trainer_runtime.save.staging_gate``), on a real model and filesystem."""

from __future__ import annotations

import threading
import time

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainer_runtime import events
from trainer_runtime.sharded.engine import ShardedEngine
from trainer_runtime.sharded.staging import HostStager
from trainer_runtime.sharded.storage import HashingWriter

from .trainkit import make, manager, params, saved_weights, step


def state_bytes(model, opt) -> int:
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return n + sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )


def test_the_wait_of_the_next_step_for_the_copy_is_recorded_as_held_time(tmp_path, capsys):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba", async_save=True)
    step(model, opt, sched)
    # The copy queues behind this blocker, which lets go 0.4 s after the next optimizer step
    # began: the step must then wait at the gate's hook, however slow a busy machine makes the
    # forward and backward passes before it.
    release = threading.Event()
    ck.engine.on_staging_thread(lambda: release.wait(30) and 0)
    timer = threading.Timer(0.4, release.set)
    started = register_optimizer_step_pre_hook(lambda *_: timer.start())  # one step only
    ck.timestamp.batch = 1
    at_save = params(model)
    ck.save()  # its gate's hook comes after the one above
    t0 = time.perf_counter()
    try:
        step(model, opt, sched)  # waits at the pre-step hook until the copy is done
    finally:
        started.remove()
        timer.cancel()
        release.set()
    step_s = time.perf_counter() - t0
    ck.wait()
    saved = ck.saved[-1]
    ck.close(save=False)
    timing = saved.timing
    assert 0.2 < timing.waited_s <= step_s, (timing, step_s)
    assert timing.call_s < 0.2 and timing.staging_s > 0
    assert abs(saved.held_s - (timing.call_s + timing.waited_s)) < 1e-9
    got = saved_weights(saved.path)  # the held step did not leak into the save
    assert all(torch.equal(got[k], b) for k, b in zip(model.state_dict(), at_save, strict=True))
    (event,) = events.read_events(capsys.readouterr().err, "committed")
    assert event.fields["held_s"] == round(saved.held_s, 3)


def test_a_step_after_the_copy_is_not_held(tmp_path):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba", async_save=True)
    step(model, opt, sched)
    ck.timestamp.batch = 1
    ck.save()
    ck.wait_for_snapshot()  # an explicit wait is not a hold of training by the save
    step(model, opt, sched)
    ck.wait()
    assert ck.saved[-1].timing.waited_s == 0.0
    ck.close(save=False)


def test_a_sync_save_holds_training_for_the_whole_call(tmp_path, capsys):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba")
    step(model, opt, sched)
    ck.timestamp.batch = 1
    t0 = time.perf_counter()
    saved = ck.save(blocking=True)
    call_s = time.perf_counter() - t0
    ck.close(save=False)
    assert saved is not None
    assert saved.timing.waited_s == 0.0 and 0 < saved.held_s <= call_s
    (event,) = events.read_events(capsys.readouterr().err, "committed")
    assert event.fields["held_s"] == round(saved.held_s, 3)  # one figure, reported and kept


def test_staging_buffers_are_allocated_after_the_first_step_and_reused_by_the_save(tmp_path):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba", async_save=True)
    assert ck.engine.stager.nbytes == 0
    step(model, opt, sched)  # creates AdamW's state, then queues the allocation
    assert ck.saver.prewarm is not None and ck.saver.prewarm.done is not None
    allocated = ck.saver.prewarm.done.result(timeout=30)
    assert allocated == state_bytes(model, opt) == ck.engine.stager.nbytes
    buffers = {k: b.data_ptr() for k, b in ck.engine.stager._buffers.items()}
    step(model, opt, sched)  # the hook fired once: no second allocation
    ck.timestamp.batch = 2
    ck.save()
    ck.wait()
    assert {k: b.data_ptr() for k, b in ck.engine.stager._buffers.items()} == buffers
    ck.close(save=False)


def test_no_staging_memory_without_async_saves(tmp_path):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba")
    step(model, opt, sched)
    assert ck.saver.prewarm is None and ck.engine.stager.nbytes == 0
    ck.close(save=False)


def _other_checkpoint(tmp_path):
    """A committed checkpoint of another state (seed 5, three steps), and that state."""
    model, opt, sched, _ = comps = make(seed=5)
    for _ in range(3):
        step(model, opt, sched)
    ck = manager(tmp_path / "other", comps, interval="1000ba")
    ck.timestamp.batch = 3
    saved = ck.save(blocking=True)
    ck.close(save=False)
    assert saved is not None
    return saved.path, params(model)


def test_a_load_while_a_save_persists_waits_for_that_save(tmp_path, monkeypatch):
    # The load reads into the staging buffers the persisting save writes from; before the
    # wait, that save committed the loaded weights under its own name, checksums valid.
    other, other_params = _other_checkpoint(tmp_path)
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba", async_save=True)
    step(model, opt, sched)
    writes = HashingWriter.write_data

    def slow_write(self, plan, planner):
        time.sleep(0.5)
        return writes(self, plan, planner)

    monkeypatch.setattr(HashingWriter, "write_data", slow_write)
    ck.timestamp.batch = 1
    at_save = params(model)
    ck.save()
    ck.wait_for_snapshot()
    assert ck.saver.persisting()
    ck.load(other)
    assert not ck.saver.persisting()
    ck.wait()
    saved = ck.saved[-1]
    ck.close(save=False)
    got = saved_weights(saved.path)
    assert all(torch.equal(got[k], b) for k, b in zip(model.state_dict(), at_save, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(params(model), other_params, strict=True))


def test_a_load_waits_for_the_first_touch_of_the_staging_buffers(tmp_path, monkeypatch):
    # The first touch zeroes buffers it allocated; a load reading into them meanwhile would
    # lose what it read after its digests had passed.
    other, other_params = _other_checkpoint(tmp_path)
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1000ba", async_save=True)
    touched, loading = [], []
    preallocate, load = HostStager.preallocate, ShardedEngine.load

    def slow_preallocate(self, tree):
        time.sleep(0.5)
        out = preallocate(self, tree)
        touched.append(time.monotonic())
        return out

    def timed_load(self, *args, **kwargs):
        loading.append(time.monotonic())
        return load(self, *args, **kwargs)

    monkeypatch.setattr(HostStager, "preallocate", slow_preallocate)
    monkeypatch.setattr(ShardedEngine, "load", timed_load)
    step(model, opt, sched)  # queues the first touch on the staging thread
    ck.load(other)
    assert ck.saver.prewarm is not None and ck.saver.prewarm.done is not None
    ck.saver.prewarm.done.result(timeout=30)
    ck.close(save=False)
    assert touched[0] <= loading[0], "the load began before the staging buffers were touched"
    assert all(torch.equal(a, b) for a, b in zip(params(model), other_params, strict=True))
