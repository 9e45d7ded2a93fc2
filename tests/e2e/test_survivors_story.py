"""Survivors stay, on the local control plane with real training in every pod.

A 3-rank fixed-size job (``manifests/spot-job.yaml`` with ``recovery.survivors: Stay``) runs on 4
pod-runner nodes. One rank's node is reclaimed without notice. The operator records the
preemption, keeps the two pods on healthy nodes (the same pods, same uids, never restarted),
relabels them into the next attempt, tells them the new membership through their annotation,
and creates a pod only for the lost place, on the spare node. Each kept pod's in-pod agent
restarts its worker in place; the job resumes from the last commit and Succeeds.

Then an elastic job at 2 of 3 pods grows when the capacity comes back: its new pod starts in
standby while the two kept ranks train on, and the gang re-forms at 3 once the new pod is warm;
an elastic job at 3 shrinks to the 2 pods left, and, with room for a new pod, trains on at 2
while that pod starts in standby, then grows back to 3; a warm spare takes a lost rank's place;
and a node under a termination notice shuts down, the gang having saved on the notice, and again
only its place gets a new pod.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rtj_operator.api.envvars import AGENT_READY_ANNOTATION, PEER_LOST_ANNOTATION
from tools.controlplane import ControlPlane
from tools.localstack import LocalStack
from tools.spotcluster import PodRunnerCluster
from tools.waiting import wait_for

from .conftest import say, stack_config

pytestmark = pytest.mark.cluster

MANIFEST = Path(__file__).with_name("manifests") / "spot-job.yaml"
REPLICAS = 3


def survivors_manifest(
    tmp: Path,
    *,
    name: str = "survivors",
    epochs: int | None = None,
    cpu: str | None = None,
    interval: str | None = None,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    **spec: object,
) -> Path:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    job = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")
    job["metadata"]["name"] = name
    job["spec"]["replicas"] = REPLICAS
    job["spec"]["recovery"] = {"survivors": "Stay"}
    job["spec"].update(spec)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        "--step-sleep=0.3"
        if arg.startswith("--step-sleep")
        else (f"--epochs={epochs}" if epochs and arg.startswith("--epochs") else arg)
        for arg in container["command"]
    ]
    if interval:
        container["command"] = [
            f"--interval={interval}" if arg.startswith("--interval") else arg
            for arg in container["command"]
        ]
    container["command"] += list(args)
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    for key, value in (env or {}).items():
        container.setdefault("env", []).append({"name": key, "value": value})
    path = tmp / f"{name}-job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def wait_status(
    stack: LocalStack, job: str, what: str, key: str, value: object = None
) -> dict[str, Any]:
    """Wait until ``status[key]`` is set (or equals ``value``); the status then."""

    def reached() -> dict[str, Any] | None:
        status = stack.job(job).get("status") or {}
        found = status.get(key)
        return status if (found == value if value is not None else found) else None

    return wait_for(what, reached, timeout=400, on_timeout=lambda: stack.diagnostics(job))


def wait_step(stack: LocalStack, job: str, step: int, what: str) -> None:
    """Wait until the job's rank 0 reports step ``step`` or later."""
    wait_for(
        what,
        lambda: ((stack.job(job).get("status") or {}).get("currentStep") or 0) >= step,
        timeout=400,
        on_timeout=lambda: stack.diagnostics(job),
    )


def reclaim_rank(
    stack: LocalStack, job: str, pod: str, note: str = "", *, silent: bool = False
) -> float:
    """Reclaim the node of ``pod`` without notice (``silent``: its machine dies, the Node
    stays); when it happened."""
    lost = stack.pod(pod)
    assert lost is not None, pod
    node_name = lost["spec"]["nodeName"]
    (stack.silence_node if silent else stack.reclaim_node)(node_name)
    at = time.time()
    say(f"{'silenced' if silent else 'reclaimed'} {node_name} ({pod}){note}")
    return at


def phases(stack: LocalStack, pod: str, after: float) -> str:
    """The pod's runtime events after ``after``, as seconds since it (where recoveries go)."""
    kinds = ("membership", "started", "fetched", "resumed", "first_step")
    seen = [
        f"{e.type} +{at - after:.1f}"
        for e in stack.runtime_events(pod)
        if e.type in kinds and (at := datetime.fromisoformat(e.time).timestamp()) > after
    ]
    return f"{pod}: {', '.join(seen)}"


def first_step_after(stack: LocalStack, pod: str, after: float) -> float:
    """Seconds from ``after`` to the pod's first training step after it."""
    steps = [
        at
        for e in stack.runtime_events(pod, "first_step")
        if (at := datetime.fromisoformat(e.time).timestamp()) > after
    ]
    assert steps, stack.pod_log(pod)[-3000:]
    return steps[0] - after


def assert_fetched_only(stack: LocalStack, pod: str, after: float, names: set[str]) -> None:
    """Every checkpoint ``pod``'s workers fetched from the bucket after ``after`` is one of
    ``names`` (the gang's new commit): none downloaded an older one first."""
    fetched = [
        e.fields["checkpoint"]
        for e in stack.runtime_events(pod, "fetched")
        if datetime.fromisoformat(e.time).timestamp() > after
    ]
    assert set(fetched) <= names, (fetched, names, phases(stack, pod, after))


