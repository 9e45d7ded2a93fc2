"""Resume and save edge cases a new user hits: fallbacks that must not block the run, epoch
boundaries, the final save, wrapped models, file-backed state, the rank file's zip format,
stale pointers and leftovers, and exporting weights."""

from __future__ import annotations

import io
import logging
import os
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainer_runtime import (
    CheckpointManager,
    ConfigError,
    CorruptCheckpointError,
    Manifest,
    NoCheckpointError,
    OverwriteError,
    ResumableSampler,
)
from trainer_runtime.cli import main as cli_main
from trainer_runtime.export import read_sharded_weights
from trainer_runtime.save.rank_file import save_rank_file, torch_save_no_crc
from trainer_runtime.sharded import VerifyingReader

from .trainkit import make, saved_weights, step


def manager(tmp_path, comps, **kw):
    model, opt, sched, scaler = comps[:4]
    kw.setdefault("run_name", "run")
    kw.setdefault("interval", "1ba")
    return CheckpointManager(
        model=model, optimizer=opt, scheduler=sched, scaler=scaler, folder=tmp_path / "ck", **kw
    )


def train(ck, comps, steps):
    for _ in range(steps):
        step(*comps[:3])
        ck.batch_end(16)


def flip_byte(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    p.write_bytes(bytes(raw))


# ---------------------------------------------------------------- item 1: fallback past two


def test_a_fallback_past_two_rejected_checkpoints_does_not_block_the_next_save(
    tmp_path, monkeypatch, caplog
):
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 6)
    ck.close()
    root = tmp_path / "ck"
    assert sorted(p.name for p in root.glob("ep*")) == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    flip_byte(root / "ep0-ba6" / "__0_0.distcp")  # damaged
    monkeypatch.setenv("RTJ_QUARANTINED", "ep0-ba4")  # quarantined by the operator

    comps2 = make()
    ck2 = manager(tmp_path, comps2, interval="2ba")
    with caplog.at_level(logging.WARNING, "trainer_runtime"):
        res = ck2.resume()
    assert res.path.endswith("ep0-ba2") and ck2.timestamp.batch == 2
    # Both rejected checkpoints are moved aside with their reason, and it is logged.
    for name, why in (("ep0-ba6", "digest"), ("ep0-ba4", "quarantined")):
        aside = root / "rejected" / name
        assert (aside / "manifest.json").exists(), name
        assert why in (aside / "REJECTED.txt").read_text().lower()
        assert not (root / name).exists()
        assert f"moved {name} aside" in caplog.text
    assert ck2.folder.read_pointer()["checkpoint"] == "ep0-ba2"
    assert os.readlink(root / "latest-rank0") == "ep0-ba2", "the link follows the pointer"
    train(ck2, comps2, 4)  # saves ep0-ba4-a<pid> and ep0-ba6: no OverwriteError
    ck2.close()
    assert ck2.saved[-1].name == "ep0-ba6"
    assert Manifest.read(root / "ep0-ba6").timestamp.batch == 6

    # The next relaunch resumes from the new ep0-ba6 and is not bothered by rejected/.
    ck3 = manager(tmp_path, make(), interval="2ba")
    assert ck3.resume().path.endswith("ep0-ba6") and ck3.resume().fallbacks == []
    ck3.close()


def test_valid_newer_checkpoints_are_still_protected_from_overwrite(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 4)
    ck.close()
    fresh = manager(tmp_path, make(), interval="2ba", autoresume=False)
    with pytest.raises(OverwriteError, match="ep0-ba4"):
        train(fresh, make(), 2)
    assert not (tmp_path / "ck" / "rejected").exists()


# ---------------------------------------------------------------- item 3: epoch boundary


