"""Steps shared by the cluster tests: start a job on its own nodes and wait for its phases."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tools.kubeapi import Kube, rtj, unique
from tools.waiting import wait_for

from .conftest import ROOT, OperatorProcess, Pool


def start_running(
    kube: Kube,
    ns: str,
    pool: Pool,
    op: OperatorProcess,
    replicas: int = 2,
    *,
    nodes: int | None = None,
    cpu: str = "32",
    **spec: Any,
) -> str:
    """Create ``nodes`` (default one per rank) and a job; wait until attempt 0 runs."""
    pool.add(nodes if nodes is not None else replicas, cpu=cpu)
    name = unique("job")
    kube.create_job(rtj(name, ns, pool.name, replicas, **spec))
    wait_for(
        f"{name} attempt 0 running",
        lambda: kube.running(ns, name, 0, replicas),
        60,
        on_timeout=op.tail,
    )
    wait_phase(kube, ns, name, "Running", 30, op=op)
    return name


def wait_phase(
    kube: Kube, ns: str, name: str, phase: str, timeout: float, *, op: OperatorProcess
) -> None:
    """Wait until the job's ``status.phase`` is ``phase`` (the operator's log tail on timeout)."""
    wait_for(
        f"{name} phase {phase}",
        lambda: kube.status(ns, name).get("phase") == phase,
        timeout,
        on_timeout=op.tail,
    )


def wait_attempt(
    kube: Kube,
    ns: str,
    name: str,
    attempt: int,
    replicas: int,
    *,
    op: OperatorProcess,
    timeout: float = 30.0,
) -> list[dict[str, Any]]:
    """Wait until every pod of ``attempt`` exists; return them."""
    return wait_for(
        f"{name} attempt {attempt} gang",
        lambda: pods if len(pods := kube.pods(ns, name, attempt)) == replicas else None,
        timeout,
        on_timeout=lambda: f"status={kube.status(ns, name)}\n{op.tail()}",
    )


def node_of(kube: Kube, ns: str, name: str, attempt: int, rank: int) -> str:
    """The node a rank runs on."""
    pod = kube.pod(ns, f"{name}-a{attempt}-r{rank}")
    assert pod is not None
    return pod["spec"]["nodeName"]


def last_interruption(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """The newest entry of the interruption history."""
    return (kube.status(ns, name).get("interruptions") or [{}])[-1]


def wait_events(kube: Kube, ns: str, name: str, reasons: set[str]) -> None:
    """Wait until Events with every reason exist (they are posted after the work is done)."""
    wait_for(
        f"events {sorted(reasons)}",
        lambda: reasons <= {e["reason"] for e in kube.events(ns, name)},
        10,
        on_timeout=lambda: str(sorted({e["reason"] for e in kube.events(ns, name)})),
    )


def condition(kube: Kube, ns: str, name: str, type_: str) -> dict[str, Any]:
    """One condition of the job."""
    for cond in kube.status(ns, name).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return {}


def pod_report(kube: Kube, ns: str, name: str) -> str:
    """Every pod of a job with its phase, node and scheduling state, then the namespace's
    warning Events: what a timeout message needs to tell a stuck scheduler from the operator."""
    lines = [f"status={kube.status(ns, name)}"]
    for pod in kube.pods(ns, name):
        meta, spec, st = pod["metadata"], pod["spec"], pod.get("status") or {}
        scheduled = next(
            (c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
        )
        lines.append(
            f"pod {meta['name']} phase={st.get('phase')} node={spec.get('nodeName')} "
            f"deleting={bool(meta.get('deletionTimestamp'))} "
            f"scheduled={scheduled.get('status')}:{scheduled.get('reason')}:"
            f"{scheduled.get('message')}"
        )
    events = kube.req("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    for e in events:
        if e.get("type") == "Warning":
            lines.append(
                f"event {e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message')}"
            )
    return "\n".join(lines)


def kubectl_binary() -> str | None:
    """kubectl from the local control plane's build, else from PATH."""
    build = ROOT / "hack" / "cluster" / "build.sh"
    if build.exists():
        bindir = subprocess.run(
            [str(build), "--print-bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if bindir and (Path(bindir) / "kubectl").exists():
            return str(Path(bindir) / "kubectl")
    return shutil.which("kubectl")


def printed_row(kubeconfig: str, ns: str, name: str) -> dict[str, str]:
    """The job's row of ``kubectl get rtj`` by column header (an empty column as "")."""
    kubectl = kubectl_binary()
    assert kubectl, "kubectl is needed to check the printer columns"
    out = subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "-n", ns, "get", "rtj", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = out.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}
