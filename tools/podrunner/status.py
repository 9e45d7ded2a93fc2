"""Pod status as a kubelet reports it: container states, phase, conditions, addresses.

Kept apart from the process handling so the mapping (exit 0 → Completed/Succeeded, anything
else → Error/Failed, 128+n for a signal, the 4096-byte termination message) is readable in one
place and testable without processes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
MAX_MESSAGE_BYTES = 4096
"""The kubelet's limit on one container's termination message."""
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def now() -> str:
    """RFC 3339 UTC with seconds, the API's metav1.Time format."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """metav1.MicroTime (Lease renewTime)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ContainerState:
    """What the agent knows about one container."""

    name: str
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    pid: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int = 0
    last_state: Obj = field(default_factory=dict)

    def running(self, pid: int) -> None:
        """The process has started."""
        self.state, self.reason, self.message = "running", "", ""
        self.pid, self.started_at = pid, now()
        self.finished_at = self.exit_code = self.signal = None

    def terminated(self, exit_code: int, sig: int | None, message: str) -> None:
        """The process has ended."""
        self.state = "terminated"
        self.reason = "Completed" if exit_code == 0 else "Error"
        self.exit_code, self.signal, self.message = exit_code, sig, message
        self.finished_at = now()

    def waiting(self, reason: str, message: str = "") -> None:
        """Not running: being prepared, or backing off before a restart."""
        if self.state == "terminated":
            self.last_state = {"terminated": self._terminated()}
        self.state, self.reason, self.message = "waiting", reason, message

    def _terminated(self) -> Obj:
        out: Obj = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.signal:
            out["signal"] = self.signal
        if self.message:
            out["message"] = self.message
        return out

    @property
    def container_id(self) -> str:
        """An ID in the ``<runtime>://<id>`` shape; the pid is the only ID a process has."""
        return f"podrunner://{self.pid}" if self.pid else ""

    def to_api(self) -> Obj:
        """The ``containerStatuses`` entry."""
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self._terminated()}
        else:
            state = {
                "waiting": {
                    "reason": self.reason,
                    **({"message": self.message} if self.message else {}),
                }
            }
        out: Obj = {
            "name": self.name,
            "image": self.image or "podrunner/none",
            "imageID": "",
            "ready": self.state == "running",
            "started": self.state == "running",
            "restartCount": self.restart_count,
            "state": state,
            "lastState": self.last_state,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def phase(states: list[ContainerState]) -> str:
    """The pod phase from its containers (no init containers)."""
    if any(s.state == "running" for s in states):
        return "Running"
    if all(s.state == "terminated" for s in states):
        # Final: a container due for a restart is reported as waiting, not terminated.
        return "Succeeded" if all(s.exit_code == 0 for s in states) else "Failed"
    if any(s.started_at for s in states):
        return "Running"  # backing off before a restart
    return "Pending"


def condition(kind: str, status: bool, reason: str = "", message: str = "") -> Obj:
    """One pod condition (strategic merge patches merge them by ``type``)."""
    out: Obj = {
        "type": kind,
        "status": "True" if status else "False",
        "lastTransitionTime": now(),
        "lastProbeTime": None,
    }
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def pod_status_patch(
    pod: Obj,
    states: list[ContainerState],
    *,
    host_ip: str,
    pod_ip: str,
    phase_override: str | None = None,
    reason: str = "",
    message: str = "",
    extra_conditions: list[Obj] | None = None,
) -> Obj:
    """A strategic merge patch of ``pods/status`` reporting ``states``."""
    current = phase_override or phase(states)
    ready = current == "Running" and all(s.state == "running" for s in states)
    not_ready_reason = (
        "PodCompleted" if current in ("Succeeded", "Failed") else ("ContainersNotReady")
    )
    started = any(s.started_at for s in states)
    conditions = [
        condition("PodReadyToStartContainers", True),
        condition("Initialized", True),
        condition("ContainersReady", ready, "" if ready else not_ready_reason),
        condition("Ready", ready, "" if ready else not_ready_reason),
        *(extra_conditions or []),
    ]
    previous = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    for cond in conditions:
        old = previous.get(cond["type"])
        if old and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
    status: Obj = {
        "phase": current,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "conditions": conditions,
        "containerStatuses": [s.to_api() for s in states],
    }
    if not (pod.get("status") or {}).get("startTime"):
        status["startTime"] = now()
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if not started and current == "Pending":
        status.pop("podIP")
        status.pop("podIPs")
    return {"metadata": {"uid": pod["metadata"]["uid"]}, "status": status}


def termination_message(path: Path, *, policy: str, exit_code: int, log_path: Path) -> str:
    """The container's termination message: its file, else (FallbackToLogsOnError) its log tail."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MESSAGE_BYTES)
    except OSError:
        data = b""
    if not data.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        try:
            tail = log_path.read_bytes()[-64 * 1024 :]
        except OSError:
            tail = b""
        lines = tail.splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
        data = b"".join(lines)[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", errors="replace")
