"""Rank 0's progress report keeps the current step fresh however often checkpoints commit.

The operator counts an interruption's lost steps from the annotation's ``current_step``; when
every commit restarted the report's wait, commits more often than the interval meant only each
commit's own step was ever sent (``stepsLost`` 0 for every loss without notice). The HTTP call
is replaced by a recorder: what is tested is when the reporter sends, not how.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from trainer_runtime import envvars
from trainer_runtime.errors import ConfigError
from trainer_runtime.pod.progress import DEFAULT_INTERVAL_S, ProgressReporter


class Recording(ProgressReporter):
    def __init__(self, tmp_path, interval_s: float | None = None, **env: str) -> None:
        (tmp_path / "token").write_text("t")
        environ = {
            envvars.POD_NAME: "p",
            envvars.KUBERNETES_SERVICE_HOST: "127.0.0.1",
            envvars.SERVICEACCOUNT_DIR: str(tmp_path),
            envvars.NAMESPACE: "ns",
            **env,
        }
        super().__init__(interval_s=interval_s, environ=environ)
        self.sent: list[tuple[float, dict[str, Any]]] = []

    def _send(self, annotations: dict[str, str]) -> None:
        state = json.loads(annotations[envvars.PROGRESS_ANNOTATION])
        self.sent.append((time.monotonic(), state))


def test_the_step_is_sent_between_commits_that_come_faster_than_the_interval(tmp_path):
    reporter = Recording(tmp_path, interval_s=0.5)
    end = time.monotonic() + 3.0
    step = 0
    while time.monotonic() < end:
        step += 1
        reporter.step(step)
        if step % 10 == 0:  # a commit every 0.2 s, more often than the interval
            reporter.committed({"checkpoint": f"ba{step}", "step": step})
        time.sleep(0.02)
    reporter.close()
    between = [s["current_step"] for _, s in reporter.sent if s["current_step"] % 10]
    assert len(between) >= 3, [s for _, s in reporter.sent]
    commits = {s["checkpoint"] for _, s in reporter.sent}
    assert len(commits) >= 10, "a commit is still sent at once"


def test_send_now_sends_the_step_at_once(tmp_path):
    reporter = Recording(tmp_path, interval_s=60)
    reporter.step(3)
    reporter.send_now(4)
    deadline = time.monotonic() + 5
    while not reporter.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reporter.sent and reporter.sent[0][1]["current_step"] == 4
    reporter.close()


def test_the_interval_comes_from_the_environment_with_a_default(tmp_path):
    assert Recording(tmp_path).interval_s == DEFAULT_INTERVAL_S
    assert Recording(tmp_path, **{envvars.PROGRESS_INTERVAL_SECONDS: "7.5"}).interval_s == 7.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match=envvars.PROGRESS_INTERVAL_SECONDS):
            Recording(tmp_path, **{envvars.PROGRESS_INTERVAL_SECONDS: bad})


def test_every_report_says_the_attempt_of_the_workers_that_send_it(tmp_path):
    """A kept pod is relabelled into the next attempt while its old workers still report: the
    operator tells their steps from the new gang's by the attempt each report says."""
    reporter = Recording(tmp_path, interval_s=60, **{envvars.ATTEMPT: "2"})
    reporter.send_now(5)
    reporter.close()
    assert reporter.sent and all(state["attempt"] == 2 for _, state in reporter.sent)
    unmanaged = Recording(tmp_path, interval_s=60)  # no RTJ_ATTEMPT: nothing said
    unmanaged.send_now(5)
    unmanaged.close()
    assert unmanaged.sent and all("attempt" not in state for _, state in unmanaged.sent)
