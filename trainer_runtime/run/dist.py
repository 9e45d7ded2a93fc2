"""Coordination between ranks for commits and resume decisions.

Checkpoint collectives run on a dedicated gloo group so they never interleave with the
training's own collectives (NCCL or gloo) and may run from the background save thread.
Without torch.distributed the coordinator degenerates to a single rank and every call is local.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from .. import envvars
from ..errors import ConfigError
from . import arguments


class Coordinator:
    def __init__(self, timeout: timedelta = timedelta(minutes=10)) -> None:
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self._group: Any = dist.new_group(backend="gloo", timeout=timeout)
            # A group still open when the interpreter finalizes can abort the process (see
            # close()). The exit hook runs after the save threads are joined and before
            # finalizing; it holds the group itself, since a coordinator that nobody closed
            # may be gone long before while the group stays registered with torch.
            self._open: list[Any] = [self._group]
            atexit.register(_destroy_at_exit, self._open)
        elif (env_world := env_world_size()) > 1:
            raise ConfigError(
                f"{envvars.WORLD_SIZE}={env_world} but torch.distributed is not initialized: "
                "call torch.distributed.init_process_group() before building the "
                "CheckpointManager"
            )
        else:
            env_rank()  # checked: a malformed RANK is named, not ignored
            self.rank, self.world_size, self._group = 0, 1, None
        self.local_rank = arguments.environment_integer(
            envvars.LOCAL_RANK, os.environ, 0, "a local rank >= 0", lambda n: n >= 0
        )

    @classmethod
    def solo(cls, local_rank: int = 0) -> Coordinator:
        """A coordinator of this process alone (rank 0 of 1, every call local), whatever
        torch.distributed says: for a save one process makes while its gang's group is broken
        (``save/survivor.py``)."""
        solo = cls.__new__(cls)
        solo.rank, solo.world_size, solo._group, solo._open = 0, 1, None, []
        solo.local_rank = local_rank
        return solo

    @property
    def distributed(self) -> bool:
        return self._group is not None

    @property
    def group(self) -> Any:
        """The dedicated gloo group (None with one process): for DCP's collectives."""
        return self._group

    def all_gather(self, obj: Any) -> list[Any]:
        if self._group is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def max_ints(self, values: list[int]) -> list[int]:
        """Element-wise max over ranks: how every rank agrees on a flag at the same step."""
        if self._group is None:
            return values
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return t.tolist()

    def barrier(self) -> None:
        if self._group is not None:
            self.all_gather(None)

    def close(self) -> None:
        """Destroy the group now, while the interpreter is whole. Idempotent and local.

        A gloo group left to interpreter shutdown can abort the process (SIGABRT): its worker
        thread needs the GIL to free a finished collective's tensors after Python has gone.
        Destroying a gloo subgroup is not a collective: it closes this rank's connections, as
        exiting would, and every collective this rank took part in is complete on its side,
        so peers still finishing the last one already hold its data. No barrier first: close
        runs on error and SIGTERM paths too, where a peer may never arrive. Call it only
        when no thread of this process uses the group any more. After the world group is
        destroyed (``dist.destroy_process_group()``) the subgroup is already gone.
        """
        group, self._group = self._group, None
        if group is not None:
            self._open.clear()
            destroy_if_open(group)


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when unset), checked."""
    return arguments.environment_integer(
        envvars.WORLD_SIZE, os.environ, 1, "a world size >= 1", lambda n: n >= 1
    )


def env_rank() -> int:
    """``RANK`` from the environment (0 when unset), checked."""
    return arguments.environment_integer(
        envvars.RANK, os.environ, 0, "a rank >= 0", lambda n: n >= 0
    )


def destroy_if_open(group: Any) -> None:
    """Destroy ``group`` (None: the world group) unless it, or the world group, is gone."""
    if dist.is_initialized():
        with contextlib.suppress(ValueError):  # already destroyed by the caller
            dist.destroy_process_group(group)


def _destroy_at_exit(still_open: list[Any]) -> None:
    """Destroy a group the program never closed (an exception ended it, or no close())."""
    while still_open:
        destroy_if_open(still_open.pop())


def failure_cause(wrapped: Any) -> BaseException:
    """The exception of one rank's entry in ``CheckpointException.failures`` (DCP stores it
    with its traceback)."""
    return wrapped[0] if isinstance(wrapped, tuple) else wrapped


def describe_failures(exc: CheckpointException) -> str:
    """One line per failed rank, ``rank r: Type: message``, without DCP's tracebacks."""
    parts = []
    for r, wrapped in sorted(exc.failures.items()):
        e = failure_cause(wrapped)
        parts.append(f"rank {r}: {type(e).__name__}: {' '.join(str(e).split())}")
    return "; ".join(parts)[:2000]


def world_group_timeout() -> timedelta | None:
    """The timeout the script gave the default process group (``init_process_group(timeout=)``),
    read from its backend; None when torch does not say (then torch's default applies)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        for device_type in group._device_types:
            timeout = group._get_backend(device_type).options._timeout
            if isinstance(timeout, timedelta):
                return timeout
    except (AttributeError, RuntimeError, ValueError):
        pass
    return None


def init_world_group(backend: str, timeout: timedelta | None) -> None:
    """Form the default process group from the environment with ``backend`` and, where the
    script gave one (``world_group_timeout``), its timeout: a long collective the script
    allowed for must not time out after an in-process switch."""
    if timeout is None:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, timeout=timeout)
