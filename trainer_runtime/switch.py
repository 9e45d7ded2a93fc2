"""The in-process switch: a running gang takes a new membership without ending its processes.

The agent's restart in place (``agent/supervisor.py``) forks new workers at every membership
change: they form the group, load the newest commit and warm up again. When every member of the
old gang is alive at the change (a grow), nothing has to be aborted, so the running workers can
switch instead, with the script's help (docs/survivors.md, "The in-process switch"):

1. **asked**: a manager built with ``in_process_switch=True`` under the agent writes
   ``<RTJ_SWITCH_FILE>.ready``; the agent then writes the new membership (its epoch and the
   worker's new environment) into ``RTJ_SWITCH_FILE`` instead of stopping the worker.
2. **agreed**: the request's epoch rides on the per-step agreement every rank already makes
   (``PreemptionResponse.at_step_boundary``, one ``max_ints``) as ``[E, -E]``, so all ranks see
   the same maximum and minimum at the same step, and switch at the first step boundary where
   every rank holds the request (maximum = minimum). Ranks whose agent reads the membership
   later keep training meanwhile.
3. **switched** (``run/switch_in_place.py``): the manager's parts are let go as at
   ``close()`` (a save in flight is waited for, the uploads are flushed), the process group is
   destroyed and formed again from the new environment, and the parts are built again exactly
   as at construction (so their collectives match those of the new ranks' constructors); the
   position stays.
4. **handed over** (``resume/from_peer.py``): the new rank 0 says whether it holds the state
   (it switched) and, if so, sends it (the per-rank contents a save would write: weights,
   optimizer, schedulers, samplers, position, metrics, extras, its RNG) to every rank; a new
   rank loads it as ``resume()`` loads a checkpoint (its RNG derived for its rank, like a rank
   the saving gang did not have), the others already hold it.
5. ``batch_end()`` / ``epoch_end()`` raise ``MembershipSwitched``: the script wraps the model in a
   new ``DistributedDataParallel`` and starts a new iteration of its data (the sampler is
   re-dealt to the new ranks at the same global position), then trains on.

A pod on a node announced for termination is told ``stop: leave`` while the others are told
``stop: switch`` (the operator's notice, docs/survivors.md): its workers take part in the same
agreement with a request that leaves (``SwitchRequest.leave``), and at the agreed boundary let the
manager's parts go and end with exit code 0 (``leave_in_place``; the old group is left to the
script's own ending, or destroyed at exit), while the others form the smaller group. Every rank
still holds the whole state, so nothing is handed over.

Only replicated state (DDP, or one process) can switch: a sharded model (FSDP2) is refused at
construction. (Rejected: the agent choosing the step: only the ranks know where they are.)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import envvars
from .errors import ConfigError
from .pod import membership

log = logging.getLogger("trainer_runtime")

READY_SUFFIX = ".ready"
CLAIMED_SUFFIX = ".claimed"


class MembershipSwitched(Exception):  # noqa: N818 - an event the loop handles, not an error
    """Raised by ``batch_end()`` / ``epoch_end()`` after this process switched to a new
    membership in process: wrap the model in a new ``DistributedDataParallel``, start a new
    iteration of the data, and train on from ``CheckpointManager.timestamp``."""

    def __init__(
        self, *, epoch: int, rank: int, world_size: int, old_world_size: int, seconds: float
    ) -> None:
        super().__init__(
            f"switched to membership epoch {epoch}: rank {rank} of {world_size} "
            f"(was {old_world_size} ranks) in {seconds:.2f} s"
        )
        self.epoch, self.rank, self.world_size = epoch, rank, world_size
        self.old_world_size, self.seconds = old_world_size, seconds


@dataclass(frozen=True)
class SwitchRequest:
    """A membership the agent asks this worker to switch to (``leave``: one it is not part of;
    it leaves the gang at the agreed boundary and ends, ``environment`` is empty;
    ``after_loss``: a member was lost, the workers rejoin from a failed collective,
    ``run/rejoin.py``)."""

    epoch: int
    environment: dict[str, str]
    leave: bool = False
    after_loss: bool = False

    @classmethod
    def parse(cls, text: str, source: str) -> SwitchRequest:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(doc).__name__}")
        epoch, env = doc.get("epoch"), doc.get("environment")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"{source}: epoch={epoch!r}: expected an integer >= 0")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ConfigError(f"{source}: environment: expected an object of strings")
        flags = {key: doc.get(key, False) for key in ("leave", "after_loss")}
        for key, value in flags.items():
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key}={value!r}: expected true or false")
        return cls(epoch, dict(env), **flags)

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "environment": self.environment,
                "leave": self.leave,
                "after_loss": self.after_loss,
            }
        )


def write_request(path: Path, request: SwitchRequest) -> None:
    """The agent's side: the request in ``path``, whole or not at all."""
    part = path.with_name(f"{path.name}.part")
    part.write_text(request.to_json())
    part.replace(path)


