"""Which gang a process belongs to: the membership epoch, and the membership an agent is told of.

A gang whose membership changes without restarting its healthy pods (docs/survivors.md) needs
two facts the plain torch environment cannot carry:

- **the epoch**: a number that only grows, one per membership of the run (a new gang, or a gang
  re-formed in place). Every commit is fenced by it (``save/fence.py``): once a process of epoch N
  started, a process of an older epoch (partitioned from the operator, slow to die) can no
  longer commit into the run, so it can never move ``latest.json`` behind the new gang's back.
- **the membership** itself, written by the operator into an annotation of every pod of the
  gang and read by the in-pod agent (``trainer_runtime.agent``) from its downward-API file:
  the epoch, the gang's size in pods, this pod's index, the rendezvous address, the checkpoint
  to resume from, and how the old workers end (``stop``: ``save`` when every old member is
  still alive, so a collective emergency save can commit first; ``kill`` when one is gone and
  a save would wait on it; ``switch`` when every old member is alive and the job switches in
  process, ``switch.py``; ``leave`` for a pod on a node announced for termination that the new
  gang, which switches in process, leaves out: ``nodeRank`` is -1 and the rest describes the new
  gang it is not part of).

The file is JSON with the operator's field names (camelCase, like the rest of the API). A file
that does not parse is a ``ConfigError`` naming the field and what was expected; an empty or
missing file means "no membership yet" (the pod's own environment holds).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import envvars
from ..errors import ConfigError
from ..run import arguments

STOP_SAVE = "save"
STOP_KILL = "kill"
STOP_SWITCH = "switch"
"""Every old member is alive and the job asked for it: the workers that can switch in process
(``switch.py``) take the new membership without ending; the others stop as with ``save``."""
STOP_LEAVE = "leave"
"""This pod is not in the new gang (its node is announced for termination) and the others switch
in process: its workers leave at the step boundary every rank agrees on (``switch.py``), or,
when they cannot switch, save with the others and end (``nodeRank`` is -1)."""
STOP_REJOIN = "rejoin"
"""A member was lost without notice and the job asked for the in-process switch: workers that
can switch (``switch.py``) and whose script hands the failure to ``CheckpointManager.rejoin``
re-form the gang in process (``run/rejoin.py``); otherwise as ``kill``."""
STOP_MODES = (STOP_SAVE, STOP_KILL, STOP_SWITCH, STOP_LEAVE, STOP_REJOIN)
LOSS_STOPS = (STOP_KILL, STOP_REJOIN)
"""The stops of a membership after a loss: a survivor may save the last finished step."""
LEAVING_RANK = -1


@dataclass(frozen=True)
class Membership:
    """One membership of the gang, as the operator announced it to one pod."""

    epoch: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    resume_from: str = ""
    stop: str = STOP_KILL
    attempt: int | None = None
    """The operator's attempt this membership belongs to (``RTJ_ATTEMPT`` of the new workers)."""
    mtbi_seconds: int | None = None
    """The job's mean time between interruptions now (``RTJ_MTBI_SECONDS`` of the new workers:
    the automatic checkpoint interval); None: the pod's own, from its creation."""
    interruptions: int | None = None
    """The interruptions that figure counts (``RTJ_INTERRUPTIONS``)."""
    savers: int = 1
    """With ``stop: kill``: the kept pods that hold the last finished step (node ranks 0 to
    ``savers - 1``); a large state is saved in shares by all of them (``save/survivor_group.py``),
    a small one by node rank 0 alone."""

    @property
    def leaves(self) -> bool:
        """This pod is told to leave the gang (``stop: leave``)."""
        return self.stop == STOP_LEAVE

    def worker_environment(self, nproc_per_node: int, local_rank: int) -> dict[str, str]:
        """The variables of one worker process of this pod under this membership."""
        return {
            envvars.RANK: str(self.node_rank * nproc_per_node + local_rank),
            envvars.WORLD_SIZE: str(self.nnodes * nproc_per_node),
            envvars.LOCAL_RANK: str(local_rank),
            envvars.LOCAL_WORLD_SIZE: str(nproc_per_node),
            envvars.MASTER_ADDR: self.master_addr,
            envvars.MASTER_PORT: str(self.master_port),
            envvars.RESUME_FROM: self.resume_from,
            envvars.MEMBERSHIP_EPOCH: str(self.epoch),
        } | {
            name: str(value)
            for name, value in (
                (envvars.ATTEMPT, self.attempt),
                (envvars.MTBI_SECONDS, self.mtbi_seconds),
                (envvars.INTERRUPTIONS, self.interruptions),
            )
            if value is not None
        }


