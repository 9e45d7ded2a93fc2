"""``run_folder``: the layout's names without torch, the one manifest-first deleter (a local
folder and a bucket prefix), the bucket's set-aside, the keep-newest-N policy, and the
``keep_local`` copies deleted with them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.objectstore.helpers import make_checkpoint
from trainer_runtime.objectstore.local_copies import UploadedLocalCopies
from trainer_runtime.objectstore.uri import S3Uri
from trainer_runtime.run_folder import names
from trainer_runtime.run_folder.deleter import BucketDeleter, LocalDeleter, delete
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.run_folder.retention import beyond_newest, select_for_deletion, spare
from trainer_runtime.run_folder.set_aside import set_aside_in_bucket
from trainer_runtime.sharded import storage


def test_the_names_module_imports_no_torch():
    script = (
        "import sys, trainer_runtime.run_folder.names, trainer_runtime.run_folder.layout, "
        "trainer_runtime.resume.rejection, trainer_runtime.run_folder.set_aside; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_the_names_are_the_writers():
    assert names.METADATA_NAME == storage.METADATA_NAME
    assert names.DATA_SUFFIX == storage.DATA_SUFFIX
    assert names.is_checkpoint_file(storage.data_file_name(3))
    assert names.is_checkpoint_file("rank12.pt") and not names.is_checkpoint_file("weights.pt")


class Recorder:
    """A deleter that records the order of its calls, failing where told."""

    def __init__(self, fail_rest: bool = False) -> None:
        self.calls: list[tuple[str, str, object]] = []
        self.fail_rest = fail_rest

    def uncommit(self, name: str) -> None:
        self.calls.append(("uncommit", name, None))

    def remove_rest(self, name: str, files=None) -> None:
        self.calls.append(("remove_rest", name, files))
        if self.fail_rest:
            raise OSError("disk gone")


def test_delete_uncommits_before_anything_else_goes():
    where = Recorder()
    delete(where, "ep0-ba1", ["rank1.pt"])
    assert where.calls == [("uncommit", "ep0-ba1", None), ("remove_rest", "ep0-ba1", ["rank1.pt"])]


def test_a_local_delete_cut_short_leaves_no_checkpoint(tmp_path: Path, monkeypatch):
    """The rest failing to go (a crash, a full disk) leaves a folder that is not committed:
    the manifest went first."""
    make_checkpoint(tmp_path, "ep0-ba1", 1, size=64)
    deleter = LocalDeleter(tmp_path)

    def crash(*args, **kwargs):
        raise OSError("crashed while deleting")

    monkeypatch.setattr(deleter, "remove_rest", crash)
    with pytest.raises(OSError, match="crashed"):
        delete(deleter, "ep0-ba1")
    assert (tmp_path / "ep0-ba1" / "rank0.pt").exists()
    assert not RunFolder(tmp_path).is_committed("ep0-ba1")


def test_a_local_delete_of_one_ranks_files_leaves_the_others(tmp_path: Path):
    make_checkpoint(tmp_path, "ep0-ba1", 1, world_size=2, size=64)
    delete(LocalDeleter(tmp_path), "ep0-ba1", ["rank1.pt"])
    assert sorted(p.name for p in (tmp_path / "ep0-ba1").iterdir()) == ["rank0.pt"]
    delete(LocalDeleter(tmp_path), "ep0-ba1", ["rank0.pt"])  # the last one: the folder goes
    assert not (tmp_path / "ep0-ba1").exists()


def test_a_local_delete_of_the_whole_folder_and_of_nothing(tmp_path: Path):
    make_checkpoint(tmp_path, "ep0-ba1", 1, world_size=2, size=64)
    delete(LocalDeleter(tmp_path), "ep0-ba1")
    assert not (tmp_path / "ep0-ba1").exists()
    delete(LocalDeleter(tmp_path), "ep0-ba1")  # already gone (another rank): no error


class FakeStore:
    """The calls of ``S3Store`` that deleting and setting aside make, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def delete(self, location: S3Uri) -> None:
        self.calls.append(("delete", location.key))

    def delete_prefix(self, location: S3Uri, *, first: tuple[str, ...] = ()) -> int:
        self.calls.append(("delete_prefix", location.key))
        return 0

    def put_bytes(self, location: S3Uri, body: bytes, content_type: str = "") -> None:
        self.calls.append(("put", location.key))

    def put_json(self, location: S3Uri, body: dict) -> None:
        assert body["checkpoint"] == "ep0-ba2" and body["reason"] == "torn"
        self.calls.append(("put", location.key))


