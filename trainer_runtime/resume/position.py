"""The runtime's own part of a loaded checkpoint: the training position, metrics and extras,
then the data overrides of this run.

Tensors go into the model and optimizer first (``resume/restore.py``, through DCP or a format-1 rank
file); what is left of the saved state is the position the run continues from. This is where
the MindSpore-style overrides (``ignore_data_position``, ``data_skip_steps``, a changed global
batch size) and an epoch that ended inside the checkpoint are applied, each once per run that
asks for it. (Rejected: applying them in the sampler, which does not know which run saved the
checkpoint and so applied them again at every relaunch.)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..run.context import RUNTIME_KEY, RunContext
from ..save.rank_contents import path_ignored
from ..timestamp import Timestamp

if TYPE_CHECKING:
    from ..sampler import ResumableSampler

log = logging.getLogger("trainer_runtime")
SAMPLER_KEY = ("state", "stateful", "sampler")


@dataclass(frozen=True)
class SavedRun:
    """What a checkpoint says about the batches of the run that saved it."""

    global_batch_size: int | None = None
    """The ``global_batch_size`` it was given, else its last ``batch_end(num_samples=...)``."""
    world_size: int | None = None
    """How many ranks saved it (None: unknown, a single rank file given as ``load_path``)."""


def apply_saved(
    ctx: RunContext,
    saved: dict[str, Any],
    *,
    weights_only: bool,
    saved_weights_only: bool = False,
    saved_world_size: int | None = None,
) -> None:
    """The runtime's own part of a restored state: position, metrics, extras.

    ``weights_only``: the caller wants the model alone (fine-tuning), so the position
    stays as it is. ``saved_weights_only``: the checkpoint holds the model, the timestamp
    and the run name only; its timestamp is restored (a re-run of a ``weights_only=True``
    job continues where it stopped) and the sampler is placed where the timestamp says, as
    it is for a checkpoint saved without a sampler. ``saved_world_size``: the manifest's.
    """
    if weights_only:
        return
    pos = ctx.position
    if "timestamp" in saved:
        pos.timestamp = Timestamp.from_dict(saved["timestamp"])
    pos.metrics = dict(saved.get("metrics", {}))
    pos.extras = dict(saved.get("extras", {}))
    runtime = pos.extras.pop(RUNTIME_KEY, None) or {}
    run = SavedRun(runtime.get("global_batch_size"), saved_world_size)
    if saved_weights_only:
        log.info(
            "weights-only checkpoint: model and timestamp restored; optimizer, schedulers "
            "and RNG start fresh"
        )
        _place_sampler_at_timestamp(ctx, run, "weights-only checkpoint")
    elif _sampler_state_missing(ctx, saved):
        _place_sampler_at_timestamp(ctx, run, "checkpoint saved without a sampler")
    _apply_data_overrides(
        ctx,
        run,
        runtime.get("data_overrides") or {},
        runtime.get("data_position"),
    )
    roll_over_finished_epoch(ctx)
    pos.mark_saved()


def _sampler_state_missing(ctx: RunContext, saved: Mapping[str, Any]) -> bool:
    """Whether a registered sampler would keep a position the checkpoint does not hold: it
    was saved without one. Not when the sampler's state is left out on purpose
    (``ignore_data_position``: the overrides place it; ``load_ignore_keys``: it keeps its
    live position)."""
    if ctx.sampler is None or "sampler" in saved.get("stateful", {}):
        return False
    settings = ctx.settings
    patterns = [p.strip("/") for p in settings.load_ignore_keys]
    return not settings.ignore_data_position and not path_ignored(SAMPLER_KEY, patterns)


def _place_sampler_at_timestamp(ctx: RunContext, run: SavedRun, source: str) -> None:
    """Without the sampler's saved state (``source`` holds none; with ``ignore_data_position``
    it is not loaded) the data position is the timestamp's, in the sampler's order for the
    timestamp's epoch: ``sample_in_epoch`` (the global count ``batch_end(num_samples=...)``
    added up), else ``batch_in_epoch`` batches of the saving run's global batch size, else of
    this sampler's ``batch_size`` times the world size when as many ranks saved it. Otherwise
    the samples of the epoch's batches are unknown: a warning says the data position is not
    restored, and the sampler starts the timestamp's epoch at its first sample."""
    sampler, ts = ctx.sampler, ctx.position.timestamp
    if sampler is None:
        return
    sampler.epoch, sampler.offset = ts.epoch, 0
    if ts.sample_in_epoch:
        sampler.advance(ts.sample_in_epoch)
        how = "its sample count"
    elif ts.batch_in_epoch:
        per_batch, how = _samples_per_batch(sampler, run)
        if per_batch is None:
            log.warning(
                "data position not restored (%s: no sampler state): its timestamp records %d "
                "batches of epoch %d but no sample count (%s); the sampler starts "
                "epoch %d at its first sample. If those batches held ResumableSampler("
                "batch_size=...) per rank at this world size, pass data_skip_steps=%d",
                source,
                ts.batch_in_epoch,
                ts.epoch,
                how,
                ts.epoch,
                ts.batch_in_epoch,
            )
            return
        sampler.advance(ts.batch_in_epoch * per_batch)
    else:
        how = "the start of the epoch"
    log.info(
        "%s: no sampler state; the sampler starts at sample %d of epoch %d, placed by the "
        "checkpoint's timestamp (%s)",
        source,
        sampler.offset,
        sampler.epoch,
        how,
    )


