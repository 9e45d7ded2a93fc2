"""Survivors first: after a loss, an elastic gang with ``Stay`` trains on at once as its kept pods.

Without it, a loss that leaves room for new pods makes the kept ranks wait in
``init_process_group`` for the lost places' new pods through their whole cold start (scheduling,
the image, the interpreter, ``import torch``; on a GPU cluster also CUDA, NCCL and the
download). With ``recovery.survivors: Stay`` and ``elastic``, the attempt after such a loss
starts as the kept pods alone when they are at least ``minReplicas``
(``elastic.survivors_first``, ``status.restore``), and the pods for the lost places start
beside it in standby, as spares do (``spares.py``: torch and the runtime imported, no worker).
As soon as all of them are warm and the kept pods have trained since the loss, the gang grows
back to its size before the loss at once, whatever ``grow.minIntervalSeconds``,
``grow.settleSeconds`` and ``grow.onlyWhenItPays`` say: the room was there at the loss, and
without going first the attempt after the loss would have taken it with new pods at once. The
grow is a warm join with nothing left to wait for: every pod is told the new membership on the
next pass (``survivors.switch_when_warm``).

Standby pods that no node took within ``STANDBY_WAIT_SECONDS`` of the loss, or that are not warm
within ``RESTORE_WAIT_SECONDS`` (a slow image pull), are given up: the gang grows with those that
are warm, or, with none, stays at its size and grows as its grow policy says (the standby pods
are deleted, ``spares.tend``).
"""

from __future__ import annotations

from ..api import names
from ..api.status_types import Restore
from . import elastic, spares
from .grow_payoff import survivors_first_pays_for
from .plan_types import MembershipWrite
from .reconcile_context import ReconcileContext
from .survivors import STANDBY_WAIT_SECONDS, trained_kept

RESTORE_WAIT_SECONDS = 600.0
"""How long a gang that a loss shrank waits for standby pods that are placed but not yet warm
(a slow image pull) before it grows with the warm ones, or gives the restore up."""


def survivors_first(
    ctx: ReconcileContext, decision: elastic.StartDecision
) -> elastic.StartDecision:
    """The start of an attempt after a loss: as the kept pods that trained alone, when
    ``elastic.survivors_first`` says so (``status.restore`` then says the size to grow back
    to). Kept pods that have not trained (the standby pods of a warm join the loss cut short)
    wait beside the gang as its standby pods instead of holding it up while they start."""
    st = ctx.status
    trained = trained_kept(ctx)
    first = elastic.survivors_first(
        ctx.job.spec,
        decision,
        len(trained),
        lambda kept, size: survivors_first_pays_for(st, kept, size),
    )
    if first is None or decision.size is None:
        return decision
    st.restore = Restore(size=decision.size, since=ctx.now)
    for name in st.kept_pods:
        if name not in trained:
            ctx.plan.memberships.append(
                MembershipWrite(
                    pod=name,
                    labels={
                        names.LABEL_ATTEMPT: None,
                        names.LABEL_RANK: None,
                        names.LABEL_ROLE: names.ROLE_SPARE,
                    },
                    annotations={},
                )
            )
    st.kept_pods = trained
    return first


def after_leave(ctx: ReconcileContext, decision: elastic.StartDecision) -> elastic.StartDecision:
    """The start of an attempt a notice began (``leave.py``): as its kept pods, which switch in
    process (a new pod started with them would join cold, and a switch hands the state only to
    pods told the membership in standby); room for more is restored as after a loss."""
    st = ctx.status
    kept = len(st.kept_pods)
    if ctx.job.spec.elastic is None:  # a fixed-size gang: a warm spare took each noticed place
        return elastic.StartDecision(
            kept,
            elastic.StartReason.FIXED,
            f"the {kept} pods switch in process, warm spares in the places on nodes announced "
            "for termination",
        )
    room = decision.size - kept if decision.size is not None else 0
    if room > 0:
        st.restore = Restore(size=kept + room, since=ctx.now)
    then = f"; {room} pods for the lost places start in standby and join when warm" if room else ""
    return elastic.StartDecision(
        kept,
        elastic.StartReason.SURVIVORS_FIRST,
        f"the {kept} kept pods switch in process without the pods on nodes announced for "
        f"termination{then}",
    )


def joining(ctx: ReconcileContext, all_running: bool) -> list[str]:
    """The warm standby pods the gang grows with on this pass ([]: not yet, or never: then
    ``status.restore`` is cleared and the grow policy decides again)."""
    st, plan = ctx.status, ctx.plan
    assert st.restore is not None
    lacking = spares.wanted(ctx)
    warm = spares.warm(ctx)[:lacking]
    placed = [p for p in spares.live(ctx) if (p.get("spec") or {}).get("nodeName")]
    waited = (ctx.now - st.restore.since).total_seconds()
    # Standby pods no node took within the warm join's wait will not come soon; placed ones
    # (an image pull) get longer.
    late = waited >= RESTORE_WAIT_SECONDS or (
        waited >= STANDBY_WAIT_SECONDS and len(placed) <= len(warm)
    )
    if lacking and len(warm) < lacking and not late:
        plan.requeue(1.0)
        return []
    if not warm:
        if lacking:
            plan.event(
                "Warning",
                "RestoreAbandoned",
                f"attempt {st.attempt}: none of the {lacking} standby pods is warm after "
                f"{waited:.0f}s; the {ctx.size} pods train on and grow as spec.elastic.grow says",
            )
        st.restore = None
        return []
    if not all_running or st.training_since is None:
        plan.requeue(1.0)  # the kept pods have not trained since the loss yet
        return []
    return warm


def decision(ctx: ReconcileContext, warm: list[str]) -> elastic.GrowDecision:
    """The grow back with the ``warm`` standby pods, for ``sizing._restart_larger``."""
    target = ctx.size + len(warm)
    lacking = spares.wanted(ctx)
    how = f"all {lacking}" if len(warm) == lacking else f"{len(warm)} of {lacking}"
    return elastic.GrowDecision(
        elastic.GrowAction.RESTART,
        target,
        f"{how} standby pods for the lost places are warm; the {ctx.size} kept pods grow back "
        f"to {target} at once",
    )
