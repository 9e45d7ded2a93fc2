"""The preemption response at a step boundary: agree with every rank, then save and go on
(a notice) or save, flush and exit inside the grace period (SIGTERM).

Both signals arrive on one rank at a time and at different steps, so every rank first agrees
(one ``max_ints`` collective per step) and all act at the same step: a save is collective.
The SIGTERM sequence works against ``shutdown.ShutdownDeadline``: wait for a save in flight,
save, move that checkpoint to the front of the upload queue, close with what is left of the
grace period, exit with the preemption exit code (``os._exit`` when a transfer thread is stuck).
It lives apart from the manager so the order of those steps reads in one place. (Rejected:
saving from the signal handler: heavy I/O there can deadlock, it runs mid-step, and a save needs
every rank at the same step; see ``pod/preemption.py``.)
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from .. import events
from ..run.announce import announce
from ..shutdown import ExitWatchdog, ShutdownDeadline, exit_now, raise_emergency_exit

if TYPE_CHECKING:
    from ..remote import RemoteBackend

log = logging.getLogger("trainer_runtime")


class _Manager(Protocol):
    """The part of ``CheckpointManager`` the emergency path drives."""

    remote: RemoteBackend | None
    preemption: Any
    coord: Any
    saver: Any
    switch_watch: Any

    def save(self, *, blocking: bool | None = None) -> Any: ...

    def close(self, *, save: bool | None = None, upload_timeout_s: float | None = None) -> None: ...


class PreemptionResponse:
    """Checks for SIGTERM and notices at each step boundary and acts on them."""

    def __init__(
        self,
        manager: _Manager,
        *,
        grace_period_s: float,
        exit_code: int,
        upload_flush_timeout_s: float | None,
    ) -> None:
        self.manager = manager
        self.grace_period_s = grace_period_s
        self.exit_code = exit_code
        self.upload_flush_timeout_s = upload_flush_timeout_s
        self._notices_handled = 0
        self.switch_request: Any = None
        """The in-process switch every rank agreed on at the last boundary (``switch.py``)."""
        self.watchdog = ExitWatchdog(grace_period_s, exit_code)
        """Its clock starts in the SIGTERM handler (``PreemptionWatcher.on_sigterm``)."""

    def at_step_boundary(self, batch: int) -> Any:
        """Agree with every rank on SIGTERM / notices (and on an in-process switch, whose
        request ``switch_request`` holds afterwards), then act; the notice save, if any."""
        watcher, switch = self.manager.preemption, self.manager.switch_watch
        local = [1 if watcher.terminating else 0, watcher.poll_notice()]
        agreed = self.manager.coord.max_ints(local + ([] if switch is None else switch.agreement()))
        terminating, notices = agreed[:2]
        self.switch_request = None if switch is None else switch.agreed(agreed[2:])
        if (terminating or notices > self._notices_handled) and self.manager.progress is not None:
            self.manager.progress.send_now(batch)  # the node may go before the save commits
        if terminating:
            self.emergency_exit(batch)
        if notices > self._notices_handled:
            self._notices_handled = notices
            log.warning("preemption notice: saving now and training on")
            # The operator writes the notice into the pods on the node that goes only: every
            # rank reports the content the ranks that saw it read (one gather, per notice).
            seen = [c for c in self.manager.coord.all_gather(watcher.last_notice) if c]
            content = watcher.last_notice or (seen[0] if seen else None)
            events.notice(rank=self.manager.coord.rank, content=content, step=batch)
            return self.manager.save(blocking=True)
        return None

    def emergency_exit(self, batch: int) -> None:
        """Save, give uploads what is left of the grace period, exit 143 before the SIGKILL."""
        mgr = self.manager
        watchdog = self.watchdog
        deadline = watchdog.start_clock(mgr.preemption.sigterm_at or time.monotonic())
        speak = mgr.coord.local_rank == 0
        announce(
            log,
            logging.WARNING,
            "SIGTERM: saving at batch %d before exiting (exit within %.1fs of the signal: "
            "grace period %.0fs minus a %.1fs margin)",
            batch,
            deadline.exit_by - deadline.signalled_at,
            deadline.grace_period_s,
            deadline.margin_s,
            speak=speak,
        )
        events.sigterm(rank=mgr.coord.rank, step=batch, grace_period_s=deadline.grace_period_s)
        saved = None
        saved_after = None
        try:
            mgr.saver.retry_after_failure("SIGTERM: the emergency save")
            saved = mgr.save(blocking=True)
            saved_after = deadline.since_signal()
            if saved is not None and mgr.remote is not None:
                mgr.remote.upload_first(saved.name)
        finally:
            budget = deadline.upload_budget()
            if self.upload_flush_timeout_s is not None:
                budget = min(budget, self.upload_flush_timeout_s)
            mgr.close(save=False, upload_timeout_s=budget)
        self._report(batch, saved, saved_after, deadline, speak=speak)
        watchdog.cancel()
        if mgr.remote is not None and mgr.remote.transfers_stuck():
            exit_now(self.exit_code)  # SystemExit would wait for the stuck thread
        raise_emergency_exit(self.exit_code)  # SystemExit, without the heap's teardown

    def _report(
        self,
        batch: int,
        saved: Any,
        saved_after: float | None,
        deadline: ShutdownDeadline,
        *,
        speak: bool,
    ) -> None:
        """The emergency save's log lines and event, once the uploads are flushed (or left):
        ``saved`` the checkpoint (None: the one already saved at this step), ``saved_after``
        the seconds from the signal to the save's end."""
        where = saved.name if saved else "the checkpoint already saved at this step"
        announce(
            log,
            logging.WARNING,
            "emergency save %s done %.2fs after SIGTERM (grace period %.0fs)",
            where,
            saved_after if saved_after is not None else 0.0,
            deadline.grace_period_s,
            speak=speak,
        )
        events.emergency_saved(
            rank=self.manager.coord.rank,
            checkpoint=saved.name if saved else None,
            step=batch,
            seconds=saved_after,
            grace_period_s=deadline.grace_period_s,
        )
        log.warning(
            "exiting %.2fs after SIGTERM (uploads flushed or left for the next attempt)",
            deadline.since_signal(),
        )
        if saved_after is not None and saved_after > 0.8 * deadline.grace_period_s:
            log.warning(
                "the emergency save took %.0f%% of the grace period: raise "
                "terminationGracePeriodSeconds or save more often",
                100 * saved_after / deadline.grace_period_s,
            )
