"""The membership file, the agent's reading of a container command, and the run's fence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_runtime.agent.command import EXEC, FORK, parse
from trainer_runtime.agent.initial import initial_membership, nproc_per_node
from trainer_runtime.errors import ConfigError
from trainer_runtime.pod import membership
from trainer_runtime.save.fence import Fence

GOOD = {"epoch": 3, "nnodes": 4, "nodeRank": 1, "masterAddr": "a.b", "masterPort": 29501}


def test_a_membership_gives_each_worker_its_ranks() -> None:
    got = membership.parse(json.dumps({**GOOD, "resumeFrom": "s3://b/r/ck", "stop": "save"}))
    assert got is not None and got.stop == "save"
    env = got.worker_environment(nproc_per_node=2, local_rank=1)
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_ADDR"] == "a.b" and env["MASTER_PORT"] == "29501"
    assert env["RTJ_RESUME_FROM"] == "s3://b/r/ck" and env["RTJ_MEMBERSHIP_EPOCH"] == "3"
    assert "RTJ_MTBI_SECONDS" not in env  # none announced: the pod's own stays


def test_a_membership_gives_restarted_workers_the_jobs_current_interval_figures() -> None:
    got = membership.parse(json.dumps({**GOOD, "mtbiSeconds": 1850, "interruptions": 2}))
    assert got is not None
    env = got.worker_environment(nproc_per_node=1, local_rank=0)
    assert env["RTJ_MTBI_SECONDS"] == "1850" and env["RTJ_INTERRUPTIONS"] == "2"


def test_the_savers_default_to_node_rank_0_alone() -> None:
    alone = membership.parse(json.dumps(GOOD))
    shared = membership.parse(json.dumps({**GOOD, "savers": 3}))
    assert alone is not None and alone.savers == 1
    assert shared is not None and shared.savers == 3


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"epoch": -1}, "epoch"),
        ({"nodeRank": 4}, "nodeRank"),
        ({"masterPort": 0}, "masterPort"),
        ({"masterAddr": ""}, "masterAddr"),
        ({"nnodes": "4"}, "nnodes"),
        ({"stop": "drain"}, "stop"),
        ({"epoch": True}, "epoch"),
        ({"mtbiSeconds": 0}, "mtbiSeconds"),
        ({"interruptions": "2"}, "interruptions"),
        ({"attempt": -1}, "attempt"),
        ({"savers": 0}, "savers"),
        ({"savers": 5}, "savers"),  # more savers than pods
        ({"nodeRank": -1}, "nodeRank"),  # -1 only for a pod told to leave
        ({"nodeRank": 0, "stop": "leave"}, "nodeRank"),
    ],
)
def test_a_bad_membership_names_the_field(change: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        membership.parse(json.dumps({**GOOD, **change}), source="m")


def test_a_pod_told_to_leave_has_no_rank_in_the_new_gang() -> None:
    told = membership.parse(json.dumps({**GOOD, "nodeRank": -1, "stop": "leave"}))
    assert told is not None and told.leaves and told.node_rank == -1
    kept = membership.parse(json.dumps({**GOOD, "stop": "switch"}))
    assert kept is not None and not kept.leaves


def test_no_membership_yet(tmp_path: Path) -> None:
    assert membership.read(tmp_path / "absent") is None
    (tmp_path / "empty").write_text("")
    assert membership.read(tmp_path / "empty") is None
    with pytest.raises(ConfigError, match="not JSON"):
        membership.parse("{", source="m")


@pytest.mark.parametrize(
    ("argv", "mode", "target", "module", "nproc"),
    [
        (["python", "-u", "train.py", "--lr", "1"], FORK, "train.py", False, None),
        (["python3.11", "-m", "pkg.train", "x"], FORK, "pkg.train", True, None),
        (["train.py"], FORK, "train.py", False, None),
        (["torchrun", "--nproc-per-node=8", "train.py"], FORK, "train.py", False, 8),
        (["torchrun", "--nproc_per_node", "2", "--standalone", "-m", "m"], FORK, "m", True, 2),
        (["bash", "run.sh"], EXEC, "bash", False, None),
        (["python", "-c", "print(1)"], EXEC, "python", False, None),
    ],
)
def test_commands_the_agent_runs(argv, mode, target, module, nproc) -> None:
    command = parse(argv)
    assert (command.mode, command.target, command.module, command.nproc_per_node) == (
        mode,
        target,
        module,
        nproc,
    )


def test_torchrun_options_the_agent_cannot_honour_are_refused() -> None:
    with pytest.raises(ConfigError, match="--rdzv-backend"):
        parse(["torchrun", "--rdzv-backend=c10d", "train.py"])
    with pytest.raises(ConfigError, match="integer >= 1"):
        parse(["torchrun", "--nproc-per-node=0", "train.py"])
    with pytest.raises(ConfigError, match="no command"):
        parse([])


def test_the_first_membership_is_the_pods_environment() -> None:
    env = {
        "PET_NNODES": "3",
        "PET_NODE_RANK": "2",
        "PET_NPROC_PER_NODE": "4",
        "MASTER_ADDR": "job-a1-r0.job",
        "MASTER_PORT": "29500",
        "RTJ_MEMBERSHIP_EPOCH": "5",
        "RTJ_RESUME_FROM": "s3://b/r",
    }
    command = parse(["torchrun", "train.py"])
    assert nproc_per_node(command, env) == 4
    first = initial_membership(command, env)
    assert (first.epoch, first.nnodes, first.node_rank) == (5, 3, 2)
    assert first.master_addr == "job-a1-r0.job" and first.resume_from == "s3://b/r"
    with pytest.raises(ConfigError, match="RTJ_MEMBERSHIP_EPOCH"):
        initial_membership(command, {**env, "RTJ_MEMBERSHIP_EPOCH": "x"})


def test_the_fence_only_rises_and_names_the_newer_gang(tmp_path: Path) -> None:
    old, new = Fence(tmp_path, 1), Fence(tmp_path, 2)
    assert old.stale() is None
    old.claim()
    new.claim()
    old.claim()  # an older gang never lowers it
    assert new.current() == 2 and new.stale() is None
    assert "epoch 1 is older than the run's fence 2" in (old.stale() or "")


def test_the_agent_leaves_no_folder_of_its_own_behind(tmp_path: Path) -> None:
    """The folder where workers say they can save from memory goes with the agent."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "trainer_runtime.agent", "--", sys.executable, "-c", "pass"]
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # torch's own compile-cache folder, made by the agent's preload of torch._inductor, stays
    left = [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")]
    assert left == []
