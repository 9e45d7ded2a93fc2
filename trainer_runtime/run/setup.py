"""A ``CheckpointManager``'s construction and its release: its settings and parts, in order.

``set_up`` is the manager's constructor body, kept out of the class so that the facade reads as
the loop's calls: the arguments resolved once (``Settings.resolve``), the run opened
(``context.open_run``), the parts with one job each built on the shared ``RunContext``, the
preemption response and the survivor's save armed, the run folder checked and the fence
claimed. The order matters: the prefetch of a warm start owns the run folder until it is done,
and the fence is claimed only once the folder is known to be usable. ``release`` is the end of
``close()``: every part let go, each even when the one before it failed.
"""

from __future__ import annotations

import os
from typing import Any

from .. import envvars, events
from ..pod import peer_loss
from ..pod.preemption import PreemptionWatcher
from ..pod.progress import TotalWork
from ..remote import close_remote
from ..resume.flow import Resumer
from ..resume.restore import Loader
from ..resume.warm_start import wait_for_prefetch
from ..save import rank_contents as state_mod
from ..save.auto_interval import AutoSchedule
from ..save.emergency import PreemptionResponse
from ..save.policy import Saver
from ..save.survivor import SurvivorSave
from ..switch import SwitchWatch, check_switchable
from .config import Settings, check_location_arguments, check_run_folder, run_folder_source
from .context import open_run
from .gang_sockets import GangSockets


def cut_old_gang(manager: Any) -> int:
    """Shut down the manager's gang's connections (``gang_sockets``), the rendezvous store's
    kept: a rank blocked on this one then fails at once (``run/rejoin.py``)."""
    port = os.environ.get(envvars.MASTER_PORT, "").strip()
    return manager._gang_sockets.cut(int(port) if port.isdigit() else None)


# The constructor's arguments that are not settings: the state to save and where it goes.
_COMPONENTS = ("model", "optimizer", "scheduler", "scaler", "stateful", "sampler")
_LOCATION = ("remote", "local_folder")


def set_up(
    manager: Any,
    arguments: dict[str, Any],
    *,
    switched: bool = False,
    sockets: GangSockets | None = None,
) -> None:
    """Build ``CheckpointManager(**arguments)``'s parts on ``manager`` (``Any``: this module is
    below manager.py). ``switched``: by an in-process switch, which reports itself; ``sockets``:
    its group's connections (default: those since the import, ``gang_sockets``)."""
    sampler = arguments["sampler"]
    manager._arguments = arguments  # an in-process switch builds the parts again (switch.py)
    manager.components = state_mod.checked_components(**{k: arguments[k] for k in _COMPONENTS})
    cfg = Settings.resolve(
        **{k: v for k, v in arguments.items() if k not in _COMPONENTS and k not in _LOCATION},
        sampler_batch_size=None if sampler is None else sampler.batch_size,
        has_sampler=sampler is not None,
    )
    remote, local_folder = arguments["remote"], arguments["local_folder"]
    check_location_arguments(local_folder, remote)
    if cfg.in_process_switch:
        check_switchable(arguments["model"], remote)
    manager.settings = cfg
    manager.interval = cfg.interval
    manager.sampler = sampler
    wait_for_prefetch()  # the run folder is the prefetch's until it is done (warm_start)
    manager._gang_sockets = sockets or GangSockets.since_import()
    ctx = manager._ctx = open_run(
        cfg,
        manager.components,
        sampler=sampler,
        remote=remote,
        local_folder=local_folder,
        keep_local=cfg.num_local_checkpoints_to_keep,
        keep_remote=cfg.num_remote_checkpoints_to_keep,
        coordination_timeout=cfg.coordination_timeout,
        sockets=manager._gang_sockets,
    )
    manager.coord, manager.commit_coord = ctx.coord, ctx.commit_coord
    manager.rank, manager.world_size = ctx.rank, ctx.world_size
    manager.run_name, manager.run_dir, manager.folder = ctx.run_name, ctx.run_dir, ctx.folder
    manager.remote, manager.engine, manager.progress = ctx.remote, ctx.engine, ctx.progress
    _arm(manager)
    check_run_folder(
        ctx.folder,
        run_name=ctx.run_name,
        rank=ctx.rank,
        overwrite=cfg.overwrite,
        source=run_folder_source(cfg, local_folder),
        remote=ctx.remote_committed(),
        remote_uri=None if ctx.remote is None else ctx.remote.uri_for(""),
    )
    if ctx.fence is not None and ctx.rank == 0:
        ctx.fence.claim()  # from now on an older gang can no longer commit (save/fence.py)
    _schedule(manager, cfg, ctx)
    if not switched:
        attempt = os.environ.get(envvars.ATTEMPT, "").strip() or None
        events.started(rank=ctx.rank, world_size=ctx.world_size, attempt=attempt)


