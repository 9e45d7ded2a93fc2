"""The agent's settings and first membership, from the environment the operator injected.

Before any membership change, the pod's own environment is the membership: torchrun's
``PET_*`` options when the operator set them (the pod's node rank, the gang's size in pods),
else the torch variables of a one-process pod. Every value is checked, and a bad one is a
``ConfigError`` naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import envvars
from ..errors import ConfigError
from ..pod import membership
from ..pod.membership import Membership
from ..run import arguments
from .command import WorkerCommand
from .preload import modules_from
from .standby import is_standby
from .supervisor import AgentSettings

DEFAULT_REJOIN_S = 30.0
DEFAULT_STOP_GRACE_S = 30.0
DEFAULT_SURVIVOR_SAVE_S = 120.0


def nproc_per_node(command: WorkerCommand, environ: Mapping[str, str]) -> int:
    """Workers per pod: the command's own count, else ``PET_NPROC_PER_NODE``, else 1."""
    if command.nproc_per_node is not None:
        return command.nproc_per_node
    return arguments.environment_integer(
        envvars.TORCHRUN_NPROC_PER_NODE, environ, 1, "an integer >= 1", lambda n: n >= 1
    )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    return arguments.environment_seconds(
        name, environ, default, "a number of seconds >= 0", lambda s: s >= 0
    )


def settings_from(command: WorkerCommand, environ: Mapping[str, str]) -> AgentSettings:
    nproc = nproc_per_node(command, environ)
    return AgentSettings(
        command=command,
        nproc_per_node=nproc,
        base_env=dict(environ),
        membership_file=environ.get(envvars.MEMBERSHIP_FILE, "").strip() or None,
        rejoin_s=_seconds(environ, envvars.REJOIN_SECONDS, DEFAULT_REJOIN_S),
        stop_grace_s=_seconds(environ, envvars.GRACE_PERIOD_SECONDS, DEFAULT_STOP_GRACE_S),
        standby=is_standby(environ),
        survivor_save_s=_seconds(environ, envvars.SURVIVOR_SAVE_SECONDS, DEFAULT_SURVIVOR_SAVE_S),
        preload=modules_from(environ),
    )


def initial_membership(command: WorkerCommand, environ: Mapping[str, str]) -> Membership:
    """The membership the pod was created with."""
    nproc = nproc_per_node(command, environ)

    def integer(name: str, default: int, expected: str, ok) -> int:
        return arguments.environment_integer(name, environ, default, expected, ok)

    world = integer(envvars.WORLD_SIZE, nproc, "an integer >= 1", lambda n: n >= 1)
    rank = integer(envvars.RANK, 0, "an integer >= 0", lambda n: n >= 0)
    nnodes = integer(
        envvars.TORCHRUN_NNODES, max(1, world // nproc), "an integer >= 1", lambda n: n >= 1
    )
    node_rank = integer(
        envvars.TORCHRUN_NODE_RANK, rank // nproc, "an integer >= 0", lambda n: n >= 0
    )
    port = integer(envvars.MASTER_PORT, 29500, "a port number", lambda n: 0 < n < 65536)
    if node_rank >= nnodes:
        raise ConfigError(
            f"{envvars.TORCHRUN_NODE_RANK}={node_rank}: expected less than the {nnodes} pods"
        )
    return Membership(
        epoch=membership.epoch_from(environ) or 0,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=environ.get(envvars.MASTER_ADDR, "").strip() or "127.0.0.1",
        master_port=port,
        resume_from=environ.get(envvars.RESUME_FROM, ""),
    )
