"""A loss without notice taken in the running processes: the survivors re-form their gang.

Without this, a rank lost without notice ends every worker of the gang: the survivors' agents
restart them in place, and the new workers form the group, load the last finished step that one
survivor saved from memory, and warm up again (``save/survivor.py``). With a script built for
the in-process switch that also hands its failed step to ``CheckpointManager.rejoin``
(docs/survivors.md), the survivors go on in the same processes instead:

1. **claimed**: the training thread caught a failed collective and calls ``rejoin(exc)``. The
   survivor's watch gives it the last step boundary (``SurvivorSave.claim_rejoin``), still whole
   when no update began since, and saves nothing from memory for this loss; the worker says so
   to its agent (``switch.claim``) and to the operator (``pod/peer_loss.py``), which may not
   know of the loss yet.
2. **cut**: the rank shuts down its old gang's connections (``gang_sockets``), so that a peer
   blocked on it (not on the lost rank) fails now instead of at gloo's timeout, and claims too.
   The watch does the same when the operator's ``stop: rejoin`` membership comes first (a peer
   cut off rather than dead fails nobody).
3. **asked**: the agent hands the new membership over as for a switch (``stop: rejoin``); the
   worker waits for it up to ``RTJ_LOSS_HOLD_SECONDS`` (the operator sets it to cover its
   detection of a node that died silently: NotReady, then ``nodeNotReadySeconds``).
4. **rolled back**: what the failed step changed since the boundary is put back (the buffers
   from their copies, the RNG and the stateful objects from the boundary's small state, the
   gradients dropped); the weights and optimizer state are the boundary's, since no update began.
5. **re-formed** (``switch_in_place``): the parts let go, the group formed again from the new
   environment, the parts built again. The ranks agree on the step each holds: rank 0's boundary
   is the gang's; a rank at another step (its step's all-reduce finished where rank 0's did not)
   or without one gets rank 0's state as a new rank does (``resume/from_peer.py``). Rank 0 without
   a boundary fails every rank alike, and the agents restart them from the newest commit.
   Re-forming longer than ``switch_in_place.FORM_S`` ends the process: the gang's restart is
   then the fallback, never a wait of 30 minutes.

``rejoin`` raises ``exc`` again (so the loop ends as it would have) when it cannot go on in process:
the failure is no failed collective, the manager was not built with ``in_process_switch=True``
under the agent, the state is not replicated, a save from memory began already, or no membership
came. Only replicated state rejoins in process (DDP); the lost rank's samples of the failed step
are trained again by the new gang, from the boundary's position.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from typing import Any, NoReturn

import torch

from ..pod import peer_loss
from ..pod.peer_loss import collective_failure
from ..save.survivor import Boundary
from ..sharded.keys import MODEL_KEY
from ..switch import SwitchRequest, claim
from . import rng
from .setup import cut_old_gang
from .switch_in_place import switch_in_place

log = logging.getLogger("trainer_runtime")

POLL_S = 0.02


def rejoin(manager: Any, exc: BaseException) -> None:
    """Take ``exc`` (a failed collective: a peer lost without notice) in process: once the
    agent hands over the new membership, roll back to the last step boundary and switch to it.
    Returns when the gang is re-formed (train on as after ``MembershipSwitched``); raises ``exc``
    again when that cannot be done."""
    survivor, watch = manager._survivor, manager.switch_watch
    if survivor is None or watch is None or manager._closed or not collective_failure(exc):
        _again(exc)
    claimed, boundary = survivor.claim_rejoin()
    if not claimed:
        _again(exc)  # the save from memory began: the process ends with it
    began = time.monotonic()
    cut = cut_old_gang(manager)
    claim(watch.path, watch.epoch)
    peer_loss.report(os.environ, watch.epoch)  # the operator may not know of the loss yet
    log.warning(
        "a collective failed (%s): rank %d holds step %s, shut down %d connections of the old "
        "gang, and waits up to %.0f s for the new membership",
        " ".join(str(exc).split())[:160],
        manager.rank,
        "?" if boundary is None else boundary.at.batch,
        cut,
        survivor.hold_s,
    )
    request = _wait_for_request(manager, survivor.hold_s)
    if request is None:
        log.warning("no membership to rejoin within %.0f s", survivor.hold_s)
        _again(exc)
    step = -1
    if boundary is not None and boundary.at.batch == manager._ctx.position.timestamp.batch:
        roll_back(manager, boundary)
        step = boundary.at.batch
    switch_in_place(manager, request, rejoin_step=step, began=began)


def _again(exc: BaseException) -> NoReturn:
    raise exc


def _wait_for_request(manager: Any, hold_s: float) -> SwitchRequest | None:
    """The agent's request for a membership after a loss (``stop: rejoin``), within
    ``hold_s``; None after that, or at SIGTERM."""
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline and not manager.preemption.terminating:
        request = manager.switch_watch.pending()
        if request is not None and request.after_loss and not request.leave:
            return request
        time.sleep(POLL_S)
    return None


def roll_back(manager: Any, boundary: Boundary) -> None:
    """Undo what the failed step changed since ``boundary``: buffers, gradients, RNG, stateful
    objects (the weights and optimizer state are the boundary's: no update began)."""
    comps = manager.components
    model = comps.model
    copies = boundary.tensors.get(MODEL_KEY) or {}
    if model is not None:
        for name, buf in model.named_buffers():
            copy = copies.get(name)
            if isinstance(copy, torch.Tensor) and copy.data_ptr() != buf.data_ptr():
                buf.copy_(copy)
        for param in model.parameters():
            param.grad = None
    for opt in comps.optimizers.values():
        opt.zero_grad(set_to_none=True)
    small = pickle.loads(boundary.small)  # noqa: S301 - this process's own
    if "rng" in small:
        rng.restore(small["rng"])
    saved = (small.get("state") or {}).get("stateful") or {}
    for key, obj in comps.stateful.items():
        if key in saved:
            obj.load_state_dict(saved[key])
