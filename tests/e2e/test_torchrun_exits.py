"""How the operator classifies the ways a torchrun pod ends, with 2 pods x 2 processes.

The job is the torchrun story's (``manifests/torchrun-job.yaml``: ``processesPerPod: 2``, the
command ``torchrun train.py`` with no flags) on pod-runner nodes. torchrun exits 1 whenever a
worker failed or it passed a SIGTERM on, so its exit code says nothing; what counts is the signal
the control plane left on the pod (docs/operator.md, Classification; docs/runtime.md, "Under
torchrun"):

* the pod **deleted by hand** (``kubectl delete pod``): a deletion the operator did not make, so
  a preemption (``PodDeleted``), although the container exits 1;
* a **SIGTERM inside the container** (a ``kill`` of torchrun, as a failed liveness probe would
  send): no disruption signal at all, so a failure, although the ranks saved and exited 143;
* a **worker crashing** (SIGKILL of global rank 3): torchrun stops rank 2 and exits 1, a failure.

Each job is deleted once the operator has classified its first interruption; training to the end
is the torchrun story's part.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.localstack import LocalStack
from tools.stories.torchrun import ContainerEnd, container_end
from tools.waiting import wait_for
from trainer_runtime import events

from .conftest import say

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
MANIFEST = Path(__file__).parent / "manifests" / "torchrun-job.yaml"
TORCHRUN_EXIT = 1
"""torchrun's exit code when a worker failed or after it forwarded SIGTERM."""


@pytest.fixture(scope="module")
def reference(prerequisites: None) -> Iterator[None]:
    """No reference run: these jobs are deleted long before they finish."""
    yield None


def start(stack: LocalStack, name: str) -> str:
    """Submit the job and wait until its first attempt committed a checkpoint."""
    stack.ensure_nodes(3)
    job = stack.apply(MANIFEST, name=name)
    wait_for(
        f"{job}: a committed checkpoint",
        lambda: (stack.job(job).get("status") or {}).get("lastCommittedCheckpoint"),
        timeout=180,
        interval=0.5,
        on_timeout=lambda: stack.diagnostics(job),
    )
    return job


def first_interruption(stack: LocalStack, job: str) -> tuple[Obj, Obj]:
    """The job's status once its first interruption is recorded, and that interruption."""
    status = wait_for(
        f"{job}: an interruption",
        lambda: (s := stack.job(job).get("status") or {}).get("interruptions") and s,
        timeout=120,
        interval=0.5,
        on_timeout=lambda: stack.diagnostics(job),
    )
    return status, status["interruptions"][0]


def torchrun_pid(stack: LocalStack, pod: str) -> int:
    """The pid of the pod's container: torchrun (the pod runner's container IDs)."""
    found = stack.pod(pod)
    assert found is not None, pod
    (container,) = found["status"]["containerStatuses"]
    return int(container["containerID"].removeprefix("podrunner://"))


