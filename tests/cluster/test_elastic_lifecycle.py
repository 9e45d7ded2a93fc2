"""An elastic job keeps the rest of the contract at the size it shrank to (issue #12, item 6).

A 4-rank elastic job loses half of its nodes and runs at 2 ranks. At that size: a rank's crash
is a failure (its own budget, the preemption count untouched) and the gang comes back at 2 ranks;
a checkpoint that keeps crashing the job right after resume is quarantined; suspend deletes the
gang and keeps the state, and resume brings it back at the size that fits; the metrics count the
causes; deleting the job removes its pods and its PodGroups. The nodes' kubelets are kwok's: where
the runtime would report a commit, the test writes the progress annotation the runtime writes.
"""

from __future__ import annotations

import urllib.request

from tools.kubeapi import rtj, unique
from tools.waiting import wait_for

from .scenario import wait_events, wait_phase
from .test_elastic import env_of, gang_on, shrink_four_to_two, template

POLICY = {"backoffBaseSeconds": 0, "backoffLimit": 10, "quarantineThreshold": 2}
ELASTIC = {"minReplicas": 2, "shrinkAfterSeconds": 3, "grow": {"enabled": False}}


def counter(metrics_url: str, name: str, **labels: str) -> float:
    """One sample of the operator's metrics (0 when not exported yet)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:  # noqa: S310
        text = response.read().decode()
    sample = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "} "
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line[len(sample) :])
    return 0.0


def live_pods(kube, ns: str, name: str) -> list[str]:
    """Pods of the job that still run or wait to (not ended, not being deleted)."""
    return [
        p["metadata"]["name"]
        for p in kube.pods(ns, name)
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_shrunk_job_fails_quarantines_suspends_and_deletes_at_its_size(kube, ns, pool, operator):
    pool.add(4, cpu="4")
    name = unique("shrunk")
    spec = {"elastic": ELASTIC, "resumePolicy": POLICY}
    kube.create_job(rtj(name, ns, pool.name, 4, template_spec=template(), **spec))
    shrink_four_to_two(kube, ns, name, operator)
    failures_before = counter(
        operator.metrics, "rtj_interruptions_total", cause="Failure", kind="failure"
    )

    # A crash at the smaller size: a failure, the preemption count untouched, back at 2 ranks.
    kube.report_progress(ns, f"{name}-a1-r0", "ep0-ba150", 150)
    wait_for(
        "checkpoint 150",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 150,
        20,
    )
    kube.end_container(ns, f"{name}-a1-r1", 1)
    pods = wait_for(
        "attempt 2 at 2 ranks", lambda: gang_on(kube, ns, name, 2, 2), 40, on_timeout=operator.tail
    )
    env = env_of(pods[0])
    assert env["WORLD_SIZE"] == "2" and env["RTJ_RESUME_FROM"].endswith("/ep0-ba150")
    status = kube.status(ns, name)
    assert (status["failures"], status["preemptions"], status["gangSize"]) == (1, 1, 2)
    assert status["interruptions"][-1]["cause"] == "Failure"

    # The checkpoint it resumed from crashes it again: quarantined after the second failure.
    kube.end_container(ns, f"{name}-a2-r0", 1)
    wait_for("attempt 3", lambda: gang_on(kube, ns, name, 3, 2), 40, on_timeout=operator.tail)
    kube.end_container(ns, f"{name}-a3-r0", 1)
    pods = wait_for(
        "attempt 4 at 2 ranks", lambda: gang_on(kube, ns, name, 4, 2), 40, on_timeout=operator.tail
    )
    env = env_of(pods[0])
    assert env["RTJ_RESUME_FROM"].endswith("/ep0-ba100") and env["RTJ_QUARANTINED"] == "ep0-ba150"
    assert env["WORLD_SIZE"] == "2"
    status = kube.status(ns, name)
    assert status["quarantinedCheckpoints"] == ["ep0-ba150"]
    assert (status["failures"], status["preemptions"]) == (3, 1)
    wait_events(kube, ns, name, {"Shrunk", "RankFailed", "CheckpointQuarantined"})
    failures_after = counter(
        operator.metrics, "rtj_interruptions_total", cause="Failure", kind="failure"
    )
    assert failures_after - failures_before == 3

    # Suspend keeps the state and deletes the gang; resume brings it back at the size that fits.
    kube.patch_job(ns, name, {"suspend": True})
    wait_phase(kube, ns, name, "Suspended", 20, op=operator)
    wait_for("gang deleted", lambda: live_pods(kube, ns, name) == [], 30, on_timeout=operator.tail)
    # Ended pods of the last two attempts stay for their logs (docs/operator.md), no older ones.
    kept = {
        p["metadata"]["labels"]["resumable.dev/attempt"]
        for p in kube.pods(ns, name)
        if not p["metadata"].get("deletionTimestamp")
    }
    assert len(kept) <= 2, kept
    kube.patch_job(ns, name, {"suspend": False})
    pods = wait_for(
        "resumed at 2 ranks", lambda: gang_on(kube, ns, name, 5, 2), 40, on_timeout=operator.tail
    )
    assert env_of(pods[0])["WORLD_SIZE"] == "2"
    status = kube.status(ns, name)
    assert (status["failures"], status["preemptions"]) == (3, 1)  # a suspend is neither

    # Deleting the job removes its pods and its PodGroups (owned by the job).
    groups = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"
    if kube.get(groups) is not None:
        assert any(g["metadata"]["name"].startswith(f"{name}-a") for g in kube.get(groups)["items"])
    kube.delete_job(ns, name)
    wait_for("pods collected", lambda: kube.pods(ns, name) == [], 60, on_timeout=operator.tail)
    if kube.get(groups) is not None:
        wait_for(
            "PodGroups collected",
            lambda: (
                not [
                    g
                    for g in kube.get(groups)["items"]
                    if g["metadata"]["name"].startswith(f"{name}-a")
                ]
            ),
            60,
        )
