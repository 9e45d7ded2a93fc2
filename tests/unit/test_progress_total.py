"""Rank 0's progress report carries the job's total steps beside the current step, as far as
the runtime knows them (the operator's progress and ETA come from these two figures)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from trainer_runtime import CheckpointManager, envvars
from trainer_runtime.errors import ConfigError
from trainer_runtime.pod.progress import ProgressReporter, TotalWork


@pytest.fixture
def sent(tmp_path, monkeypatch) -> list[dict[str, Any]]:
    """Every progress report rank 0 sends, as the annotation's JSON (no API server)."""
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("t")
    for name, value in {
        envvars.POD_NAME: "p",
        envvars.KUBERNETES_SERVICE_HOST: "127.0.0.1",
        envvars.SERVICEACCOUNT_DIR: str(tmp_path / "sa"),
        envvars.NAMESPACE: "ns",
        envvars.PROGRESS_INTERVAL_SECONDS: "3600",  # flushes only: at commits and at close
    }.items():
        monkeypatch.setenv(name, value)
    reports: list[dict[str, Any]] = []

    def record(self: ProgressReporter, annotations: dict[str, str]) -> None:
        reports.append(json.loads(annotations[envvars.PROGRESS_ANNOTATION]))

    monkeypatch.setattr(ProgressReporter, "_send", record)
    return reports


def manager(tmp_path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(
        model=torch.nn.Linear(2, 2),
        folder=tmp_path / "ck",
        run_name="r",
        handle_sigterm=False,
        **kwargs,
    )


def test_total_steps_argument_goes_with_every_report(tmp_path, sent):
    ck = manager(tmp_path, interval="5ba", total_steps=40)
    for _ in range(5):
        ck.batch_end(num_samples=8)
    ck.close(save=False)
    assert sent, "the commit at step 5 is reported"
    assert all(r["total_steps"] == 40 for r in sent)
    assert sent[-1]["current_step"] == 5 and sent[-1]["current_sample"] == 40


def test_steps_total_is_the_total(tmp_path, sent):
    ck = manager(tmp_path, interval="3ba")
    for _ in ck.steps(12):
        ck.batch_end()
        if ck.timestamp.batch == 3:
            break
    ck.close(save=False)
    assert sent[-1]["total_steps"] == 12 and sent[-1]["current_step"] == 3


def test_the_environment_gives_the_total_and_the_argument_wins(tmp_path, sent, monkeypatch):
    monkeypatch.setenv(envvars.TOTAL_STEPS, "1000")
    assert manager(tmp_path, interval="1ba").total_work.known() == 1000
    assert manager(tmp_path, interval="1ba", total_steps=7, overwrite=True).total_work.known() == 7
    monkeypatch.setenv(envvars.TOTAL_STEPS, "many")
    with pytest.raises(ConfigError, match=envvars.TOTAL_STEPS):
        manager(tmp_path, interval="1ba")


def test_epochs_times_the_first_epochs_steps(tmp_path, sent):
    ck = manager(tmp_path, interval="1ep", epochs=3)
    assert ck.total_work.known() is None  # a loader's length is not known before an epoch
    for _ in range(4):
        ck.batch_end()
    ck.epoch_end()  # commits (interval 1ep) and learns 4 steps per epoch
    ck.close(save=False)
    assert ck.total_work.known() == 12 and sent[-1]["total_steps"] == 12
    given = TotalWork(epochs=3, steps_per_epoch=10)
    assert given.known() == 30 and not given.epoch_ended(batch=7, epoch=1)


def test_without_a_total_the_report_has_none(tmp_path, sent):
    ck = manager(tmp_path, interval="2ba")
    ck.batch_end()
    ck.batch_end()
    ck.close(save=False)
    assert sent and all("total_steps" not in r for r in sent)


def test_a_bad_total_names_the_argument(tmp_path):
    with pytest.raises(ConfigError, match="total_steps"):
        manager(tmp_path, total_steps=0)
    with pytest.raises(ConfigError, match="epochs"):
        manager(tmp_path, epochs="3")
