"""A worker tells the operator that its gang lost a peer: the annotation on its own pod.

A worker whose collective fails knows within a second that a peer is gone; the operator, when
the peer's machine died without its Node being deleted, would learn it only once the node
controller marks the node NotReady (40-50 s) and ``nodeNotReadySeconds`` pass. The report lets
the operator look at the Leases of the gang's nodes at once and take the node whose kubelet
stopped renewing as lost (docs/operator.md, "Classification"). The report alone names no node: a
collective fails the same way on every rank, whichever peer went.

Two writers:

- a kept worker (``recovery.survivors: Stay``) reports and then waits for the new membership
  (``save/survivor.py``, ``run/rejoin.py``): from a daemon thread, so that wait never waits on
  the API server (``report``);
- any other worker of a managed gang ends on the failed collective, and reports first
  (``ExitReport``): the operator then holds the failure until the Leases say whether a node
  died silently, so a spot machine that vanished is not charged to ``backoffLimit``.

Best effort; outside a pod it does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import torch

from .. import envvars
from ..errors import ConfigError
from . import membership
from .own_pod import OwnPod

log = logging.getLogger("trainer_runtime.peer_loss")

TRIES = 4
EXIT_WAIT_S = 3.0
"""How long an ending worker waits for its report to be written (one PATCH takes milliseconds;
an API server that does not answer must not hold the failure's exit longer than that)."""

_MARKERS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "connection refused",
    "broken pipe",
    "socket",
)


def collective_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a failed collective: a
    ``torch.distributed`` error, or a ``RuntimeError`` of a backend's transport (gloo raises
    plain ``RuntimeError``s such as "Connection reset by peer")."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, torch.distributed.DistError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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


class ExitReport:
    """The report of a worker that ends on a failed collective: seen in
    ``CheckpointManager.__exit__`` or, for a script without ``with``, through
    ``sys.excepthook`` (torchrun's workers and the agent's both end there). One per process,
    for the process's life: the hook stays after ``close()``, since the exception that ends
    the script passes the interpreter's hook after the manager closed."""

    _installed: ExitReport | None = None

    def __init__(self) -> None:
        self.sent = False
        self._previous: Any = sys.excepthook

    @classmethod
    def install(cls, world_size: int) -> ExitReport | None:
        """The process's report, installed once; None outside a managed pod's gang."""
        environ = os.environ
        if world_size < 2 or membership.epoch_from(environ) is None:
            return None  # alone, or unmanaged (the run's context validated the epoch)
        if not OwnPod(environ).enabled:
            return None
        if cls._installed is None:
            cls._installed = cls()
            sys.excepthook = cls._installed._excepthook
        return cls._installed

    def seen(self, exc: BaseException | None) -> None:
        """Report ``exc`` when it is a failed collective (once), waiting up to ``EXIT_WAIT_S``
        for the write: the process ends after this."""
        if self.sent or not collective_failure(exc):
            return
        try:  # the epoch of the gang that broke: an in-process switch updates the environment
            epoch = membership.epoch_from(os.environ)
        except ConfigError:
            return  # never an error of its own in the exit hook
        if epoch is None:
            return
        self.sent = True
        thread = report(os.environ, epoch)
        if thread is not None:
            thread.join(EXIT_WAIT_S)

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        try:
            self.seen(exc)
        finally:
            (self._previous or sys.__excepthook__)(kind, exc, tb)


def failed(exc: BaseException) -> None:
    """The training loop ended on ``exc`` (``CheckpointManager.__exit__``): reported when it is
    a failed collective and this process installed its ``ExitReport``."""
    installed = ExitReport._installed
    if installed is not None:
        installed.seen(exc)
