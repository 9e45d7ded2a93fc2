"""Spare pods: started ranks that wait beside a fixed-size gang to take a lost one's place.

With ``recovery.survivors: Stay`` a preemption keeps the healthy pods, but the lost places still
get new pods that cold-start (scheduling, the container, the interpreter, ``import torch``) while
the survivors wait for them in ``init_process_group``. ``recovery.spares: K`` keeps K pods
started ahead: each runs the training container under the in-pod agent in standby
(``RTJ_STANDBY=1``: torch and the runtime imported, ``resumable.dev/agent-ready`` written, no
worker), labelled ``resumable.dev/role: spare`` and without an attempt or rank. A preemption
gives the lost ranks' places to warm spares (they join ``status.keptPods`` after the survivors
and are relabelled into the attempt like them); only places no spare covers get new pods. The
pool is topped up while the gang runs whole and the nodes have room for more than the gang.

Ranks come first: a spare that no node took is deleted as soon as a rank of the gang waits for
a node, and so are spares beyond K and every spare once the job ends or is suspended. Spares
are for fixed-size gangs under the operator's own or native gang scheduling; a Kueue-admitted
gang replaces its pods whole, and an elastic gang grows into free nodes instead. An elastic gang
has them only for a while after a loss, as the standby pods of the lost places (restore.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..api import names
from ..api.spec_types import Survivors
from .gang_mechanisms import of_status
from .manifests import build_pod
from .podstate import is_deleting, is_finished, pod_deletion
from .reconcile_context import ReconcileContext
from .survivors import ready_epoch


def wanted(ctx: ReconcileContext) -> int:
    """How many spares the job keeps now (0 when the gang cannot use them): ``spares`` for a
    fixed-size gang; for an elastic one, the standby pods for the lost places of a gang that a
    loss shrank to its kept pods, until it grows back (restore.py)."""
    spec = ctx.job.spec
    usable = (
        spec.recovery.survivors is Survivors.STAY
        and not spec.suspend
        and of_status(ctx.status.gang_scheduling).keeps_pods
    )
    if not usable:
        return 0
    if spec.elastic is None:
        return spec.recovery.spares
    restore = ctx.status.restore
    return max(0, restore.size - ctx.size) if restore is not None else 0


def is_spare(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(names.LABEL_ROLE) == names.ROLE_SPARE


def live(ctx: ReconcileContext) -> list[dict[str, Any]]:
    """The job's spares that are neither being deleted nor ended, oldest name first."""
    found = [p for p in ctx.owned if is_spare(p) and not is_deleting(p) and not is_finished(p)]
    return sorted(found, key=lambda p: p["metadata"]["name"])


def _healthy_node(ctx: ReconcileContext, pod: Mapping[str, Any]) -> bool:
    node = ctx.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    return node is not None and node.exists and not node.deleting and node.ready is True


def warm(ctx: ReconcileContext) -> list[str]:
    """The spares that can take a rank now: Running on a healthy node, the agent warm."""
    return [
        p["metadata"]["name"]
        for p in live(ctx)
        if (p.get("status") or {}).get("phase") == "Running"
        and ready_epoch(p) is not None
        and _healthy_node(ctx, p)
    ]


def fill_places(ctx: ReconcileContext, kept: Sequence[str], size: int) -> list[str]:
    """``kept`` (the survivors), then as many warm spares as the gang of ``size`` lacks."""
    if not kept or wanted(ctx) == 0:
        return list(kept)
    return [*kept, *warm(ctx)[: max(0, size - len(kept))]]


def tend(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]], all_running: bool) -> None:
    """While the gang is active: delete spares that would take a rank's node or are too many,
    and start the missing ones when the whole gang runs and the nodes have room to spare."""
    want = wanted(ctx)
    spares = live(ctx)
    rank_waiting = any(not (p.get("spec") or {}).get("nodeName") for p in current.values())
    keep: list[dict[str, Any]] = []
    for pod in spares:
        unplaced = not (pod.get("spec") or {}).get("nodeName")
        if len(keep) >= want:
            ctx.plan.deletions.append(pod_deletion(pod, f"the job keeps {want} spares"))
        elif unplaced and rank_waiting:
            ctx.plan.deletions.append(pod_deletion(pod, "a rank waits for a node"))
        else:
            keep.append(pod)
    missing = want - len(keep)
    if missing <= 0 or not all_running or rank_waiting:
        return
    room = ctx.fit(ctx.size + want) - ctx.size - len(keep)
    taken = {p["metadata"]["name"] for p in ctx.owned}
    index = 0
    for _ in range(min(missing, room)):
        while names.spare_name(ctx.job.ref.name, ctx.status.attempt, index) in taken:
            index += 1
        ctx.plan.spares.append(_spare_pod(ctx, index))
        index += 1


def release(ctx: ReconcileContext, why: str) -> None:
    """Delete every spare (the job ended or is suspended)."""
    for pod in live(ctx):
        ctx.plan.deletions.append(pod_deletion(pod, why))


def _spare_pod(ctx: ReconcileContext, index: int) -> dict[str, Any]:
    """A spare: the training pod of the next attempt's rank 0, in standby, under its own name
    and without an attempt or rank (so no gang counts it before it takes a place)."""
    st, job = ctx.status, ctx.job
    name = names.spare_name(job.ref.name, st.attempt, index)
    pod = build_pod(
        job,
        st.attempt + 1,
        0,
        size=ctx.size,
        resume_from="",
        quarantined=list(st.quarantined_checkpoints),
        status=st,
        standby=True,
        name=name,
    )
    labels = pod["metadata"]["labels"]
    labels.pop(names.LABEL_ATTEMPT, None)
    labels.pop(names.LABEL_RANK, None)
    labels[names.LABEL_ROLE] = names.ROLE_SPARE
    return pod
