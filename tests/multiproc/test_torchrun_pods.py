"""Two processes per pod, launched by torchrun from nothing but the environment the operator
injects: two torchrun "pods" on 127.0.0.1 train the example job at world size 4, then a SIGTERM
to each torchrun (what the kubelet sends a container's first process) ends in an emergency save.

The environment is built by the operator's own manifest code (``rank_environment``) for a job
with ``replicas: 2, processesPerPod: 2``; the only change is the rendezvous address, the headless
Service's DNS name in a cluster, which is 127.0.0.1 here. torchrun gets no flags at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from rtj_operator.api import envvars
from rtj_operator.api.api_types import parse_job
from rtj_operator.decide.manifests import rank_environment
from trainer_runtime import envvars as runtime_envvars
from trainer_runtime import events
from trainer_runtime.save.manifest import Manifest

from .checks import committed_and_valid, wait_for_gang
from .launch import free_port

pytestmark = pytest.mark.multiproc
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_deterministic.py"
GRACE = 30


def job_body(tmp: Path, port: int) -> dict:
    return {
        "apiVersion": "resumable.dev/v1alpha1",
        "kind": "ResumableTrainingJob",
        "metadata": {"name": "tr", "namespace": "ns", "uid": "u"},
        "spec": {
            "replicas": 2,
            "processesPerPod": 2,
            "masterPort": port,
            "checkpoint": {"dir": str(tmp / "ck")},
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": GRACE,
                    "containers": [{"name": "trainer", "image": "local"}],
                }
            },
        },
    }


def pod_env(tmp: Path, port: int, pod: int) -> dict[str, str]:
    job = parse_job(job_body(tmp, port))
    injected = rank_environment(
        job, 0, pod, resume_from="", quarantined=[], report_file=str(tmp / f"report{pod}")
    )
    env = {item["name"]: item["value"] for item in injected}
    env[envvars.MASTER_ADDR] = env[envvars.TORCHRUN_MASTER_ADDR] = "127.0.0.1"
    env[envvars.NOTICE_FILE] = str(tmp / f"notice{pod}")  # the downward-API file of each pod
    env[runtime_envvars.EVENTS_FILE] = str(tmp / "events.jsonl")  # one file, every rank
    return env


def start_pod(tmp: Path, port: int, pod: int) -> subprocess.Popen:
    env = {**os.environ, **pod_env(tmp, port, pod), "PYTHONUNBUFFERED": "1"}
    args = ["--epochs", "50", "--step-sleep", "0.1", "--interval", "3ba", "--workers", "0"]
    # Every checkpoint is kept: the test compares the emergency save with one taken before the
    # notice, which the default retention (3) deletes when a loaded machine is slow to settle.
    args += ["--dataset-size", "960", "--keep=-1"]
    log = open(tmp / f"pod{pod}.log", "w")  # noqa: SIM115 - closed when the process ends
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", str(EXAMPLE), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def notice_events(tmp: Path) -> list[events.RuntimeEvent]:
    path = tmp / "events.jsonl"
    found = events.read_events(path.read_text().splitlines()) if path.exists() else []
    return [e for e in found if e.type == "notice"]


def test_the_injected_environment_alone_starts_a_four_rank_torchrun_gang(tmp_path):
    port = free_port()
    env = pod_env(tmp_path, port, 1)
    assert env["WORLD_SIZE"] == "4" and env["RANK"] == "2"
    pods = [start_pod(tmp_path, port, pod) for pod in range(2)]
    run = tmp_path / "ck" / "tr"
    try:
        saving = partial(committed_and_valid, run, settled=False)
        wait_for_gang(lambda: len(saving()) >= 2, 240, "two interval checkpoints")
        before = saving()[0]
        assert Manifest.read(run / before).world_size == 4
        # A notice reaches pod 1 only (the operator annotates the pods on the node that goes):
        # all four ranks save, and each one's event carries the notice's reason.
        (tmp_path / "notice1").write_text('{"reason": "spot-reclaim-test"}')
        wait_for_gang(lambda: len(notice_events(tmp_path)) == 4, 120, "four notice events")
        for proc in pods:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(GRACE + 15) for proc in pods]
    finally:
        for proc in pods:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    logs = [(tmp_path / f"pod{pod}.log").read_text() for pod in range(2)]
    names = committed_and_valid(run)
    newest = Manifest.read(run / names[0])
    assert newest.world_size == 4
    assert names[0] != before and names.index(before) > 0
    assert newest.timestamp.sample >= Manifest.read(run / before).timestamp.sample
    assert f"emergency save {names[0]} done" in logs[0], logs[0][-3000:]
    # torchrun forwards SIGTERM to its workers, which save and exit 143; torchrun itself then
    # ends with 1 (docs/operator.md: the operator classifies by the pod's signals, not this).
    assert codes == [1, 1], (codes, logs[0][-3000:])
    report = (tmp_path / "report0").read_text()
    assert names[0] in report
    assert not (tmp_path / "report1").exists(), "only global rank 0 reports progress"
    notices = notice_events(tmp_path)
    assert sorted(e.rank for e in notices) == [0, 1, 2, 3]
    assert {e["reason"] for e in notices} == {"spot-reclaim-test"}, notices
