"""SIGTERM and notice handling in-process, and the data-position overrides on resume."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from trainer_runtime import CheckpointManager, ConfigError, DataPositionError, Manifest
from trainer_runtime.sampler import ResumableSampler

from .trainkit import make, params, step


def test_sigterm_saves_at_the_next_step_then_exits_143(tmp_path, caplog):
    model = make()[0]
    ck = CheckpointManager(model=model, folder=tmp_path, run_name="r", interval="100ba")
    ck.batch_end(4)
    os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
    assert (tmp_path / "ep0-ba2").exists() is False
    with pytest.raises(SystemExit) as exc:
        ck.batch_end(4)
    assert exc.value.code == 143
    assert Manifest.read(tmp_path / "ep0-ba2").timestamp.batch == 2
    assert "emergency save ep0-ba2 done" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is not ck.preemption._on_sigterm  # restored


def test_sigterm_exits_with_the_configured_exit_code(tmp_path):
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path, run_name="r", interval="100ba", preemption_exit_code=7
    )
    ck.batch_end(4)
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        ck.batch_end(4)
    assert exc.value.code == 7
    assert Manifest.read(tmp_path / "ep0-ba2").timestamp.batch == 2


def test_notice_file_triggers_one_save_and_training_goes_on(tmp_path):
    notice = tmp_path / "notice"
    notice.write_text("")
    ck = CheckpointManager(
        model=make()[0],
        folder=tmp_path / "ck",
        run_name="r",
        interval="100ba",
        notice_file=str(notice),
    )
    assert ck.batch_end(1) is None
    notice.write_text('{"reason": "cloud.google.com/impending-node-termination"}')
    time.sleep(1.1)  # the file is looked at once a second, not every step
    saved = ck.batch_end(1)
    assert saved is not None and saved.name == "ep0-ba2"
    time.sleep(1.1)
    assert ck.batch_end(1) is None  # same notice: no second save
    ck.close()


def sampled_run(tmp_path, **kw):
    sampler = ResumableSampler(40, num_replicas=1, rank=0, seed=2, batch_size=4)
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path, run_name="r", interval="1ba", sampler=sampler, **kw
    )
    return ck, sampler


def test_sampler_position_saved_and_restored_without_user_code(tmp_path):
    ck, sampler = sampled_run(tmp_path)
    for _ in range(3):
        ck.batch_end(4)
    ck.close()
    ck2, sampler2 = sampled_run(tmp_path)
    ck2.resume()
    assert sampler2.offset == 12 and list(sampler2) == list(sampler)


def test_ignore_data_position_keeps_weights_and_step(tmp_path):
    ck, _ = sampled_run(tmp_path)
    for _ in range(3):
        ck.batch_end(4)
    ck.close()
    ck2, sampler2 = sampled_run(tmp_path, ignore_data_position=True)
    ck2.resume()
    assert (ck2.timestamp.batch, ck2.timestamp.batch_in_epoch, sampler2.offset) == (3, 0, 0)


def test_data_skip_steps(tmp_path):
    ck, _ = sampled_run(tmp_path)
    ck.batch_end(4)
    ck.close()
    ck2, sampler2 = sampled_run(tmp_path, data_skip_steps=2)
    ck2.resume()
    assert (ck2.timestamp.batch, sampler2.offset) == (1, 4 + 2 * 4)


def test_data_overrides_apply_once_not_at_every_relaunch(tmp_path):
    """The script keeps its overrides after the dataset changed; a preempted attempt's
    relaunch resumes at the exact data position its checkpoint saved (they restarted the
    epoch's data, or skipped data_skip_steps more steps, at every relaunch)."""
    ck, _ = sampled_run(tmp_path / "skip")
    ck.batch_end(4)
    ck.close()
    offsets = []
    for _ in range(3):  # the first attempt with the override, then two relaunches of it
        ck, sampler = sampled_run(tmp_path / "skip", data_skip_steps=2)
        ck.resume()
        offsets.append(sampler.offset)
        ck.batch_end(4)
        ck.close()
    assert offsets == [4 + 8, 12 + 4, 16 + 4]
    ck, sampler = sampled_run(tmp_path / "skip", data_skip_steps=1)  # another value: it skips
    ck.resume()
    assert sampler.offset == 24 + 4

    ck, _ = sampled_run(tmp_path / "ignore")
    for _ in range(3):
        ck.batch_end(4)
    ck.close()
    positions = []
    for _ in range(3):
        ck, sampler = sampled_run(tmp_path / "ignore", ignore_data_position=True)
        ck.resume()
        positions.append((ck.timestamp.batch, sampler.offset))
        ck.batch_end(4)
        ck.close()
    assert positions == [(3, 0), (4, 4), (5, 8)]


def test_both_overrides_kept_on_relaunch_resume_where_the_relaunched_run_saved(tmp_path):
    """ignore_data_position and data_skip_steps together: the first attempt restarts the
    epoch and skips 2 steps; its relaunches (same flags) go on from the sample their
    checkpoint saved. They went back by the skipped steps (the sampler was placed by the
    timestamp, which counts trained samples only) and repeated 8 samples at each relaunch."""
    ck, _ = sampled_run(tmp_path)
    for _ in range(3):
        ck.batch_end(4)
    ck.close()
    seen: list[int] = []
    positions = []
    for _ in range(3):
        ck, sampler = sampled_run(tmp_path, ignore_data_position=True, data_skip_steps=2)
        ck.resume()
        positions.append(sampler.offset)
        seen += list(sampler)[:4]  # the one step this attempt trains
        ck.batch_end(4)
        ck.close()
    assert positions == [8, 12, 16]
    assert seen == sampler.epoch_order()[8:20]


def test_global_batch_size_change_rescales_the_step(tmp_path):
    ck, _ = sampled_run(tmp_path)
    for _ in range(4):
        ck.batch_end(4)
    ck.close()
    ck2, sampler2 = sampled_run(tmp_path, global_batch_size=8)
    ck2.resume()
    assert (ck2.timestamp.sample, ck2.timestamp.batch, sampler2.offset) == (16, 2, 16)


def test_a_short_last_batch_is_not_a_global_batch_size_change(tmp_path):
    """40 samples in steps of 16: the epoch's last batch_end counts 8. A relaunch with the
    same global_batch_size keeps the step (it was rescaled 3 -> 2, as if the batch was 8)."""
    ck, _ = sampled_run(tmp_path, global_batch_size=16)
    for count in (16, 16, 8):
        ck.batch_end(count)
    ck.close()
    ck2, sampler2 = sampled_run(tmp_path, global_batch_size=16)
    ck2.resume()
    assert (ck2.timestamp.epoch, ck2.timestamp.batch, ck2.timestamp.sample) == (1, 3, 40)
    assert sampler2.offset == 0


def test_a_changed_dataset_is_refused_before_the_live_state_changes(tmp_path):
    """A resume onto a dataset of another size raises DataPositionError (it used to come
    after the weights and optimizer state were loaded, the step still 0); the checkpoint
    stays, and ignore_data_position=True then resumes from it."""
    model, opt, sched = make()[:3]
    ck = CheckpointManager(
        model=model, optimizer=opt, folder=tmp_path, run_name="r", sampler=ResumableSampler(40)
    )
    for _ in range(2):
        step(model, opt, sched)
        ck.batch_end(4)
    ck.close()
    model2, opt2 = make(seed=5)[:2]
    live = params(model2)
    grown = CheckpointManager(
        model=model2, optimizer=opt2, folder=tmp_path, run_name="r", sampler=ResumableSampler(50)
    )
    with pytest.raises(DataPositionError, match="dataset of 40 samples, this one has 50"):
        grown.resume()
    assert all(torch.equal(a, b) for a, b in zip(live, params(model2), strict=True))
    assert opt2.state_dict()["state"] == {} and grown.timestamp.batch == 0
    grown.close(save=False)
    retry = CheckpointManager(
        model=model2,
        optimizer=opt2,
        folder=tmp_path,
        run_name="r",
        sampler=ResumableSampler(50),
        ignore_data_position=True,
    )
    assert retry.resume().path.endswith("ep0-ba2") and retry.timestamp.batch == 2
    retry.close(save=False)


def test_batch_end_without_a_count_needs_the_samplers_batch_size_and_counts_nothing(tmp_path):
    """Refused before counting: the step moved on while the sampler stayed, and the message
    named advance(), which the script never called."""
    sampler = ResumableSampler(40, num_replicas=1, rank=0)
    ck = CheckpointManager(model=make()[0], folder=tmp_path, run_name="r", sampler=sampler)
    with pytest.raises(ConfigError, match=r"batch_end\(\) without num_samples="):
        ck.batch_end()
    assert (ck.timestamp.batch, sampler.offset) == (0, 0)
    ck.batch_end(4)
    assert (ck.timestamp.batch, sampler.offset) == (1, 4)
    ck.close(save=False)


def test_data_skip_steps_needs_a_sampler_with_batch_size(tmp_path):
    with pytest.raises(ConfigError, match="data_skip_steps needs sampler"):
        CheckpointManager(model=make()[0], folder=tmp_path, run_name="r", data_skip_steps=3)


def test_a_step_longer_than_the_grace_period_still_exits_143_by_the_deadline(tmp_path):
    """SIGTERM mid-step: the exit deadline (grace minus margin) runs from the signal, not from
    the next step boundary; a step that outlasts it ends with 143 at the deadline, unsaved,
    instead of being SIGKILLed by the kubelet at the grace period."""
    script = textwrap.dedent(
        f"""
        import sys, time, torch
        from trainer_runtime import CheckpointManager
        ck = CheckpointManager(
            model=torch.nn.Linear(2, 2), folder={str(tmp_path)!r}, run_name="r",
            interval="100ba", grace_period_s=3,
        )
        ck.batch_end(1)
        print("ready", flush=True)
        time.sleep(30)  # one step far longer than the grace period
        ck.batch_end(1)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready"
    signalled = time.monotonic()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=20)
    took = time.monotonic() - signalled
    assert child.returncode == 143, err
    assert took < 3, f"exited {took:.1f}s after SIGTERM; the deadline is 1 s (3 s - 2 s margin)"
    assert "still busy" in err and "exiting now with 143" in err
    assert not list(tmp_path.glob("ep0-*"))  # no step boundary came: nothing saved


def test_a_weights_only_load_ignores_the_saved_data_position(tmp_path):
    """``load_weights_only=True`` takes the model's weights and nothing else, so a checkpoint of
    a run over another dataset (fine-tuning elsewhere) loads: its data position is not used."""
    model, opt, sched = make()[:3]
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=tmp_path / "pre",
        run_name="r",
        sampler=ResumableSampler(40),
    )
    for _ in range(2):
        step(model, opt, sched)
        ck.batch_end(4)
    ck.close()
    model2, opt2 = make(seed=5)[:2]
    tuned = CheckpointManager(
        model=model2,
        optimizer=opt2,
        folder=tmp_path / "tune",
        run_name="t",
        sampler=ResumableSampler(50),
        load_path=str(tmp_path / "pre" / "ep0-ba2"),
        load_weights_only=True,
    )
    tuned.resume()
    assert all(torch.equal(a, b) for a, b in zip(params(model), params(model2), strict=True))
    assert tuned.timestamp.batch == 0 and tuned.sampler.offset == 0
    tuned.close(save=False)


def warnings_about(caplog, topic: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and topic in r.getMessage()
    ]


@pytest.mark.parametrize(
    "case",
    [
        ("2", None, "RTJ_GRACE_PERIOD_SECONDS=2"),
        ("0.5", None, "RTJ_GRACE_PERIOD_SECONDS=0.5"),
        (None, 1.5, "grace_period_s=1.5"),
        ("60", 2, "grace_period_s=2"),  # the argument wins over the variable, and is named
    ],
)
def test_a_grace_period_within_the_exit_margin_is_warned_about_once(
    tmp_path, monkeypatch, caplog, case
):
    """A grace period at or below the 2 s margin puts the exit deadline at the signal itself:
    no time for the emergency save, and nothing said about it until a preemption lost work."""
    env, arg, named = case
    if env is None:
        monkeypatch.delenv("RTJ_GRACE_PERIOD_SECONDS", raising=False)
    else:
        monkeypatch.setenv("RTJ_GRACE_PERIOD_SECONDS", env)
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        ck = CheckpointManager(model=make()[0], folder=tmp_path, run_name="r", grace_period_s=arg)
        ck.batch_end(4)
        ck.close()
    warned = warnings_about(caplog, "grace period")
    assert len(warned) == 1, warned
    assert named in warned[0] and "2.0 s margin" in warned[0], warned[0]
    assert ck._response.grace_period_s == float(arg if arg is not None else env)  # still tries


@pytest.mark.parametrize(("env", "kw"), [("2.5", {}), ("30", {}), ("1", {"handle_sigterm": False})])
def test_a_grace_period_past_the_margin_or_unused_is_not_warned_about(
    tmp_path, monkeypatch, caplog, env, kw
):
    monkeypatch.setenv("RTJ_GRACE_PERIOD_SECONDS", env)
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        CheckpointManager(model=make()[0], folder=tmp_path, run_name="r", **kw).close()
    assert warnings_about(caplog, "grace period") == []


def samplerless_run(tmp_path, *, count: int | None, **kw):
    """Epoch 0 in full (10 batches of 4 of 40 samples), then 3 batches of epoch 1, saved
    by a manager that has no sampler; ``count`` is what batch_end() is given."""
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path, run_name="r", interval="1ba", sampler=None, **kw
    )
    for _ in range(10):
        ck.batch_end(count)
    ck.epoch_end()
    for _ in range(3):
        ck.batch_end(count)
    ck.close(save=False)
    return ck


def resume_with_sampler(tmp_path, caplog, **sampler_kw):
    sampler = ResumableSampler(40, num_replicas=1, rank=0, seed=2, **sampler_kw)
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path, run_name="r", interval="1ba", sampler=sampler
    )
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        ck.resume()
    ck.close(save=False)
    return ck, sampler


def epoch1_after(offset: int) -> list[int]:
    return ResumableSampler(40, num_replicas=1, rank=0, seed=2).epoch_order(1)[offset:]


@pytest.mark.parametrize(
    "saving",
    [
        {"count": 4},  # batch_end(num_samples=4): the timestamp counts the samples
        {"count": None, "global_batch_size": 4},  # batch_end(): the saved global batch counts
    ],
)
def test_a_checkpoint_saved_without_a_sampler_places_one_at_its_timestamp(tmp_path, caplog, saving):
    """The sampler started epoch 0 at sample 0 although the checkpoint's timestamp said
    epoch 1, 12 samples in: the run trained epoch 0's data again."""
    samplerless_run(tmp_path, **saving)
    ck, sampler = resume_with_sampler(tmp_path, caplog)
    assert (ck.timestamp.epoch, ck.timestamp.batch_in_epoch) == (1, 3)
    assert (sampler.epoch, sampler.offset) == (1, 12)
    assert list(sampler) == epoch1_after(12)
    assert warnings_about(caplog, "data position") == []
    assert "checkpoint saved without a sampler: no sampler state" in caplog.text


def test_a_checkpoint_without_a_sample_count_says_the_data_position_is_not_restored(
    tmp_path, caplog
):
    """batch_end() without num_samples and no global_batch_size: the saving run never said
    how many samples a batch held, so the position in the epoch is unknown."""
    samplerless_run(tmp_path, count=None)
    _, sampler = resume_with_sampler(tmp_path, caplog)
    assert (sampler.epoch, sampler.offset) == (1, 0)  # the right epoch, from its start
    assert list(sampler) == epoch1_after(0)
    warned = warnings_about(caplog, "data position")
    assert len(warned) == 1, warned
    assert "not restored" in warned[0] and "3 batches of epoch 1" in warned[0]
    assert "no sample count" in warned[0] and "data_skip_steps=3" in warned[0]


def test_a_sampler_with_a_batch_size_at_the_saved_world_size_counts_the_batches(tmp_path, caplog):
    samplerless_run(tmp_path, count=None)
    _, sampler = resume_with_sampler(tmp_path, caplog, batch_size=4)
    assert (sampler.epoch, sampler.offset) == (1, 12)
    assert warnings_about(caplog, "data position") == []
