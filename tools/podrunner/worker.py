"""One thread per pod: prepare it, run its containers, report, and stop them when told.

The thread that starts a container also waits for it (the parent-death signal follows the
forking thread), refreshes the pod's downward-API files on every update the agent hands it, and
on deletion does what a kubelet does: SIGTERM, the grace period, SIGKILL, a final status, then
the deletion with ``gracePeriodSeconds=0`` that removes the object.

This module holds the pod's lifecycle decisions only; the per-container bookkeeping is in
``containers``, the status patch in ``reporting``, the hand-over from the agent's threads in
``inbox`` and the grace-period rules in ``deletion``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

from tools.kubeapi import Obj

from .containers import PodContainers
from .deletion import MIN_GRACE_S, finalize_deletion, grace_seconds, is_deleting
from .inbox import PodInbox
from .preparation import Context, PodPreparation
from .reporting import StatusReporter
from .status import condition
from .translate import ConfigError

log = logging.getLogger("podrunner")

RESTART_BACKOFF_S = (1.0, 30.0)
"""First and longest back-off before restarting a container (kubelet: 10 s and 5 min)."""
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def shutdown_condition() -> Obj:
    """The condition a kubelet adds to a pod it stops for a graceful node shutdown."""
    return condition("DisruptionTarget", True, "TerminationByKubelet", SHUTDOWN_MESSAGE)


class PodWorker:
    """Runs one pod's containers, in its own thread, for as long as the pod lives on this node.

    Composition rather than a Thread subclass: Thread's private names (``_stop``...) are easy
    to shadow by accident.
    """

    def __init__(self, ctx: Context, pod: Obj, *, lost: bool = False) -> None:
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.label = f"{meta['namespace']}/{meta['name']}"
        self.node: str = pod["spec"]["nodeName"]
        self.thread = threading.Thread(target=self.run, name=f"pod {self.label}", daemon=True)
        self.ctx = ctx
        self.lost = lost
        self.inbox = PodInbox(pod)
        self.prep = PodPreparation(ctx, pod)
        self.containers = PodContainers(ctx, self.prep, pod, self.label)
        self.reporter = StatusReporter(ctx, self.inbox, self.label)

    # Called by the agent's threads.

    def start(self) -> None:
        """Start the pod's thread."""
        self.thread.start()

    def is_alive(self) -> bool:
        """Whether the pod's thread still runs."""
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the pod's thread."""
        self.thread.join(timeout)

    def update(self, pod: Obj) -> None:
        """A newer version of the pod (labels, annotations, deletionTimestamp)."""
        self.inbox.update(pod)

    def gone(self) -> None:
        """The pod object no longer exists (force-deleted, or PodGC)."""
        self.inbox.mark_gone()

    def shutdown(self) -> None:
        """The node is shutting down gracefully."""
        self.inbox.mark_shutdown()

    # The thread.

    def _report(
        self,
        *,
        phase_override: str | None = None,
        reason: str = "",
        message: str = "",
        extra: list[Obj] | None = None,
    ) -> bool:
        return self.reporter.report(
            self.containers.states,
            phase_override=phase_override,
            reason=reason,
            message=message,
            extra=extra,
        )

    def run(self) -> None:
        """Catch everything: a crash here must not leave processes unsupervised."""
        try:
            self._run()
        except Exception:
            log.exception("%s: pod worker failed; stopping its containers", self.label)
            self.containers.kill_all(2.0)
        finally:
            if self.inbox.snapshot().gone:
                shutil.rmtree(self.ctx.pod_dir(self.uid), ignore_errors=True)

    def _run(self) -> None:
        pod = self.inbox.snapshot().pod
        spec = pod["spec"]
        if spec.get("initContainers"):
            self.containers.all_waiting("UnsupportedPodSpec")
            self._report(
                phase_override="Failed",
                reason="UnsupportedPodSpec",
                message="podrunner does not run initContainers",
            )
            log.warning("%s: rejected (initContainers are not supported)", self.label)
            return
        if self.lost:
            self._handle_lost(pod)
            return
        if not self._prepare():
            return
        for spec_container in spec["containers"]:
            self.containers.start(spec_container["name"])
        self._report()
        self._supervise()

    def _handle_lost(self, pod: Obj) -> None:
        """Its processes died with a previous agent: report that, as a kubelet would."""
        self.containers.restore_counts(pod)
        self.containers.all_unknown(
            "The container could not be located when the pod was "
            "terminated (the pod runner restarted)"
        )
        policy = pod["spec"].get("restartPolicy", "Always")
        if policy == "Never":
            self._report(phase_override="Failed")
            log.info(
                "%s: lost (its processes died with a previous agent); reported Failed", self.label
            )
            return
        log.info("%s: lost with a previous agent; restarting its containers", self.label)
        if not self._prepare():
            return
        for state in self.containers.states:
            state.restart_count += 1
            self.containers.start(state.name)
        self._report()
        self._supervise()

    def _prepare(self) -> bool:
        """Volumes and plans; retries configuration errors until they clear or the pod goes."""
        delay = 0.5
        while True:
            pod, _, gone, shutdown = self.inbox.snapshot()
            if gone or shutdown or is_deleting(pod):
                if is_deleting(pod) and not gone:
                    self.containers.all_unknown("The container was deleted before it started")
                    self._report(phase_override="Failed")
                    finalize_deletion(self.ctx.kube, pod)
                    log.info("%s: deleted before it started", self.label)
                return False
            try:
                self.prep.build(pod)
                return True
            except ConfigError as err:
                self.containers.all_waiting("CreateContainerConfigError", str(err))
                self._report()
                log.warning("%s: cannot start yet: %s", self.label, err)
            self.inbox.wait(delay)
            delay = min(delay * 2, 5.0)

    def _supervise(self) -> None:
        policy = self.inbox.snapshot().pod["spec"].get("restartPolicy", "Always")
        containers = self.containers
        restart_at: dict[str, float] = {}
        backoff: dict[str, float] = {}
        dirty = False
        while True:
            self.inbox.wait(0.2)
            pod, updated, gone, shutdown = self.inbox.snapshot()
            volumes, account = self.prep.volumes, self.prep.account
            if updated and volumes is not None:
                changed = volumes.refresh(pod)
                if changed:
                    log.info("%s: refreshed volume(s) %s", self.label, ", ".join(changed))
            if account is not None and account.refresh_due():
                account.refresh(pod)
            for name in containers.newly_exited():
                containers.record_exit(name)
                dirty = True
                state = containers.state(name)
                failed = state.exit_code != 0
                if policy == "Always" or (policy == "OnFailure" and failed):
                    delay = backoff.get(name, RESTART_BACKOFF_S[0])
                    backoff[name] = min(delay * 2, RESTART_BACKOFF_S[1])
                    restart_at[name] = time.monotonic() + delay
                    state.waiting("CrashLoopBackOff", f"back-off {delay:.0f}s restarting {name}")
            if gone or shutdown or is_deleting(pod):
                self._stop_containers(pod, gone=gone, shutdown=shutdown)
                return
            for name, when in list(restart_at.items()):
                if time.monotonic() >= when:
                    del restart_at[name]
                    containers.state(name).restart_count += 1
                    containers.start(name)
                    dirty = True
            if dirty:
                dirty = not self._report()
            finished = all(s.state == "terminated" for s in containers.states)
            if not restart_at and finished and not dirty:
                return

    def _stop_containers(self, pod: Obj, *, gone: bool, shutdown: bool) -> None:
        running = self.containers.running()
        if shutdown:
            grace = min(grace_seconds(pod), self.ctx.shutdown_grace_s)
            self._report(extra=[shutdown_condition()])
            why = "node shutdown"
        elif gone:
            grace, why = MIN_GRACE_S, "pod object gone"
        else:
            grace, why = max(grace_seconds(pod), MIN_GRACE_S), "pod deleted"
        if running:
            log.info(
                "%s: stopping %s (%s, grace %.0fs)", self.label, ", ".join(running), why, grace
            )
        self.containers.stop(running, grace)
        self.containers.settle_back_offs()
        if gone:
            return
        if shutdown:
            self._report(
                phase_override="Failed",
                reason="Terminated",
                message=SHUTDOWN_MESSAGE,
                extra=[shutdown_condition()],
            )
            return
        if self._report():
            finalize_deletion(self.ctx.kube, pod)
            log.info("%s: deleted", self.label)
