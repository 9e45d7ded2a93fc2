"""Training progress counters and the save-interval language built on them.

Progress is counted in three units a user can reason about (epochs, batches, samples), like
Composer's time strings, so ``interval="500ba"`` reads the same here. The global sample count
is what survives a change of world size or batch size (see ``sampler.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from typing import Any

from .errors import ConfigError


class Event(StrEnum):
    """The points of the training loop where a save may happen."""

    BATCH_END = "batch_end"
    EPOCH_END = "epoch_end"


@dataclass
class Timestamp:
    """Where training is. Counters count work *completed*; all start at zero."""

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    wall_time: float = 0.0
    """Seconds spent training, summed over every attempt of the run."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def copy(self) -> Timestamp:
        return replace(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timestamp:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def sort_key(self) -> tuple[int, int, int, float]:
        """Order of progress: more samples is newer; batches, then epochs break ties (all
        that orders a run that counts no samples). The sample count comes first because it
        is the one counter a resume never moves back: a relaunch with a larger
        ``global_batch_size`` rescales the step down (160 samples: step 10 at 16 a step,
        5 at 32), and ordered by step the checkpoints it saved were older than the one it
        resumed from (its first save was refused as writing behind it)."""
        return (self.sample, self.batch, self.epoch, self.wall_time)


IntervalFn = Callable[[Timestamp, Event], bool]

_TIME_RE = re.compile(r"^\s*(\d+)\s*(ep|ba|sp)\s*$")
_ACCEPTED = (
    "an int (epochs), a string like '1ep', '500ba' or '2000sp', "
    "or a callable(timestamp, event) -> bool"
)


@dataclass(frozen=True)
class SaveInterval:
    """Decides whether the loop point just reached is a save point."""

    unit: str  # "ep", "ba", "sp" or "fn"
    every: int = 0
    fn: IntervalFn | None = None

    @classmethod
    def parse(cls, value: int | str | IntervalFn, *, arg: str = "interval") -> SaveInterval:
        if callable(value):
            return cls("fn", fn=value)
        if isinstance(value, bool):
            raise ConfigError(f"{arg}={value!r} is not valid: expected {_ACCEPTED}")
        if isinstance(value, int):
            if value <= 0:
                raise ConfigError(f"{arg}={value!r} must be a positive number of epochs")
            return cls("ep", every=value)
        if isinstance(value, str):
            m = _TIME_RE.match(value)
            if m and int(m.group(1)) > 0:
                return cls(m.group(2), every=int(m.group(1)))
        raise ConfigError(f"{arg}={value!r} is not valid: expected {_ACCEPTED}")

    @property
    def needs_samples(self) -> bool:
        return self.unit == "sp"

    def should_save(self, now: Timestamp, before: Timestamp, event: Event) -> bool:
        """``before`` is the timestamp at the previous loop point (for sample intervals)."""
        if self.unit == "fn":
            assert self.fn is not None
            return bool(self.fn(now, event))
        if self.unit == "ep":
            return event is Event.EPOCH_END and now.epoch % self.every == 0
        if event is not Event.BATCH_END:
            return False
        if self.unit == "ba":
            return now.batch % self.every == 0
        return now.sample // self.every > before.sample // self.every
