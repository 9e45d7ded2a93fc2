"""Single-process behaviour of the checkpoint core on a real filesystem."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import threading
from datetime import timedelta

import numpy as np
import pytest
import torch

from trainer_runtime import (
    CheckpointManager,
    ConfigError,
    IncompatibleCheckpointError,
    Manifest,
    NoCheckpointError,
    OverwriteError,
    ResumableSampler,
    SaveFailedError,
)
from trainer_runtime.save.manifest import hash_file

from .trainkit import Counter, make, params, saved_keys, saved_weights, step


def manager(tmp_path, comps, **kw):
    model, opt, sched, scaler = comps[:4]
    kw.setdefault("run_name", "run")
    kw.setdefault("interval", "3ba")
    return CheckpointManager(
        model=model, optimizer=opt, scheduler=sched, scaler=scaler, folder=tmp_path / "ck", **kw
    )


def draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def test_resume_is_exact_for_every_piece_of_state(tmp_path):
    comps = make()
    counter = Counter()
    ck = manager(tmp_path, comps, stateful={"counter": counter})
    assert ck.resume().source == "fresh"
    for _ in range(6):
        step(*comps[:3], counter)
        if ck.timestamp.batch == 2:
            ck.metrics["loss"] = 0.25
            ck.extras["note"] = "hello"
        ck.batch_end(num_samples=16)
    ck.close()
    assert [s.name for s in ck.saved] == ["ep0-ba3", "ep0-ba6"]

    # Reference: an uninterrupted run of 9 steps.
    ref = make()
    for _ in range(9):
        step(*ref[:3])
    ref_draws = draws()

    # Crash after batch 6 is committed: a new process would rebuild everything, then resume.
    comps2 = make(seed=123)  # different seed everywhere: only the checkpoint can fix it
    counter2 = Counter()
    ck2 = manager(tmp_path, comps2, stateful={"counter": counter2})
    res = ck2.resume()
    assert res.source == "checkpoint" and res.path.endswith("ep0-ba6")
    assert (ck2.timestamp.batch, ck2.timestamp.sample, counter2.value) == (6, 96, 6)
    assert ck2.metrics == {"loss": 0.25} and ck2.extras == {"note": "hello"}
    assert comps2[2].state_dict()["last_epoch"] == 6
    assert comps2[3].get_scale() == 1024.0
    for _ in range(3):
        step(*comps2[:3])
    assert all(torch.equal(a, b) for a, b in zip(params(comps2[0]), params(ref[0]), strict=True))
    assert draws() == ref_draws
    ck2.close()


def test_manifest_lists_files_with_size_and_checksum(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba")
    ck.batch_end(8)
    ck.close()
    folder = tmp_path / "ck" / "ep0-ba1"
    m = Manifest.read(folder)
    assert (m.run_name, m.world_size, m.timestamp.batch, m.timestamp.sample) == ("run", 1, 1, 8)
    assert m.save_duration_s > 0 and m.created_at
    assert m.format_version == 2
    assert sorted(e.path for e in m.files) == [".metadata", "__0_0.distcp"]
    for entry in m.files:
        assert entry.rank == 0
        assert (entry.size, entry.xxh3_128) == hash_file(folder / entry.path)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "manifest.json",
    ]
    pointer = json.loads((tmp_path / "ck" / "latest.json").read_text())
    assert pointer["checkpoint"] == "ep0-ba1"
    assert (tmp_path / "ck" / "latest-rank0").resolve() == folder.resolve()


def test_weights_only_save_and_load(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba", weights_only=True)
    step(*comps[:3])
    ck.batch_end(16)
    ck.close()
    m = Manifest.read(tmp_path / "ck" / "ep0-ba1")
    assert m.weights_only
    keys = saved_keys(tmp_path / "ck" / "ep0-ba1")
    assert keys and all(k.startswith(("model.", "ranks.")) for k in keys), keys  # no optimizer
    assert any(k.startswith("model.") for k in keys)

    fresh = make(seed=5)
    ck2 = CheckpointManager(
        model=fresh[0],
        optimizer=fresh[1],
        folder=tmp_path / "other",
        run_name="ft",
        autoresume=True,
        load_path=str(tmp_path / "ck"),
        load_weights_only=True,
    )
    res = ck2.resume()
    assert res.source == "load_path" and ck2.timestamp.batch == 0
    assert all(torch.equal(a, b) for a, b in zip(params(fresh[0]), params(comps[0]), strict=True))
    assert fresh[1].state_dict()["state"] == {}  # optimizer untouched
    ck2.close()


def test_load_path_is_ignored_once_the_run_has_checkpoints(tmp_path):
    base = make(seed=1)
    src = manager(tmp_path / "src", base, interval="1ba")
    src.batch_end(1)
    src.close()
    comps = make(seed=2)
    kw = dict(load_path=str(tmp_path / "src" / "ck"), load_weights_only=True, interval="1ba")
    ck = manager(tmp_path, comps, **kw)
    assert ck.resume().source == "load_path"
    step(*comps[:3])
    ck.batch_end(4)
    ck.close()
    ck2 = manager(tmp_path, make(seed=3), **kw)
    res = ck2.resume()
    assert res.source == "checkpoint" and ck2.timestamp.batch == 1
    ck2.close()


def test_incompatible_model_names_keys_and_shapes(tmp_path):
    comps = make(hidden=8)
    ck = manager(tmp_path, comps, interval="1ba")
    ck.batch_end(1)
    ck.close()
    other = make(hidden=6)
    bad = CheckpointManager(model=other[0], folder=tmp_path / "ck", run_name="run")
    with pytest.raises(IncompatibleCheckpointError) as err:
        bad.resume()
    msg = str(err.value)
    assert "0.weight: checkpoint (8, 4) vs model (6, 4)" in msg
    assert "1.running_mean" in msg


def test_non_strict_and_ignored_keys(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba")
    ck.batch_end(1)
    ck.close()
    path = tmp_path / "ck" / "ep0-ba1"

    model = torch.nn.Sequential(*list(make(seed=9)[0])[:3])  # no last layer
    loader = CheckpointManager(model=model, folder=tmp_path / "x", run_name="x")
    with pytest.raises(IncompatibleCheckpointError, match=r"not in model: 3\.bias, 3\.weight"):
        loader.load(path)
    loader.load(path, strict=False)
    assert torch.equal(model[0].weight, comps[0][0].weight)

    target = make(seed=9)
    before = target[0][3].weight.detach().clone()
    loader2 = CheckpointManager(
        model=target[0], optimizer=target[1], folder=tmp_path / "y", run_name="y"
    )
    loader2.load(path, ignore_keys=["state/model/3.*", "state/optimizers", "rng"])
    assert torch.equal(target[0][3].weight, before)
    assert torch.equal(target[0][0].weight, comps[0][0].weight)
    assert target[1].state_dict()["state"] == {}


def write_two(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba")
    ck.batch_end(1)
    ck.batch_end(1)
    ck.close()
    return tmp_path / "ck"


def truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def flip(p):
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    p.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: truncate(d / "__0_0.distcp"), "has "),
        (lambda d: flip(d / "__0_0.distcp"), "fail their checksum"),
        (lambda d: (d / "__0_0.distcp").unlink(), "is missing"),
        (lambda d: (d / "manifest.json").unlink(), "does not exist (checkpoint not committed)"),
        (
            lambda d: (d / "manifest.json").write_text('{"format": "rtj-checkpoint", "form'),
            "not valid JSON",
        ),
    ],
    ids=["truncated", "flipped-byte", "deleted-rank-file", "deleted-manifest", "torn-manifest"],
)
def test_damaged_newest_falls_back_with_reason(tmp_path, caplog, damage, reason):
    root = write_two(tmp_path)
    damage(root / "ep0-ba2")
    ck = manager(tmp_path, make(seed=4))
    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        res = ck.resume()
    assert res.path.endswith("ep0-ba1") and ck.timestamp.batch == 1
    assert any("ep0-ba2" in r.getMessage() and reason in r.getMessage() for r in caplog.records)
    assert res.fallbacks and reason in res.fallbacks[0]


def test_a_file_of_the_wrong_size_is_named_with_both_sizes_and_the_checkpoint_once(tmp_path):
    """The fallback line and a load_path's error say which file, the size found, the size
    expected, and name the checkpoint once."""
    root = write_two(tmp_path)
    data = root / "ep0-ba2" / "__0_0.distcp"
    size = data.stat().st_size
    truncate(data)
    shutil.copytree(root / "ep0-ba2", tmp_path / "broken" / "ep0-ba2")
    ck = manager(tmp_path, make(seed=4), autoresume=True)
    (line,) = ck.resume().fallbacks
    ck.close(save=False)
    said = (
        f"__0_0.distcp (rank 0) has {size - 100} bytes, expected {size} (its size in the manifest)"
    )
    assert line == f"ep0-ba2: on rank 0, {said}"
    with pytest.raises(NoCheckpointError) as raised:
        manager(
            tmp_path / "other",
            make(),
            autoresume=False,
            load_path=str(tmp_path / "broken" / "ep0-ba2"),
        ).resume()
    assert said in str(raised.value) and str(raised.value).count("ep0-ba2") == 1, raised.value


def test_quarantined_checkpoint_is_skipped(tmp_path, monkeypatch):
    write_two(tmp_path)
    monkeypatch.setenv("RTJ_QUARANTINED", "s3://b/p/run/ep0-ba2")
    ck = manager(tmp_path, make())
    assert ck.resume().path.endswith("ep0-ba1")


def test_retention_keeps_newest_n(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba", num_checkpoints_to_keep=2)
    for _ in range(5):
        ck.batch_end(1)
    ck.close()
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.is_dir() and not p.is_symlink())
    assert names == ["ep0-ba4", "ep0-ba5"]


@pytest.mark.parametrize("async_save", [False, True])
def test_a_second_save_at_the_same_position_writes_nothing(tmp_path, async_save):
    comps = make()
    ck = manager(tmp_path, comps, interval="1000ba", async_save=async_save)
    step(*comps[:3])
    ck.batch_end(1)
    first = ck.save()
    assert (first is None) == async_save  # an async save commits in the background
    assert ck.save() is None  # in flight or committed: the same position is not written again
    ck.wait()
    assert [c.name for c in ck.saved] == ["ep0-ba1"]
    step(*comps[:3])
    ck.batch_end(1)
    ck.save()
    ck.close()
    assert [c.name for c in ck.saved] == ["ep0-ba1", "ep0-ba2"]
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.is_dir() and not p.is_symlink())
    assert names == ["ep0-ba1", "ep0-ba2"]


def test_a_name_without_batch_never_rewrites_a_committed_checkpoint(tmp_path, monkeypatch):
    """``ep{epoch}`` names every save of an epoch alike: each save after the first gets
    ``-ba<batch>``, so no save writes into a committed checkpoint; one that fails leaves the
    committed ones as they were."""
    from trainer_runtime.sharded import engine

    comps = make()
    ck = manager(tmp_path, comps, interval="1ba", filename="ep{epoch}/rank{rank}.pt")
    names = []
    for _ in range(3):
        step(*comps[:3])
        names.append(ck.batch_end(1).name)
    assert names == ["ep0", "ep0-ba2", "ep0-ba3"]
    first = (tmp_path / "ck" / "ep0" / "manifest.json").read_bytes()
    write = engine.ShardedEngine.write

    def disk_full(self, *args, **kwargs):
        write(self, *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine.ShardedEngine, "write", disk_full)
    step(*comps[:3])
    with pytest.raises(SaveFailedError):
        ck.batch_end(1)
    monkeypatch.setattr(engine.ShardedEngine, "write", write)
    ck.close(save=False)
    assert (tmp_path / "ck" / "ep0" / "manifest.json").read_bytes() == first
    assert [m.name for m in ck.folder.committed()] == ["ep0-ba3", "ep0-ba2", "ep0"]
    again = make(seed=1)
    resumed = manager(tmp_path, again, interval="1ba", filename="ep{epoch}/rank{rank}.pt")
    assert os.path.basename(resumed.resume().path) == "ep0-ba3"
    assert resumed.timestamp.batch == 3
    step(*again[:3])
    resumed.epoch_end()
    resumed.close()
    assert (tmp_path / "ck" / "ep1" / "manifest.json").exists()


@pytest.mark.parametrize(
    "filename, loop, expected",
    [
        # batch_end() without num_samples counts no sample: every save rendered "s0"
        ("s{sample}/rank{rank}.pt", "batch_end", ["s0", "s0-ba2", "s0-ba3"]),
        # epoch_end() alone counts no batch: every save rendered "ba0"
        ("ba{batch}/rank{rank}.pt", "epoch_end", ["ba0", "ba0-ba0", "ba0-ba0-2"]),
    ],
)
def test_a_sample_or_batch_name_that_repeats_never_rewrites_a_committed_checkpoint(
    tmp_path, filename, loop, expected
):
    """Names with {sample} or {batch} were taken to differ at every save, so a repeated one
    was written into the committed checkpoint of that name, in place: three saves left one
    folder, "s0", holding the last."""
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba" if loop == "batch_end" else 1, filename=filename)
    saved = []
    for _ in range(3):
        step(*comps[:3])
        saved.append(getattr(ck, loop)())
    ck.close(save=False)
    assert [s.name for s in saved] == expected
    assert sorted(m.name for m in ck.folder.committed()) == sorted(expected)
    for s in saved:  # each checkpoint holds its own position, as committed
        assert Manifest.read(s.path).timestamp.to_dict() == s.timestamp.to_dict()


def test_a_repeated_sample_name_is_not_written_into_a_checkpoint_of_an_earlier_attempt(tmp_path):
    """Only names this process's saves had rendered were looked up: the relaunch's first save
    rendered "s0" again (no sample counted) and was written into the first attempt's
    committed s0, in place; it gets s0-ba3."""
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba", filename="s{sample}/rank{rank}.pt")
    for _ in range(2):
        step(*comps[:3])
        ck.batch_end()
    ck.close()
    first = Manifest.read(tmp_path / "ck" / "s0")
    again = make()
    ck = manager(tmp_path, again, interval="1ba", filename="s{sample}/rank{rank}.pt")
    assert ck.resume().path.endswith("s0-ba2")
    step(*again[:3])
    assert ck.batch_end().name == "s0-ba3"
    ck.close()
    assert Manifest.read(tmp_path / "ck" / "s0").to_json() == first.to_json()


def test_retention_uncommits_at_once_and_deletes_in_the_background(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba", num_checkpoints_to_keep=1)
    ck.batch_end(1)
    ck.batch_end(1)  # a sync save: returns once ep0-ba2 is committed and ep0-ba1 uncommitted
    assert not (tmp_path / "ck" / "ep0-ba1" / "manifest.json").exists()
    assert [m.name for m in ck.folder.committed()] == ["ep0-ba2"]
    ck.wait()  # waits for the deletion too
    assert not (tmp_path / "ck" / "ep0-ba1").exists()
    ck.batch_end(1)
    ck.close()
    assert not (tmp_path / "ck" / "ep0-ba2").exists()
    assert (tmp_path / "ck" / "ep0-ba3" / "manifest.json").exists()


def test_retention_spares_checkpoints_still_uploading(tmp_path):
    class Uploading:
        """Stands in for the object-store seam: it reports ep0-ba1 as still uploading."""

        def submit(self, run_dir, manifest, rank):
            pass

        def pending(self):
            return {"ep0-ba1"}

        def uri_for(self, name):
            return f"s3://b/{name}"

        def find_newest(self, *, exclude, pass_over=None):
            raise AssertionError("this test does not resume")

        def fetch(self, name, run_dir, ranks):
            raise AssertionError("this test does not resume")

        def close(self):
            pass

    ck = manager(tmp_path, make(), interval="1ba", num_checkpoints_to_keep=1, remote=Uploading())
    for _ in range(3):
        ck.batch_end(1)
    ck.close()
    names = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.is_dir() and not p.is_symlink())
    assert names == ["ep0-ba1", "ep0-ba3"]


@pytest.mark.parametrize("keep", [0, -2])
def test_bad_retention_value(tmp_path, keep):
    with pytest.raises(ConfigError, match="num_checkpoints_to_keep"):
        manager(tmp_path, make(), num_checkpoints_to_keep=keep)


BAD_ARGUMENTS = {
    # wrong type: a ConfigError naming the argument and the type, never a bare TypeError
    "num_checkpoints_to_keep='3'": (
        {"num_checkpoints_to_keep": "3"},
        "num_checkpoints_to_keep='3': expected an int, -1 (keep all) or a positive count; got a",
    ),
    "num_checkpoints_to_keep=True": ({"num_checkpoints_to_keep": True}, "expected an int"),
    "data_skip_steps=1.0": ({"data_skip_steps": 1.0}, "data_skip_steps=1.0: expected an int"),
    "global_batch_size='8'": ({"global_batch_size": "8"}, "global_batch_size='8': expected an int"),
    "grace_period_s=True": ({"grace_period_s": True}, "grace_period_s=True: expected seconds"),
    "upload_flush_timeout_s='5'": (
        {"upload_flush_timeout_s": "5"},
        "upload_flush_timeout_s='5': expected seconds >= 0",
    ),
    "overwrite='yes'": ({"overwrite": "yes"}, "overwrite='yes': expected True or False, got a str"),
    "final_save=1": ({"final_save": 1}, "final_save=1: expected True or False, got an int"),
    "handle_sigterm=None": ({"handle_sigterm": None}, "handle_sigterm=None: expected True or"),
    # object-store retention: the public names, and checked even with a local folder
    "num_local_checkpoints_to_keep=-5": (
        {"num_local_checkpoints_to_keep": -5},
        "num_local_checkpoints_to_keep=-5: expected None or a count >= 0",
    ),
    "num_local_checkpoints_to_keep='1'": (
        {"num_local_checkpoints_to_keep": "1"},
        "num_local_checkpoints_to_keep='1': expected an int",
    ),
    "num_remote_checkpoints_to_keep=0": (
        {"num_remote_checkpoints_to_keep": 0},
        "num_remote_checkpoints_to_keep=0: expected -1 (keep all) or a positive count",
    ),
    "num_remote_checkpoints_to_keep=0 (s3)": (
        {"num_remote_checkpoints_to_keep": 0, "folder": "s3://bucket/p/{run_name}"},
        "num_remote_checkpoints_to_keep=0: expected -1",
    ),
    "num_local_checkpoints_to_keep=-5 (s3)": (
        {"num_local_checkpoints_to_keep": -5, "folder": "s3://bucket/p/{run_name}"},
        "num_local_checkpoints_to_keep=-5: expected None or a count >= 0",
    ),
    # preemption: checked now, not at SIGTERM
    "preemption_exit_code='x'": (
        {"preemption_exit_code": "x"},
        "preemption_exit_code='x': expected an int, an exit status 0-255",
    ),
    "preemption_exit_code=300": (
        {"preemption_exit_code": 300},
        "preemption_exit_code=300: expected an exit status 0-255",
    ),
    "preemption_exit_code=-1": ({"preemption_exit_code": -1}, "expected an exit status 0-255"),
    "preemption_exit_code=True": ({"preemption_exit_code": True}, "expected an int"),
    "coordination_timeout=5": (
        {"coordination_timeout": 5},
        "coordination_timeout=5: expected a datetime.timedelta > 0",
    ),
    "coordination_timeout=0s": ({"coordination_timeout": timedelta(0)}, "expected a datetime"),
    # names: a plain string would be split into characters
    "quarantined='ep1-ba2'": (
        {"quarantined": "ep1-ba2"},
        "quarantined='ep1-ba2': expected a list of checkpoint names, e.g. ['ep1-ba2']",
    ),
    "quarantined=[1]": ({"quarantined": [1]}, "quarantined=[1]: expected a list of"),
    "load_ignore_keys='optimizer'": (
        {"load_ignore_keys": "optimizer"},
        "load_ignore_keys='optimizer': expected a list of key prefixes",
    ),
    "run_name=5": ({"run_name": 5}, "run_name=5 must be a non-empty name"),
    "run_name=.": ({"run_name": "."}, "run_name='.' must be a non-empty name without '/': not"),
    # load_path: the same URI checks as the folder, at construction rather than at resume()
    "load_path='gs://x/y'": (
        {"load_path": "gs://x/y"},
        "load_path='gs://x/y': unsupported scheme gs://; expected s3://BUCKET/PREFIX "
        "(Google Cloud Storage",
    ),
    "load_path='oci://b/p'": ({"load_path": "oci://b/p"}, "(OCI Object Storage: use s3://"),
    "load_path='s3a://b/p'": ({"load_path": "s3a://b/p"}, "s3a:// is Hadoop's spelling"),
    "load_path='https://h/b'": (
        {"load_path": "https://h/b"},
        "load_path='https://h/b': unsupported scheme https://",
    ),
    "load_path=5": ({"load_path": 5}, "load_path=5: expected a path or an s3:// URI, got an int"),
    "notice_file=5": ({"notice_file": 5}, "notice_file=5: expected a file path"),
    "notice_file='/'": ({"notice_file": "/"}, "notice_file='/' is a folder: expected the notice"),
    # the live objects: checked at construction, not at the first save
    "model='net'": ({"model": "net"}, "model: expected a torch.nn.Module, got str"),
    "optimizer='sgd'": (
        {"optimizer": "sgd"},
        "optimizer: expected an object with state_dict() and load_state_dict() (or a list or "
        "dict of them), got str",
    ),
    "optimizer=[ok, 5]": (
        {"optimizer": [torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), 5]},
        "optimizer[1]: expected an object with state_dict()",
    ),
    "scheduler=5": ({"scheduler": 5}, "scheduler: expected an object with state_dict()"),
    "scaler=5": ({"scaler": 5}, "scaler: expected an object with state_dict()"),
    "stateful=[1, 2]": ({"stateful": [1, 2]}, "stateful: expected a dict of name -> an object"),
    "stateful={'x': 5}": ({"stateful": {"x": 5}}, "stateful['x']: expected an object with"),
    "sampler=object()": (
        {"sampler": object()},
        "sampler: expected a trainer_runtime.ResumableSampler, got object",
    ),
    "resume_from=5": (
        {"resume_from": 5},
        "resume_from=5: expected a checkpoint's name or path, got an int",
    ),
    "folder=123": ({"folder": 123}, "folder=123: expected a path or an s3:// URI, got an int"),
    "folder='gs://x/root/{run_name}'": (
        {"folder": "gs://x/root/{run_name}"},
        "folder='gs://x/root/{run_name}': unsupported scheme gs://",
    ),
    "folder='s3:///root'": ({"folder": "s3:///root"}, "folder='s3:///root' names no bucket"),
    "folder=''": ({"folder": ""}, "folder='': expected a path or an s3:// URI, got an empty"),
    # a TypeError deep in locate_run for an s3:// folder, accepted silently for a local one
    "local_folder=3": (
        {"local_folder": 3},
        "local_folder=3: expected None or a folder path (str or os.PathLike), got an int",
    ),
    # an s3:// run was staged in the working directory
    "local_folder=''": (
        {"local_folder": ""},
        "local_folder='': expected None or a folder path, got an empty string",
    ),
    # AttributeError: 'int' object has no attribute 'uri_for'
    "remote=3": (
        {"remote": 3},
        "remote=3: expected None or an object-store backend with submit, pending, find_newest",
    ),
}


@pytest.mark.parametrize("kw, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_argument_is_a_config_error_naming_it(tmp_path, kw, message):
    args = {"model": make()[0], "folder": tmp_path / "ck", "run_name": "run", **kw}
    with pytest.raises(ConfigError) as err:
        CheckpointManager(**args)
    assert message in str(err.value)
    assert not (tmp_path / "ck").exists(), "refused before anything was created"


@pytest.mark.parametrize(
    "variable, value, message",
    [
        (
            "RTJ_CHECKPOINT_DIR",
            "gs://x/envroot",
            "RTJ_CHECKPOINT_DIR='gs://x/envroot': unsupported scheme gs://; expected "
            "s3://BUCKET/PREFIX (Google Cloud Storage",
        ),
        ("RTJ_CHECKPOINT_DIR", "s3://", "RTJ_CHECKPOINT_DIR='s3://' names no bucket"),
        ("RTJ_CHECKPOINT_DIR", "s3://Bad_Bucket/p", "RTJ_CHECKPOINT_DIR='s3://Bad_Bucket/p'"),
        ("RTJ_RUN_NAME", "a/b", "RTJ_RUN_NAME='a/b' must be a non-empty name without '/'"),
        ("RTJ_RUN_NAME", "..", "RTJ_RUN_NAME='..' must be a non-empty name without '/': not '.'"),
        ("RTJ_NOTICE_FILE", "/", "RTJ_NOTICE_FILE='/' is a folder: expected the notice file"),
        (
            "RTJ_GRACE_PERIOD_SECONDS",
            "soon",
            "RTJ_GRACE_PERIOD_SECONDS='soon': expected seconds > 0",
        ),
        ("WORLD_SIZE", "two", "WORLD_SIZE='two': expected a world size >= 1"),
        ("WORLD_SIZE", "0", "WORLD_SIZE='0': expected a world size >= 1"),
        ("RANK", "first", "RANK='first': expected a rank >= 0"),
        ("LOCAL_RANK", "-1", "LOCAL_RANK='-1': expected a local rank >= 0"),
    ],
)
def test_bad_environment_value_is_a_config_error_naming_the_variable(
    tmp_path, monkeypatch, variable, value, message
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RTJ_RUN_NAME", "envrun")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as err:
        CheckpointManager(model=make()[0])
    assert message in str(err.value)


def test_unusable_folder_from_the_environment_names_the_variable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RTJ_CHECKPOINT_DIR", str(blocker / "root"))
    with pytest.raises(ConfigError) as err:
        CheckpointManager(model=make()[0], run_name="r")
    assert "is a file, not a folder; set RTJ_CHECKPOINT_DIR to a writable folder" in str(err.value)
    with pytest.raises(ConfigError) as err:  # an explicit folder wins, and is what is named
        CheckpointManager(model=make()[0], run_name="r", folder=blocker / "ck")
    assert "is a file, not a folder; pass folder= a writable folder" in str(err.value)


@pytest.mark.parametrize("root", ["team{a}", "odd}", "x{run_name}"])
def test_checkpoint_dir_from_the_environment_is_a_plain_path(tmp_path, monkeypatch, root):
    """Its braces are literal: they were read as template variables and refused (or
    substituted) under the name folder=, which the user never passed."""
    monkeypatch.setenv("RTJ_CHECKPOINT_DIR", str(tmp_path / root))
    ck = CheckpointManager(model=make()[0], run_name="r")
    assert ck.run_dir == tmp_path / root / "r"
    ck.close()


def test_object_store_retention_with_a_local_folder_is_ignored_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        ck = manager(
            tmp_path, make(), num_local_checkpoints_to_keep=0, num_remote_checkpoints_to_keep=2
        )
    ck.close()
    assert (
        "num_local_checkpoints_to_keep=0, num_remote_checkpoints_to_keep=2: ignored, the "
        f"folder {str(tmp_path / 'ck')!r} is not an s3:// folder" in caplog.text
    )


def test_explicit_quarantined_replaces_the_environment(tmp_path, monkeypatch):
    write_two(tmp_path)
    monkeypatch.setenv("RTJ_QUARANTINED", "ep0-ba2")
    ck = manager(tmp_path, make(), quarantined=["ep0-ba1"])
    assert ck.settings.quarantined == {"ep0-ba1"}
    assert ck.resume().path.endswith("ep0-ba2"), "the variable's name is not quarantined"
    ck.close()
    ck = manager(tmp_path, make(), quarantined=[])
    assert ck.settings.quarantined == frozenset()
    ck.close()
    ck = manager(tmp_path, make())  # no argument: the variable
    assert ck.settings.quarantined == {"ep0-ba2"}
    ck.close()


def test_overwrite_protection_other_run(tmp_path):
    write_two(tmp_path)
    with pytest.raises(OverwriteError, match="other run"):
        manager(tmp_path, make(), run_name="someone-else")
    manager(tmp_path, make(), run_name="someone-else", overwrite=True).close()


def test_overwrite_protection_newer_checkpoints(tmp_path):
    root = write_two(tmp_path)
    ck = manager(tmp_path, make(), autoresume=False, interval="1ba")
    with pytest.raises(
        OverwriteError, match=r"ep0-ba2 \(batch 2\) at or after the current position"
    ):
        ck.batch_end(1)
    assert Manifest.read(root / "ep0-ba2").timestamp.batch == 2  # nothing touched
    ck2 = manager(tmp_path, make(), autoresume=False, interval="1ba", overwrite=True)
    ck2.batch_end(1)
    ck2.close()
    committed = sorted(p.parent.name for p in root.glob("ep*/manifest.json"))
    assert committed == ["ep0-ba1"]


def test_a_first_save_on_a_committed_checkpoints_name_is_refused_or_replaces_it(tmp_path):
    """A run that did not resume reaches the position of a committed checkpoint: its save would
    rewrite that checkpoint's files in place. Refused; with overwrite=True, uncommitted first."""
    root = write_two(tmp_path)
    before = {p.name: p.read_bytes() for p in (root / "ep0-ba2").iterdir()}
    comps = make()
    ck = manager(tmp_path, comps, autoresume=False, interval="2ba")
    ck.batch_end(1)
    with pytest.raises(OverwriteError, match=r"ep0-ba2 \(batch 2\) at or after"):
        ck.batch_end(1)
    assert {p.name: p.read_bytes() for p in (root / "ep0-ba2").iterdir()} == before
    ck.close(save=False)
    with torch.no_grad():
        comps[0][0].weight.add_(1.0)  # a state the old ep0-ba2 does not hold
    ck2 = manager(tmp_path, comps, autoresume=False, interval="2ba", overwrite=True)
    ck2.batch_end(1)
    assert ck2.batch_end(1).name == "ep0-ba2"
    ck2.close()
    assert sorted(p.parent.name for p in root.glob("ep*/manifest.json")) == ["ep0-ba1", "ep0-ba2"]
    fresh = make()
    again = manager(tmp_path, fresh)
    assert again.resume().path.endswith("ep0-ba2")
    again.close(save=False)
    assert torch.equal(fresh[0][0].weight, comps[0][0].weight)


