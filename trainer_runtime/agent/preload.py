"""Modules the agent imports for its workers' next fork (``RTJ_AGENT_PRELOAD``).

A worker forked from the agent inherits what the agent imported. A script that compiles
(``torch.compile``) or asks for deterministic algorithms (``torch.use_deterministic_algorithms``)
imports ``torch._inductor`` and ``torch._dynamo`` on first use: about 1 s of CPU on the 2-core
development machine, paid again by every worker restarted in place. The agent imports them once:

- a standby pod, before it says it is warm (it has nothing else to do);
- any other pod, right after its first workers started: they import what they use themselves, so
  the first start is not delayed, and every restart in place after it finds the modules loaded.

The import makes no CUDA call and starts no thread (``tests/unit/test_agent_preload.py``), so
forking after it is as safe as forking after ``import torch``. It costs the agent about 100 MiB of
memory, shared with the forked workers. ``RTJ_AGENT_PRELOAD`` names other modules (comma
separated), or none when empty. A module that fails to import is reported, never fatal.
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from collections.abc import Mapping

from .. import envvars
from ..errors import ConfigError

log = logging.getLogger("trainer_runtime.agent")

DEFAULT_MODULES = ("torch._inductor.config",)
"""What ``torch.compile`` and ``torch.use_deterministic_algorithms`` import on first use
(``torch._inductor``, and through it ``torch._dynamo``)."""

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def modules_from(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The modules ``RTJ_AGENT_PRELOAD`` names (the default when it is unset, none when empty);
    a ``ConfigError`` naming the variable for an entry that is not a module name."""
    raw = environ.get(envvars.AGENT_PRELOAD)
    if raw is None:
        return DEFAULT_MODULES
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in names:
        if not _MODULE_NAME.fullmatch(name):
            raise ConfigError(
                f"{envvars.AGENT_PRELOAD}={raw!r}: {name!r} is not a module name; expected "
                "dotted module names separated by commas (empty: preload nothing)"
            )
    return names


def preload(modules: tuple[str, ...], clock=time.monotonic) -> float:
    """Import ``modules``; the seconds it took. A failed import is logged and skipped."""
    began = clock()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a user's module may raise anything
            log.warning("agent: could not preload %s (%s: %s)", name, type(exc).__name__, exc)
    seconds = clock() - began
    if modules:
        log.info("agent: preloaded %s in %.2f s", ", ".join(modules), seconds)
    return seconds