def test_a_checkpoint_at_an_epochs_last_batch_resumes_at_the_next_epoch(tmp_path):
    data = torch.arange(8.0).reshape(8, 1)
    comps = make()
    sampler = ResumableSampler(8, num_replicas=1, rank=0, shuffle=False, batch_size=4)
    ck = manager(tmp_path, comps, sampler=sampler, interval="2ba")
    ck.resume()
    for _ in list(sampler):  # one epoch: 8 samples, 2 batches of 4; the save is at batch 2
        pass
    train(ck, comps, 2)  # killed here: after the save at the epoch's last batch, before epoch_end
    ck.close(save=False)

    sampler2 = ResumableSampler(8, num_replicas=1, rank=0, shuffle=False, batch_size=4)
    ck2 = manager(tmp_path, make(), sampler=sampler2, interval="2ba")
    ck2.resume()
    ts = ck2.timestamp
    assert (ts.epoch, ts.batch, ts.batch_in_epoch, ts.sample_in_epoch) == (1, 2, 0, 0)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler2)
    assert len(loader) == 2
    assert next(iter(loader)).flatten().tolist() == [0.0, 1.0, 2.0, 3.0]  # a full next epoch
    ck2.close(save=False)


# ---------------------------------------------------------------- item 5: final save


def test_close_saves_the_final_state_once_and_a_rerun_trains_no_step(tmp_path):
    comps = make()
    ck = manager(tmp_path, comps, interval="4ba")
    ck.resume()
    train(ck, comps, 6)  # interval saves at 4 only
    ck.epoch_end()
    ck.close()
    names = [s.name for s in ck.saved]
    assert names == ["ep0-ba4", "ep1-ba6"], names
    final = Manifest.read(tmp_path / "ck" / "ep1-ba6").timestamp
    assert (final.epoch, final.batch) == (1, 6)

    ck2 = manager(tmp_path, make(), interval="4ba")
    ck2.resume()
    assert (ck2.timestamp.epoch, ck2.timestamp.batch) == (1, 6)
    assert list(range(ck2.timestamp.epoch, 1)) == []  # the quickstart loop runs no epoch
    ck2.close()
    assert ck2.saved == []  # nothing new since the resume: no second copy

    comps3 = make()
    ck3 = manager(tmp_path / "other", comps3, interval="4ba", final_save=False)
    train(ck3, comps3, 3)
    ck3.close()
    assert ck3.saved == []


def test_close_does_not_save_when_epochs_ended_but_no_step_was_trained(tmp_path):
    ck = manager(tmp_path, make(), interval="100ba")
    ck.resume()
    ck.epoch_end()
    ck.epoch_end()
    ck.close()
    assert ck.saved == []
    assert not list((tmp_path / "ck").glob("ep*"))


# ---------------------------------------------------------------- item 6: torch.compile


def test_compiled_and_ddp_like_wrappers_save_plain_keys(tmp_path):
    class Wrapper(nn.Module):  # what DDP/FSDP look like from outside: .module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    compiled = torch.compile(Wrapper(torch.compile(plain, backend="eager")), backend="eager")
    assert any("_orig_mod." in k for k in compiled.state_dict())
    ck = CheckpointManager(model=compiled, folder=tmp_path / "ck", run_name="c", interval="1ba")
    ck.batch_end(1)
    ck.close()
    weights = saved_weights(tmp_path / "ck" / "ep0-ba1")
    assert sorted(weights) == sorted(plain.state_dict())
    fresh = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    fresh.load_state_dict(weights)  # strict: loads into the plain model
    assert torch.equal(fresh[0].weight, plain[0].weight)


# ---------------------------------------------------------------- item 7: no file-backed state


def mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


def test_after_resume_no_live_tensor_is_backed_by_the_checkpoint_file(tmp_path):
    comps = make(hidden=256)
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.extras["table"] = torch.arange(4096.0)
    train(ck, comps, 2)
    ck.close()
    rank_file = tmp_path / "ck" / "ep0-ba4" / "__0_0.distcp"

    comps2 = make(hidden=256)
    ck2 = manager(tmp_path, comps2, interval="2ba")
    assert ck2.resume().path.endswith("ep0-ba4")
    assert comps2[1].state_dict()["state"], "the optimizer state was restored"
    assert ck2.extras["table"].shape == (4096,)
    assert str(tmp_path / "ck") not in mapped_files()  # no mapping of any checkpoint file
    rank_file.unlink()  # a deleted checkpoint's space is not pinned by a mapping either
    assert "__0_0.distcp (deleted)" not in mapped_files()
    step(*comps2[:3])
    ck2.close(save=False)