@pytest.fixture(scope="module")
def stack(
    prerequisites: None, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("survivors-stack")
    cfg = stack_config(control_plane, workdir, "rtj-survivors", nodes=REPLICAS + 1)
    with LocalStack(cfg) as running:
        yield running


@pytest.fixture(autouse=True)
def each_test_ends_its_jobs(stack: LocalStack) -> Iterator[None]:
    """The tests share the stack's nodes: a job a failed test left running would hold them."""
    yield
    stack.end_jobs()


def test_a_lost_node_keeps_the_other_ranks_pods(stack: LocalStack, tmp_path: Path) -> None:
    # A commit every 20 steps, and the loss two or more steps after the first one: the steps
    # since it are what a survivor's memory saves.
    job = stack.apply(survivors_manifest(tmp_path, interval="20ba", epochs=8))
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    wait_step(stack, job, 22, "two steps after the commit")
    first = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=0)}
    assert len(first) == REPLICAS
    lost_at = reclaim_rank(stack, job, f"{job}-a0-r1")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["attempt"] == 1 and status["preemptions"] == 1 and status["failures"] == 0
    kept = [f"{job}-a0-r0", f"{job}-a0-r2"]
    assert status.get("keptPods") == kept, (status, stack.diagnostics(job))
    second = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=1)}
    assert set(second) == {*kept, f"{job}-a1-r2"}, set(second)
    for name in kept:  # the same pods: never deleted, never recreated
        assert second[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        memberships = stack.runtime_events(name, "membership")
        assert [e.fields["epoch"] for e in memberships] == [1], memberships
    reasons = [e.get("reason") for e in stack.events(job)]
    assert "SurvivorsStay" in reasons
    back = first_step_after(stack, f"{job}-a0-r0", lost_at)
    say(f"loss -> kept rank 0's first step after resuming: {back:.1f} s")
    for pod in (f"{job}-a0-r0", f"{job}-a1-r2"):
        say(phases(stack, pod, lost_at))
    # Kept rank 0 saved the last finished step from its memory, into the bucket, and the new gang
    # went on from it: the loss without notice cost at most the step that was running.
    (saved,) = stack.runtime_events(f"{job}-a0-r0", "survivor_saved")
    assert saved.fields["checkpoint"], saved
    resumed = [e for e in stack.runtime_events(f"{job}-a1-r2", "resumed")]
    assert resumed[-1].fields["checkpoint"] == saved.fields["checkpoint"], resumed
    assert resumed[-1].fields["source"] == "remote"  # the new pod fetched it from the bucket
    # The kept pod that does not save starts its workers at once: they fetch the survivor's
    # save once it is committed, never the older checkpoint the operator named.
    assert_fetched_only(stack, f"{job}-a0-r2", lost_at, {saved.fields["checkpoint"]})
    (interruption,) = status["interruptions"]
    say(f"survivor's save: step {saved.fields['step']} in {saved.fields['seconds']} s")
    say(f"interruption: {interruption}")
    assert saved.fields["step"] >= 22, saved
    assert interruption["stepsLost"] <= 1, interruption


def test_a_large_state_is_saved_in_shares_by_the_kept_pods_into_the_bucket(
    stack: LocalStack, tmp_path: Path
) -> None:
    """The same loss with the split save on (``RTJ_SURVIVOR_SPLIT_MIB=0``: every state counts as
    large): both kept pods write a share of the last finished step from their node-local disks
    into the bucket, kept rank 0 commits it, and the new pod fetches and resumes from it."""
    path = survivors_manifest(
        tmp_path, name="shares", interval="20ba", epochs=8, env={"RTJ_SURVIVOR_SPLIT_MIB": "0"}
    )
    job = stack.apply(path)
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    wait_step(stack, job, 22, "two steps after the commit")
    lost_at = reclaim_rank(stack, job, f"{job}-a0-r1")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["keptPods"] == [f"{job}-a0-r0", f"{job}-a0-r2"], status
    saves = [stack.runtime_events(pod, "survivor_saved") for pod in status["keptPods"]]
    assert all(len(s) == 1 for s in saves), (saves, stack.diagnostics(job))
    names = {s[0].fields["checkpoint"] for s in saves}
    assert len(names) == 1 and None not in names, saves  # one checkpoint, a share from each
    seconds = [s[0].fields["seconds"] for s in saves]
    say(f"shared save: step {saves[0][0].fields['step']}, {seconds} s")
    resumed = stack.runtime_events(f"{job}-a1-r2", "resumed")[-1].fields
    assert resumed["checkpoint"] in names and resumed["source"] == "remote", resumed
    assert resumed["saved_world_size"] == 2, resumed
    # Kept rank 1's share is uploaded before kept rank 0 commits: its new workers still fetch
    # only the committed save, not the older checkpoint the operator named.
    assert_fetched_only(stack, f"{job}-a0-r2", lost_at, names)
    (interruption,) = status["interruptions"]
    assert interruption["stepsLost"] <= 1, interruption


HOLD = "example.com/hold"


def grow_from_two(
    stack: LocalStack, tmp: Path, *, name: str, epochs: int, **manifest: Any
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """An elastic job of 3 pods, with room for 2 until its gang of 2 committed, then for 3:
    the job, its pods at 2 by name, and its status once it Succeeded at 3."""
    stack.ensure_nodes(REPLICAS)
    spare = stack.live_nodes()[REPLICAS - 1 :]
    for node_name in spare:  # capacity for 2 pods only
        stack.taint_node(node_name, HOLD)
    path = survivors_manifest(
        tmp,
        name=name,
        epochs=epochs,
        cpu="20",  # one pod per node
        elastic={
            "minReplicas": 2,
            "shrinkAfterSeconds": 5,
            "grow": {"minIntervalSeconds": 5, "settleSeconds": 0},
        },
        **manifest,
    )
    job = stack.apply(path)
    at_two = wait_status(stack, job, "the 2-pod gang's first commit", "lastCommittedCheckpoint")
    assert at_two["gangSize"] == 2
    first = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=at_two["attempt"])}
    for node_name in spare:
        stack.untaint_node(node_name, HOLD)
    say("room for the third pod is back")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["gangSize"] == REPLICAS and status["failures"] == 0, status
    return job, first, status


