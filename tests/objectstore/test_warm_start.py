"""A relaunched rank fetches the checkpoint the operator named while its gang forms.

Real processes against the real S3 server: the first run saves to the store; the relaunched one
gets the operator's environment (RTJ_RESUME_FROM naming the checkpoint) and a fresh local disk.
It imports ``trainer_runtime``, then waits as ``init_process_group`` would for a slow gang; the
checkpoint must be on its disk before its ``CheckpointManager`` exists, and ``resume()`` must
load it from there (verified) without fetching it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainer_runtime import envvars, events
from trainer_runtime.resume.warm_start import plan_from_environment

from .test_manager_s3 import saved_run

REPO = Path(__file__).resolve().parents[2]

RELAUNCHED = """
import json, sys, time
from pathlib import Path
import trainer_runtime  # starts the prefetch in a managed pod
import torch
from trainer_runtime import CheckpointManager

staging = Path(sys.argv[1])
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not list(staging.rglob("ep0-ba2/manifest.json")):
    time.sleep(0.05)  # the gang forming: the fetch goes on meanwhile
on_disk_before_the_manager = bool(list(staging.rglob("ep0-ba2/manifest.json")))
from tests.unit.trainkit import make  # the first run's model, optimizer and scheduler

model, opt, sched = make()[:3]
ck = CheckpointManager(model=model, optimizer=opt, scheduler=sched, interval="1ba")
result = ck.resume()
ck.close(save=False)
print(json.dumps({"before": on_disk_before_the_manager, "source": result.source,
                  "path": result.path, "batch": result.timestamp.batch}))
"""


def relaunch(tmp_path: Path, s3_root, server_env: dict[str, str], **extra: str) -> dict:
    script = tmp_path / "relaunched.py"
    script.write_text(RELAUNCHED)
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **server_env,
        envvars.CHECKPOINT_DIR: str(s3_root),
        envvars.RUN_NAME: "s3run",
        envvars.RESUME_FROM: f"{s3_root}/s3run/ep0-ba2",
        envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path / "node-b"),
        envvars.EVENTS_FILE: str(tmp_path / "events.jsonl"),
        **extra,
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "node-b")],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_named_checkpoint_is_on_disk_before_the_manager_and_resumed_from_there(
    tmp_path, s3_root, s3_env
):
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    got = relaunch(tmp_path, s3_root, s3_env.env())
    assert got["before"], "the checkpoint was not fetched while the script waited"
    assert got["batch"] == 2 and got["path"].endswith("ep0-ba2")
    assert got["source"] == "remote", "a checkpoint fetched from the store is a remote resume"
    found = events.read_events((tmp_path / "events.jsonl").read_text())
    kinds = [e.type for e in found]
    assert kinds.index("fetched") < kinds.index("started") < kinds.index("resumed"), kinds
    assert kinds.count("fetched") == 1, "resume() fetched it again instead of using the disk"
    (resumed,) = [e for e in found if e.type == "resumed"]
    assert resumed["source"] == "remote" and resumed["uri"] == f"{s3_root}/s3run/ep0-ba2"


def test_rtj_prefetch_0_leaves_the_fetch_to_resume(tmp_path, s3_root, s3_env):
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    got = relaunch(tmp_path, s3_root, s3_env.env(), **{envvars.PREFETCH: "0"})
    assert not got["before"]
    assert got["source"] == "remote" and got["batch"] == 2


def test_only_a_named_checkpoint_of_this_run_is_prefetched(tmp_path):
    base = {
        envvars.CHECKPOINT_DIR: "s3://b/runs",
        envvars.RUN_NAME: "job",
        envvars.RESUME_FROM: "s3://b/runs/job/ep0-ba4",
        envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path),
    }
    plan = plan_from_environment(base)
    assert plan is not None and plan.checkpoint_uri == "s3://b/runs/job/ep0-ba4"
    assert plan.local_run_dir == tmp_path / "s3" / "b" / "runs" / "job"
    cases = {
        "first attempt": {envvars.RESUME_FROM: ""},
        "the run root": {envvars.RESUME_FROM: "s3://b/runs/job"},
        "another run": {envvars.RESUME_FROM: "s3://b/runs/other/ep0-ba4"},
        "a local folder": {envvars.CHECKPOINT_DIR: "/ck", envvars.RESUME_FROM: "/ck/job/ep0-ba4"},
        "local rank 1": {envvars.LOCAL_RANK: "1"},
        "turned off": {envvars.PREFETCH: "0"},
    }
    for why, change in cases.items():
        assert plan_from_environment({**base, **change}) is None, why
    assert json.dumps(plan.rank) == "0"
