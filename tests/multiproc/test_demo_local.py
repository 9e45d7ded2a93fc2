"""`make demo-local` as a user runs it: the SIGTERM save, the SIGKILL, and bitwise-equal weights.

The demo follows its ranks through their runtime events, so each interruption lands where it
says (after a commit) however slowly the processes start; this checks that each phase happened
as narrated, not only that the weights came out equal.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_runtime.events import read_events

pytestmark = pytest.mark.multiproc
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo_local.py"


def test_demo_local_saves_on_sigterm_resumes_after_sigkill_and_ends_equal(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, str(DEMO), "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "exited [143, 143]" in out, out
    assert "final weights equal the uninterrupted run's, bit for bit" in out, out

    # The SIGTERM came after the first commit, and both ranks saved on it.
    first_attempt = (work / "events-spot-1.jsonl").read_text()
    assert read_events(first_attempt, "committed")
    saved = read_events(first_attempt, "emergency_saved")
    assert sorted(e.rank for e in saved) == [0, 1]
    # The relaunch resumed from that save's step, committed, and was killed before its end.
    second = (work / "events-spot-2.jsonl").read_text()
    resumed = read_events(second, "resumed")
    assert resumed and resumed[0]["step"] == saved[0]["step"]
    killed_at = read_events(second, "committed")[-1]["step"]
    # The last launch resumed from the newest commit before the kill, or one after it.
    last = read_events((work / "events-spot-3.jsonl").read_text(), "resumed")
    assert last and last[0]["step"] >= killed_at
    match = re.search(r"resumed at step (\d+), committed (\S+), killed", out)
    assert match and int(match.group(1)) == saved[0]["step"], out
