"""A sampler that knows how far into the epoch training got, and resumes exactly there.

A drop-in for ``DistributedSampler`` (and for a plain random or sequential sampler with one
rank): the epoch order is a deterministic shuffle of (seed, epoch), rank ``r`` of ``W`` takes
positions ``r, r+W, r+2W, ...`` of it. The position saved is a *global* count of samples the
training loop consumed in this epoch, not what DataLoader workers prefetched: the checkpoint
manager advances it at each ``batch_end()``. Because every global position below the count has
been consumed by some rank, the rest of the epoch can be re-dealt to any new world size
without repeating or skipping a sample.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from .errors import CheckpointError, ConfigError
from .run import arguments
from .run.dist import env_rank, env_world_size

log = logging.getLogger(__name__)


class DataPositionError(CheckpointError):
    """The saved data position does not fit the dataset being resumed."""


class ResumableSampler(Sampler[int]):
    def __init__(  # noqa: PLR0917 - DistributedSampler's positional order, as a drop-in
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: int | None = None,
    ) -> None:
        """The arguments of ``DistributedSampler``, in its order (positional or by name), plus
        ``batch_size``, by name only: the per-rank batch size, needed only for ``advance()``
        without an argument and for ``data_skip_steps``."""
        self.num_samples_total = dataset if isinstance(dataset, int) else len(dataset)
        if self.num_samples_total <= 0:
            raise ConfigError(f"dataset has {self.num_samples_total} samples; expected at least 1")
        world = arguments.optional_integer("num_replicas", num_replicas, "a count >= 1", _pos)
        world = world if world is not None else _dist_world()
        given_rank = arguments.optional_integer("rank", rank, "a rank >= 0", lambda n: n >= 0)
        self.rank = given_rank if given_rank is not None else _dist_rank()
        if world < 1 or not 0 <= self.rank < world:
            raise ConfigError(
                f"rank={self.rank} num_replicas={world}: expected 0 <= rank < replicas"
            )
        self.num_replicas = world
        self.shuffle = arguments.flag("shuffle", shuffle)
        self.seed = arguments.integer("seed", seed, "a random seed", lambda n: True)
        self.drop_last = arguments.flag("drop_last", drop_last)
        self.batch_size = arguments.optional_integer(
            "batch_size", batch_size, "a positive per-rank batch size", _pos
        )
        self.epoch = 0
        self.offset = 0
        """Samples of this epoch consumed by all ranks together."""

    # ----------------------------------------------------------------- order
    def epoch_order(self, epoch: int | None = None) -> list[int]:
        """The whole epoch's global order, before dealing to ranks."""
        n = self.num_samples_total
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + (self.epoch if epoch is None else epoch))
        return torch.randperm(n, generator=g).tolist()

    def _remaining_global(self) -> list[int]:
        rest = self.epoch_order()[self.offset :]
        world = self.num_replicas
        if self.drop_last:
            return rest[: len(rest) - len(rest) % world]
        if rest and len(rest) % world:
            pad = world - len(rest) % world
            rest = rest + (rest * math.ceil(pad / len(rest)))[:pad]
        return rest

    def __iter__(self) -> Iterator[int]:
        return iter(self._remaining_global()[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return len(self._remaining_global()) // self.num_replicas

    # ----------------------------------------------------------------- progress
    def set_epoch(self, epoch: int) -> None:
        """Like DistributedSampler.set_epoch; a new epoch starts at its first sample."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.offset = 0

    def advance(self, num_samples: int | None = None) -> None:
        """Record that the loop consumed ``num_samples`` samples (all ranks together)."""
        if num_samples is None:
            if self.batch_size is None:
                raise ConfigError(
                    "advance() without a count needs ResumableSampler(batch_size=...)"
                )
            num_samples = self.batch_size * self.num_replicas
        self.offset = min(self.offset + num_samples, self.num_samples_total)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples_total": self.num_samples_total,
            "num_replicas": self.num_replicas,
        }

    def check_state(self, state: dict[str, Any]) -> None:
        """``DataPositionError`` unless ``state`` is a position in a dataset of this size (a
        load checks it before it changes any live state)."""
        if state["num_samples_total"] != self.num_samples_total:
            raise DataPositionError(
                f"the checkpoint's data position is for a dataset of {state['num_samples_total']} "
                f"samples, this one has {self.num_samples_total}; pass "
                "ignore_data_position=True to restart the data (weights and step are kept)"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        if (state["seed"], state["shuffle"]) != (self.seed, self.shuffle):
            log.warning(
                "sampler seed/shuffle changed since the checkpoint (%s/%s -> %s/%s): the rest "
                "of the epoch follows the new order",
                state["seed"],
                state["shuffle"],
                self.seed,
                self.shuffle,
            )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        if state.get("num_replicas", self.num_replicas) != self.num_replicas:
            log.info(
                "data position re-dealt from %d to %d ranks at global sample %d of epoch %d",
                state["num_replicas"],
                self.num_replicas,
                self.offset,
                self.epoch,
            )


def _dist_world() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return env_world_size()


def _dist_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return env_rank()


def _pos(n: int) -> bool:
    return n >= 1