def _samples_per_batch(sampler: ResumableSampler, run: SavedRun) -> tuple[int | None, str]:
    """The global samples in each of the saving run's batches, and how that is known (or,
    with None, why it is not)."""
    if run.global_batch_size:
        return run.global_batch_size, f"batches of the saved global batch {run.global_batch_size}"
    unknown = "batch_end() was given no num_samples and the run no global_batch_size"
    if sampler.batch_size is None:
        return None, f"{unknown}, and this sampler has no batch_size"
    if run.world_size != sampler.num_replicas:
        saved_by = "an unknown number of" if run.world_size is None else str(run.world_size)
        return None, f"{unknown}, and {saved_by} rank(s) saved it, not {sampler.num_replicas}"
    per_batch = sampler.batch_size * sampler.num_replicas
    return per_batch, f"batch_size {sampler.batch_size} x {sampler.num_replicas} rank(s)"


def _place_sampler_where_saved(
    ctx: RunContext, run: SavedRun, saved_position: Mapping[str, Any] | None
) -> None:
    """The sampler's position as the saving run recorded it (``policy.runtime_record``), when
    it is this dataset's; else the timestamp's. The timestamp counts the samples trained, not
    the ``data_skip_steps`` the saving run skipped, so placing the sampler by it alone repeated
    those steps' worth of samples at every relaunch."""
    sampler = ctx.sampler
    if (
        sampler is None
        or not saved_position
        or saved_position.get("num_samples_total") != sampler.num_samples_total
    ):
        _place_sampler_at_timestamp(ctx, run, "no recorded data position of this dataset")
        return
    sampler.load_state_dict(dict(saved_position))


def roll_over_finished_epoch(ctx: RunContext) -> None:
    """A checkpoint taken after an epoch's last batch (before ``epoch_end()``) resumes at
    the start of the next epoch: the rest of the saved epoch holds no batch, and loops
    that expect at least one batch per epoch would fail on every relaunch."""
    sampler = ctx.sampler
    if sampler is None or len(sampler) > 0:
        return
    ts = ctx.position.timestamp
    finished = ts.epoch
    ts.epoch += 1
    ts.batch_in_epoch = ts.sample_in_epoch = 0
    sampler.set_epoch(ts.epoch)
    log.info(
        "the checkpoint ends epoch %d (no data left in it): resuming at the start of epoch %d",
        finished,
        ts.epoch,
    )


def _apply_data_overrides(
    ctx: RunContext,
    run: SavedRun,
    saved_overrides: Mapping[str, Any],
    saved_position: Mapping[str, Any] | None = None,
) -> None:
    """Changed dataset or batch size: MindSpore-style overrides of the data position.

    Each applies once: ``saved_overrides`` are those of the run that wrote the checkpoint,
    whose data position already follows them. A relaunch of the same script after a
    preemption (the overrides still passed) resumes at the exact position; re-applying
    them restarted the epoch's data, or skipped ``data_skip_steps`` more steps, at every
    relaunch."""
    settings, sampler = ctx.settings, ctx.sampler
    ts = ctx.position.timestamp
    ignore = settings.ignore_data_position
    if ignore and saved_overrides.get("ignore_data_position") is True:
        ignore = False
        # The sampler's saved state was not loaded (with the override it never is: it may
        # be another dataset's); the position the saving run recorded is this dataset's.
        _place_sampler_where_saved(ctx, run, saved_position)
        log.info(
            "ignore_data_position: already applied by the run that saved this checkpoint; "
            "its data position is kept (epoch %d, sample %d of it)",
            ts.epoch,
            sampler.offset if sampler is not None else ts.sample_in_epoch,
        )
    skip = settings.data_skip_steps
    if skip and saved_overrides.get("data_skip_steps") == skip:
        skip = 0
        log.info(
            "data_skip_steps=%d: already applied by the run that saved this checkpoint; "
            "nothing more is skipped (pass another value to skip again)",
            settings.data_skip_steps,
        )
    if ignore:
        ts.batch_in_epoch = ts.sample_in_epoch = 0
        if sampler is not None:
            sampler.epoch, sampler.offset = ts.epoch, 0
        log.info(
            "ignore_data_position: data restarts at the start of epoch %d, weights and step kept",
            ts.epoch,
        )
    if skip and sampler is not None:
        sampler.advance(skip * sampler.batch_size * sampler.num_replicas)
        log.info("data_skip_steps: skipped %d steps of data", skip)
    new, saved_global_batch = settings.global_batch_size, run.global_batch_size
    if new and saved_global_batch and new != saved_global_batch:
        ts.batch = ts.sample // new
        ts.batch_in_epoch = ts.sample_in_epoch // new
        log.info(
            "global batch size %d -> %d: step counter rescaled to %d",
            saved_global_batch,
            new,
            ts.batch,
        )
