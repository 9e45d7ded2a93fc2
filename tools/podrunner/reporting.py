"""Sending a pod's status to the API server, as its kubelet would.

Every report of a pod worker goes through here: one strategic-merge patch of ``pods/status``
built from the containers' states (``status.pod_status_patch``), so conditions others add
(``DisruptionTarget``) are kept. A pod that no longer exists (404, or a 409 on a recreated pod of
the same name) is marked gone in the worker's inbox instead of being retried; any other failure
returns False so the worker retries on its next round.

Rejected: replacing the whole status (PUT). It needs a resourceVersion retry loop and would drop
conditions written by others between the read and the write.
"""

from __future__ import annotations

import logging

from tools.kubeapi import STRATEGIC, ApiError, Obj

from .inbox import PodInbox
from .preparation import Context
from .status import ContainerState, pod_status_patch

log = logging.getLogger("podrunner")


class StatusReporter:
    """Reports one pod's status; knows the pod only through its inbox."""

    def __init__(self, ctx: Context, inbox: PodInbox, label: str) -> None:
        self.ctx = ctx
        self.inbox = inbox
        self.label = label

    def report(
        self,
        states: list[ContainerState],
        *,
        phase_override: str | None = None,
        reason: str = "",
        message: str = "",
        extra: list[Obj] | None = None,
    ) -> bool:
        """Patch pods/status; False when it failed (the caller retries)."""
        pod, _, gone, _ = self.inbox.snapshot()
        if gone:
            return True
        meta = pod["metadata"]
        body = pod_status_patch(
            pod,
            states,
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
                self.inbox.mark_gone()
                return True
            log.warning("%s: status update failed: %s", self.label, err)
            return False
        except OSError as err:
            log.warning("%s: status update failed: %s", self.label, err)
            return False
        return True
