"""An in-process switch on the ranks of the running gang (``switch.py`` has the protocol).

At the step boundary every rank agreed on, the manager's parts are let go as at ``close()`` (the
survivor's watch retired, a save in flight waited for, the uploads flushed), the process group
is destroyed and formed again from the new membership's environment with the same backend, and
the parts are built again exactly as at construction, so their collectives match those of the
new ranks' constructors. The position stays; the sampler deals the rest of the epoch to the new
ranks; rank 0 hands the state to the new ranks (``resume/from_peer.py``). A rank told to leave
(``stop: leave``) ends at that boundary instead (``leave_in_place``).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import torch.distributed as dist

from .. import envvars, events
from ..errors import CheckpointError
from ..resume.from_peer import exchange, load_from_peer
from ..resume.position import roll_over_finished_epoch
from ..shutdown import raise_emergency_exit
from ..switch import MembershipSwitched, SwitchRequest
from .announce import announce
from .dist import destroy_if_open, init_world_group, world_group_timeout
from .gang_sockets import GangSockets
from .setup import release, set_up

log = logging.getLogger("trainer_runtime")

FORM_S = 120.0
"""How long re-forming the gang after a loss may take (the old gang's parts let go first, its
uploads flushed: not counted). Every member is alive and asked already, so it takes seconds; a
rejoin still forming after this ends the process (exit code 1, every thread's stack on stderr),
and the gang falls back to its restart from the newest commit."""


def switch_in_place(
    manager: Any, request: SwitchRequest, *, rejoin_step: int | None = None, began: float = 0.0
) -> MembershipSwitched:
    """Switch this process to ``request``'s membership (every rank of the old gang at the
    same step boundary); the exception ``batch_end()`` raises then. ``rejoin_step``: after a
    loss (``run/rejoin.py``), the step this rank holds (-1: none); ``began``: when the loss was
    taken."""
    began = began or time.monotonic()
    old_world, position = manager.world_size, manager._ctx.position
    backend, timeout = dist.get_backend(), world_group_timeout()
    if manager._survivor is not None:  # armed for the old gang; set_up arms a new one
        manager._survivor.close()
    _let_go(manager, after_loss=rejoin_step is not None)
    # After a loss the new gang forms at once, every member alive and asked: bounded.
    with contextlib.nullcontext() if rejoin_step is None else bounded(FORM_S):
        dist.destroy_process_group()
        _apply_environment(request.environment)
        sockets = GangSockets()
        with sockets.forming():
            init_world_group(backend, timeout)
        set_up(manager, manager._arguments, switched=True, sockets=sockets)
        ctx = manager._ctx
        ctx.position = position
        _deal(manager, ctx)
        _exchange(manager, ctx, old_world, rejoin_step)
    switched = MembershipSwitched(
        epoch=request.epoch,
        rank=ctx.rank,
        world_size=ctx.world_size,
        old_world_size=old_world,
        seconds=time.monotonic() - began,
    )
    manager._resumed_at = time.monotonic()
    step = ctx.position.timestamp.batch
    if rejoin_step is not None and ctx.progress is not None:
        ctx.progress.continued(step)
    speak = ctx.coord.local_rank == 0
    how = "rejoin after a lost rank" if rejoin_step is not None else "switch"
    announce(log, logging.WARNING, "in-process %s at step %d: %s", how, step, switched, speak=speak)
    events.switched(
        rank=ctx.rank,
        epoch=request.epoch,
        step=step,
        world_size=ctx.world_size,
        old_world_size=old_world,
        seconds=switched.seconds,
        after_loss=rejoin_step is not None,
    )
    return switched


def _exchange(manager: Any, ctx: Any, old_world: int, rejoin_step: int | None) -> None:
    """Rank 0's state to the ranks that do not hold it: new ones, and after a loss a rank at
    another step than rank 0's, or at none."""
    holds = rejoin_step is None or rejoin_step >= 0
    contents = exchange(ctx, holder=holds, old_world_size=old_world, step=rejoin_step)
    if contents is not None:
        load_from_peer(ctx, contents)
        _deal(manager, ctx)
    elif not holds:
        raise CheckpointError(
            "rejoin after a loss: this rank holds no finished step and the new gang's rank 0 "
            "none either; the workers are restarted from the newest commit"
        )


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """End the process if the body runs longer than ``seconds``: a group that never forms (a
    member gone again, a rendezvous that does not answer) must not hold the gang for the
    process group's 30-minute timeout. ``faulthandler``'s watchdog is a C thread, so it fires
    while the body waits inside torch without the GIL; it replaces the script's own
    ``dump_traceback_later``, if any, for that time."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _deal(manager: Any, ctx: Any) -> None:
    """The same global position, dealt to the new ranks."""
    if manager.sampler is not None:
        manager.sampler.rank, manager.sampler.num_replicas = ctx.rank, ctx.world_size
        roll_over_finished_epoch(ctx)  # as a new rank's load does


def _let_go(manager: Any, *, after_loss: bool) -> None:
    """The old gang's parts, let go as at ``close()``. After a loss a save in flight fails on
    the broken group: said, not raised (the boundary is what the new gang goes on from)."""
    try:
        release(manager, None)
    except Exception as exc:
        if not after_loss:
            raise
        log.warning("a save of the old gang failed at the loss: %s", exc)


def leave_in_place(manager: Any, request: SwitchRequest) -> NoReturn:
    """Leave the gang at the boundary every rank agreed on (``stop: leave``: this pod's node is
    announced for termination, the others switch to a gang without it): the manager's parts are
    let go as at ``close()`` without a save (the others hold the same state and go on), and the
    process ends with exit code 0.

    The old group is left to the script: training scripts commonly end with
    ``dist.destroy_process_group()`` in a ``finally`` block, which fails on a group already
    destroyed and would end the leaving pod Failed. It is destroyed at exit when the script did
    not."""
    began = time.monotonic()
    step = manager._ctx.position.timestamp.batch
    rank, world = manager._ctx.rank, manager.world_size
    manager.close(save=False)
    atexit.register(destroy_if_open, None)  # the world group, unless the script destroyed it
    announce(
        log,
        logging.WARNING,
        "in-process switch at step %d: rank %d of %d leaves the gang (membership epoch %d)",
        step,
        rank,
        world,
        request.epoch,
        speak=True,
    )
    events.left(rank=rank, epoch=request.epoch, step=step, seconds=time.monotonic() - began)
    raise_emergency_exit(0)


def _apply_environment(environment: Mapping[str, str]) -> None:
    """The new membership's variables; the agent's store flag only where it is given (node
    rank 0's pod serves the store, the others are its clients)."""
    os.environ.pop(envvars.USE_AGENT_STORE, None)
    os.environ.update(environment)
