"""A checkpoint benchmark stopped with Ctrl-C leaves no data folder and no process behind, and
ends with one line and exit status 130 (a shell's code for SIGINT), not a traceback.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group; each run here starts
in a session of its own and gets that signal the same way, midway through its timed rounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tools.waiting import wait_for

pytestmark = pytest.mark.multiproc

ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED_EXIT = 130


def group_members(pgid: int) -> list[str]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, check=False)
    return out.stdout.split()


def data_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]


def _default_sigint() -> None:
    """A terminal's foreground job takes Ctrl-C by default; a test run started in the
    background by a non-interactive shell (as CI may start it) inherits SIGINT ignored, and
    Python keeps it ignored, so the benchmark would never see the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_midway(tmp_path: Path, script: str, started: str, *extra: str) -> Path:
    """Run ``script``, Ctrl-C it once ``started`` is logged; its data folder, checked for the
    clean ending first."""
    data = tmp_path / "data"
    log = tmp_path / "bench.log"
    cmd = [sys.executable, f"benchmarks/{script}", "--json", str(tmp_path / "out.json")]
    cmd += ["--size-mib", "16", "--rounds", "50", "--dir", str(data), *extra]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,  # noqa: PLW1509 - one signal call, no lock taken
        )
    try:
        wait_for(
            f"{started!r} in the log",
            lambda: started in log.read_text(),
            timeout=300,
            on_timeout=lambda: log.read_text()[-3000:],
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        # A data file, not the folder's own scratch mark (a dot file, there from the start):
        # the run is midway through its rounds, with ranks and relaunched children at work.
        wait_for("the run's first data file", lambda: any(data_files(data)), timeout=300)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
        wait_for("every process ended", lambda: not group_members(proc.pid), timeout=30)
    finally:
        if proc.poll() is None or group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert proc.returncode == INTERRUPTED_EXIT, out[-3000:]
    assert "[bench] interrupted (Ctrl-C)" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return data


def test_checkpoint_benchmark_interrupted_removes_its_data_folder(tmp_path: Path) -> None:
    data = interrupt_midway(tmp_path, "checkpoint.py", "round 1/50")
    assert not data.exists(), sorted(str(p) for p in data.rglob("*"))


def test_engines_benchmark_interrupted_removes_its_folder_and_ranks(tmp_path: Path) -> None:
    data = interrupt_midway(
        tmp_path, "checkpoint_engines.py", "[bench] single:", "--configs", "single"
    )
    assert not data.exists(), sorted(str(p) for p in data.rglob("*"))


def run_entry_point(body: str) -> subprocess.CompletedProcess[str]:
    """A benchmark entry point (``interrupt.run``) around ``main``'s ``body``, in a process."""
    script = (
        "import sys\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "import interrupt\n"
        "def main():\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
        + "interrupt.run(main)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_error_raised_while_ctrl_c_is_handled_still_ends_as_an_interrupt() -> None:
    """``torch.save`` interrupted in its zip writer raises a RuntimeError from its clean-up."""
    done = run_entry_point(
        "try:\n    raise KeyboardInterrupt\nexcept KeyboardInterrupt:\n"
        "    raise RuntimeError('unexpected pos 5282688 vs 5282580')"
    )
    assert done.returncode == INTERRUPTED_EXIT, done.stderr
    assert done.stderr == "[bench] interrupted (Ctrl-C)\n"


def test_a_failure_without_ctrl_c_keeps_its_traceback_and_status() -> None:
    done = run_entry_point("raise RuntimeError('disk on fire')")
    assert done.returncode == 1
    assert "RuntimeError: disk on fire" in done.stderr and "interrupted" not in done.stderr
    assert run_entry_point("return 3").returncode == 3
