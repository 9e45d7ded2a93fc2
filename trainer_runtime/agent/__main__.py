"""``python -m trainer_runtime.agent [--rejoin-seconds S] -- COMMAND...``: see ``__init__``.

The agent imports torch and the runtime first (what each restarted worker then skips), with the
import-time checkpoint prefetch held back: a worker starts it with its own environment.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import envvars

# The prefetch at import belongs to the workers (each with its own RTJ_RESUME_FROM); the agent
# imports the runtime with it off, then gives the workers the environment as it was.
_PREFETCH_BEFORE = os.environ.get(envvars.PREFETCH)
os.environ[envvars.PREFETCH] = "0"
import torch  # noqa: E402 - imported once here, inherited by every forked worker
import torch.distributed  # noqa: E402
import torch.distributed.checkpoint  # noqa: E402, F401

import trainer_runtime  # noqa: E402, F401

from ..errors import ConfigError  # noqa: E402
from .command import parse  # noqa: E402
from .initial import initial_membership, settings_from  # noqa: E402
from .supervisor import Supervisor  # noqa: E402

if _PREFETCH_BEFORE is None:
    del os.environ[envvars.PREFETCH]
else:
    os.environ[envvars.PREFETCH] = _PREFETCH_BEFORE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_runtime.agent",
        description="Run a training command's workers warm, re-formed in place when the "
        "gang's membership changes.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command_line = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        command = parse(command_line)
        settings = settings_from(command, dict(os.environ))
        initial = initial_membership(command, dict(os.environ))
    except ConfigError as exc:
        print(f"rtj: agent: {exc}", file=sys.stderr)
        return 2
    return Supervisor(settings, initial).run()


if __name__ == "__main__":
    sys.exit(main())