def test_a_grow_keeps_the_gang_training_while_the_new_pod_starts(
    stack: LocalStack, tmp_path: Path
) -> None:
    """An elastic job at 2 of 3 pods grows when a node comes back: the new pod starts in
    standby while the two kept ranks train on, and only then does the gang re-form at 3."""
    job, first, status = grow_from_two(stack, tmp_path, name="grows", epochs=12)
    assert status["interruptions"][-1]["cause"] == "Grow", status["interruptions"]
    reasons = [e.get("reason") for e in stack.events(job)]
    assert "MembershipSwitched" in reasons, reasons
    assert "GrowRequested" not in reasons, reasons  # no checkpoint first: they save at the switch
    grown = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    kept = status["keptPods"]
    assert sorted(kept) == sorted(first) and len(grown) == REPLICAS
    for name in kept:  # the same pods, told once, saving on the way (stop: save)
        assert grown[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        told = stack.runtime_events(name, "membership")
        assert [(e.fields["epoch"], e.fields["stop"]) for e in told] == [
            (status["attempt"], "save")
        ], told
    (new,) = set(grown) - set(kept)
    ready = json.loads(grown[new]["metadata"]["annotations"][AGENT_READY_ANNOTATION])
    assert ready["epoch"] == status["attempt"]
    started = datetime.fromisoformat(ready["processStarted"]).timestamp()
    warm = datetime.fromisoformat(ready["readyAt"]).timestamp()
    rank0 = kept[0]
    trained_meanwhile = [
        e
        for e in stack.runtime_events(rank0, "committed")
        if e.fields.get("world_size") == 2
        and started < datetime.fromisoformat(e.time).timestamp() < warm + 1
    ]
    assert trained_meanwhile, (ready, stack.pod_log(rank0)[-3000:])
    switched = datetime.fromisoformat(stack.runtime_events(rank0, "membership")[0].time)
    back = first_step_after(stack, rank0, switched.timestamp())
    say(
        f"new pod's start {warm - started:.1f} s, {len(trained_meanwhile)} commits meanwhile; "
        f"kept rank 0 stopped -> first step at 3 pods: {back:.1f} s"
    )
    # Every pod's new workers fetch the switch's save, once the kept ranks committed it: none
    # downloads the checkpoint before it (the membership names none, the run's newest counts).
    resumed = [
        e.fields["checkpoint"]
        for e in stack.runtime_events(rank0, "resumed")
        if datetime.fromisoformat(e.time) > switched
    ]
    assert resumed, stack.pod_log(rank0)[-3000:]
    for name in grown:
        assert_fetched_only(stack, name, switched.timestamp(), {resumed[0]})


def test_a_grow_switches_the_running_workers_in_process(stack: LocalStack, tmp_path: Path) -> None:
    """The same grow with ``recovery.inProcessSwitch`` and the example built for it: the kept
    pods' workers take the membership of 3 without ending (no checkpoint asked for first, no
    save, no restart, no load), the new pod's rank gets the state from rank 0, and the job
    Succeeds."""
    job, first, status = grow_from_two(
        stack,
        tmp_path,
        name="switches",
        epochs=36,  # 4 steps of 24 samples an epoch
        args=("--in-process-switch", "--global-batch-size=24", "--workers=0"),
        recovery={"survivors": "Stay", "inProcessSwitch": True},
    )
    reasons = [e.get("reason") for e in stack.events(job)]
    assert "Growing" in reasons and "GrowRequested" not in reasons, reasons  # no save first
    events = [e for e in stack.events(job) if e.get("reason") == "MembershipSwitched"]
    assert events and "switch in process" in events[-1]["message"], events
    grown = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    kept = status["keptPods"]
    assert sorted(kept) == sorted(first) and len(grown) == REPLICAS
    for name in kept:  # the same pods and the same workers: switched, not restarted or resumed
        assert grown[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        told = stack.runtime_events(name, "membership")
        assert [(e["epoch"], e["stop"]) for e in told] == [(status["attempt"], "switch")], told
        switched = stack.runtime_events(name, "switched")
        assert [(e["world_size"], e["old_world_size"]) for e in switched] == [(3, 2)], switched
        after = [e for e in stack.runtime_events(name) if e.time > told[0].time]
        assert not [e for e in after if e.type in ("started", "resumed")], after
    (new,) = set(grown) - set(kept)
    joined = stack.runtime_events(new, "resumed")
    assert [e["source"] for e in joined] == ["peers"], stack.pod_log(new)[-3000:]
    # Its agent fetched the newest commit while it waited in standby (what a gang that cannot
    # switch would resume from); its worker downloaded nothing: the state came from rank 0.
    switch_at = stack.runtime_events(kept[0], "switched")[0].time
    fetched = [e for e in stack.runtime_events(new, "fetched") if e.time > switch_at]
    assert not fetched, fetched
    rank0 = stack.runtime_events(kept[0], "switched")[0]
    say(f"kept rank 0 switched at step {rank0['step']} in {rank0['seconds']:.2f} s")


def three_losing_rank_one(
    stack: LocalStack,
    tmp: Path,
    name: str,
    *,
    epochs: int,
    free_node: bool,
    lost_rank: int = 1,
    switching: bool = False,
    silent: bool = False,
    **elastic: object,
) -> tuple[str, dict[str, dict[str, Any]], float]:
    """An elastic job of 3 pods (one a node, ``minReplicas`` 2, a commit every 20 steps) whose
    rank 1 (or ``lost_rank``) loses its node without notice two steps after the first commit;
    ``free_node``: a fourth node is free then; ``switching``: the example built for the
    in-process switch, with ``recovery.inProcessSwitch``; ``silent``: the node's machine dies
    and its Node stays. The job, its pods before the loss by name, when it happened."""
    usable = REPLICAS + 1 if free_node else REPLICAS
    stack.ensure_nodes(usable)
    for node_name in stack.live_nodes()[:usable]:
        stack.untaint_node(node_name, HOLD)
    for node_name in stack.live_nodes()[usable:]:
        stack.taint_node(node_name, HOLD)
    path = survivors_manifest(
        tmp,
        name=name,
        epochs=epochs,
        cpu="20",  # one pod per node
        interval="20ba",
        elastic={"minReplicas": 2, **elastic},
        **(SWITCHING | {"recovery": IN_PROCESS} if switching else {}),
    )
    job = stack.apply(path)
    at_three = wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    assert at_three["gangSize"] == REPLICAS and at_three["attempt"] == 0, at_three
    wait_step(stack, job, 22, "two steps after the commit")
    first = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=0)}
    room = "a fourth node is free" if free_node else "no room for a third pod"
    lost = reclaim_rank(stack, job, f"{job}-a0-r{lost_rank}", f"; {room}", silent=silent)
    return job, first, lost


