"""One thread per pod: prepare it, run its containers, report, and stop them when told.

The thread that starts a container also waits for it (the parent-death signal follows the
forking thread), refreshes the pod's downward-API files on every update the agent hands it, and
on deletion does what a kubelet does: SIGTERM, the grace period, SIGKILL, a final status, then
the deletion with ``gracePeriodSeconds=0`` that removes the object.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable

from tools.kubeapi import STRATEGIC, ApiError, Kube, Obj

from .preparation import Context, PodPreparation
from .processes import ContainerProcess, stop_all
from .status import ContainerState, condition, pod_status_patch, termination_message
from .translate import (
    ConfigError,
    describe,
)

log = logging.getLogger("podrunner")

DEFAULT_GRACE_S = 30.0
MIN_GRACE_S = 2.0
"""The kubelet's minimumGracePeriodInSeconds: no container gets less between SIGTERM and
SIGKILL, not even in a force deletion (grace 0) or when its pod object vanished."""
RESTART_BACKOFF_S = (1.0, 30.0)
"""First and longest back-off before restarting a container (kubelet: 10 s and 5 min)."""
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def is_deleting(pod: Obj) -> bool:
    """Whether the pod has a deletionTimestamp."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def grace_seconds(pod: Obj) -> float:
    """The deletion's grace period, else the spec's."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for value in (
        meta.get("deletionGracePeriodSeconds"),
        spec.get("terminationGracePeriodSeconds"),
    ):
        if value is not None:
            return float(value)
    return DEFAULT_GRACE_S


def finalize_deletion(kube: Kube, pod: Obj) -> None:
    """Remove a pod whose containers are all stopped, as the kubelet does (grace 0, same uid)."""
    meta = pod["metadata"]
    try:
        kube.request(
            "DELETE",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]},
            },
        )
    except ApiError as err:
        if not (err.not_found or err.conflict):
            raise


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
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._updated = False
        self._gone = False
        self._shutdown = False
        containers = pod["spec"].get("containers") or []
        self.states = [ContainerState(c["name"], c.get("image", "")) for c in containers]
        self.procs: dict[str, ContainerProcess] = {}
        self.prep = PodPreparation(ctx, pod)

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
        with self._lock:
            self._pod, self._updated = pod, True
        self._wake.set()

    def gone(self) -> None:
        """The pod object no longer exists (force-deleted, or PodGC)."""
        with self._lock:
            self._gone = True
        self._wake.set()

    def shutdown(self) -> None:
        """The node is shutting down gracefully."""
        with self._lock:
            self._shutdown = True
        self._wake.set()

    # The thread.

    def _snapshot(self) -> tuple[Obj, bool, bool, bool]:
        with self._lock:
            updated, self._updated = self._updated, False
            return self._pod, updated, self._gone, self._shutdown

    def run(self) -> None:
        """Catch everything: a crash here must not leave processes unsupervised."""
        try:
            self._run()
        except Exception:
            log.exception("%s: pod worker failed; stopping its containers", self.label)
            stop_all(list(self.procs.values()), 2.0)
        finally:
            _, _, gone, _ = self._snapshot()
            if gone:
                shutil.rmtree(self.ctx.pod_dir(self.uid), ignore_errors=True)

    def _run(self) -> None:
        pod, _, _, _ = self._snapshot()
        spec = pod["spec"]
        if spec.get("initContainers"):
            for state in self.states:
                state.waiting("UnsupportedPodSpec")
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
            self._start(spec_container["name"])
        self._report()
        self._supervise()

    def _handle_lost(self, pod: Obj) -> None:
        """Its processes died with a previous agent: report that, as a kubelet would."""
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        for state in self.states:
            old = previous.get(state.name) or {}
            state.restart_count = int(old.get("restartCount", 0))
            state.started_at = ((old.get("state") or {}).get("running") or {}).get("startedAt")
            state.terminated(
                137,
                None,
                "The container could not be located when the pod was "
                "terminated (the pod runner restarted)",
            )
            state.reason = "ContainerStatusUnknown"
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
        for state in self.states:
            state.restart_count += 1
            self._start(state.name)
        self._report()
        self._supervise()

    def _prepare(self) -> bool:
        """Volumes and plans; retries configuration errors until they clear or the pod goes."""
        delay = 0.5
        while True:
            pod, _, gone, shutdown = self._snapshot()
            if gone or shutdown or is_deleting(pod):
                if is_deleting(pod) and not gone:
                    self._report_never_started()
                    finalize_deletion(self.ctx.kube, pod)
                    log.info("%s: deleted before it started", self.label)
                return False
            try:
                self.prep.build(pod)
                return True
            except ConfigError as err:
                for state in self.states:
                    state.waiting("CreateContainerConfigError", str(err))
                self._report()
                log.warning("%s: cannot start yet: %s", self.label, err)
            self._wake.wait(delay)
            self._wake.clear()
            delay = min(delay * 2, 5.0)

    def _report_never_started(self) -> None:
        """Deleted while still being prepared: terminal, as a kubelet reports it."""
        for state in self.states:
            state.terminated(137, None, "The container was deleted before it started")
            state.reason = "ContainerStatusUnknown"
        self._report(phase_override="Failed")

    def _start(self, name: str) -> None:
        plan = self.prep.plans[name]
        state = self._state(name)
        plan.termination_path.write_bytes(b"")
        try:
            proc = ContainerProcess(plan.argv, plan.env, plan.cwd, plan.log_path, self.ctx.watchdog)
        except OSError as err:
            state.terminated(128, None, f"cannot start {plan.argv[0]!r}: {err}")
            state.reason = "StartError"
            log.warning("%s: %s: start failed: %s", self.label, name, err)
            return
        self.procs[name] = proc
        state.running(proc.pid)
        log.info(
            "%s: started %s pid=%d on %s: %s",
            self.label,
            name,
            proc.pid,
            self.node,
            describe(plan.argv),
        )

    def _state(self, name: str) -> ContainerState:
        return next(s for s in self.states if s.name == name)

    def _record_exit(self, name: str, *, killed: bool = False) -> None:
        proc, plan, state = self.procs[name], self.prep.plans[name], self._state(name)
        exit_ = proc.poll()
        assert exit_ is not None
        message = termination_message(
            plan.termination_path,
            policy=plan.termination_policy,
            exit_code=exit_.exit_code,
            log_path=plan.log_path,
        )
        state.terminated(exit_.exit_code, exit_.signal, plan.mapper.to_container(message))
        what = "killed" if killed else "exited"
        log.info(
            "%s: %s %s pid=%d exit=%d%s",
            self.label,
            what,
            name,
            proc.pid,
            exit_.exit_code,
            f" signal={exit_.signal}" if exit_.signal else "",
        )

    def _supervise(self) -> None:
        pod, _, _, _ = self._snapshot()
        policy = pod["spec"].get("restartPolicy", "Always")
        restart_at: dict[str, float] = {}
        backoff: dict[str, float] = {}
        dirty = False
        while True:
            self._wake.wait(0.2)
            self._wake.clear()
            pod, updated, gone, shutdown = self._snapshot()
            volumes, account = self.prep.volumes, self.prep.account
            if updated and volumes is not None:
                changed = volumes.refresh(pod)
                if changed:
                    log.info("%s: refreshed volume(s) %s", self.label, ", ".join(changed))
            if account is not None and account.refresh_due():
                account.refresh(pod)
            for name, proc in list(self.procs.items()):
                state = self._state(name)
                if state.state != "running" or proc.poll() is None:
                    continue
                self._record_exit(name)
                dirty = True
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
                    self._state(name).restart_count += 1
                    self._start(name)
                    dirty = True
            if dirty:
                dirty = not self._report()
            if not restart_at and all(s.state == "terminated" for s in self.states) and not dirty:
                return

    def _stop_containers(self, pod: Obj, *, gone: bool, shutdown: bool) -> None:
        running = [n for n, p in self.procs.items() if self._state(n).state == "running"]
        if shutdown:
            grace = min(grace_seconds(pod), self.ctx.shutdown_grace_s)
            self._report(
                extra=[
                    condition("DisruptionTarget", True, "TerminationByKubelet", SHUTDOWN_MESSAGE)
                ]
            )
            why = "node shutdown"
        elif gone:
            grace, why = MIN_GRACE_S, "pod object gone"
        else:
            grace, why = max(grace_seconds(pod), MIN_GRACE_S), "pod deleted"
        if running:
            log.info(
                "%s: stopping %s (%s, grace %.0fs)", self.label, ", ".join(running), why, grace
            )
        stop_all([self.procs[n] for n in running], grace)
        for name in running:
            self._record_exit(name, killed=True)
        for state in self.states:
            if state.state == "waiting" and state.last_state:  # backing off: make it final
                state.state, state.reason = "terminated", state.last_state["terminated"]["reason"]
        if gone:
            return
        if shutdown:
            self._report(
                phase_override="Failed",
                reason="Terminated",
                message=SHUTDOWN_MESSAGE,
                extra=[
                    condition("DisruptionTarget", True, "TerminationByKubelet", SHUTDOWN_MESSAGE)
                ],
            )
            return
        if self._report():
            finalize_deletion(self.ctx.kube, pod)
            log.info("%s: deleted", self.label)

    def _report(
        self,
        *,
        phase_override: str | None = None,
        reason: str = "",
        message: str = "",
        extra: list[Obj] | None = None,
    ) -> bool:
        """Patch pods/status; False when it failed (the caller retries)."""
        pod, _, gone, _ = self._snapshot()
        if gone:
            return True
        meta = pod["metadata"]
        body = pod_status_patch(
            pod,
            self.states,
            host_ip=self.ctx.addrs.host_ip,
            pod_ip=self.ctx.addrs.pod_ip,
            phase_override=phase_override,
            reason=reason,
            message=message,
            extra_conditions=extra,
        )
        try:
            self.ctx.kube.request(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                body=body,
                content_type=STRATEGIC,
            )
        except ApiError as err:
            if err.not_found or err.conflict:
                self.gone()
                return True
            log.warning("%s: status update failed: %s", self.label, err)
            return False
        except OSError as err:
            log.warning("%s: status update failed: %s", self.label, err)
            return False
        return True


def make_resolver(timeout_s: float = 1.0) -> Callable[[str], bool]:
    """``resolves(name)``: whether a host name resolves here, cached, never blocking long."""
    cache: dict[str, bool] = {}
    lock = threading.Lock()

    def resolves(name: str) -> bool:
        with lock:
            if name in cache:
                return cache[name]
        answer: list[bool] = []

        def look() -> None:
            try:
                socket.getaddrinfo(name, None)
                answer.append(True)
            except OSError:
                answer.append(False)

        thread = threading.Thread(target=look, daemon=True)
        thread.start()
        thread.join(timeout_s)
        result = bool(answer and answer[0])
        with lock:
            cache[name] = result
        return result

    return resolves