# ---------------------------------------------------------------- item 8: CRC-free rank files


def test_rank_files_skip_the_zip_crc_without_touching_torchs_global_setting(tmp_path):
    """The format-version-1 writer (kept for tools and tests that write v1 checkpoints)."""
    comps = make()
    tree = {"state": {"model": comps[0].state_dict(), "timestamp": {"batch": 5}}}
    seen_flags: list[bool] = []
    stop = threading.Event()

    def user_thread_saves() -> None:  # the user's own torch.save while rank files are written
        while not stop.is_set():
            seen_flags.append(torch.serialization.get_crc32_options())
            buf = io.BytesIO()
            torch.save({"w": torch.ones(64)}, buf)
            bad = zipfile.ZipFile(io.BytesIO(buf.getvalue())).testzip()
            assert bad is None, f"user's torch.save lost its CRC on {bad}"

    t = threading.Thread(target=user_thread_saves)
    t.start()
    try:
        for i in range(5):
            (tmp_path / f"r{i}").mkdir()
            save_rank_file(tree, tmp_path / f"r{i}" / "rank0.pt", rank=0, rel_path="rank0.pt")
    finally:
        stop.set()
        t.join()
    assert seen_flags and all(seen_flags)
    assert torch.serialization.get_crc32_options() is True
    rank_file = tmp_path / "r4" / "rank0.pt"
    infos = zipfile.ZipFile(rank_file).infolist()
    assert infos and all(i.CRC == 0 for i in infos)
    data = torch.load(rank_file, weights_only=True)  # still a normal torch file
    assert data["state"]["timestamp"]["batch"] == 5
    buf = io.BytesIO()
    torch_save_no_crc({"x": torch.arange(3)}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["x"].tolist() == [0, 1, 2]


# ---------------------------------------------------------------- item 9: small things


def test_a_pointer_one_checkpoint_behind_is_moved_on_without_a_warning(tmp_path, caplog):
    """A crash between a manifest and the pointer leaves ``latest.json`` naming the checkpoint
    before: a valid one, not a fault to warn about."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 4)
    ck.close(save=False)
    pointer = tmp_path / "ck" / "latest.json"
    pointer.write_text(pointer.read_text().replace("ep0-ba4", "ep0-ba2"))
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.path.endswith("ep0-ba4")
    said = [r for r in caplog.records if "latest.json named ep0-ba2" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], caplog.text
    assert "older committed checkpoint" in said[0].getMessage()
    assert ck.folder.read_pointer()["checkpoint"] == "ep0-ba4"


def test_leftovers_are_cleaned_and_a_stale_pointer_is_reported(tmp_path, caplog):
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 4)
    ck.close(save=False)
    root = tmp_path / "ck"
    leftover = root / "ep0-ba9"
    leftover.mkdir()
    (leftover / "rank0.pt").write_bytes(b"half written")
    pointer = root / "latest.json"
    pointer.write_text(pointer.read_text().replace("ep0-ba4", "ep0-ba8"))  # deleted folder

    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.path.endswith("ep0-ba4")
    assert "latest.json named ep0-ba8" in caplog.text
    assert not leftover.exists() and "removed leftover" in caplog.text
    assert ck.folder.read_pointer()["checkpoint"] == "ep0-ba4"
    caplog.clear()
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.fallbacks == [] and "not resuming from" not in caplog.text  # reported once


def pointer_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "latest.json" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe\x00", "is not JSON"),
        (b"[1, 2]", "not a JSON object (it holds an array)"),
        (b'{"updated_at": "2026-01-01"}', "names no checkpoint"),
        (b'{"checkpoint": 5}', "names no checkpoint"),
        (b'{"checkpoint": "ep9-ba99"}', "latest.json named ep9-ba99"),
    ],
)
def test_a_garbage_pointer_is_reported_once_and_resume_scans_the_folder(
    tmp_path, caplog, body, fault
):
    """A latest.json that did not parse, or named no checkpoint, was rewritten at resume
    without a word; resume lists the folder either way, and now says what was wrong."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 4)
    ck.close(save=False)
    pointer = tmp_path / "ck" / "latest.json"
    pointer.write_bytes(body)

    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.path.endswith("ep0-ba4") and res.fallbacks == []
    warned = pointer_warnings(caplog)
    assert len(warned) == 1, warned
    assert fault in warned[0] and "latest.json" in warned[0] and "ep0-ba4" in warned[0]
    assert ck.folder.read_pointer()["checkpoint"] == "ep0-ba4"
    assert [m.name for m in ck.folder.committed()] == ["ep0-ba4", "ep0-ba2"]  # none lost
    caplog.clear()
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        manager(tmp_path, make(), interval="2ba").resume()
    assert pointer_warnings(caplog) == []  # repaired: reported once


def test_a_garbage_pointer_in_a_run_folder_without_checkpoints_is_removed(tmp_path, caplog):
    (tmp_path / "ck").mkdir()
    pointer = tmp_path / "ck" / "latest.json"
    pointer.write_bytes(b"garbage")
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make()).resume()
    assert res.source == "fresh"
    warned = pointer_warnings(caplog)
    assert len(warned) == 1 and "is not JSON" in warned[0], warned
    assert not pointer.exists()  # it named nothing committed, and nothing is