def test_a_bucket_delete_removes_the_manifest_first():
    store = FakeStore()
    deleter = BucketDeleter(store, S3Uri("b", "runs/r"))  # type: ignore[arg-type]
    delete(deleter, "ep0-ba1")
    assert store.calls == [
        ("delete", "runs/r/ep0-ba1/manifest.json"),
        ("delete_prefix", "runs/r/ep0-ba1"),
    ]
    store.calls.clear()
    delete(deleter, "ep0-ba1", ["rank1.pt"])
    assert store.calls == [
        ("delete", "runs/r/ep0-ba1/manifest.json"),
        ("delete", "runs/r/ep0-ba1/rank1.pt"),
    ]


def test_setting_aside_in_a_bucket_keeps_the_evidence_before_uncommitting():
    store = FakeStore()
    aside = set_aside_in_bucket(store, S3Uri("b", "r"), "ep0-ba2", b"{}", "torn")  # type: ignore[arg-type]
    assert aside == S3Uri("b", "r/rejected/ep0-ba2")
    assert store.calls == [
        ("put", "r/rejected/ep0-ba2/manifest.json"),
        ("put", "r/rejected/ep0-ba2/reason.json"),
        ("delete", "r/ep0-ba2/manifest.json"),
        ("delete_prefix", "r/ep0-ba2"),
    ]


NAMES = ["ep0-ba5", "ep0-ba4", "ep0-ba3", "ep0-ba2", "ep0-ba1"]


def test_beyond_newest_keeps_n_and_zero_keeps_none():
    assert beyond_newest(NAMES, 2) == ["ep0-ba3", "ep0-ba2", "ep0-ba1"]
    assert beyond_newest(NAMES, 0) == NAMES  # keep_local=0: the newest goes too
    assert beyond_newest(NAMES, 9) == []
    assert beyond_newest(NAMES, 1, counts=lambda n: n != "ep0-ba5") == NAMES[2:]
    with pytest.raises(ValueError, match="keep=-1"):
        beyond_newest(NAMES, -1)


def test_spare_and_the_newest_is_never_selected():
    assert spare(NAMES, {"ep0-ba4", "x"}) == ["ep0-ba5", "ep0-ba3", "ep0-ba2", "ep0-ba1"]
    # Nothing counts: every one is "beyond" the kept set, but the newest stays.
    assert select_for_deletion(NAMES[:2], keep=1, counts=lambda n: False) == []


def test_keep_local_deletes_beyond_the_newest_except_pending_and_uncommitted(tmp_path: Path):
    """``UploadedLocalCopies``: keep the newest ``keep`` uploaded copies; of the older, one
    still pending stays, as does an adopted one the bucket does not hold committed."""
    copies = UploadedLocalCopies(keep=1, leader_rank=0)
    adopted, m_adopted = make_checkpoint(tmp_path, "ep0-ba1", 1, size=64)
    copies.adopt(m_adopted, adopted)
    pending = {"ep0-ba2"}
    folders = {}
    for batch in (2, 3, 4):
        folder, manifest = make_checkpoint(tmp_path, f"ep0-ba{batch}", batch, size=64)
        folders[batch] = folder
        copies.uploaded(
            manifest,
            folder,
            0,
            still_pending=lambda n: n in pending,
            committed_remotely=lambda m: m.name != "ep0-ba1",
        )
    assert adopted.exists()  # adopted, and not committed in the bucket: the only copy
    assert folders[2].exists()  # still pending
    assert not folders[3].exists()  # beyond the newest one: deleted
    assert folders[4].exists()
    assert [c.manifest.name for c in copies._kept] == ["ep0-ba4", "ep0-ba2", "ep0-ba1"]
