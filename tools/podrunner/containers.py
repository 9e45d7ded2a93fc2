"""One pod's container processes and the state reported for each.

A pod worker decides what happens to its pod (start, restart, stop, report); this module keeps
the per-container bookkeeping those decisions act on: which process runs each container, the
``ContainerState`` the status reports, and the exit record (exit code, signal, termination
message mapped back to in-pod paths). Kept apart so the worker reads as the pod's lifecycle and
this as what a kubelet's container runtime would tell it. Rejected: keeping it in
the worker, which made one class of about 330 lines do four jobs.

Every method that starts a process must run on the pod's worker thread: the containers'
parent-death signal follows the thread that forked them.
"""

from __future__ import annotations

import logging

from tools.kubeapi import Obj

from .preparation import Context, PodPreparation
from .processes import ContainerProcess, stop_all
from .status import ContainerState, termination_message
from .translate import describe

log = logging.getLogger("podrunner")


class PodContainers:
    """The containers of one pod: their processes and their reported states."""

    def __init__(self, ctx: Context, prep: PodPreparation, pod: Obj, label: str) -> None:
        self.ctx = ctx
        self.prep = prep
        self.label = label
        self.node: str = pod["spec"]["nodeName"]
        containers = pod["spec"].get("containers") or []
        self.states = [ContainerState(c["name"], c.get("image", "")) for c in containers]
        self.procs: dict[str, ContainerProcess] = {}

    def state(self, name: str) -> ContainerState:
        """The reported state of container ``name``."""
        return next(s for s in self.states if s.name == name)

    def start(self, name: str) -> None:
        """Start container ``name`` from its plan; a command that cannot run is a StartError."""
        plan = self.prep.plans[name]
        state = self.state(name)
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

    def record_exit(self, name: str, *, killed: bool = False) -> None:
        """Record how container ``name``'s process ended (it must have ended)."""
        proc, plan, state = self.procs[name], self.prep.plans[name], self.state(name)
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

    def newly_exited(self) -> list[str]:
        """Containers reported running whose process has ended."""
        return [
            name
            for name, proc in list(self.procs.items())
            if self.state(name).state == "running" and proc.poll() is not None
        ]

    def running(self) -> list[str]:
        """Containers reported running."""
        return [n for n in self.procs if self.state(n).state == "running"]

    def stop(self, names: list[str], grace_s: float) -> None:
        """SIGTERM, ``grace_s``, SIGKILL (group and token); record each as killed."""
        stop_all([self.procs[n] for n in names], grace_s)
        for name in names:
            self.record_exit(name, killed=True)

    def kill_all(self, grace_s: float) -> None:
        """Stop every process still running, whatever its state says (a crashed worker)."""
        stop_all(list(self.procs.values()), grace_s)

    def settle_back_offs(self) -> None:
        """A container waiting to restart will not: report its last termination as final."""
        for state in self.states:
            if state.state == "waiting" and state.last_state:
                state.state, state.reason = "terminated", state.last_state["terminated"]["reason"]

    def all_waiting(self, reason: str, message: str = "") -> None:
        """Every container waits for the same reason (a config error, an unsupported spec)."""
        for state in self.states:
            state.waiting(reason, message)

    def all_unknown(self, message: str) -> None:
        """Every container ended without a trace here (exit 137, ContainerStatusUnknown)."""
        for state in self.states:
            state.terminated(137, None, message)
            state.reason = "ContainerStatusUnknown"

    def restore_counts(self, pod: Obj) -> None:
        """Carry restart counts and start times over from the pod's last reported status."""
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        for state in self.states:
            old = previous.get(state.name) or {}
            state.restart_count = int(old.get("restartCount", 0))
            state.started_at = ((old.get("state") or {}).get("running") or {}).get("startedAt")
