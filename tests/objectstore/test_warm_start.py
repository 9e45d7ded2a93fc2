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
from trainer_runtime.resume import warm_start
from trainer_runtime.resume.warm_start import (
    PrefetchPlan,
    SettleWait,
    newest_target,
    plan_from_environment,
)

from .test_manager_s3 import saved_run

REPO = Path(__file__).resolve().parents[2]

RELAUNCHED = """
import json, sys, time
from pathlib import Path
import trainer_runtime  # starts the prefetch in a managed pod
import torch
from trainer_runtime import CheckpointManager

staging, expected = Path(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not list(staging.rglob(f"{expected}/manifest.json")):
    time.sleep(0.05)  # the gang forming: the fetch goes on meanwhile
on_disk_before_the_manager = bool(list(staging.rglob(f"{expected}/manifest.json")))
from tests.unit.trainkit import make  # the first run's model, optimizer and scheduler

model, opt, sched = make()[:3]
ck = CheckpointManager(model=model, optimizer=opt, scheduler=sched, interval="1ba")
result = ck.resume()
ck.close(save=False)
print(json.dumps({"before": on_disk_before_the_manager, "source": result.source,
                  "path": result.path, "batch": result.timestamp.batch}))
"""


def managed_pod_env(tmp_path: Path, s3_root, server_env: dict[str, str], named: str) -> dict:
    """What the operator gives a relaunched rank's pod: the run, the checkpoint it named, and a
    fresh local disk (``node-b``)."""
    return {
        "PYTHONPATH": str(REPO),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **server_env,
        envvars.CHECKPOINT_DIR: str(s3_root),
        envvars.RUN_NAME: "s3run",
        envvars.RESUME_FROM: f"{s3_root}/s3run/{named}",
        envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path / "node-b"),
    }


def relaunch(
    tmp_path: Path,
    s3_root,
    server_env: dict[str, str],
    named: str = "ep0-ba2",
    expected: str = "ep0-ba2",
    **extra: str,
) -> dict:
    script = tmp_path / "relaunched.py"
    script.write_text(RELAUNCHED)
    env = {
        **managed_pod_env(tmp_path, s3_root, server_env, named),
        envvars.EVENTS_FILE: str(tmp_path / "events.jsonl"),
        **extra,
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "node-b"), expected],
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
    (fetched,) = [e for e in found if e.type == "fetched"]
    assert fetched["prefetch"] is True, fetched.fields
    (resumed,) = [e for e in found if e.type == "resumed"]
    assert resumed["source"] == "remote" and resumed["uri"] == f"{s3_root}/s3run/ep0-ba2"


def test_a_newer_commit_than_the_named_one_is_what_the_prefetch_fetches(tmp_path, s3_root, s3_env):
    """A survivor's save from memory lands after the operator named the last commit: the new
    rank fetches and loads the newest once, not the named one and then the newest again."""
    saved_run(s3_root, tmp_path / "node-a", batches=3)
    got = relaunch(tmp_path, s3_root, s3_env.env(), named="ep0-ba2", expected="ep0-ba3")
    assert got["before"] and got["batch"] == 3 and got["path"].endswith("ep0-ba3"), got
    found = events.read_events((tmp_path / "events.jsonl").read_text())
    fetched = [e["checkpoint"] for e in found if e.type == "fetched"]
    assert fetched == ["ep0-ba3"], fetched
    assert not list((tmp_path / "node-b").rglob("ep0-ba2/manifest.json")), "the older was fetched"


def test_a_quarantined_newer_commit_is_not_prefetched(tmp_path, s3_root, s3_env):
    saved_run(s3_root, tmp_path / "node-a", batches=3)
    quarantined = {envvars.QUARANTINED: f"{s3_root}/s3run/ep0-ba3"}
    got = relaunch(tmp_path, s3_root, s3_env.env(), named="ep0-ba2", **quarantined)
    assert got["before"] and got["batch"] == 2 and got["path"].endswith("ep0-ba2"), got


POD = """
import os, subprocess, sys, time
from pathlib import Path
script, staging, expected, events_dir = sys.argv[1:5]
def rank(local):
    env = {**os.environ, "LOCAL_RANK": str(local), "RTJ_EVENTS_FILE": f"{events_dir}/{local}.jsonl"}
    return subprocess.Popen([sys.executable, script, staging, expected], env=env)
first = rank(0)
done = Path(events_dir) / "0.jsonl"
deadline = time.monotonic() + 60
def fetched():
    return done.exists() and '"fetched"' in done.read_text()
while time.monotonic() < deadline and not fetched():
    time.sleep(0.05)
second = rank(1)  # as torchrun's local rank 1, which meets rank 0 only after its fetch
sys.exit(first.wait() or second.wait())
"""


