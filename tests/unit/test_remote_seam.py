"""The remote seam's contract (``trainer_runtime.remote``, docs/object-store.md "Your own
backend"): a third-party backend writes the core six methods and gets the rest as no-ops; an
object that does not subclass the base works through its core six; and the newest valid remote
checkpoint is found by one walk."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from trainer_runtime import CheckpointManager
from trainer_runtime.objectstore.errors import ChecksumMismatchError
from trainer_runtime.remote import (
    RemoteBackendBase,
    RemoteChoice,
    as_backend,
    close_remote,
    newest_fetched,
)
from trainer_runtime.save.manifest import Manifest
from trainer_runtime.timestamp import Timestamp

from .trainkit import make, saved_weights


class FolderBackend(RemoteBackendBase):
    """A store that is another folder: the core six only, as a user would write them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.closed: list[float | None] = []
        self.broken: set[str] = set()

    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
        shutil.copytree(run_dir / manifest.name, self.root / manifest.name, dirs_exist_ok=True)

    def pending(self) -> set[str]:
        return set()

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice:
        given = pass_over or {}
        found = [Manifest.read(p) for p in self.root.iterdir() if (p / "manifest.json").exists()]
        passed: list[tuple[str, str]] = []
        for m in sorted(found, key=lambda m: m.timestamp.batch, reverse=True):
            if m.name in exclude:
                continue
            if m.name in given:
                passed.append((m.name, given[m.name]))
                continue
            return RemoteChoice(m.name, m.world_size, passed)
        return RemoteChoice(None, passed_over=passed)

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path:
        if name in self.broken:
            raise ChecksumMismatchError(f"{name}: damaged")
        return Path(shutil.copytree(self.root / name, run_dir / name, dirs_exist_ok=True))

    def uri_for(self, checkpoint: str) -> str:
        return f"folder://{self.root / checkpoint}"

    def close(self, timeout_s: float | None = None) -> None:
        self.closed.append(timeout_s)


class CoreOnly:
    """Not a subclass: the six methods the documentation has always asked for, and an
    optional one that the runtime must not call (only a subclass declares capabilities)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def submit(self, run_dir, manifest, rank):
        self.calls.append(f"submit {manifest.name}")

    def pending(self):
        return set()

    def find_newest(self, *, exclude, pass_over=None):
        return RemoteChoice(None)

    def fetch(self, name, run_dir, ranks):
        raise AssertionError("nothing to fetch")

    def uri_for(self, checkpoint):
        return f"x://{checkpoint}"

    def close(self):
        self.calls.append("close")

    def upload_first(self, name):
        raise AssertionError("not part of a plain object's contract")


def test_a_backend_must_write_the_core_six() -> None:
    class Partial(RemoteBackendBase):
        def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


def test_the_optional_capabilities_default_to_nothing(tmp_path: Path) -> None:
    backend = FolderBackend(tmp_path)
    assert backend.upload_first("ep0-ba1") == []
    assert backend.committed() == [] and backend.committed(attempts=1) == []
    assert backend.reject("ep0-ba1", "why", newer_than=Timestamp()) is False
    assert backend.repair_pointer() is None
    assert backend.resubmit_unsynced(tmp_path) == []
    assert backend.transfers_stuck() is False


def test_a_subclass_is_used_as_it_is_and_gets_the_flush_bound(tmp_path: Path) -> None:
    backend = FolderBackend(tmp_path)
    assert as_backend(backend) is backend and as_backend(None) is None
    close_remote(backend, 7.5)
    close_remote(backend, None)
    assert backend.closed == [7.5, None]


def test_a_plain_object_is_adapted_to_its_core_six(tmp_path: Path) -> None:
    plain = CoreOnly()
    remote = as_backend(plain)
    assert remote is not plain and isinstance(remote, RemoteBackendBase)
    assert remote.uri_for("ep0-ba1") == "x://ep0-ba1" and repr(remote) == repr(plain)
    assert remote.upload_first("ep0-ba1") == [] and not remote.transfers_stuck()
    close_remote(remote, 3.0)  # its close() takes no bound: called without one
    assert plain.calls == ["close"]


def test_newest_fetched_passes_over_broken_ones_newest_first() -> None:
    names = ["ep0-ba30", "ep0-ba20", "ep0-ba10"]
    asked: list[set[str]] = []

    def find(tried: set[str]) -> RemoteChoice:
        asked.append(set(tried))
        left = [n for n in names if n not in tried and n != "ep0-ba30"]
        return RemoteChoice(left[0] if left else None, 1, [("ep0-ba30", "quarantined")])

    def fetch(name: str, world: int) -> str | None:
        return "checksum" if name == "ep0-ba20" else None

    told: list[tuple[str, str]] = []
    chosen, passed = newest_fetched(find, fetch, skip={"x"}, on_broken=lambda *a: told.append(a))
    assert chosen == "ep0-ba10"
    assert passed == [("ep0-ba30", "quarantined"), ("ep0-ba20", "checksum")]
    assert told == [("ep0-ba20", "checksum")]
    assert asked == [{"x"}, {"x", "ep0-ba20"}]
    assert newest_fetched(lambda tried: RemoteChoice(None), fetch) == (None, [])


def _run(folder: Path, remote: object, **kw: object) -> CheckpointManager:
    model, opt, sched, scaler = make()[:4]
    return CheckpointManager(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        folder=folder,
        run_name="run",
        interval="2ba",
        remote=remote,
        **kw,
    )


def test_a_user_backend_resumes_a_run_on_a_new_disk(tmp_path: Path) -> None:
    """The core six are enough: the run uploads through ``submit``, and a run on an empty disk
    resumes from the newest remote checkpoint that fetches intact, passing a broken one over."""
    store = FolderBackend(tmp_path / "store")
    store.root.mkdir()
    first = _run(tmp_path / "node-a", store)
    assert first.resume().source == "fresh"
    for _ in range(6):
        first.batch_end(1)
    first.close(upload_timeout_s=5.0)
    assert store.closed == [5.0]
    assert sorted(p.name for p in store.root.iterdir()) == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    weights = saved_weights(store.root / "ep0-ba4")

    store.broken = {"ep0-ba6"}
    second = _run(tmp_path / "node-b", store)
    got = second.resume()
    assert (got.source, got.timestamp.batch) == ("remote", 4)
    assert any("ep0-ba6" in line and "damaged" in line for line in got.fallbacks)
    fetched = saved_weights(tmp_path / "node-b" / "ep0-ba4")
    assert fetched.keys() == weights.keys()
    assert all(torch.equal(fetched[k], weights[k]) for k in weights)
    second.close()


def test_a_plain_object_still_serves_a_run(tmp_path: Path) -> None:
    plain = CoreOnly()
    run = _run(tmp_path / "ck", plain)
    assert run.resume().source == "fresh"
    for _ in range(2):
        run.batch_end(1)
    run.close(upload_timeout_s=1.0)
    assert plain.calls == ["submit ep0-ba2", "close"]
