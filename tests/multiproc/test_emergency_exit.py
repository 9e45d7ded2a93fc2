"""After the emergency save, the process ends without tearing down its heap, but only when the
runtime's ``SystemExit`` really ended the program.

Real processes, a real SIGTERM. Whether the heap was torn down shows in a module-level object
whose ``__del__`` writes a marker: the ordinary interpreter shutdown runs it, ``os._exit`` does
not. ``atexit`` handlers must run either way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .checks import committed_and_valid

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, os, signal, sys
from pathlib import Path
import torch
from trainer_runtime import CheckpointManager

out = Path(sys.argv[1])

class TornDown:
    # Late in shutdown, module globals and builtins may be gone, and pathlib may need an import
    # (Python 3.12): everything __del__ uses is bound when the class is made.
    def __del__(self, marker=str(out / "torn-down"), os=os):
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"yes")
        os.close(fd)

keep = TornDown()
atexit.register(lambda: (out / "atexit").write_text("yes"))
model = torch.nn.Linear(4, 4)
ck = CheckpointManager(model=model, folder=out / "ck", run_name="r", interval="100ba")
ck.batch_end(4)
os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
{body}
"""


def run(tmp: Path, body: str) -> int:
    proc = launch(tmp, body)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode


def launch(tmp: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.py"
    script.write_text(SCRIPT.format(body=textwrap.dedent(body)))
    return subprocess.run(
        [sys.executable, str(script), str(tmp)],
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "RTJ_GRACE_PERIOD_SECONDS": "20"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_uncaught_emergency_exit_skips_the_teardown_after_the_atexit_handlers(tmp_path):
    code = run(tmp_path, "ck.batch_end(4)")
    assert code == 143
    assert committed_and_valid(tmp_path / "ck") == ["ep0-ba2"]
    assert (tmp_path / "atexit").exists(), "an atexit handler of the program did not run"
    assert not (tmp_path / "torn-down").exists(), "the heap was torn down after the save"


def test_a_caught_emergency_exit_leaves_the_ordinary_shutdown_and_exit_code(tmp_path):
    code = run(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        except SystemExit as exc:
            assert exc.code == 143
        # a harness goes on after catching it, and exits later on its own account
        sys.exit(3)
        """,
    )
    assert code == 3
    assert committed_and_valid(tmp_path / "ck") == ["ep0-ba2"]
    assert (tmp_path / "atexit").exists()
    assert (tmp_path / "torn-down").exists(), "a caught exit must not skip the teardown"


def test_a_reraised_emergency_exit_still_ends_the_process_with_143(tmp_path):
    code = run(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        finally:
            (out / "finally").write_text("yes")
        """,
    )
    assert code == 143
    assert (tmp_path / "finally").exists()
    assert (tmp_path / "atexit").exists()
    assert not (tmp_path / "torn-down").exists()


def test_an_emergency_exit_caught_at_the_top_level_ends_with_the_scripts_own_code(tmp_path):
    code = run(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        except SystemExit:
            pass
        (out / "went-on").write_text("yes")
        """,
    )
    assert code == 0
    assert (tmp_path / "went-on").exists()
    assert (tmp_path / "torn-down").exists()


def test_an_exit_raised_while_handling_it_ends_fast_with_its_own_code(tmp_path):
    code = run(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        finally:
            sys.exit(5)
        """,
    )
    assert code == 5
    assert (tmp_path / "atexit").exists()
    assert not (tmp_path / "torn-down").exists()


def test_logging_and_a_bare_reraise_still_skips_the_teardown(tmp_path):
    """The idiom of real training scripts: ``except SystemExit: log(...); raise``."""
    code = run(
        tmp_path,
        """
        import logging

        def main():
            try:
                ck.batch_end(4)
            except SystemExit as exc:
                logging.getLogger("train").warning("stopping: %s", exc)
                raise

        main()
        """,
    )
    assert code == 143
    assert (tmp_path / "atexit").exists()
    assert not (tmp_path / "torn-down").exists(), "a bare raise took the slow exit"


def test_a_reraise_from_a_nested_function_skips_the_teardown(tmp_path):
    code = run(
        tmp_path,
        """
        def report_and_reraise():
            (out / "reported").write_text("yes")
            raise

        try:
            ck.batch_end(4)
        except SystemExit:
            report_and_reraise()
        """,
    )
    assert code == 143
    assert (tmp_path / "reported").exists()
    assert not (tmp_path / "torn-down").exists()


def test_a_new_systemexit_from_the_caught_one_ends_fast_with_the_new_code(tmp_path):
    code = run(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        except SystemExit as exc:
            raise SystemExit(7) from exc
        """,
    )
    assert code == 7
    assert (tmp_path / "atexit").exists()
    assert not (tmp_path / "torn-down").exists()


def test_an_exception_other_than_systemexit_ends_through_the_ordinary_shutdown(tmp_path):
    proc = launch(
        tmp_path,
        """
        try:
            ck.batch_end(4)
        except SystemExit as exc:
            raise RuntimeError("converted") from exc
        """,
    )
    assert proc.returncode == 1
    assert "RuntimeError: converted" in proc.stderr
    assert (tmp_path / "torn-down").exists()


def test_an_emergency_exit_through_a_main_function_and_a_with_block_skips_the_teardown(
    tmp_path,
):
    code = run(
        tmp_path,
        """
        import contextlib

        def main():
            with contextlib.ExitStack():
                for _ in range(3):
                    ck.batch_end(4)

        if __name__ == "__main__":
            main()
        """,
    )
    assert code == 143
    assert (tmp_path / "atexit").exists()
    assert not (tmp_path / "torn-down").exists()
