"""``python -m trainer_runtime.agent [--rejoin-seconds S] -- COMMAND...``: see ``__init__``.

The agent imports torch and the runtime first (what each restarted worker then skips). Importing
the runtime starts the checkpoint prefetch the pod's environment asks for (resume/warm_start.py), in
this process; and for a run in an object store the agent loads boto3 and the S3 client's data
(``store.warm_up``). Before it forks a worker it waits for the prefetch: a fork beside a running
thread could hand the child a lock that thread held. The first worker then finds the checkpoint
on the local disk and builds its S3 clients without loading anything. The agent also imports the
modules ``RTJ_AGENT_PRELOAD`` names (``preload.py``) for the workers it forks later: right after
its first workers started, or, in a standby pod, before it says it is warm.

The S3 client's data is loaded after the prefetch, not beside it: the prefetch's own client loads
the same data into the same cache, and two threads parsing it at once both do the work (measured
with torch imported and a thread building the same client, 2 idle cores, 4 runs: 0.40-0.56 s side
by side against 0.23-0.27 s one after the other; more on busy cores, where a replacement starts).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch  # imported once here, inherited by every forked worker
import torch.distributed
import torch.distributed.checkpoint  # noqa: F401

import trainer_runtime  # noqa: F401

from .. import envvars
from ..errors import ConfigError
from ..resume import warm_start
from .command import parse
from .initial import initial_membership, settings_from
from .supervisor import Supervisor

log = logging.getLogger("trainer_runtime.agent")


def prepare_to_fork(environ: dict[str, str]) -> None:
    """Finish what the workers would otherwise each do again: the prefetch, then the S3
    client's data (only for a run in an object store; without boto3 the workers report it)."""
    warm_start.wait_for_prefetch()
    if environ.get(envvars.CHECKPOINT_DIR, "").startswith("s3://"):
        from ..objectstore.errors import ObjectStoreConfigError  # noqa: PLC0415
        from ..objectstore.store import warm_up  # noqa: PLC0415

        try:
            seconds = warm_up()
            log.info("agent: S3 client data loaded in %.2f s", seconds)
        except ObjectStoreConfigError as exc:
            log.warning("agent: %s", exc)


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
    prepare_to_fork(dict(os.environ))
    return Supervisor(settings, initial).run()


if __name__ == "__main__":
    sys.exit(main())
