"""The resume decision and the emergency save reach stderr however the script sets up logging.

Real processes: a script with no logging setup (nanoGPT, the FSDP2 example), one at WARNING,
and one at INFO (the line goes through its handler, once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, os, signal, sys
import torch
from trainer_runtime import CheckpointManager
{setup}
model = torch.nn.Linear(4, 4)
ck = CheckpointManager(model=model, folder=sys.argv[1], run_name="r", interval="2ba")
ck.resume()
for _ in range(4):
    ck.batch_end(4)
if sys.argv[2] == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    ck.batch_end(4)
ck.close()
"""

SETUPS = {
    "none": "",
    "warning": "logging.basicConfig(level=logging.WARNING)",
    "info": "logging.basicConfig(level=logging.INFO, format='APP %(name)s %(message)s')",
}


def run(tmp_path: Path, setup: str, mode: str = "plain") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(setup=SETUPS[setup]))
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck"), mode],
        check=False,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("setup", ["none", "warning"])
def test_without_an_info_handler_the_decisions_are_written_to_stderr(tmp_path, setup):
    first = run(tmp_path, setup)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "rtj: starting run r from scratch" in first.stderr
    second = run(tmp_path, setup)
    assert "rtj: resumed run r from " in second.stderr
    assert "at epoch 0 batch 4" in second.stderr
    killed = run(tmp_path, setup, "sigterm")
    assert killed.returncode == 128 + signal.SIGTERM
    # WARNING lines: through the script's handler when it has one (at WARNING), else stderr
    for said in ("SIGTERM: saving at batch 13 ", "emergency save ep0-ba13 done"):
        lines = [line for line in killed.stderr.splitlines() if said in line]
        assert len(lines) == 1, killed.stderr[-2000:]
        assert lines[0].startswith("rtj: " if setup == "none" else "WARNING:trainer_runtime")


def test_with_an_info_handler_the_line_goes_through_it_once(tmp_path):
    run(tmp_path, "info")
    second = run(tmp_path, "info")
    lines = [line for line in second.stderr.splitlines() if "resumed run r from" in line]
    assert len(lines) == 1, second.stderr[-2000:]
    assert lines[0].startswith("APP trainer_runtime "), lines
