"""The run's fence in the bucket: a stale gang's checkpoint is not committed remotely either.

``save/fence.py`` keeps the fence in the run folder the pods share. A run in an object store has one
more place a stale gang could write: its uploads, whose remote commit (``remote_commit.py``)
puts ``manifest.json`` and moves ``latest.json``. So ``fence.json`` is kept at the run's root in
the bucket too: rank 0 of each managed gang raises it to its epoch when its backend opens (the
gang's start), and the leader checks it right before the manifest of each remote commit. A
process of an older epoch (a stale gang) then commits nothing remotely (``StaleMembershipError``:
never retried, its files stay where they are, and no pointer moves). What counts is the epoch of
the process that uploads, not the one the manifest records: a newer gang that finds an older
gang's committed checkpoint still on its disk (its upload cut short by the grace period) sends
it on as before. Like the local fence it is a read then a write, not an atomic compare.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import StaleMembershipError
from ..pod.membership import epoch_from
from ..save.fence import FENCE_NAME, FenceRules
from ..save.manifest import Manifest
from .errors import ObjectStoreError
from .store import S3Store
from .uri import S3Uri

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BucketFence(FenceRules):
    """The fence of the remote run ``run_uri`` as seen by a gang of membership ``epoch``."""

    store: S3Store
    run_uri: S3Uri
    epoch: int

    def where(self) -> str:
        return str(self.run_uri.join(FENCE_NAME))

    def _read(self) -> str | None:
        data = self.store.get_bytes(self.run_uri.join(FENCE_NAME))
        return None if data is None else data.decode(errors="replace")

    def _write(self, body: str) -> None:
        self.store.put_bytes(
            self.run_uri.join(FENCE_NAME), body.encode(), content_type="application/json"
        )


def claim_at_start(
    store: S3Store, run_uri: S3Uri, rank: int, environ: Mapping[str, str] | None = None
) -> None:
    """Rank 0 of a managed gang (``RTJ_MEMBERSHIP_EPOCH`` set) raises the bucket's fence; a
    store that refuses is logged (the gang trains on; the fence then protects less)."""
    epoch = epoch_from(os.environ if environ is None else environ)
    if epoch is None or rank != 0:
        return
    fence = BucketFence(store, run_uri, epoch)
    try:
        fence.claim()
    except ObjectStoreError as exc:
        log.warning("object store: could not raise %s to epoch %d: %s", fence.where(), epoch, exc)


def check_before_commit(
    store: S3Store, run_uri: S3Uri, manifest: Manifest, environ: Mapping[str, str] | None = None
) -> None:
    """Raise ``StaleMembershipError`` when a newer gang than this process's has claimed the run
    in the bucket."""
    epoch = epoch_from(os.environ if environ is None else environ)
    if epoch is None:
        return  # not a managed gang: nothing fences it
    stale = BucketFence(store, run_uri, epoch).stale()
    if stale is not None:
        raise StaleMembershipError(f"{manifest.name} is not committed to {run_uri}: {stale}")
