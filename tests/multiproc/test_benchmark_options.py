"""A benchmark refuses a bad option before it builds or saves any state; load_phases'
``--same-process`` mode runs end to end at a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

ROOT = Path(__file__).resolve().parents[2]


def test_load_phases_unknown_contender_is_refused_before_any_state_is_saved(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    cmd = [sys.executable, "benchmarks/load_phases.py", "--json", str(tmp_path / "out.json")]
    cmd += ["--size-mib", "8", "--dir", str(data), "--contenders", "load,bogus"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    assert "--contenders: unknown ['bogus']" in out.stderr
    assert "load-warm" in out.stderr  # the names it accepts
    assert not data.exists(), sorted(str(p) for p in data.rglob("*"))


@pytest.mark.parametrize("script", ["checkpoint.py", "checkpoint_engines.py"])
def test_a_dir_holding_the_users_files_is_refused_and_kept(tmp_path: Path, script: str) -> None:
    """The benchmarks empty their data folder before and after a run: ``--dir`` pointed at a
    folder of the user's deleted everything in it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    cmd = [sys.executable, f"benchmarks/{script}", "--json", str(tmp_path / "out.json")]
    cmd += ["--quick", "--dir", str(mine)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    assert f"--dir {mine}: the folder holds files this benchmark did not write" in out.stderr
    assert (mine / "notes.txt").read_text() == "keep me"


def test_load_phases_same_process_refuses_an_unknown_contender(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cmd = [sys.executable, "benchmarks/load_phases.py", "--same-process", "--size-mib", "8"]
    cmd += ["--dir", str(data), "--contenders", "verified,bogus"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    assert "--contenders: unknown ['bogus']" in out.stderr
    assert "read-whole-16m" in out.stderr  # the names it accepts
    assert not data.exists()


def test_load_phases_same_process_times_both_loads_and_their_ratio(tmp_path: Path) -> None:
    """The verified load and DCP's, in one process, one round: every sample and the ratios."""
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, "benchmarks/load_phases.py", "--same-process", "--warm"]
    cmd += ["--size-mib", "8", "--rounds", "1", "--dir", str(tmp_path / "d")]
    cmd += ["--json", str(out_json), "--contenders", "verified,dcp"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert report["mode"] == "same-process"
    assert sorted(report["samples"]) == ["dcp", "verified"]
    verified = report["samples"]["verified"][0]
    assert verified["read.hash"] > 0  # the runtime's load hashed what it read
    assert verified["with_first_step"] >= verified["seconds"] > 0
    assert set(report["ratios"]["verified / dcp, seconds"]) == {"from_medians", "paired"}
