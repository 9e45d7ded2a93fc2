"""The preemption notice: which node taints announce termination, and what the pod is told.

A notice is advice, not an ending: the operator writes it into the pod's annotation, the kubelet
refreshes the downward-API file the runtime watches, and the runtime checkpoints at once. The
gang is only restarted when the pod really goes, because a notice can be withdrawn (a cancelled
scale-down) and a restart would then waste the work since the last checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..api.spec_types import TaintSelector
from ..api.timeutil import iso


def taint_matches(taint: dict[str, Any], selector: TaintSelector) -> bool:
    """A taint matches when its key does and the selector's value/effect, when set, do too."""
    if taint.get("key") != selector.key:
        return False
    if selector.value is not None and taint.get("value", "") != selector.value:
        return False
    return selector.effect is None or taint.get("effect") == selector.effect


def termination_taint(
    taints: Iterable[dict[str, Any]], selectors: Iterable[TaintSelector]
) -> dict[str, Any] | None:
    """The first taint that announces termination, if any."""
    selectors = list(selectors)
    for taint in taints:
        if any(taint_matches(taint, s) for s in selectors):
            return taint
    return None


def notice_payload(taint: dict[str, Any], node: str, now: datetime) -> str:
    """The annotation value of the notice contract: ``{"time", "reason", "node"}``.

    ``time`` is the taint's own timeAdded when the API server recorded it (NoExecute taints),
    so every rank of the gang gets the same instant; otherwise when the operator saw it.
    """
    added = taint.get("timeAdded")
    return json.dumps(
        {"time": added or iso(now), "reason": taint.get("key", ""), "node": node},
        separators=(",", ":"),
    )