def _schedule(manager: Any, cfg: Settings, ctx: Any) -> None:
    """The job's total work (reported) and the automatic save interval, if asked for."""
    manager.total_work = TotalWork(cfg.total_steps, cfg.epochs, cfg.steps_per_epoch)
    manager._report_total()
    manager.auto_interval = (
        None
        if cfg.auto_interval is None
        else AutoSchedule(cfg.auto_interval, rank=ctx.rank, coord=ctx.coord)
    )
    manager._resumed_at = None


def _arm(manager: Any) -> None:
    """The parts on the run's context: saver, loader, resumer, and the responses to a
    preemption (the watcher, the emergency response and its watchdog) and to a lost rank."""
    ctx, cfg = manager._ctx, manager.settings
    manager.preemption = PreemptionWatcher(
        notice_file=cfg.notice_file, handle_sigterm=cfg.handle_sigterm
    )
    manager.saver = Saver(ctx)
    manager.loader = Loader(ctx)
    manager.resumer = Resumer(ctx, manager.loader)
    manager._response = PreemptionResponse(
        manager,
        grace_period_s=cfg.grace_period_s,
        exit_code=cfg.preemption_exit_code,
        upload_flush_timeout_s=cfg.upload_flush_timeout_s,
    )
    manager.preemption.on_sigterm = manager._response.watchdog.start_clock
    manager._closed = False
    manager._survivor = SurvivorSave.arm(
        ctx, lambda: manager.preemption.terminating, cut=lambda: cut_old_gang(manager)
    )
    if manager._survivor is None:  # a worker that ends on a failed collective reports it first
        peer_loss.ExitReport.install(ctx.world_size)
    manager.switch_watch = SwitchWatch.from_environment(os.environ, cfg.in_process_switch)


def release(manager: Any, upload_timeout_s: float | None) -> None:
    """``close()`` after the final save: wait for the background save, flush the uploads (at
    most ``upload_timeout_s``, default ``upload_flush_timeout_s``), destroy the coordination
    groups, then stop handling SIGTERM. Each step runs even when the one before it raised."""
    if manager.progress is not None:
        manager.progress.close()
    try:
        manager.wait()
    finally:
        manager.saver.shutdown()
        try:
            if manager.remote is not None:
                timeout = upload_timeout_s
                if timeout is None:
                    timeout = manager.settings.upload_flush_timeout_s
                close_remote(manager.remote, timeout)
        finally:
            _release_groups(manager)
            # SIGTERM stays handled until the uploads are flushed: a signal during the flush
            # starts the watchdog's clock, so the uploads get the grace period and the process
            # ends with the preemption exit code at its deadline, instead of dying at once by
            # the default action.
            manager.preemption.close()
            manager._response.watchdog.close()  # idle: ended; signalled: keeps its deadline


def _release_groups(manager: Any) -> None:
    """Destroy both coordination groups, once no save thread of this rank can use them."""
    if manager.saver.persisting():
        return  # still persisting (close interrupted): leave them to the process's end
    manager.coord.close()
    manager.commit_coord.close()