_FIELDS = {
    "epoch": (int, "an integer >= 0"),
    "nnodes": (int, "an integer >= 1"),
    "nodeRank": (int, "an integer >= 0 and < nnodes (-1 with stop: leave)"),
    "masterAddr": (str, "a host name or address"),
    "masterPort": (int, "a port number from 1 to 65535"),
}


def parse(text: str, *, source: str = "membership") -> Membership | None:
    """The membership in ``text``, or None for an empty text (none announced yet)."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    values = {}
    for key, (kind, expected) in _FIELDS.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"{source}: {key}={value!r}: expected {expected}")
        values[key] = value
    stop = data.get("stop", STOP_KILL)
    resume_from = data.get("resumeFrom", "")
    rank, leaves = values["nodeRank"], stop == STOP_LEAVE
    rank_ok = rank == LEAVING_RANK if leaves else 0 <= rank < values["nnodes"]
    problems = [
        (values["epoch"] < 0, "epoch"),
        (values["nnodes"] < 1, "nnodes"),
        (not rank_ok, "nodeRank"),
        (not values["masterAddr"], "masterAddr"),
        (not 0 < values["masterPort"] < 65536, "masterPort"),
    ]
    for bad, key in problems:
        if bad:
            raise ConfigError(f"{source}: {key}={values[key]!r}: expected {_FIELDS[key][1]}")
    if stop not in STOP_MODES:
        raise ConfigError(f"{source}: stop={stop!r}: expected one of {', '.join(STOP_MODES)}")
    if not isinstance(resume_from, str):
        raise ConfigError(f"{source}: resumeFrom={resume_from!r}: expected a string")
    optional = {
        key: _optional_count(data, key, source, least)
        for key, least in (
            ("attempt", 0),
            ("mtbiSeconds", 1),
            ("interruptions", 0),
            ("savers", 1),
        )
    }
    savers = optional["savers"] or 1
    if savers > values["nnodes"]:
        raise ConfigError(f"{source}: savers={savers}: expected an integer from 1 to nnodes")
    return Membership(
        epoch=values["epoch"],
        nnodes=values["nnodes"],
        node_rank=values["nodeRank"],
        master_addr=values["masterAddr"],
        master_port=values["masterPort"],
        resume_from=resume_from,
        stop=stop,
        attempt=optional["attempt"],
        mtbi_seconds=optional["mtbiSeconds"],
        interruptions=optional["interruptions"],
        savers=savers,
    )


def _optional_count(data: Mapping[str, object], key: str, source: str, least: int) -> int | None:
    """``data[key]``: absent (None) or an integer >= ``least``."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"{source}: {key}={value!r}: expected an integer >= {least}")
    return value


def read(path: str | os.PathLike[str]) -> Membership | None:
    """The membership in the file at ``path``; None when it is missing or empty."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    return parse(text, source=str(path))


def epoch_from(environ: Mapping[str, str]) -> int | None:
    """``RTJ_MEMBERSHIP_EPOCH``, or None when unset (no fencing: an unmanaged run)."""
    if not environ.get(envvars.MEMBERSHIP_EPOCH, "").strip():
        return None
    return arguments.environment_integer(
        envvars.MEMBERSHIP_EPOCH, environ, 0, "an integer >= 0", lambda n: n >= 0
    )