def test_a_save_that_replaces_a_garbage_pointer_says_so(tmp_path, caplog):
    """Without resume (autoresume=False) the first commit replaced the garbage silently."""
    (tmp_path / "ck").mkdir()
    pointer = tmp_path / "ck" / "latest.json"
    pointer.write_bytes(b'{"checkpoint": null}')
    comps = make()
    ck = manager(tmp_path, comps, autoresume=False)
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        train(ck, comps, 2)
    ck.close(save=False)
    warned = pointer_warnings(caplog)
    assert len(warned) == 1 and "names no checkpoint" in warned[0], warned
    assert "ep0-ba1" in warned[0]
    assert ck.folder.read_pointer()["checkpoint"] == "ep0-ba2"


def test_a_folder_of_the_users_in_the_run_folder_is_not_deleted_as_a_leftover(tmp_path, caplog):
    """Resume deleted every folder without a manifest, a user's tb_logs/ included; only
    folders holding nothing but checkpoint files (a crashed save's or download's) go."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.close(save=False)
    root = tmp_path / "ck"
    (root / "tb_logs" / "run1").mkdir(parents=True)
    (root / "tb_logs" / "run1" / "events.out").write_text("the user's")
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("the user's")
    crashed = root / "ep0-ba9"  # a save cut short: data files and a temp file only
    crashed.mkdir()
    for name in ("__0_0.distcp", ".metadata", ".manifest.json.tmp-1-ab"):
        (crashed / name).write_bytes(b"partial")

    with caplog.at_level(logging.INFO, "trainer_runtime"):
        res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.path.endswith("ep0-ba2")
    assert (root / "tb_logs" / "run1" / "events.out").read_text() == "the user's"
    assert (root / "notes" / "README.txt").read_text() == "the user's"
    assert "tb_logs is not a checkpoint (it holds run1/" in caplog.text
    assert not crashed.exists() and "removed leftover" in caplog.text


def test_weights_exported_into_the_run_folder_are_not_deleted_as_a_leftover(tmp_path, capsys):
    """Every ``*.pt`` counted as a format-1 data file, so ``export/weights.pt`` (what
    ``rtj-checkpoints export`` wrote there) made ``export/`` a crashed save's leftover: listed
    as NOT COMMITTED, and deleted at the next resume. Only ``rank<r>.pt`` is format 1's."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.close(save=False)
    root = tmp_path / "ck"
    assert cli_main(["export", str(root), str(root / "export" / "weights.pt")]) == 0
    (root / "best").mkdir()
    (root / "best" / "model.pt").write_bytes((root / "export" / "weights.pt").read_bytes())
    crashed = root / "ep0-ba9"  # a format-1 save cut short
    crashed.mkdir()
    (crashed / "rank0.pt").write_bytes(b"partial")
    capsys.readouterr()
    assert cli_main(["ls", str(root)]) == 0
    listed = [line[2:].split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["ep0-ba2", "ep0-ba9"]

    res = manager(tmp_path, make(), interval="2ba").resume()
    assert res.path.endswith("ep0-ba2")
    assert [line.split(":")[0] for line in res.fallbacks] == ["ep0-ba9"]  # reported once
    exported = torch.load(root / "export" / "weights.pt", weights_only=True)
    assert set(exported) == set(comps[0].state_dict())
    assert (root / "best" / "model.pt").exists() and not crashed.exists()


def test_a_folder_of_the_users_is_not_reported_as_a_checkpoint_passed_over(tmp_path, caplog):
    """tb_logs/ in the run folder was listed at every resume as "not resuming from tb_logs:
    ... manifest.json does not exist (checkpoint not committed)", and in the result's and the
    resumed event's fallbacks, which are the checkpoints passed over; it is no checkpoint."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.close(save=False)
    (tmp_path / "ck" / "tb_logs").mkdir()
    (tmp_path / "ck" / "tb_logs" / "events.out").write_text("the user's")

    for _ in range(2):  # the same at every resume
        caplog.clear()
        with caplog.at_level(logging.INFO, "trainer_runtime"):
            res = manager(tmp_path, make(), interval="2ba").resume()
        assert res.path.endswith("ep0-ba2") and res.fallbacks == []
        assert "not resuming from" not in caplog.text
        assert "tb_logs is not a checkpoint (it holds events.out" in caplog.text
    assert (tmp_path / "ck" / "tb_logs" / "events.out").read_text() == "the user's"


def test_a_checkpoint_committed_before_its_pointer_was_written_is_resumed(tmp_path):
    """A crash between the manifest's commit and the pointer's write (the window a multi-
    process test saw live) leaves a committed checkpoint and no latest.json."""
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.close(save=False)
    (tmp_path / "ck" / "latest.json").unlink()
    weights = saved_weights(tmp_path / "ck" / "ep0-ba2")

    again = make()
    ck2 = manager(tmp_path, again, interval="2ba")
    res = ck2.resume()
    assert res.path.endswith("ep0-ba2") and ck2.timestamp.batch == 2
    assert all(torch.equal(weights[k], v) for k, v in again[0].state_dict().items())
    train(ck2, again, 2)
    ck2.close(save=False)
    assert ck2.folder.read_pointer()["checkpoint"] == "ep0-ba4"


def test_export_writes_a_plain_state_dict(tmp_path, capsys):
    comps = make()
    ck = manager(tmp_path, comps, interval="2ba")
    train(ck, comps, 2)
    ck.close()
    out = tmp_path / "export" / "weights.pt"
    assert cli_main(["export", str(tmp_path / "ck"), str(out)]) == 0
    assert "ep0-ba2" in capsys.readouterr().out
    weights = torch.load(out, weights_only=True)
    model = make()[0]
    model.load_state_dict(weights)
    assert all(torch.equal(weights[k], v) for k, v in comps[0].state_dict().items())
    assert cli_main(["export", str(tmp_path), str(out)]) == 1  # no checkpoint there


def one_checkpoint_with_a_flipped_byte(
    tmp_path: Path, chooses: Callable[[str, int], bool], *, at: int = 0
) -> tuple[Path, Any]:
    """A run's one checkpoint, with byte ``at`` of the first chunk that ``chooses`` (by its
    name and length) flipped; the checkpoint and that chunk's storage record."""
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba")
    train(ck, comps, 1)
    ck.close()
    checkpoint = tmp_path / "ck" / "ep0-ba1"
    metadata = VerifyingReader(str(checkpoint)).read_metadata()
    info = next(v for k, v in metadata.storage_data.items() if chooses(k.fqn, v.length))
    data = checkpoint / info.relative_path
    raw = bytearray(data.read_bytes())
    raw[info.offset + at] ^= 0xFF
    data.write_bytes(bytes(raw))
    return checkpoint, info


