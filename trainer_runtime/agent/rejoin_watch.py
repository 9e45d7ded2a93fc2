"""The agent's side of a loss handed to its workers in process (``stop: rejoin``).

The loss is the workers' once every one of them claimed it (``run/rejoin.py`` writes the claim,
with the epoch of the gang that broke, beside its switch file). A worker that ends first, or no
claim within the survivor's wait (``CLAIM_S``) and a second, and the agent restarts them in
place as at ``stop: kill``: this pod's saver, if it is one, saved the last finished step
meanwhile (``save/rejoin_claim.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import switch
from ..pod.membership import Membership
from ..save.rejoin_claim import CLAIM_S

SLACK_S = 1.0
"""How much longer than the survivor's watch the agent waits for the claims."""


@dataclass(frozen=True)
class PendingRejoin:
    membership: Membership
    since: float
    lost_epochs: tuple[int, int]
    """The epochs the gang the loss broke may have had, oldest first: from the one the workers
    last formed to the newest handed to them (a switch they may not have taken before the loss
    came). A claim is of this loss when it names one of them; an earlier loss's claim names an
    older epoch."""


def next_step(
    pending: PendingRejoin | None, codes: Sequence[int | None], files: Sequence[Path], now: float
) -> tuple[PendingRejoin | None, Membership | None]:
    """What is still pending, and the membership to restart the workers for (None: none).
    Settled when every worker runs and claimed the loss (``files``: their switch files);
    failed when a worker ended first or the claims are late."""
    if pending is None:
        return None, None
    running = all(code is None for code in codes)
    if running and all(_names_this_loss(switch.claimed(f), pending) for f in files):
        return None, None
    if running and now - pending.since < CLAIM_S + SLACK_S:
        return pending, None
    return None, pending.membership


def _names_this_loss(claimed: int | None, pending: PendingRejoin) -> bool:
    oldest, newest = pending.lost_epochs
    return claimed is not None and oldest <= claimed <= newest
