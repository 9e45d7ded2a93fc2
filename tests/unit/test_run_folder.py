"""``layout.RunFolder`` over a local folder: listing order, torn and set-aside folders, the
pointer, verification and the newest-valid walk. The same model over an object-store prefix is
tested in ``tests/objectstore/test_run_folder_remote.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.objectstore.helpers import make_checkpoint
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.run_folder.names import (
    MANIFEST_NAME,
    POINTER_NAME,
    REASON_FILE,
    REJECTED_DIR,
    REJECTED_WITH_DATA,
    TRIMMED_FILE,
)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Committed: zz-newest (batch 40), ep0-ba30 (2 ranks), ep0-ba10, ep0-ba9 (by name it
    would sort before ep0-ba30 and ep0-ba10); a torn folder, a set-aside checkpoint and a
    hidden temporary folder."""
    root = tmp_path / "run"
    make_checkpoint(root, "ep0-ba10", 10, size=4096)
    make_checkpoint(root, "zz-newest", 40, size=4096)
    make_checkpoint(root, "ep0-ba30", 30, world_size=2, size=4096)
    make_checkpoint(root, "ep0-ba9", 9, size=4096)
    torn, _ = make_checkpoint(root, "ep0-ba50", 50, size=4096)
    (torn / MANIFEST_NAME).unlink()
    make_checkpoint(root / REJECTED_DIR, "ep0-ba60", 60, size=4096)
    make_checkpoint(root, ".download-ep0-ba70", 70, size=4096)
    return root


def test_lists_committed_newest_by_progress_then_the_rest_with_a_reason(run: Path):
    folder = RunFolder(run)
    cands = folder.candidates()
    assert [c.name for c in cands] == ["zz-newest", "ep0-ba30", "ep0-ba10", "ep0-ba9", "ep0-ba50"]
    torn = cands[-1]
    assert torn.manifest is None
    assert "does not exist" in str(torn.reason)
    assert [m.name for m in folder.committed()] == ["zz-newest", "ep0-ba30", "ep0-ba10", "ep0-ba9"]


def test_a_tie_in_progress_goes_to_the_checkpoint_the_pointer_names(tmp_path: Path):
    root = tmp_path / "run"
    _, a = make_checkpoint(root, "a", 10, size=1024)
    _, b = make_checkpoint(root, "b", 10, size=1024)
    for m in (a, b):  # identical progress and creation time: only the pointer decides
        m.created_at = "2026-01-01T00:00:00+00:00"
        (root / m.name / MANIFEST_NAME).write_text(m.to_json())
    folder = RunFolder(root)
    for named in ("a", "b"):
        (root / POINTER_NAME).write_text(json.dumps({"checkpoint": named}))
        assert folder.committed()[0].name == named
        assert folder.pointer_name() == named


def test_verify_checks_only_the_ranks_asked_for(run: Path):
    folder = RunFolder(run)
    ckpt = next(m for m in folder.committed() if m.name == "ep0-ba30")
    flip_byte(run / "ep0-ba30" / "rank1.pt")
    assert folder.verify(ckpt, [0]) is None
    reason = folder.verify(ckpt, [1])
    assert reason is not None and "rank1.pt" in reason and "checksum" in reason
    assert folder.verify(ckpt, None) == reason, "None means every rank"


def test_newest_valid_falls_back_past_damaged_and_incomplete_checkpoints(run: Path):
    flip_byte(run / "zz-newest" / "rank0.pt")
    os.remove(run / "ep0-ba30" / "rank1.pt")
    walk = RunFolder(run).newest_valid(lambda m: None)
    assert walk.chosen is not None and walk.chosen.name == "ep0-ba10"
    assert walk.reasons(lambda m: m.name) == [
        "zz-newest: rank0.pt (rank 0) fails its checksum",
        "ep0-ba30: rank1.pt (rank 1) is missing",
    ]
    # Asking only for rank 0's files, ep0-ba30 holds up.
    walk0 = RunFolder(run).newest_valid(lambda m: [0])
    assert walk0.chosen is not None and walk0.chosen.name == "ep0-ba30"


def test_pointer_that_does_not_parse_is_no_pointer(run: Path):
    folder = RunFolder(run)
    assert folder.pointer_name() is None
    (run / POINTER_NAME).write_text("{not json")
    assert folder.read_pointer() is None and folder.pointer_name() is None
    (run / POINTER_NAME).write_text(json.dumps(["ep0-ba10"]))
    assert folder.pointer_name() is None


def test_a_missing_folder_has_no_candidates(tmp_path: Path):
    folder = RunFolder(tmp_path / "absent")
    assert folder.candidates() == []
    assert folder.newest_valid(lambda m: None).chosen is None


def test_only_the_newest_set_aside_folders_keep_their_data(tmp_path: Path) -> None:
    """Every checkpoint resume set aside kept its data on the node's disk, one more per
    relaunch that rejected the newest, until a save failed for want of space. The newest
    ``REJECTED_WITH_DATA`` keep it; older ones keep their manifest and reason only."""
    run = RunFolder(tmp_path)
    names = [f"ep0-ba{b}" for b in range(1, REJECTED_WITH_DATA + 3)]
    for i, name in enumerate(names):
        make_checkpoint(tmp_path, name, i + 1, world_size=2, size=4096)
        (tmp_path / name / ".metadata").write_bytes(b"meta")
        run.move_aside(name, f"damaged {name}")
        # Set aside one after another: a second apart, whatever the clock's resolution.
        reason = tmp_path / REJECTED_DIR / name / REASON_FILE
        os.utime(reason, (1_000_000 + i, 1_000_000 + i))
    run.move_aside("absent", "nothing there")  # no folder: nothing moved, nothing trimmed
    aside = tmp_path / REJECTED_DIR
    for name in names[-REJECTED_WITH_DATA:]:
        assert {p.name for p in (aside / name).iterdir()} == {
            "rank0.pt",
            "rank1.pt",
            ".metadata",
            MANIFEST_NAME,
            REASON_FILE,
        }, name
    # Each move trimmed the folders beyond the newest two, the last move the newest of them.
    for name in names[:-REJECTED_WITH_DATA]:
        left = {p.name for p in (aside / name).iterdir()}
        assert left == {".metadata", MANIFEST_NAME, REASON_FILE, TRIMMED_FILE}, name
        assert f"damaged {name}" in (aside / name / REASON_FILE).read_text()
        assert "data files deleted" in (aside / name / TRIMMED_FILE).read_text()
