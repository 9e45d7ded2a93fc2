"""benchmarks/fork_hang_probe.py: the probe's report and exit code agree, bad input is refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "fork_hang_probe.py"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork and pthreads on Linux")


def run_probe(forks: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROBE), "--forks", str(forks)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_probe_reports_its_forks_and_fails_exactly_when_a_child_hung() -> None:
    run = run_probe(30)
    found = re.search(r"Python \S+: (\d+) of 30 children hung; (\d+) native threads", run.stdout)
    assert found, run.stdout + run.stderr
    hung, entered = int(found[1]), int(found[2])
    assert entered > 0, "no native thread entered Python: the probe raced nothing"
    assert run.returncode == (1 if hung else 0)


def test_the_probe_refuses_a_count_below_one() -> None:
    run = run_probe(0)
    assert run.returncode == 2 and "--forks must be at least 1" in run.stderr
