"""A kept worker tells the operator that its gang lost a peer: the annotation on its own pod.

A worker whose collective fails knows within a second that a peer is gone; the operator, when
the peer's machine died without its Node being deleted, would learn it only once the node
controller marks the node NotReady (40-50 s) and ``nodeNotReadySeconds`` pass. The report lets
the operator look at the Leases of the gang's nodes at once and take the node whose kubelet
stopped renewing as lost (docs/survivors.md). The report alone names no node: a collective
fails the same way on every rank, whichever peer went.

Best effort, from a daemon thread, so the worker's wait for the new membership never waits on
the API server; outside a pod it does nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime

from .. import envvars
from .own_pod import OwnPod

log = logging.getLogger("trainer_runtime.peer_loss")

TRIES = 4


def payload(epoch: int) -> str:
    """The annotation's value: the membership epoch of the gang whose collective failed."""
    at = datetime.now(UTC).isoformat(timespec="milliseconds")
    return json.dumps({"epoch": epoch, "at": at}, separators=(",", ":"))


def report(environ: Mapping[str, str], epoch: int) -> threading.Thread | None:
    """Write the report on this pod from a daemon thread (returned; None outside a pod)."""
    pod = OwnPod(environ)
    if not pod.enabled:
        return None
    thread = threading.Thread(
        target=_send, args=(pod, payload(epoch)), name="rtj-peer-lost", daemon=True
    )
    thread.start()
    return thread


def _send(pod: OwnPod, value: str) -> None:
    error = pod.annotate_retrying({envvars.PEER_LOST_ANNOTATION: value}, TRIES)
    if error is not None:
        log.warning("cannot report the lost peer on pod %s (%s)", pod.pod, error)