def test_unwritable_folder_is_a_construction_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="is a file, not a folder") as exc:
        CheckpointManager(model=make()[0], folder=blocker / "ck", run_name="r")
    assert "File exists" not in str(exc.value) and str(blocker) in str(exc.value)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        CheckpointManager(model=make()[0], folder=blocker, run_name="r")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(ConfigError, match="is not writable"):
            CheckpointManager(model=make()[0], folder=ro / "ck", run_name="r")


def test_autoresume_requires_run_name(tmp_path, monkeypatch):
    monkeypatch.delenv("RTJ_RUN_NAME", raising=False)
    with pytest.raises(ConfigError, match="stable run_name"):
        CheckpointManager(model=make()[0], folder=tmp_path)
    ck = CheckpointManager(model=make()[0], folder=tmp_path / "{run_name}", autoresume=False)
    assert ck.run_name.startswith("run-") and ck.run_dir.name == ck.run_name


def test_samples_interval_needs_num_samples(tmp_path):
    ck = manager(tmp_path, make(), interval="64sp")
    with pytest.raises(ConfigError, match="num_samples"):
        ck.batch_end()


def test_load_path_without_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    ck = manager(tmp_path, make(), load_path=str(tmp_path / "empty"))
    with pytest.raises(NoCheckpointError, match="holds no checkpoint that verifies"):
        ck.resume()