def test_export_of_a_damaged_checkpoint_says_why_in_one_line(tmp_path, capsys):
    checkpoint, info = one_checkpoint_with_a_flipped_byte(
        tmp_path, lambda fqn, _: fqn.startswith("model."), at=1
    )
    assert cli_main(["export", str(checkpoint), str(tmp_path / "w.pt")]) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("rtj-checkpoints:")]
    assert f"{info.relative_path} (rank 0) fails its checksum" in line  # the file check first
    assert "Traceback" not in err
    # A chunk that changes after that check is caught as it is read, also in one line.
    with pytest.raises(CorruptCheckpointError) as caught:
        read_sharded_weights(checkpoint, Manifest.read(checkpoint))
    (line,) = str(caught.value).splitlines()
    assert "rank 0: ChunkDigestError:" in line and "fail their checksum" in line


def test_export_of_a_named_checkpoint_verifies_every_file_like_a_run_folders(tmp_path, capsys):
    """Given a run folder, export takes the newest checkpoint whose every file verifies; given
    that checkpoint by name, it checked only the model chunks it read, so damaged optimizer
    bytes (which ``verify`` reports BROKEN) went unnoticed and the export succeeded. Now a
    named checkpoint is verified the same way first, and nothing is written."""
    checkpoint, info = one_checkpoint_with_a_flipped_byte(
        tmp_path, lambda fqn, length: not fqn.startswith("model.") and length > 0
    )
    out = tmp_path / "w.pt"
    assert cli_main(["verify", str(checkpoint)]) == 1
    assert "BROKEN" in capsys.readouterr().out
    assert cli_main(["export", str(checkpoint), str(out)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"rtj-checkpoints: checkpoint {checkpoint} does not verify: "
        f"{info.relative_path} (rank 0) fails its checksum"
    )
    assert not out.exists()


def test_a_location_in_another_scheme_gets_trainings_error(capsys):
    assert cli_main(["ls", "gs://bucket/run"]) == 2
    err = capsys.readouterr().err
    assert "FOLDER='gs://bucket/run': unsupported scheme gs://; expected s3://BUCKET/PREFIX" in err
    assert "folder=" not in err  # the CLI's argument, not CheckpointManager's


# ---------------------------------------------------------------- extras the unpickler refuses


class NotPlain:
    """A user object put in extras: pickles, but the weights-only unpickler refuses it."""


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_extras_the_unpickler_would_refuse_are_refused_at_save(tmp_path, async_save):
    comps = make()
    ck = manager(tmp_path, comps, interval="100ba", async_save=async_save)
    ck.resume()
    train(ck, comps, 1)
    ck.extras["obj"] = NotPlain()
    with pytest.raises(ConfigError, match=r"ckpt\.extras\['obj'\] holds .*NotPlain.*plain Python"):
        ck.save()
    ck.wait()
    assert not (tmp_path / "ck" / "ep0-ba1").exists(), "nothing is written"
    ck.extras["obj"] = {"plain": [1, 2.5, "x"]}
    ck.close()  # the position was not taken for saved: the final save writes it
    assert [s.name for s in ck.saved] == ["ep0-ba1"]
    ck2 = manager(tmp_path, make())
    ck2.resume()
    assert ck2.extras == {"obj": {"plain": [1, 2.5, "x"]}}
    ck2.close()


def test_a_checkpoint_whose_state_the_unpickler_refuses_is_passed_over(tmp_path):
    """Written by a trusting run (or before the save-time check): resume falls back with the
    reason instead of raising torch's UnpicklingError, and the live state is the older one's."""
    comps = make()
    ck = manager(tmp_path, comps, trusted_pickle=True)
    ck.resume()
    train(ck, comps, 1)
    kept = {k: v.clone() for k, v in comps[0].state_dict().items()}
    ck.extras["obj"] = NotPlain()
    train(ck, comps, 1)
    ck.close()
    comps2 = make(seed=7)
    ck2 = manager(tmp_path, comps2)
    res = ck2.resume()
    assert res.path.endswith("ep0-ba1") and ck2.timestamp.batch == 1
    assert "ep0-ba2" in res.fallbacks[0] and "NotPlain" in res.fallbacks[0]
    assert "refuses" in res.fallbacks[0]
    live = comps2[0].state_dict()
    assert all(torch.equal(live[k], v) for k, v in kept.items())
    assert (tmp_path / "ck" / "rejected" / "ep0-ba2").is_dir()
    ck2.close()


def test_a_checkpoint_folder_that_does_not_load_says_to_give_its_run_folder(tmp_path):
    """A missing ``.metadata`` or a damaged chunk: ``load()`` of that checkpoint folder says
    what is wrong and what to do; the run folder loads the newest one that verifies."""
    comps = make()
    ck = manager(tmp_path, comps, interval="1ba")
    train(ck, comps, 2)
    ck.close()
    run = tmp_path / "ck"
    (run / "ep0-ba2" / ".metadata").unlink()
    fresh = make(seed=5)
    loader = manager(tmp_path / "other", fresh, autoresume=False)
    with pytest.raises(NoCheckpointError) as raised:
        loader.load(run / "ep0-ba2")
    message = str(raised.value)
    assert ".metadata (rank 0) is missing" in message
    assert f"give its run folder {run} instead" in message
    loader.load(run)
    assert loader.timestamp.batch == 1
    loader.close(save=False)


# ---------------------------------------------------------------- a copy that followed the links


def test_a_run_folder_copied_through_its_links_resumes_and_saves(tmp_path, capsys):
    """``cp -rL`` (or a sync tool that follows links) turns ``latest-rank0`` into a folder
    holding a copy of the checkpoint it named. Every save then failed: renaming the new link
    over a folder is ``IsADirectoryError``, so a job resumed from such a copy crash-looped.
    Now the copy is no checkpoint (its manifest names another folder): listed as not
    committed, moved into ``rejected/`` at resume, and the save links as before."""
    import shutil

    comps = make()
    ck = manager(tmp_path, comps)
    train(ck, comps, 2)
    ck.close()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "ck", copy / "ck", symlinks=False)  # what cp -rL does
    root = copy / "ck"
    assert (root / "latest-rank0").is_dir() and not (root / "latest-rank0").is_symlink()

    assert cli_main(["verify", str(root)]) == 0  # the copy is not a broken checkpoint either
    lines = {line[2:].split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert (
        "NOT COMMITTED" in lines["latest-rank0"]
        and "names checkpoint 'ep0-ba2'" in (lines["latest-rank0"])
    )
    assert lines["ep0-ba2"].endswith(" ok") and lines["ep0-ba1"].endswith(" ok"), lines

    comps2 = make()
    ck2 = manager(copy, comps2)
    assert ck2.resume().path.endswith("ep0-ba2")
    train(ck2, comps2, 1)
    ck2.close()
    assert os.readlink(root / "latest-rank0") == "ep0-ba3"
    aside = root / "rejected" / "latest-rank0"
    assert (aside / "manifest.json").is_file() and "names checkpoint" in (
        aside / "REJECTED.txt"
    ).read_text()


def test_a_folder_in_a_latest_links_place_is_moved_aside_by_the_link(tmp_path):
    """Without a resume first (``load()`` of another run, then saves), the commit's link meets
    the folder itself: it is set aside, never deleted, and the link is made."""
    from trainer_runtime.run_folder.layout import RunFolder

    run = RunFolder(tmp_path)
    (tmp_path / "ep0-ba1").mkdir()
    (tmp_path / "latest-rank0").mkdir()
    (tmp_path / "latest-rank0" / "keep.txt").write_text("mine")
    run.link_latest("latest-rank0", "ep0-ba1")
    assert os.readlink(tmp_path / "latest-rank0") == "ep0-ba1"
    assert (tmp_path / "rejected" / "latest-rank0" / "keep.txt").read_text() == "mine"
    run.link_latest("latest-rank0", "ep0-ba1")  # a link in its place: replaced as before
    assert os.readlink(tmp_path / "latest-rank0") == "ep0-ba1"
