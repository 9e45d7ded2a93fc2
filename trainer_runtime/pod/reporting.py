"""Telling the operator about each committed checkpoint.

The runtime writes one JSON line to ``RTJ_REPORT_FILE`` (the container's termination message
file), which the kubelet copies into the pod status when the container ends. The operator uses it
to fill ``status.lastCommittedCheckpoint`` and to point the next attempt at it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .. import envvars
from ..save.manifest import Manifest

log = logging.getLogger(__name__)


def commit_record(
    manifest: Manifest, uri: str, *, world_size: int | None = None
) -> dict[str, object]:
    """``world_size``: the gang's, when the checkpoint was written by fewer processes than
    train (a survivor's save: one); default the manifest's."""
    ts = manifest.timestamp
    attempt = os.environ.get(envvars.ATTEMPT, "").strip()
    return {
        "checkpoint": manifest.name,
        "uri": uri,
        "step": ts.batch,
        "epoch": ts.epoch,
        "sample": ts.sample,
        "time": manifest.created_at,
        # The world size the run trains at: an elastic gang's operator records it per commit.
        "world_size": manifest.world_size if world_size is None else world_size,
    } | ({"attempt": int(attempt)} if attempt.isdigit() else {})


def report_commit(
    manifest: Manifest, uri: str, *, world_size: int | None = None
) -> dict[str, object]:
    """Best effort: a failure to report never fails the save. Returns the record."""
    record = commit_record(manifest, uri, world_size=world_size)
    target = os.environ.get(envvars.REPORT_FILE, "").strip()
    if target:
        try:
            Path(target).write_text(json.dumps(record) + "\n")
        except OSError as exc:
            log.warning("could not write the commit report to %s: %s", target, exc)
    return record
