"""Who takes a loss without notice: the training thread in process, or the survivor's save.

Both learn of the loss: the training thread from a collective that fails (``run/rejoin.py``
claims it), the survivor's watching thread from the operator's ``stop: rejoin`` membership
(``save/survivor.py``). Exactly one of them acts. The watch first shuts down the old gang's
connections (so that a training thread blocked on a peer that is cut off rather than dead fails
and can claim), then waits ``CLAIM_S`` for the claim; unclaimed, it refuses later claims and saves
the last finished step as at ``stop: kill``. A training thread whose loop let the failure end
it (a script that does not call ``rejoin``) refuses at once (``SurvivorSave.hold``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

CLAIM_S = 3.0
"""How long the survivor's watch waits for the training thread to claim a loss in process; the
agent waits a second more before it restarts the workers (``agent/supervisor.py``)."""


class RejoinClaim:
    """The one decision between the training thread's rejoin and the survivor's save."""

    def __init__(self, cut: Callable[[], object] = lambda: None) -> None:
        self._cut = cut
        self._cond = threading.Condition()
        self._claimed = False
        self._refused = False

    def take(self) -> bool:
        """The training thread's claim; False when the save was chosen already."""
        with self._cond:
            if self._refused:
                return False
            self._claimed = True
            self._cond.notify_all()
            return True

    def refuse(self) -> bool:
        """No claim from now on; whether one was made before."""
        with self._cond:
            self._refused = not self._claimed
            self._cond.notify_all()
            return self._claimed

    def awaited(self, timeout_s: float = CLAIM_S) -> bool:
        """The watch's side at a ``stop: rejoin`` membership: cut the old gang's connections,
        wait for the claim; True when the training thread took the loss."""
        self._cut()
        with self._cond:
            self._cond.wait_for(lambda: self._claimed or self._refused, timeout_s)
        return self.refuse()
