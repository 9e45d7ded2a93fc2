"""Crash injection for the "operator killed mid-resubmission" tests.

Setting ``RTJ_OPERATOR_CRASH_AT`` to a point name makes the operator process exit abruptly
(``os._exit``, no cleanup, like SIGKILL) the first time it reaches that point while resubmitting
a gang (attempt >= 1). The points sit exactly where a crash is most dangerous:

- ``after-status``: the next attempt is recorded in status, none of its pods exist yet;
- ``mid-creation``: one pod of the next attempt exists, the others do not.

Unset in production; reading one environment variable is the whole cost.
"""

from __future__ import annotations

import logging
import os

ENV = "RTJ_OPERATOR_CRASH_AT"
EXIT_CODE = 86

log = logging.getLogger(__name__)


def armed(point: str, attempt: int) -> bool:
    """Whether the process should crash at ``point`` for this attempt."""
    return attempt >= 1 and os.environ.get(ENV) == point


def crash_point(point: str, attempt: int) -> None:
    """Exit the process at once when armed for ``point``."""
    if armed(point, attempt):
        log.error("test hook %s=%s: exiting abruptly at attempt %d", ENV, point, attempt)
        logging.shutdown()
        os._exit(EXIT_CODE)
