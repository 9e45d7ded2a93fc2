"""``kubectl get rtj`` shows PROGRESS and ETA from rank 0's progress reports, and the ETA names
the state instead of a number while no gang trains.

The fake nodes run no trainer: the test writes the annotation the runtime writes (step, total
steps and the time it was sent), as the other cluster tests do for commits.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tools.kubeapi import MERGE, Kube
from tools.waiting import wait_for

from .conftest import OperatorProcess, Pool
from .scenario import kubectl_binary, node_of, printed_row, start_running, wait_attempt


def report(
    kube: Kube, ns: str, pod: str, step: int, *, total: int, at: datetime, commit: bool = False
) -> None:
    """What rank 0's runtime sends every few seconds (with a checkpoint it just committed at
    ``step`` when ``commit``)."""
    body: dict[str, object] = {
        "current_step": step,
        "current_sample": step * 8,
        "total_steps": total,
        "reported_at": at.isoformat(timespec="seconds"),
    }
    if commit:
        body |= {
            "checkpoint": f"ep0-ba{step}",
            "uri": f"s3://ckpt/run/ep0-ba{step}",
            "step": step,
            "sample": step * 8,
            "time": at.isoformat(timespec="seconds"),
        }
    kube.req(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}",
        content_type=MERGE,
        body={"metadata": {"annotations": {"resumable.dev/progress": json.dumps(body)}}},
    )


def test_progress_and_eta_columns(
    kube: Kube, kubeconfig: str, ns: str, pool: Pool, operator: OperatorProcess
) -> None:
    assert kubectl_binary(), "kubectl is needed to check the printer columns"
    name = start_running(kube, ns, pool, operator, replicas=1)
    rank0 = f"{name}-a0-r0"
    now = datetime.now(UTC)
    report(kube, ns, rank0, 100, total=1000, at=now - timedelta(seconds=60))
    wait_for(
        "the first report seen",
        lambda: (kube.status(ns, name).get("progress") or {}).get("step") == 100,
        30,
        on_timeout=operator.tail,
    )
    # 300 steps in 60 s: 5 a second, 600 left; committed, so the next gang resumes from it.
    report(kube, ns, rank0, 400, total=1000, at=now, commit=True)
    row = wait_for(
        "PROGRESS and ETA printed",
        lambda: r if (r := printed_row(kubeconfig, ns, name)).get("ETA") == "2m" else None,
        30,
        on_timeout=lambda: f"status={kube.status(ns, name)}\n{operator.tail()}",
    )
    assert row["PROGRESS"] == "40%"
    progress = kube.status(ns, name)["progress"]
    assert progress["stepsPerSecond"] == 5.0 and progress["etaSeconds"] == 120.0
    assert progress["state"] == "Training" and progress["totalSteps"] == 1000

    kube.delete_node(node_of(kube, ns, name, 0, 0))  # the gang is lost: no ETA until one trains
    row = wait_for(
        "ETA names the state",
        lambda: (
            r
            if (r := printed_row(kubeconfig, ns, name)).get("ETA")
            in ("Restarting", "WaitingForCapacity")
            else None
        ),
        60,
        on_timeout=lambda: f"status={kube.status(ns, name)}\n{operator.tail()}",
    )
    assert row["PROGRESS"] == "40%"  # the last commit's step while no gang trains
    assert "etaSeconds" not in kube.status(ns, name)["progress"]
    wait_attempt(kube, ns, name, 1, 1, op=operator)
