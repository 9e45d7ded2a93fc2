"""The operator with a Kubernetes client that kills the process at a named point.

``python -m tests.cluster.crashing_operator --crash-at POINT <rtj-operator arguments>`` runs the
real operator (``rtj_operator.__main__.main``) after wrapping ``KubeApi.create`` so the process
exits abruptly (``os._exit``, no cleanup, like SIGKILL) the first time it resubmits a gang
(a pod of attempt >= 1). The points sit exactly where a crash is most dangerous:

- ``after-status``: the next attempt is recorded in status (the executor writes it before any
  pod), none of its pods exist yet: the exit comes instead of the first pod creation;
- ``mid-creation``: one pod of the next attempt exists, the others do not: the first creation
  goes through, the concurrent ones are held back, then the process exits.

The wrapping lives here, in the test entry point, so the product carries no crash hooks: the
rejected alternative was an environment variable read by the executor at those two places.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

OPERATOR_DIR = Path(__file__).resolve().parents[2] / "operator"
if str(OPERATOR_DIR) not in sys.path:
    sys.path.insert(0, str(OPERATOR_DIR))

from rtj_operator.act.kube import KubeApi  # noqa: E402
from rtj_operator.api import names  # noqa: E402

POINTS = ("after-status", "mid-creation")
EXIT_CODE = 86
"""The exit status a crash point ends the process with (tests check it was the crash)."""

log = logging.getLogger("crashing_operator")

Create = Callable[..., Awaitable[bool]]


def resubmitted_pod(path: str, body: dict[str, Any] | None) -> bool:
    """Whether a POST to ``path`` creates a pod of a resubmitted gang (attempt >= 1)."""
    if not path.endswith("/pods"):
        return False
    labels = ((body or {}).get("metadata") or {}).get("labels") or {}
    return int(labels.get(names.LABEL_ATTEMPT, "0")) >= 1


def _exit(point: str) -> None:
    log.error("crash point %s: exiting abruptly with status %d", point, EXIT_CODE)
    logging.shutdown()
    os._exit(EXIT_CODE)


def crashing_create(real: Create, point: str) -> Create:
    """``KubeApi.create`` that crashes at ``point`` on the first resubmitted pod."""
    if point not in POINTS:
        raise ValueError(f"--crash-at: expected one of {', '.join(POINTS)}, got {point!r}")
    claimed = False

    async def create(self: KubeApi, path: str, body: dict[str, Any], **kwargs: Any) -> bool:
        nonlocal claimed
        if not resubmitted_pod(path, body):
            return await real(self, path, body, **kwargs)
        if claimed:
            await asyncio.Event().wait()  # held back for good: the process exits first
        claimed = True
        if point == "after-status":
            _exit(point)
        created = await real(self, path, body, **kwargs)
        _exit(point)
        return created

    return create


def main(argv: list[str] | None = None) -> int:
    """``--crash-at POINT`` then the operator's own arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--crash-at":
        print("usage: crashing_operator --crash-at POINT <rtj-operator arguments>", file=sys.stderr)
        return 2
    KubeApi.create = crashing_create(KubeApi.create, args[1])  # type: ignore[method-assign]
    from rtj_operator.__main__ import main as operator_main

    return operator_main(args[2:])


if __name__ == "__main__":
    sys.exit(main())