def agent_files(path: Path) -> tuple[Path, Path, Path]:
    """The request, the worker's "can switch" marker and its claim of a loss: the agent removes
    them before it starts a worker."""
    return path, Path(f"{path}{READY_SUFFIX}"), Path(f"{path}{CLAIMED_SUFFIX}")


def claim(path: Path, epoch: int) -> None:
    """The worker's side: it took a loss in process (``run/rejoin.py``) in the gang of
    ``epoch`` and waits for the new membership."""
    Path(f"{path}{CLAIMED_SUFFIX}").write_text(f"{epoch}\n")


def claimed(path: Path) -> int | None:
    """The epoch of the gang whose loss the worker given ``path`` last claimed (None: none)."""
    try:
        text = Path(f"{path}{CLAIMED_SUFFIX}").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def can_switch(path: Path) -> bool:
    """Whether the worker given ``path`` said it can switch in process."""
    return Path(f"{path}{READY_SUFFIX}").exists()


class SwitchWatch:
    """This worker's side of the agent's file: says it can switch, and reads a request at each
    step boundary (a ``stat``; the file is read again only when it changed)."""

    def __init__(self, path: Path, epoch: int) -> None:
        self.path, self.epoch = path, epoch
        self._stamp: tuple[int, int] | None = None
        self._request: SwitchRequest | None = None
        self._said: str | None = None
        Path(f"{path}{READY_SUFFIX}").write_text(f"{os.getpid()}\n")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], enabled: bool) -> SwitchWatch | None:
        """The watch of a manager built with ``in_process_switch=True`` under the agent."""
        path = environ.get(envvars.SWITCH_FILE, "").strip()
        if not (enabled and path):
            return None
        return cls(Path(path), membership.epoch_from(environ) or 0)

    def pending(self) -> SwitchRequest | None:
        """The request of an epoch newer than this gang's, if the agent wrote one."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._request = SwitchRequest.parse(self.path.read_text(), str(self.path))
            except (OSError, ValueError, ConfigError) as exc:
                if str(exc) != self._said:  # said once; the file is read again when it changes
                    log.warning("in-process switch: %s is not a request (%s)", self.path, exc)
                    self._said = str(exc)
                self._request = None
        request = self._request
        return request if request is not None and request.epoch > self.epoch else None

    def agreement(self) -> list[int]:
        """This rank's part of the step's agreement: ``[E, -E]``, E the epoch it was asked to
        switch to (0: none)."""
        request = self.pending()
        epoch = 0 if request is None else request.epoch
        return [epoch, -epoch]

    def agreed(self, values: Sequence[int]) -> SwitchRequest | None:
        """The request to switch to now: every rank holds the same epoch (maximum = minimum)."""
        high, low = values[0], -values[1]
        request = self._request
        if high and high == low and request is not None and request.epoch == high:
            return request
        return None


def expects_peer_state(environ: Mapping[str, str]) -> bool:
    """Whether the agent started this worker for a membership that switches in process."""
    return environ.get(envvars.PEER_STATE, "").strip() == "1"


def check_switchable(model: Any, remote: Any) -> None:
    """``in_process_switch=True`` needs replicated state and the module itself: a model wrapped
    in ``DistributedDataParallel`` before the manager would make a new rank's wrapper wait for
    the old ranks' before the state is handed over. A switch closes the manager's object-store
    backend and builds it again, which it can do only for the one it built (``folder=s3://``),
    not for a ``remote=`` object of the script's."""
    if remote is not None:
        raise ConfigError(
            "in_process_switch=True with remote=: a switch closes the backend and builds it "
            "again, which only a backend of the runtime's own can do; give folder='s3://...'"
        )
    from torch.distributed.tensor import DTensor  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    if isinstance(model, DistributedDataParallel):
        raise ConfigError(
            "in_process_switch=True: pass the module (model.module), not its "
            "DistributedDataParallel wrapper, and wrap it after resume() and again after each "
            "MembershipSwitched (docs/survivors.md)"
        )
    if model is not None and any(isinstance(p, DTensor) for p in model.parameters()):
        raise ConfigError(
            "in_process_switch=True: a sharded model (FSDP2) cannot switch in process; its "
            "ranks hold different shards (only replicated state is handed over)"
        )
