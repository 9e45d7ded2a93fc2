"""The sharded engine's load: a version-2 checkpoint read into the live state at any world size.

Every rank reads into host staging buffers first (``staging.HostStager``), verifying every chunk
as it arrives (``reading.VerifyingReader``); only when every rank has read and verified
everything does it copy into the live tensors, in place. An optimizer without state yet (a
relaunched process) is read into new tensors built from the checkpoint's metadata instead, which
become its state once verified (``optim_target``); an optimizer with state takes the verified
buffers as its state. A failure on any rank fails every rank alike, with the live state
untouched. (Rejected: reading straight into the live tensors, which a corrupt chunk would leave
half overwritten.)
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

from ..errors import ConfigError, CorruptCheckpointError, IncompatibleCheckpointError
from ..run import rng
from ..run.dist import Coordinator, describe_failures, failure_cause
from ..save import rank_contents as state_mod
from ..save import safe_unpickle
from ..save.manifest import FORMAT_VERSION_SHARDED, FileEntry, Manifest
from . import fitting, optim_target
from .device_ring import load_targets
from .keys import MODEL_KEY, OPTIM_KEY, RANKS_KEY
from .live_state import small_components, tensor_state
from .reading import VerifyingReader
from .staging import HostStager, copy_into_live
from .storage import METADATA_NAME, read_metadata_bytes

log = logging.getLogger("trainer_runtime")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside; the collector's previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, but pickled objects load with ``weights_only`` unless trusted."""

    def __init__(self, *, trusted: bool, allow_partial_load: bool) -> None:
        super().__init__(allow_partial_load=allow_partial_load)
        self._trusted = trusted

    def create_local_plan(self) -> LoadPlan:
        """DCP's plan. A target that does not fit the checkpoint (a shape, a missing key) is an
        ``IncompatibleCheckpointError``: the checkpoint is sound, the live state differs from
        it, and no fallback would fare better."""
        try:
            return super().create_local_plan()
        except (ValueError, RuntimeError) as exc:
            raise IncompatibleCheckpointError(f"the live state does not fit: {exc}") from exc

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=not self._trusted)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import (  # noqa: PLC0415
                set_element,
            )

            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


@dataclass
class LoadReport:
    """What a load did, for the log line and the tests."""

    saved_world_size: int
    source_rank: int
    rng: str
    """'restored' (same rank's stream), 'derived' (new rank on a larger world) or 'none'
    (weights only, or ``load_ignore_keys`` dropped ``rng``: the generators are as they were)."""
    bytes_read: int
    seconds: float
    onto_gpu: bool = False
    """GPU tensors were read straight onto the GPU (``device_ring``), not via host memory."""


def _check_sharded(folder: Path, manifest: Manifest) -> None:
    """A version-1 checkpoint is a ``ConfigError``: sound, but not this engine's format."""
    if not manifest.sharded:
        raise ConfigError(
            f"ShardedEngine.load: checkpoint {folder} has format_version "
            f"{manifest.format_version} (one rank{{r}}.pt per rank), not "
            f"{FORMAT_VERSION_SHARDED}; load it with CheckpointManager.load() or resume(), "
            "which read both versions"
        )


def _fit_model(
    live: dict[str, Any], metadata: Metadata, patterns: list[str], *, strict: bool
) -> set[str]:
    """Drop from ``live`` what ``patterns`` ignore and (``strict=False``) the model's keys
    whose saved shape differs; returns the keys not loaded."""
    ignored = fitting.drop_ignored(live, patterns)
    skipped: list[str] = []
    if MODEL_KEY in live:
        skipped = fitting.fit_model(live[MODEL_KEY], metadata, strict=strict, ignored=patterns)
    return {*skipped, *ignored}