def test_a_shrink_keeps_the_ranks_that_are_left(stack: LocalStack, tmp_path: Path) -> None:
    """An elastic job at 3 pods loses a node without notice, with no room left for a third pod:
    the two kept pods re-form the gang at 2 in place (no pod is created), from the last
    finished step that kept rank 0 saved from its memory."""
    job, first, lost_at = three_losing_rank_one(
        stack, tmp_path, "shrinks", epochs=8, free_node=False, shrinkAfterSeconds=0
    )
    attempt = 0
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["gangSize"] == 2 and status["failures"] == 0, status
    kept = [f"{job}-a{attempt}-r0", f"{job}-a{attempt}-r2"]
    assert status.get("keptPods") == kept, (status, stack.diagnostics(job))
    last = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    assert set(last) == set(kept), set(last)  # a shrink creates no pod
    for name in kept:  # the same pods, told the new membership once
        assert last[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        told = stack.runtime_events(name, "membership")
        assert [e.fields["nnodes"] for e in told] == [2], told
    (saved,) = stack.runtime_events(kept[0], "survivor_saved")
    shrink = status["interruptions"][-1]
    assert saved.fields["checkpoint"] and shrink["stepsLost"] <= 1, (saved, shrink)
    back = first_step_after(stack, kept[0], lost_at)
    say(f"loss -> kept rank 0's first step at 2 pods: {back:.1f} s; interruption: {shrink}")
    for pod in kept:
        say(phases(stack, pod, lost_at))


def test_a_loss_without_notice_is_taken_in_process_by_the_kept_workers(
    stack: LocalStack, tmp_path: Path
) -> None:
    """With ``recovery.inProcessSwitch``, an elastic job at 3 pods loses rank 1's node without
    notice, with no room left: the two kept pods are told ``stop: rejoin``, and their workers,
    whose step failed on the lost peer, re-form the gang at 2 in the same processes from the last
    step they finished: no save from memory, no restart, no load, at most the running step
    lost (and the operator's status says so)."""
    job, first, lost_at = three_losing_rank_one(
        stack, tmp_path, "rejoins", epochs=30, free_node=False, switching=True, shrinkAfterSeconds=0
    )
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    kept = [f"{job}-a0-r0", f"{job}-a0-r2"]
    assert status["gangSize"] == 2 and status["keptPods"] == kept, (status, stack.diagnostics(job))
    assert status["failures"] == 0, status
    last = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    for name in kept:
        assert last[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
        told = stack.runtime_events(name, "membership")
        assert [(e["epoch"], e["stop"]) for e in told] == [(1, "rejoin")], told
        (switched,) = stack.runtime_events(name, "switched")
        assert (switched["world_size"], switched["old_world_size"]) == (2, 3), switched
        assert switched["after_loss"] is True, switched
        after = [e for e in stack.runtime_events(name) if e.time > told[0].time]
        assert not [e for e in after if e.type in ("started", "resumed")], after
        assert not stack.runtime_events(name, "survivor_saved")
    (loss,) = status["interruptions"]
    assert loss["stepsLost"] <= 1, loss
    assert status["sizeHistory"][-1]["stepsLost"] <= 1, status["sizeHistory"]
    switched_at = datetime.fromisoformat(stack.runtime_events(kept[0], "switched")[0].time)
    back = first_step_after(stack, kept[0], lost_at)
    say(
        f"loss -> the gang of 2 rejoined in process: {switched_at.timestamp() - lost_at:.1f} s, "
        f"first step {back:.1f} s; interruption: {loss}"
    )


def silent_loss(
    stack: LocalStack, job: str, status: dict[str, Any], silent_node: str
) -> dict[str, Any]:
    """The job's one interruption, asserted to be ``silent_node`` taken as silent."""
    (loss,) = status["interruptions"]
    assert (loss["cause"], loss["node"]) == ("NodeSilent", silent_node), (
        loss,
        stack.diagnostics(job),
    )
    return loss


def assert_before_not_ready(stack: LocalStack, node_name: str, at: datetime) -> None:
    """``at`` came before the node controller marked the node NotReady, if it did since."""
    node = stack.kube.get(f"/api/v1/nodes/{node_name}")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    if ready["status"] != "True":
        unready_at = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00"))
        assert at < unready_at, (at, ready)


def test_a_node_that_dies_silently_is_taken_as_lost_once_its_kubelet_stops_renewing(
    stack: LocalStack, tmp_path: Path
) -> None:
    """As above, but rank 1's machine dies and its Node stays: it reads Ready for the node
    controller's grace (40 s here), then ``nodeNotReadySeconds`` (60 s) would pass before the
    operator took it for lost. The kept workers' failed collective is reported on their pods
    (``resumable.dev/peer-lost``); the operator reads the gang's nodes' Leases, takes the node
    whose kubelet stopped renewing as lost while it still reads Ready (cause ``NodeSilent``),
    and the kept workers rejoin in process."""
    job, first, lost_at = three_losing_rank_one(
        stack,
        tmp_path,
        "silent",
        epochs=30,
        free_node=False,
        switching=True,
        silent=True,
        shrinkAfterSeconds=0,
    )
    silent_node = first[f"{job}-a0-r1"]["spec"]["nodeName"]
    try:
        status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
        loss = silent_loss(stack, job, status, silent_node)
        assert loss["stepsLost"] <= 1 and status["failures"] == 0, status
        kept = [f"{job}-a0-r0", f"{job}-a0-r2"]
        assert status["gangSize"] == 2 and status["keptPods"] == kept, status
        for name in kept:
            pod = stack.pod(name)
            assert pod is not None and pod["metadata"]["uid"] == first[name]["metadata"]["uid"]
            reported = json.loads(pod["metadata"]["annotations"][PEER_LOST_ANNOTATION])
            assert reported["epoch"] == 0, reported
            (switched,) = stack.runtime_events(name, "switched")
            assert switched["after_loss"] is True and switched["world_size"] == 2, switched
        switched_at = datetime.fromisoformat(stack.runtime_events(kept[0], "switched")[0].time)
        assert_before_not_ready(stack, silent_node, switched_at)
        say(
            f"silent node -> the gang of 2 rejoined in process: "
            f"{switched_at.timestamp() - lost_at:.1f} s (node Ready then: the operator's "
            f"NotReady path would have waited 40 s + nodeNotReadySeconds 60 s)"
        )
    finally:
        stack.delete_node(silent_node)


def test_a_silent_node_under_a_gang_that_replaces_its_pods_is_a_preemption_not_a_failure(
    stack: LocalStack, tmp_path: Path
) -> None:
    """``recovery.survivors: Replace`` (the default) and no ``failureSettleSeconds``: rank 1's
    machine dies and its Node stays, reading Ready. The other ranks' workers end on the failed
    collective and say so on their pods first (``resumable.dev/peer-lost``); the operator holds
    their failure while it checks the Leases of the gang's nodes, takes the silent node as lost
    (``NodeSilent``) and resubmits the gang as for any preemption. Before, the crashed ranks
    counted as a failure at once, charged to ``backoffLimit``."""
    stack.ensure_nodes(REPLICAS + 1)
    for node_name in stack.live_nodes()[: REPLICAS + 1]:
        stack.untaint_node(node_name, HOLD)
    for node_name in stack.live_nodes()[REPLICAS + 1 :]:
        stack.taint_node(node_name, HOLD)
    path = survivors_manifest(
        tmp_path,
        name="silent-replace",
        epochs=8,
        cpu="20",  # one pod per node
        interval="20ba",
        recovery={"survivors": "Replace"},
    )
    job = stack.apply(path)
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    wait_step(stack, job, 22, "two steps after the commit")
    lost_pod = f"{job}-a0-r1"
    silent_node = stack.pod(lost_pod)["spec"]["nodeName"]
    lost_at = reclaim_rank(stack, job, lost_pod, "; a fourth node is free", silent=True)
    try:
        status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
        loss = silent_loss(stack, job, status, silent_node)
        assert loss["preemption"] is True and status["failures"] == 0, status
        seen_at = datetime.fromisoformat(loss["time"].replace("Z", "+00:00"))
        assert_before_not_ready(stack, silent_node, seen_at)
        say(
            f"silent node under a Replace gang -> preemption seen after "
            f"{seen_at.timestamp() - lost_at:.1f} s (before: a failure, counted at once)"
        )
    finally:
        stack.delete_node(silent_node)


def test_a_lost_rank_0_is_saved_for_and_reported_by_the_new_rank_0(
    stack: LocalStack, tmp_path: Path
) -> None:
    """Rank 0's node is lost without notice: the kept pod that becomes node rank 0 saves the
    last finished step from its memory, and the operator learns of that commit although the
    rank that reports progress was the one lost: the interruption and the size history count at
    most the step that was running, and the commit is among the job's known checkpoints as the
    interrupted attempt's."""
    job, first, lost_at = three_losing_rank_one(
        stack, tmp_path, "rank0", epochs=8, free_node=False, lost_rank=0, shrinkAfterSeconds=0
    )
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    kept = [f"{job}-a0-r1", f"{job}-a0-r2"]
    assert status.get("keptPods") == kept and status["gangSize"] == 2, status
    last = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    for name in kept:  # the same pods: the one lost was rank 0's, the gang stayed
        assert last[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
    (saved,) = stack.runtime_events(kept[0], "survivor_saved")
    assert saved.fields["checkpoint"] and saved.fields["step"] >= 22, saved
    (shrink,) = status["interruptions"]
    say(f"survivor's save: step {saved.fields['step']}; interruption: {shrink}")
    assert shrink["stepsLost"] <= 1 and shrink["lastCommittedStep"] >= saved.fields["step"], (
        shrink,
        saved,
    )
    assert status["sizeHistory"][-1]["stepsLost"] <= 1, status["sizeHistory"]
    known = {k["name"]: k for k in status.get("knownCheckpoints") or []}
    if saved.fields["checkpoint"] in known:  # the newest few are kept: later commits may push it
        assert known[saved.fields["checkpoint"]].get("attempt") == 0, known
    back = first_step_after(stack, kept[0], lost_at)
    say(f"loss of rank 0 -> kept rank 0's first step at 2 pods: {back:.1f} s")


def test_a_loss_with_room_left_trains_on_at_two_and_grows_back_warm(
    stack: LocalStack, tmp_path: Path
) -> None:
    """An elastic job at 3 pods loses a node without notice while a fourth node is free: the
    two kept pods train on at 2 at once instead of waiting for a new pod's cold start, the lost
    place's pod starts in standby on the free node, and the gang grows back to 3 as soon as it
    is warm (without the 300 s grow interval)."""
    job, _, lost_at = three_losing_rank_one(stack, tmp_path, "restores", epochs=20, free_node=True)
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    kept, standby = [f"{job}-a0-r0", f"{job}-a0-r2"], f"{job}-a1-s0"
    assert status["gangSize"] == REPLICAS, (status, stack.diagnostics(job))
    assert status["failures"] == 0, status
    assert status["keptPods"] == [*kept, standby], (status, stack.diagnostics(job))
    assert [i["cause"] for i in status["interruptions"]][-1] == "Grow", status["interruptions"]
    assert [s["reason"] for s in status["sizeHistory"]][-2:] == ["SurvivorsFirst", "Grown"]
    for name in kept:  # told the gang of 2 at once, then the gang of 3
        told = stack.runtime_events(name, "membership")
        assert [e.fields["nnodes"] for e in told] == [2, REPLICAS], told
    told = stack.runtime_events(standby, "membership")
    assert [(e.fields["epoch"], e.fields["nnodes"]) for e in told] == [(2, REPLICAS)], told
    at_two = first_step_after(stack, kept[0], lost_at)
    ready = json.loads(stack.pod(standby)["metadata"]["annotations"][AGENT_READY_ANNOTATION])
    warm = datetime.fromisoformat(ready["readyAt"]).timestamp()
    assert at_two < warm - lost_at, (at_two, ready)  # trained before the new pod was warm
    say(
        f"loss -> kept rank 0's first step at 2 pods: {at_two:.1f} s; standby pod warm "
        f"{warm - lost_at:.1f} s after the loss"
    )
    for pod in (*kept, standby):
        say(phases(stack, pod, lost_at))


def use_every_node(stack: LocalStack, count: int) -> None:
    """At least ``count`` nodes, none held back."""
    stack.ensure_nodes(count)
    for name in stack.live_nodes():
        stack.untaint_node(name, HOLD)


def wait_warm(stack: LocalStack, spare: str) -> None:
    """Until the spare's agent says it is warm."""

    def warm() -> bool:
        pod = stack.pod(spare) or {}
        return AGENT_READY_ANNOTATION in (pod.get("metadata") or {}).get("annotations", {})

    wait_for("the spare to be warm", warm, timeout=240, on_timeout=stack.diagnostics)


def test_a_warm_spare_takes_the_lost_ranks_place(stack: LocalStack, tmp_path: Path) -> None:
    """A fixed 3-rank job keeps one spare pod warm on a fourth node; a reclaimed rank's place
    goes to the spare (no new rank pod), and a new spare starts on the fifth node."""
    use_every_node(stack, REPLICAS + 2)
    job = stack.apply(
        survivors_manifest(
            tmp_path,
            name="spares",
            epochs=8,
            cpu="20",
            recovery={"survivors": "Stay", "spares": 1},
        )
    )
    spare = f"{job}-a0-s0"
    wait_warm(stack, spare)
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    lost_at = reclaim_rank(stack, job, f"{job}-a0-r1", f"; {spare} is warm")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["attempt"] == 1 and status["preemptions"] == 1 and status["failures"] == 0
    assert status["keptPods"] == [f"{job}-a0-r0", f"{job}-a0-r2", spare], status
    second = {p["metadata"]["name"] for p in stack.pods(job, attempt=1)}
    assert second == set(status["keptPods"]), second  # no rank pod was created
    told = stack.runtime_events(spare, "membership")
    assert [e.fields["epoch"] for e in told] == [1], told
    assert "SurvivorsStay" in [e.get("reason") for e in stack.events(job)]
    back = first_step_after(stack, f"{job}-a0-r0", lost_at)
    say(f"loss -> kept rank 0's first step with the spare in rank 2: {back:.1f} s")
    for pod in (f"{job}-a0-r0", spare):
        say(phases(stack, pod, lost_at))


def test_a_node_under_notice_keeps_the_other_ranks_pods(stack: LocalStack, tmp_path: Path) -> None:
    """A termination notice, then the node shuts down: the gang saves on the notice and trains
    on, the node's pod ends in its grace period, and the next attempt keeps the two pods on
    healthy nodes and creates one only for the lost place."""
    stack.ensure_nodes(REPLICAS + 1)
    for name in stack.live_nodes():
        stack.untaint_node(name, HOLD)
    job = stack.apply(survivors_manifest(tmp_path, name="notices", epochs=16, cpu="20"))
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    first = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=0)}
    assert len(first) == REPLICAS
    node = first[f"{job}-a0-r1"]["spec"]["nodeName"]
    noticed_at = time.time()
    stack.taint_node(node, PodRunnerCluster.TAINT, "NoSchedule", "true")
    say(f"termination notice on {node} ({job}-a0-r1)")

    def saved_on_notice() -> bool:
        saved = (stack.job(job).get("status") or {}).get("lastCommittedCheckpoint") or {}
        at = saved.get("time")
        return bool(at) and datetime.fromisoformat(at).timestamp() > noticed_at

    wait_for("the notice's save", saved_on_notice, timeout=120, on_timeout=stack.diagnostics)
    stack.shut_down_node(node)
    lost_at = time.time()
    say(f"{node} shut down")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    kept = [f"{job}-a0-r0", f"{job}-a0-r2"]
    assert status.get("keptPods") == kept, (status, stack.diagnostics(job))
    second = {p["metadata"]["name"]: p for p in stack.pods(job, attempt=status["attempt"])}
    assert set(second) == {*kept, f"{job}-a{status['attempt']}-r2"}, set(second)
    for name in kept:  # the same pods: never deleted, never recreated
        assert second[name]["metadata"]["uid"] == first[name]["metadata"]["uid"]
    (interruption,) = status["interruptions"]
    assert interruption["stepsLost"] <= 1, interruption
    back = first_step_after(stack, kept[0], lost_at)
    say(f"shutdown -> kept rank 0's first step: {back:.1f} s; interruption: {interruption}")


SWITCHING: dict[str, Any] = {
    "args": ("--in-process-switch", "--global-batch-size=24", "--workers=0"),
}
"""The example built for the in-process switch (``switching_manifest``)."""
IN_PROCESS = {"survivors": "Stay", "inProcessSwitch": True}


def switching_manifest(tmp: Path, name: str, **spec: Any) -> Path:
    """A job of 3 pods (one a node) of the example built for the in-process switch: 30 epochs
    of 4 steps of 24 samples, a commit every 20 steps."""
    return survivors_manifest(
        tmp,
        name=name,
        epochs=30,
        cpu="20",
        interval="20ba",
        **SWITCHING,
        **spec,
    )


def notice_until_left(stack: LocalStack, job: str, leaving: str, note: str = "") -> float:
    """Taint the node of ``leaving`` as a termination handler does, wait until that pod's
    workers left the gang in process, then shut the node down; when the notice came."""
    node = stack.pod(leaving)["spec"]["nodeName"]
    noticed_at = time.time()
    stack.taint_node(node, PodRunnerCluster.TAINT, "NoSchedule", "true")
    say(f"termination notice on {node} ({leaving}){note}")
    wait_for(
        "the noticed pod to leave",
        lambda: bool(stack.runtime_events(leaving, "left")),
        timeout=120,
        on_timeout=lambda: stack.diagnostics(job),
    )
    stack.shut_down_node(node)
    return noticed_at


def assert_switched_at_the_leave(
    stack: LocalStack, kept: list[str], left: Any, *, sizes: tuple[int, int]
) -> None:
    """The kept pods' workers were told to switch once, switched from ``sizes[1]`` to
    ``sizes[0]`` ranks at the step the leaving rank left, and were neither restarted nor
    resumed."""
    for name in kept:
        told = stack.runtime_events(name, "membership")
        assert [(e["epoch"], e["stop"]) for e in told] == [(1, "switch")], told
        (switched,) = stack.runtime_events(name, "switched")
        assert (switched["world_size"], switched["old_world_size"]) == sizes, switched
        assert switched["step"] == left["step"], (switched, left)  # the same boundary
        after = [e for e in stack.runtime_events(name) if e.time > told[0].time]
        assert not [e for e in after if e.type in ("started", "resumed")], after


def test_a_notice_lets_the_noticed_pod_leave_and_the_others_switch_in_process(
    stack: LocalStack, tmp_path: Path
) -> None:
    """With ``recovery.inProcessSwitch``, a termination notice on the node of rank 1 of an
    elastic job of 3 ends the attempt at the notice: the pod there leaves the gang at the next
    step boundary and ends, while the two other pods' workers switch to the gang of 2 without
    ending (no save, no restart, no load, no step lost); the node then shuts down without
    touching the gang, and the job Succeeds."""
    stack.ensure_nodes(REPLICAS)
    for node_name in stack.live_nodes()[:REPLICAS]:
        stack.untaint_node(node_name, HOLD)
    for node_name in stack.live_nodes()[REPLICAS:]:
        stack.taint_node(node_name, HOLD)
    job = stack.apply(
        switching_manifest(
            tmp_path,
            "leaves",
            elastic={"minReplicas": 2},
            recovery={"survivors": "Stay", "inProcessSwitch": True},
        )
    )
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    leaving, kept = f"{job}-a0-r1", [f"{job}-a0-r0", f"{job}-a0-r2"]
    noticed_at = notice_until_left(stack, job, leaving)
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["attempt"] == 1 and status["gangSize"] == 2, (status, stack.diagnostics(job))
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    assert status["keptPods"] == kept, status
    (interruption,) = status["interruptions"]
    assert interruption["cause"] == "TerminationNotice", interruption
    assert interruption["stepsLost"] == 0, interruption
    assert "Leaving" in [e.get("reason") for e in stack.events(job)]
    (left,) = stack.runtime_events(leaving, "left")
    assert left["epoch"] == 1, left
    assert not stack.runtime_events(leaving, "notice")  # no save was asked for
    assert_switched_at_the_leave(stack, kept, left, sizes=(2, 3))
    switched_at = datetime.fromisoformat(stack.runtime_events(kept[0], "switched")[0].time)
    say(
        f"notice -> the gang of 2 switched at step {left['step']}: "
        f"{switched_at.timestamp() - noticed_at:.1f} s"
    )


def test_a_fixed_gangs_warm_spare_takes_a_noticed_place_in_process(
    stack: LocalStack, tmp_path: Path
) -> None:
    """A fixed 3-rank job with one warm spare and ``recovery.inProcessSwitch``: a termination
    notice on rank 1's node ends the attempt at the notice; the pod there leaves at the next
    step boundary while the two others and the spare switch to the gang of 3 in process (the
    spare gets the state from rank 0): no save, no restart, no step lost."""
    use_every_node(stack, REPLICAS + 1)
    job = stack.apply(
        switching_manifest(
            tmp_path,
            "spareswitch",
            recovery={"survivors": "Stay", "spares": 1, "inProcessSwitch": True},
        )
    )
    spare = f"{job}-a0-s0"
    wait_warm(stack, spare)
    wait_status(stack, job, "a first commit", "lastCommittedCheckpoint")
    leaving, kept = f"{job}-a0-r1", [f"{job}-a0-r0", f"{job}-a0-r2"]
    noticed_at = notice_until_left(stack, job, leaving, f"; {spare} is warm")
    status = wait_status(stack, job, "the job to succeed", "phase", "Succeeded")
    assert status["attempt"] == 1 and status["gangSize"] == 3, (status, stack.diagnostics(job))
    assert status["keptPods"] == [*kept, spare], status
    (interruption,) = status["interruptions"]
    assert interruption["cause"] == "TerminationNotice" and interruption["stepsLost"] == 0
    (left,) = stack.runtime_events(leaving, "left")
    assert_switched_at_the_leave(stack, kept, left, sizes=(3, 3))
    joined = stack.runtime_events(spare, "resumed")
    assert [(e["source"], e["step"]) for e in joined] == [("peers", left["step"])], joined
    switched_at = datetime.fromisoformat(stack.runtime_events(kept[0], "switched")[0].time)
    say(
        f"notice -> the gang of 3 with the spare switched at step {left['step']}: "
        f"{switched_at.timestamp() - noticed_at:.1f} s"
    )