def test_an_empty_load_path_is_none(tmp_path, monkeypatch):
    """``load_path=""`` (``os.environ.get("INIT_CKPT", "")``) is no load path, as documented:
    a fresh start, not the current directory searched for checkpoints."""
    monkeypatch.chdir(tmp_path)
    ck = manager(tmp_path, make(), load_path="")
    assert ck.resume().source == "fresh" and ck.timestamp.batch == 0
    ck.close(save=False)


class SlowToPickle:
    """Makes the background persist take a while, so a save is still in flight."""

    release = threading.Event()

    def __reduce__(self):
        SlowToPickle.release.wait(10)
        return (int, (0,))


def test_async_snapshot_is_taken_before_the_next_optimizer_step(tmp_path):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1ba", async_save=True)
    step(model, opt, sched)
    at_save = params(model)
    ck.batch_end(1)
    step(model, opt, sched)  # runs while the save persists; must not leak into it
    ck.close()
    saved = saved_weights(tmp_path / "ck" / "ep0-ba1")
    assert all(torch.equal(saved[k], b) for k, b in zip(model.state_dict(), at_save, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(params(model), at_save, strict=True))


def test_async_skip_policy_and_close_waits(tmp_path):
    SlowToPickle.release.clear()
    ck = manager(
        tmp_path, make(), interval="1ba", async_save=True, async_policy="skip", trusted_pickle=True
    )
    ck.extras["slow"] = SlowToPickle()
    ck.batch_end(1)  # starts a save that blocks in pickling
    ck.extras.clear()
    ck.batch_end(1)  # skipped: one in flight
    assert ck.skipped_saves == 1
    SlowToPickle.release.set()
    ck.close(save=False)  # waits for ep0-ba1 to commit (no final save of batch 2)
    assert [s.name for s in ck.saved] == ["ep0-ba1"]
    assert (tmp_path / "ck" / "ep0-ba1" / "manifest.json").exists()


def test_async_failure_is_raised_at_the_next_call(tmp_path):
    ck = manager(tmp_path, make(), interval="1ba", async_save=True)
    (tmp_path / "ck" / "ep0-ba1").write_text("a file where the checkpoint folder goes")
    ck.batch_end(1)
    ck.wait_for_snapshot()
    with pytest.raises(SaveFailedError, match="background save failed"):
        ck.wait()
    ck.batch_end(1)  # the manager keeps working after the failure was reported
    ck.close()
    assert Manifest.read(tmp_path / "ck" / "ep0-ba2").timestamp.batch == 2


def test_cli_lists_and_verifies(tmp_path, capsys):
    from trainer_runtime.cli import main

    root = write_two(tmp_path)
    assert main(["verify", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("* ep0-ba2") and "ok" in out
    flip(root / "ep0-ba1" / "__0_0.distcp")
    assert main(["verify", str(root)]) == 1
    assert "BROKEN: __0_0.distcp (rank 0) fails its checksum" in capsys.readouterr().out


def test_cli_ls_lists_a_leftover_save_but_not_a_folder_of_the_users(tmp_path, capsys):
    """Resume leaves a folder of the user's in the run folder alone (it is no checkpoint);
    ``ls`` listed it as a checkpoint not committed."""
    from trainer_runtime.cli import main

    root = write_two(tmp_path)
    (root / "tb_logs" / "run1").mkdir(parents=True)
    (root / "ep0-ba9").mkdir()
    (root / "ep0-ba9" / "__0_0.distcp").write_bytes(b"cut short")
    for cmd in ("ls", "verify"):
        assert main([cmd, str(root)]) == 0
        names = [line[2:].split()[0] for line in capsys.readouterr().out.splitlines()]
        assert names == ["ep0-ba2", "ep0-ba1", "ep0-ba9"], (cmd, names)


def test_cli_verify_of_a_checkpoint_folder_without_a_manifest_fails(tmp_path, capsys):
    """Read as a run folder, a checkpoint folder whose manifest is gone (a save cut short)
    printed nothing, and verify exited 0 as if it had checked a sound checkpoint."""
    from trainer_runtime.cli import main

    root = write_two(tmp_path)
    (root / "ep0-ba2" / "manifest.json").unlink()
    assert main(["verify", str(root / "ep0-ba2")]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:3] == ["ep0-ba2", "NOT", "COMMITTED"], line
    assert main(["ls", str(root / "ep0-ba2")]) == 0
    assert "NOT COMMITTED" in capsys.readouterr().out
    assert main(["verify", str(root / "ep0-ba1")]) == 0


def test_cli_verify_of_a_run_folder_fails_on_a_manifest_that_does_not_parse(tmp_path, capsys):
    """A manifest that is there but does not parse is damage (the commit writes it whole):
    ``verify`` of the run folder printed it as NOT COMMITTED and exited 0. Now BROKEN, exit 1;
    a folder without a manifest (a save cut short) stays NOT COMMITTED and passes."""
    from trainer_runtime.cli import main

    root = write_two(tmp_path)
    (root / "ep0-ba9").mkdir()
    (root / "ep0-ba9" / "__0_0.distcp").write_bytes(b"cut short")
    assert main(["verify", str(root)]) == 0
    capsys.readouterr()
    (root / "ep0-ba1" / "manifest.json").write_text("{ torn")
    assert main(["verify", str(root)]) == 1
    lines = {line[2:].split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["ep0-ba1"].split()[1] == "BROKEN:" and "not valid JSON" in lines["ep0-ba1"]
    assert lines["ep0-ba2"].endswith(" ok") and "NOT COMMITTED" in lines["ep0-ba9"], lines
    assert main(["ls", str(root)]) == 0  # ls lists; only verify judges
    assert "NOT COMMITTED" in capsys.readouterr().out


def test_cli_verify_of_a_checkpoint_folder_prints_the_path_as_given(tmp_path, capsys, monkeypatch):
    """Given a relative checkpoint folder, verify printed its absolute path (the folder was
    resolved to find its run folder); now the path the user typed, both for a relative and
    for an absolute one."""
    from trainer_runtime.cli import main

    root = write_two(tmp_path)
    (root / "ep0-ba2" / "manifest.json").unlink()
    (root / "latest-rank0").unlink()
    (root / "latest-rank0").symlink_to("ep0-ba1")
    monkeypatch.chdir(tmp_path)
    assert main(["verify", "ck/ep0-ba2"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert " ck/ep0-ba2/manifest.json does not exist" in line and str(tmp_path) not in line
    monkeypatch.chdir(root / "ep0-ba2")
    assert main(["verify", "../ep0-ba2"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert " ../ep0-ba2/manifest.json does not exist" in line, line
    assert main(["verify", str(root / "ep0-ba2")]) == 1
    assert f" {root}/ep0-ba2/manifest.json does not exist" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(["verify", "ck/latest-rank0"]) == 0  # a link names the checkpoint it points to
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:2] == ["ep0-ba1", "epoch"] and line.endswith(" ok"), line


def test_async_saves_reuse_staging_buffers_without_mixing_contents(tmp_path):
    comps = make()
    model, opt, sched, _ = comps
    ck = manager(tmp_path, comps, interval="1ba", async_save=True)
    expected = []
    for _ in range(3):
        step(model, opt, sched)
        expected.append(params(model))
        ck.batch_end(1)
    ck.close()
    assert ck.engine.stager.nbytes > 0, "async snapshots went through the staging buffers"
    names = list(model.state_dict())
    for i, want in enumerate(expected, start=1):
        got = saved_weights(tmp_path / "ck" / f"ep0-ba{i}")
        assert all(torch.equal(got[n], b) for n, b in zip(names, want, strict=True)), f"save {i}"


def test_a_quarantined_name_is_never_reused(tmp_path, monkeypatch):
    root = write_two(tmp_path)
    monkeypatch.setenv("RTJ_QUARANTINED", "ep0-ba2")
    monkeypatch.setenv("RTJ_ATTEMPT", "3")
    ck = manager(tmp_path, make(), interval="1ba")
    assert ck.resume().path.endswith("ep0-ba1")
    saved = ck.batch_end(1)
    ck.close()
    assert saved.name == "ep0-ba2-a3"
    aside = root / "rejected" / "ep0-ba2"  # moved aside by resume, with the reason
    assert "quarantined" in (aside / "REJECTED.txt").read_text()
    assert Manifest.read(aside).created_at != Manifest.read(root / "ep0-ba2-a3").created_at
    ck2 = manager(tmp_path, make(), interval="1ba")
    assert ck2.resume().path.endswith("ep0-ba2-a3")


WEIGHTS_ONLY_RUN = """
import json, sys, torch
from trainer_runtime import CheckpointManager, ResumableSampler
folder, stop_after = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = torch.optim.Adam(model.parameters())
sampler = ResumableSampler(12, num_replicas=1, rank=0, seed=3)
ck = CheckpointManager(model=model, optimizer=opt, sampler=sampler, folder=folder, run_name="w",
                       interval="1ba", weights_only=True)
ck.resume()
out = {"batch": ck.timestamp.batch, "adam_state": len(opt.state),
       "weight": model.weight.tolist(), "seen": []}
for epoch in range(ck.timestamp.epoch, 2):
    batch = []
    for i in sampler:
        batch.append(i)
        if len(batch) < 2:
            continue
        opt.zero_grad(); model(torch.ones(2, 2)).sum().backward(); opt.step()
        out["seen"].append([epoch, *batch]); batch = []
        ck.batch_end(num_samples=2)
        if len(out["seen"]) == stop_after:  # killed here: no close()
            out["weight"] = model.weight.tolist()
            print(json.dumps(out)); sys.exit(0)
    ck.epoch_end()
ck.close()
print(json.dumps(out))
"""


def test_a_weights_only_run_resumes_its_model_timestamp_and_data_on_a_rerun(tmp_path):
    """``weights_only=True`` saves the model, the timestamp and the run name: a re-run of the
    job continues from them (the optimizer starts fresh) instead of restarting at batch 0
    and then refusing to save under its own newer checkpoints."""

    def run(stop_after):
        done = subprocess.run(
            [sys.executable, "-c", WEIGHTS_ONLY_RUN, str(tmp_path / "ck"), str(stop_after)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.splitlines()[-1])

    first = run(stop_after=4)
    second = run(stop_after=100)
    assert second["batch"] == 4, "the re-run restarted instead of resuming"
    assert second["weight"] == first["weight"], "the model was not restored"
    assert second["adam_state"] == 0, "a weights-only checkpoint holds no optimizer state"
    epoch0 = [i for seen in first["seen"] + second["seen"] if seen[0] == 0 for i in seen[1:]]
    assert sorted(epoch0) == list(range(12)), "epoch 0's data repeated or skipped samples"
    assert len(second["seen"]) == 2 + 6  # the rest of epoch 0, then all of epoch 1
    assert Manifest.read(tmp_path / "ck" / "ep2-ba12").weights_only


@pytest.mark.parametrize("bad", [-1, 2.5, True, "4"])
def test_a_malformed_sample_count_is_refused_and_counts_nothing(tmp_path, bad):
    model = make()[0]
    ck = CheckpointManager(model=model, folder=tmp_path / "ck", run_name="r", interval="9ba")
    with pytest.raises(ConfigError, match=r"batch_end\(num_samples=\.\.\.\) must be an int >= 0"):
        ck.batch_end(bad)
    assert (ck.timestamp.batch, ck.timestamp.sample) == (0, 0)
    ck.close(save=False)


def test_a_numpy_sample_count_counts_like_an_int(tmp_path):
    """Every count argument takes NumPy integers (``numbers.Integral``); batch_end refused
    ``np.int64`` (a length computed with NumPy) although the constructor's counts took it."""
    sampler = ResumableSampler(40, num_replicas=1, rank=0)
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path / "ck", run_name="r", interval="8sp", sampler=sampler
    )
    ck.batch_end(np.int64(4))
    ck.batch_end(np.int32(4))
    assert (ck.timestamp.batch, ck.timestamp.sample, sampler.offset) == (2, 8, 8)
    assert type(ck.timestamp.sample) is int
    assert [s.name for s in ck.saved] == ["ep0-ba2"]
    with pytest.raises(ConfigError, match=r"must be an int >= 0 .* got np.float64\(4.0\)"):
        ck.batch_end(np.float64(4.0))
    ck.close(save=False)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("folder", "s3:/bucket/ckpt/{run_name}"),
        ("folder", "S3:bucket/ckpt/{run_name}"),
        ("folder", "gs:/bucket/ckpt/{run_name}"),
        ("RTJ_CHECKPOINT_DIR", "s3:/bucket/ckpt"),
        ("load_path", "s3:/bucket/ckpt/run/ep0-ba1"),
    ],
)
def test_an_object_store_uri_missing_a_slash_is_refused_not_taken_for_a_local_path(
    tmp_path, monkeypatch, where, value
):
    """Read as a path, ``s3:/bucket/...`` put the checkpoints in a folder ``s3:`` of the
    working directory (lost with the node). It is a malformed URI (docs/object-store.md):
    a ConfigError naming the argument and the expected form, and nothing is created."""
    monkeypatch.chdir(tmp_path)
    kw = {"run_name": "run", "autoresume": False}
    if where == "RTJ_CHECKPOINT_DIR":
        monkeypatch.setenv(where, value)
    else:
        kw[where] = value
        if where == "load_path":
            kw["folder"] = tmp_path / "ck"
    with pytest.raises(ConfigError, match=rf"{where}='{re.escape(value)}'.*expected s3://BUCKET"):
        CheckpointManager(model=make()[0], **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # A local folder so named is still reachable, written as a relative path.
    ck = CheckpointManager(model=make()[0], folder="./s3:/x/{run_name}", run_name="run")
    ck.close(save=False)
    assert (tmp_path / "s3:" / "x" / "run").is_dir()
