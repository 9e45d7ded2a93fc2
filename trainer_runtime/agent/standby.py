"""A standby pod: warm, announced, and waiting to be named into the gang.

A pod the operator adds to a gang that trains on meanwhile (an elastic grow with survivors
staying, docs/survivors.md) is created with ``RTJ_STANDBY=1``. Its agent has imported torch and
the runtime by the time this runs; it then writes ``resumable.dev/agent-ready`` on its own pod
(the epoch it waits to join, and when its interpreter started) and starts no worker until the
membership file holds that epoch or a newer one. The operator switches the running gang to the
new membership only then, so the running ranks train through the new pods' cold start instead
of waiting for it in ``init_process_group``.

A standby pod waits as long as the operator lets it: the operator deletes it when the job gives
the grow up. SIGTERM ends the wait.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from .. import envvars, events
from ..pod.membership import Membership
from ..pod.own_pod import OwnPod
from ..run.announce import announce

log = logging.getLogger("trainer_runtime.agent")


def is_standby(environ: Mapping[str, str]) -> bool:
    return environ.get(envvars.STANDBY, "").strip().lower() in ("1", "true", "yes")


def ready_payload(epoch: int) -> str:
    """The annotation's value: the epoch this pod waits to join, when it got warm and when its
    interpreter started (the difference is its own start-up, torch's import included)."""
    return json.dumps(
        {
            "epoch": epoch,
            "readyAt": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "processStarted": events.process_start_time(),
        },
        separators=(",", ":"),
    )


def announce_ready(environ: Mapping[str, str], epoch: int) -> bool:
    """Write the ready annotation on this pod; whether it was written (outside a pod, or when
    the API server refuses, the operator's wait for it ends on its own timeout instead)."""
    pod = OwnPod(environ)
    if not pod.enabled:
        log.warning("agent: standby outside a pod the API server knows; not announced")
        return False
    error = pod.annotate_retrying({envvars.AGENT_READY_ANNOTATION: ready_payload(epoch)}, 5)
    if error is None:
        return True
    log.warning("agent: cannot announce this standby pod as ready (%s)", error)
    return False


def wait_for_membership(
    initial: Membership,
    read_newer: Callable[[int], Membership | None],
    stopped: Callable[[], bool],
    poll_s: float,
) -> Membership | None:
    """The first membership of epoch ``initial.epoch`` or newer; None when ``stopped`` first."""
    announce(
        log,
        logging.WARNING,
        "%s",
        f"agent: standby for membership epoch {initial.epoch}; warm, waiting to be named",
        speak=True,
    )
    while not stopped():
        found = read_newer(initial.epoch)
        if found is not None:
            return found
        time.sleep(poll_s)
    return None
