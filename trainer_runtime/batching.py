"""Keep the global batch constant when an elastic gang changes its world size.

An elastic job (docs/operator.md, Elastic gangs) may resume at half its ranks. Scaling the global
batch with the world size would change the optimisation (learning-rate schedules, batch-norm
statistics, the step counter's meaning) every time spot capacity moves; instead each rank runs
more micro-batches and accumulates gradients before the optimizer step, so one step still
consumes ``global_batch_size`` samples at every world size. The alternative of scaling the
learning rate with the batch was rejected as the default: it is model-specific.

Usage::

    plan = batching.plan(global_batch_size=64, world_size=ws, micro_batch_size=8)
    for step in ...:
        for i in range(plan.accumulation_steps):
            loss = model(next(batches)) / plan.accumulation_steps
            loss.backward()
        optimizer.step()
        ckpt.batch_end(num_samples=plan.global_batch_size)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .run import arguments


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step is split at one world size."""

    global_batch_size: int
    """Samples per optimizer step over all ranks (constant across world sizes)."""
    world_size: int
    micro_batch_size: int
    """Samples per forward/backward pass on one rank."""
    accumulation_steps: int
    """Micro-batches each rank accumulates before the optimizer step."""

    @property
    def per_rank_samples(self) -> int:
        """Samples one rank consumes per optimizer step."""
        return self.micro_batch_size * self.accumulation_steps


def plan(*, global_batch_size: int, world_size: int, micro_batch_size: int) -> BatchPlan:
    """Split ``global_batch_size`` over ``world_size`` ranks in micro-batches of at most
    ``micro_batch_size``; raises ConfigError when it cannot be split evenly."""
    global_batch_size, world_size, micro_batch_size = (
        arguments.integer(name, value, "a count >= 1", lambda n: n >= 1)
        for name, value in (
            ("global_batch_size", global_batch_size),
            ("world_size", world_size),
            ("micro_batch_size", micro_batch_size),
        )
    )
    if global_batch_size % world_size:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not divisible by world_size={world_size}: "
            "choose a global batch that every allowed world size divides (for example a multiple "
            "of the least common multiple of minReplicas..replicas)"
        )
    per_rank = global_batch_size // world_size
    micro = min(micro_batch_size, per_rank)
    while per_rank % micro:
        micro -= 1  # the largest micro-batch that divides the rank's share
    return BatchPlan(
        global_batch_size=global_batch_size,
        world_size=world_size,
        micro_batch_size=micro,
        accumulation_steps=per_rank // micro,
    )
