"""What every part of the local stack shares: paths, names, the error type, narration.

One module of constants rather than constants spread over the parts, so a name (the chart's
release, the claim for the final weights) is spelled once for the stack, the story and the demo
alike. What the operator names (the API, the labels of its pods) comes from the operator's own
module, ``rtj_operator.api.names``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MINIO_SH = REPO / "hack" / "s3" / "build-minio.sh"
CHART = REPO / "charts" / "resumable-training-operator"
OPERATOR_DIR = REPO / "operator"
RELEASE = "rtj-operator"
OPERATOR_NAMESPACE = "rtj-system"
S3_SECRET = "rtj-s3"  # noqa: S105 - a Secret's name
RESULTS_CLAIM = "rtj-results"
NODE_PREFIX = "spot-"
NOT_SCHEDULABLE = "rtj-localstack/operator=runs-as-a-local-process"
"""nodeSelector given to the chart's Deployment: even before it is scaled to 0, its pod can
never land on a pod-runner node (which would try to run it as a process)."""

Obj = dict[str, Any]
Say = Callable[[str], None]


class StackError(RuntimeError):
    """A prerequisite is missing or a component did not come up; the message says which."""


def _quiet(_line: str) -> None:
    """The default narrator: says nothing."""


def run_streaming(
    argv: list[str],
    say: Say,
    prefix: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """Run a command, passing each output line to ``say`` (progress of slow builds); its output.

    Raises StackError with the output's end when it fails.
    """
    lines: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            say(f"{prefix}{line.rstrip()}")
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                raise StackError(f"{argv[0]} ran past {timeout:.0f}s")
        code = proc.wait()
    if code != 0:
        tail = "\n".join(lines[-30:])
        raise StackError(f"{' '.join(argv)} failed with exit code {code}:\n{tail}")
    return "\n".join(lines)