def worker_pid(pod: str, rank: int) -> int:
    """The pid of the torchrun worker of global ``rank`` in ``pod`` (its own session, so found
    by its environment)."""
    wanted = {f"RTJ_POD_NAME={pod}".encode(), f"RANK={rank}".encode(), b"LOCAL_WORLD_SIZE=2"}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = set(Path(entry.path, "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            return int(entry.name)
    raise AssertionError(f"no worker of rank {rank} in {pod}")


def finish(stack: LocalStack, job: str) -> None:
    stack.kubectl("delete", "rtj", "-n", stack.cfg.namespace, job, "--wait=false")


def assert_torchrun_exit(stack: LocalStack, pod: Obj, ending: str) -> None:
    """torchrun in ``pod`` ended as torchrun ends: exit 1, its log ending with ``ending`` (the
    exception it exits with).

    Once the operator has classified the first pod that ended, it deletes the rest of the gang,
    so a torchrun still winding down can get the deletion's SIGTERM too. While torchrun's own
    handler is installed, that SIGTERM only raises again (still exit 1); in the interpreter's
    last moments, after Python has put the default handlers back, it ends the process (signal
    15, 143). That code is then the deletion's, so the log, written before, shows torchrun's own
    ending.
    """
    name = pod["metadata"]["name"]
    end = lost_end(stack, pod)
    log = stack.pod_log(name)
    assert ending in log, log[-3000:]
    if end.stopped and end.signal == signal.SIGTERM:
        say(f"{name}: the gang's deletion ended torchrun after its own {ending}")
        return
    assert end.exit_code == TORCHRUN_EXIT, end


def lost_end(stack: LocalStack, pod: Obj) -> ContainerEnd:
    return wait_for(
        f"the exit of {pod['metadata']['name']}",
        lambda: _end_or_none(stack, pod),
        timeout=60,
        interval=0.5,
    )


def _end_or_none(stack: LocalStack, pod: Obj) -> ContainerEnd | None:
    try:
        return container_end(stack, pod["spec"]["nodeName"], pod["metadata"]["name"])
    except AssertionError:
        return None


def test_pod_deleted_by_hand_is_a_preemption_though_torchrun_exits_1(stack: LocalStack) -> None:
    job = start(stack, "tr-deleted")
    name = f"{job}-a0-r1"
    pod = stack.pod(name)
    assert pod is not None
    stack.kubectl("delete", "pod", "-n", stack.cfg.namespace, name, "--wait=false")
    status, interruption = first_interruption(stack, job)
    assert interruption["cause"] == "PodDeleted" and interruption["preemption"], interruption
    assert interruption["pod"] == name, interruption
    # Both workers of the deleted pod saved on the SIGTERM torchrun passed on; torchrun exit 1
    # (the deletion's SIGTERM is the only one it gets, so its own code always shows).
    end = lost_end(stack, pod)
    assert end.exit_code == TORCHRUN_EXIT, end
    log = stack.pod_log(name)
    assert len(events.read_events(log, events.EMERGENCY_SAVED)) == 2, log[-3000:]
    status = stack.job(job)["status"]
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    say(f"{job}: deleted by hand: {interruption['cause']}, torchrun exit {TORCHRUN_EXIT}")
    finish(stack, job)


def test_sigterm_inside_the_container_is_a_failure(stack: LocalStack) -> None:
    job = start(stack, "tr-killed")
    name = f"{job}-a0-r1"
    pod = stack.pod(name)
    assert pod is not None
    os.kill(torchrun_pid(stack, name), signal.SIGTERM)
    status, interruption = first_interruption(stack, job)
    # The 4 ranks agree on the SIGTERM at the next step, all save and exit 143, and both
    # torchruns exit 1: whichever pod the operator sees first, the attempt failed.
    assert interruption["cause"] == "Failure" and not interruption["preemption"], interruption
    assert interruption["exitCode"] == TORCHRUN_EXIT, interruption
    assert_torchrun_exit(stack, pod, "SignalException")
    log = stack.pod_log(name)
    assert len(events.read_events(log, events.EMERGENCY_SAVED)) == 2, log[-3000:]
    assert status["failures"] == 1 and status["preemptions"] == 0, status
    say(f"{job}: SIGTERM inside the container: {interruption['cause']}")
    finish(stack, job)


def test_a_crashing_worker_fails_its_pod_with_exit_1(stack: LocalStack) -> None:
    job = start(stack, "tr-crashed")
    name = f"{job}-a0-r1"
    pod = stack.pod(name)
    assert pod is not None
    os.kill(worker_pid(name, 3), signal.SIGKILL)
    started = time.monotonic()
    status, interruption = first_interruption(stack, job)
    assert interruption["cause"] == "Failure" and not interruption["preemption"], interruption
    # torchrun's own code, not the worker's (-9): it stopped rank 2 and reports a failed node
    # (pod 0's workers fail on the broken connection, and its torchrun exits 1 too).
    assert interruption["exitCode"] == TORCHRUN_EXIT, interruption
    assert status["failures"] == 1 and status["preemptions"] == 0, status
    assert_torchrun_exit(stack, pod, "ChildFailedError")
    say(f"{job}: worker crash classified in {time.monotonic() - started:.1f}s")
    finish(stack, job)