class ShardedLoader:
    """Loads of version-2 checkpoints into one run's live components (collective)."""

    def __init__(
        self,
        components: state_mod.Components,
        coord: Coordinator,
        stager: HostStager,
        *,
        trusted_pickle: bool = False,
    ) -> None:
        self.components = components
        self.coord = coord
        self.rank, self.world_size = coord.rank, coord.world_size
        self.stager = stager
        """Shared with the save side: loads read into the buffers async saves stage into."""
        self.trusted_pickle = trusted_pickle

    @gc_paused()
    def load(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
    ) -> tuple[dict[str, Any], LoadReport]:
        """Load a version-2 checkpoint into the live components; collective over all ranks.

        Returns the saved small state (timestamp, metrics, extras...) like
        ``rank_contents.restore``.
        Raises ``CorruptCheckpointError`` on every rank when any rank read a chunk that fails
        its digest; the live state is untouched then. A version-1 manifest is a ``ConfigError``
        (its checkpoint is sound, but not this engine's format).

        The cyclic garbage collector is paused for the call, as DCP's own state-dict functions
        pause it: the metadata and the load plan are thousands of small objects, and in a
        process that just imported torch their allocation set off the first full collection
        of torch's ~270,000 objects (0.13 s of a 0.43 s load of 96 MiB), which no loaded
        object needs.
        """
        _check_sharded(folder, manifest)
        started = time.monotonic()
        meta_entry = next((f for f in manifest.files if f.path == METADATA_NAME), None)
        metadata = self._agreed_metadata(folder, meta_entry)
        weights_only = weights_only or manifest.weights_only
        saved_ws = manifest.world_size
        source = self.rank if self.rank < saved_ws else 0
        patterns = [p.strip("/") for p in ignore_keys]
        live = tensor_state(self.components, weights_only=True)  # the model; the optimizer below
        not_loaded = _fit_model(live, metadata, patterns, strict=strict)
        make = partial(
            self._targets, live, metadata, weights_only, not_loaded=not_loaded, patterns=patterns
        )
        target, fresh_optim = load_targets(make)
        target[RANKS_KEY] = {str(source): b""}
        reader = VerifyingReader(
            folder, expected_metadata=meta_entry, trusted=self.trusted_pickle, metadata=metadata
        )
        self._read(folder, target, reader, partial_load=not strict or bool(patterns))
        # Unpickled before anything live changes: one that fails fails every rank alike.
        data = self._agreed_rank_state(folder, target[RANKS_KEY][str(source)])
        if not weights_only:  # the same saved position on every rank: all raise alike
            state_mod.check_data_position(self.components, data, patterns)
        self._into_live(live, target, fresh_optim)
        rng_mode = self._rng_mode(data, patterns, weights_only=weights_only, saved_ws=saved_ws)
        small_patterns = [p for p in patterns if not p.startswith(("state/model", "state/optim"))]
        saved = state_mod.restore(
            small_components(self.components),
            data,
            weights_only=weights_only,
            strict=strict,
            ignore_keys=small_patterns,
        )
        seconds, onto_gpu = time.monotonic() - started, reader.ring_copies > 0
        return saved, LoadReport(saved_ws, source, rng_mode, reader.bytes_read, seconds, onto_gpu)

    def _targets(
        self,
        live: dict[str, Any],
        metadata: Metadata,
        weights_only: bool,
        gpu_on_gpu: bool,
        *,
        not_loaded: set[str],
        patterns: list[str],
    ) -> tuple[dict[str, Any], Any]:
        """``load_targets``'s ``make``: the tree the load reads into, and the fresh optimizer
        state it reads into instead of the live one (None: into the staging buffers, or no
        optimizer). ``live`` gains the optimizer's state when it is loaded in place. The
        optimizer state of ``not_loaded`` keys' parameters is not loaded either."""
        # An ignored optimizer is not even initialised (taking its state dict would).
        skip_optim = fitting.optimizers_ignored(patterns)
        with_optim = not weights_only and not skip_optim and bool(self.components.model)
        fresh = None
        if with_optim:
            fresh = optim_target.plan(
                self.components.model,
                self.components.optimizers,
                metadata,
                OPTIM_KEY,
                skip=not_loaded,
                skip_path=lambda path: fitting.optimizer_path_ignored(path, patterns),
                gpu_on_gpu=gpu_on_gpu,
            )
        if not (weights_only or skip_optim) and fresh is None and OPTIM_KEY not in live:
            live.update(
                fitting.optimizer_state(
                    self.components, metadata, skip=not_loaded, ignored=patterns
                )
            )
        tree = self.stager.empty_like(live, gpu_on_gpu=gpu_on_gpu)
        if fresh is not None:  # read into new tensors, adopted below once verified
            tree[OPTIM_KEY] = fresh
        return tree, fresh

    def _read(
        self, folder: Path, target: dict[str, Any], reader: VerifyingReader, *, partial_load: bool
    ) -> None:
        """DCP's collective load into ``target``, every chunk verified as it is read; a failure
        on any rank is an ``IncompatibleCheckpointError`` (the state does not fit) or a
        ``CorruptCheckpointError`` on all, the live state untouched."""
        try:
            dcp.load(
                target,
                storage_reader=reader,
                planner=_SafeLoadPlanner(
                    trusted=self.trusted_pickle, allow_partial_load=partial_load
                ),
                process_group=self.coord.group,
                no_dist=not self.coord.distributed,
            )
        except CheckpointException as exc:
            why = describe_failures(exc)
            if all(
                isinstance(failure_cause(f), IncompatibleCheckpointError)
                for f in exc.failures.values()
            ):
                raise IncompatibleCheckpointError(
                    f"checkpoint {folder} does not fit the live state, which is untouched: {why}"
                ) from exc
            raise CorruptCheckpointError(
                f"checkpoint {folder} failed to load, live state untouched: {why}"
            ) from exc

    def _into_live(self, live: dict[str, Any], target: dict[str, Any], fresh_optim: Any) -> None:
        """The verified tensors into the live state: copied, or (the optimizer's state) the
        staging buffers or the fresh tensors they were read into exchanged for the live ones."""
        handed_over = self._optimizer_exchanges(live, target, fresh_optim)
        problems: list[str] = []
        copy_into_live(
            live,
            target,
            on_mismatch=lambda p, why: problems.append(f"{p}: {why}"),
            skip={item.path for item in handed_over},
        )
        if problems:
            raise IncompatibleCheckpointError("loaded state does not fit: " + "; ".join(problems))
        # The optimizer's state tensors are other objects now: the next save's ``_signature``
        # differs, so it takes a new state dict instead of the cached one.
        optim_target.exchange(handed_over, self.stager.exchange)
        if OPTIM_KEY in live or fresh_optim is not None:
            fitting.restore_param_groups(self.components.optimizers, target[OPTIM_KEY])
        if fresh_optim is not None:
            optim_target.adopt(self.components.model, self.components.optimizers, fresh_optim)

    def _rng_mode(
        self, data: dict[str, Any], patterns: list[str], *, weights_only: bool, saved_ws: int
    ) -> str:
        """How the random generators are restored ("none", "restored", or "derived": a rank
        the saving world did not have gets rank 0's state, derived for its rank in ``data``)."""
        rng_dropped = state_mod.path_ignored(("rng",), patterns)  # restore drops it
        rng_mode = "none" if weights_only or rng_dropped or "rng" not in data else "restored"
        if rng_mode != "none" and saved_ws != self.world_size and self.rank >= saved_ws:
            data["rng"] = rng.derived(data["rng"], self.rank)
            rng_mode = "derived"
        return rng_mode

    def _optimizer_exchanges(
        self, live: dict[str, Any], target: dict[str, Any], fresh_optim: Any
    ) -> list[optim_target.Exchange]:
        """A running process's optimizer state that the verified staging buffers replace
        instead of being copied into (``optim_target.exchanges``)."""
        if fresh_optim is not None or OPTIM_KEY not in live or self.components.model is None:
            return []
        return optim_target.exchanges(
            self.components.model,
            self.components.optimizers,
            live[OPTIM_KEY],
            target.get(OPTIM_KEY, {}),
            prefix=f"/{OPTIM_KEY}",
            holds=self.stager.holds,
        )

    def _agreed_metadata(self, folder: Path, entry: FileEntry | None) -> Metadata:
        """Every rank reads and checks ``.metadata``; any failure fails all ranks alike."""
        metadata, problem = None, None
        try:
            blob = (folder / METADATA_NAME).read_bytes()
            if entry is None:
                problem = "the manifest lists no .metadata"
            elif len(blob) != entry.size or xxhash.xxh3_128_hexdigest(blob) != entry.xxh3_128:
                problem = ".metadata does not match its manifest entry"
            else:
                metadata = read_metadata_bytes(blob, trusted=self.trusted_pickle)
        except Exception as exc:  # unreadable or disallowed pickle: the checkpoint is unusable
            problem = f".metadata unreadable: {type(exc).__name__}: {exc}"
        self._fail_everywhere(problem, f"checkpoint {folder}")
        assert metadata is not None
        return metadata

    def _agreed_rank_state(self, folder: Path, blob: bytes) -> dict[str, Any]:
        """The saved rank's small state, unpickled on every rank; a failure on any rank is a
        ``CorruptCheckpointError`` on all (resume passes the checkpoint over)."""
        data, problem = None, None
        try:
            data = torch.load(io.BytesIO(blob), weights_only=not self.trusted_pickle)
        except Exception as exc:  # UnpicklingError, or a truncated or foreign blob
            why = safe_unpickle.describe_unloadable(blob, exc, trusted=self.trusted_pickle)
            problem = f"rank {self.rank}'s saved state does not load: {why}"
        self._fail_everywhere(problem, f"checkpoint {folder} failed to load, live state untouched")
        assert data is not None
        return data

    def _fail_everywhere(self, problem: str | None, context: str) -> None:
        """Collective: ``CorruptCheckpointError`` on every rank when any rank had a problem
        (the first rank's, after ``context``)."""
        problems = [p for p in self.coord.all_gather(problem) if p]
        if problems:
            raise CorruptCheckpointError(f"{context}: {problems[0]}")