def test_the_pods_other_local_ranks_report_the_prefetched_checkpoint_as_remote(
    tmp_path, s3_root, s3_env
):
    """torchrun's local ranks share their pod's disk: rank 0 fetches, rank 1 finds the files
    there, and both say the resume came from the store; a later process that is not of that pod
    finds the same files and says local."""
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    (tmp_path / "relaunched.py").write_text(RELAUNCHED)
    (tmp_path / "pod.py").write_text(POD)
    (tmp_path / "events").mkdir()
    env = managed_pod_env(tmp_path, s3_root, s3_env.env(), "ep0-ba2")
    args = [str(tmp_path / "relaunched.py"), str(tmp_path / "node-b"), "ep0-ba2"]
    pod = subprocess.run(
        [sys.executable, str(tmp_path / "pod.py"), *args, str(tmp_path / "events")],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert pod.returncode == 0, pod.stderr[-3000:]
    by_rank = {
        rank: events.read_events((tmp_path / "events" / f"{rank}.jsonl").read_text())
        for rank in (0, 1)
    }
    assert [e.type for e in by_rank[1]].count("fetched") == 0, "local rank 1 fetched too"
    for rank, found in by_rank.items():
        (resumed,) = [e for e in found if e.type == "resumed"]
        assert resumed["source"] == "remote", (rank, resumed)
    later = subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=REPO,
        env={**env, envvars.LOCAL_RANK: "1", envvars.EVENTS_FILE: str(tmp_path / "later.jsonl")},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert later.returncode == 0, later.stderr[-3000:]
    assert json.loads(later.stdout.strip().splitlines()[-1])["source"] == "checkpoint"


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


def test_a_worker_restarted_in_place_prefetches_the_newest_once_the_old_saves_are_over(tmp_path):
    """The agent marks the workers it starts for a membership read from its file: they wait for
    node rank 0's word in the new rendezvous store, then fetch the run's newest checkpoint
    (none named: the operator leaves ``resumeFrom`` empty at a grow's switch) or the named one,
    or a newer one of the run."""
    restarted = {
        envvars.CHECKPOINT_DIR: "s3://b/runs",
        envvars.RUN_NAME: "job",
        envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path),
        envvars.MEMBERSHIP_CHANGED: "1",
        envvars.MASTER_ADDR: "job-a0-r0.job",
        envvars.MASTER_PORT: "29500",
        envvars.MEMBERSHIP_EPOCH: "4",
    }
    for resume in ("", "s3://b/runs/job", "s3://b/runs/job/"):
        plan = plan_from_environment({**restarted, envvars.RESUME_FROM: resume})
        assert plan is not None and plan.checkpoint_uri == "", resume
        assert plan.settle == SettleWait("job-a0-r0.job", 29500, 4)
    named = plan_from_environment({**restarted, envvars.RESUME_FROM: "s3://b/runs/job/ep0-ba4"})
    assert named is not None and named.checkpoint_uri.endswith("/ep0-ba4") and named.settle
    first_start = {**restarted, envvars.MEMBERSHIP_CHANGED: "0", envvars.RESUME_FROM: ""}
    assert plan_from_environment(first_start) is None  # as before: nothing named, nothing fetched
    no_store = {k: v for k, v in restarted.items() if k != envvars.MASTER_PORT}
    assert plan_from_environment(no_store) is None
    assert plan_from_environment({**restarted, envvars.PREFETCH: "0"}) is None


def test_with_none_named_the_newest_committed_checkpoint_is_fetched(tmp_path, s3_root, store):
    saved_run(s3_root, tmp_path / "node-a", batches=3)
    plan = PrefetchPlan("", tmp_path / "node-b", 0, f"{s3_root}/s3run")
    newest = newest_target(store, plan)
    assert newest is not None and newest.endswith("/ep0-ba3"), newest
    empty = PrefetchPlan("", tmp_path / "node-b", 0, f"{s3_root}/no-such-run")
    assert newest_target(store, empty) is None


SETTLE_ENV = {
    envvars.CHECKPOINT_DIR: "s3://b/runs",
    envvars.RUN_NAME: "job",
    envvars.RESUME_FROM: "s3://b/runs/job/ep0-ba4",
    envvars.MASTER_ADDR: "job-a0-r0.job",
    envvars.MASTER_PORT: "29500",
    envvars.MEMBERSHIP_EPOCH: "3",
    envvars.MEMBERSHIP_CHANGED: "1",
}


def test_a_forked_worker_for_a_new_membership_starts_its_own_prefetch(tmp_path, monkeypatch):
    """A worker forked from the agent inherits the agent's prefetch: the right one for the
    agent's first workers; a worker for a new membership waits for the old gang's saves, and
    does not fetch again what the agent fetched if that is still the newest."""
    started: list[tuple[warm_start.PrefetchPlan, Path | None]] = []

    class Recorded:
        def __init__(self, plan: warm_start.PrefetchPlan, have: Path | None = None) -> None:
            started.append((plan, have))

    class Inherited:
        fetched = tmp_path / "s3" / "b" / "runs" / "job" / "ep0-ba4"

    inherited = Inherited()
    monkeypatch.setattr(warm_start, "CheckpointPrefetch", Recorded)
    monkeypatch.setattr(warm_start, "_prefetch", inherited)
    for key, value in {**SETTLE_ENV, envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(envvars.MEMBERSHIP_CHANGED, "0")
    assert warm_start.start_in_forked_worker() is inherited and not started  # a first start
    monkeypatch.setenv(envvars.MEMBERSHIP_CHANGED, "1")
    assert isinstance(warm_start.start_in_forked_worker(), Recorded)
    ((plan, have),) = started
    assert plan.settle == SettleWait("job-a0-r0.job", 29500, 3), plan
    assert have == Inherited.fetched


def test_a_process_without_torch_yet_prefetches_without_the_wait(tmp_path):
    """The wait asks a TCPStore, which needs torch: importing it on the download thread beside
    the main thread's own import brought the agent down. Before torch is imported (the agent's
    start), the download goes ahead without the wait, beside torch's import."""
    code = (
        "import sys, trainer_runtime\n"
        "from trainer_runtime.resume import warm_start\n"
        "running = warm_start._prefetch\n"
        "print('torch' in sys.modules, running is not None and running.plan.settle is None)\n"
        "running.wait()\n"
    )
    env = {
        **os.environ,
        **SETTLE_ENV,
        envvars.LOCAL_CHECKPOINT_DIR: str(tmp_path),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing there: the download fails, logged
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"], (proc.stdout, proc.stderr[-2000:])
