"""The sharded checkpoint engine: one checkpoint written by all ranks together, read at any size.

What is saved is a DCP state dict built with ``torch.distributed.checkpoint.state_dict``:
``model`` and ``optim/<name>`` keyed by parameter name (so DDP, FSDP2 and single-process
layouts are interchangeable), plus ``ranks/<r>``: each rank's small non-tensor state (RNG,
schedulers, scaler, stateful objects such as the sampler, timestamp, metrics, extras), pickled
in the weights-only-safe form ``state.capture`` produces. DCP's planner writes each replicated
tensor once (spread over the ranks) and each shard by its owner; ``storage.HashingWriter`` lays
the bytes down with digests; the caller commits the returned file entries in a manifest.

A load reads into host staging buffers first (``staging.HostStager``), verifying every chunk as
it arrives; only when every rank has read and verified everything does it copy into the live
tensors, in place. An optimizer without state yet (a relaunched process) is read into new
tensors built from the checkpoint's metadata instead, which become its state once verified
(``optim_target``): creating its state only to copy over it would touch that memory twice. An
optimizer with state takes the verified buffers as its state, and the stager keeps the tensors
they replace (``optim_target.exchanges``). Corrupt data therefore never half-overwrites live
weights, and nothing live is left backed by a checkpoint file. The price is one host copy of
the model and optimizer state (the same buffers async saves stage into), and one memcpy of the
model.

Writing per-rank ``torch.save`` files (format version 1, ``serialization.py``) was the
alternative; it writes every replica in full and cannot change world size for sharded state.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from .. import rng, safe_state
from .. import state as state_mod
from ..dist import Coordinator, describe_failures, failure_cause
from ..errors import ConfigError, CorruptCheckpointError, IncompatibleCheckpointError
from ..manifest import FORMAT_VERSION_SHARDED, FileEntry, Manifest
from . import fitting, optim_target
from .device_ring import load_targets
from .keys import MODEL_KEY, OPTIM_KEY, RANKS_KEY
from .reading import VerifyingReader
from .staging import HostStager, copy_into_live
from .storage import METADATA_NAME, HashingWriter, read_metadata_bytes

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


class ShardedEngine:
    """Save and load one run's state as sharded DCP checkpoints (format version 2)."""

    def __init__(
        self,
        components: state_mod.Components,
        coord: Coordinator,
        *,
        commit_coord: Coordinator | None = None,
        trusted_pickle: bool = False,
        pin_memory: bool | None = None,
    ) -> None:
        self.components = components
        self.coord = coord
        self.commit_coord = commit_coord or coord
        """Writes run on this group: they may run in a background thread (see dist.py)."""
        self.rank, self.world_size = coord.rank, coord.world_size
        self.trusted_pickle = trusted_pickle
        self.stager = HostStager(pin_memory=pin_memory)
        self._cache: tuple[tuple, dict[str, Any]] | None = None
        self._written: tuple[tuple, set[str]] | None = None
        self._stage_pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ state
    def _tensor_state(self, *, weights_only: bool) -> dict[str, Any]:
        comps = self.components
        out: dict[str, Any] = {}
        if comps.model is None:
            return out
        opts = StateDictOptions()
        out[MODEL_KEY] = get_model_state_dict(comps.model, options=opts)
        if not weights_only and comps.optimizers:
            out[OPTIM_KEY] = {
                name: get_optimizer_state_dict(comps.model, opt, options=opts)
                for name, opt in comps.optimizers.items()
            }
        return out

    def _signature(self) -> tuple:
        """Identity of every live tensor the state dict refers to: while it holds, a state
        dict taken earlier still points at the live values (they change in place)."""
        comps = self.components
        if comps.model is None:
            return ()
        sig: list[Any] = [id(t) for t in comps.model.parameters()]
        sig += [id(t) for t in comps.model.buffers()]
        for opt in comps.optimizers.values():
            sig.append(len(opt.param_groups))
            for st in opt.state.values():
                # A plain value (a float step count) changes without changing identity: never
                # reuse a tree holding one (object() equals nothing).
                sig += [id(v) if isinstance(v, torch.Tensor) else object() for v in st.values()]
        return tuple(sig)

    def _cached_tensor_state(self, *, weights_only: bool) -> dict[str, Any]:
        """``_tensor_state`` for a save, reusing the tree of the previous save when the live
        tensors are the same objects: taking a state dict walks every parameter's name and
        costs tens of milliseconds, which an async save's call would otherwise stall on."""
        sig = (weights_only, self._signature())
        if self._cache is None or self._cache[0] != sig:
            tree = self._tensor_state(weights_only=weights_only)
            model = tree.get(MODEL_KEY, {})
            if all(isinstance(v, torch.Tensor) for v in model.values()):  # no _extra_state
                self._cache = ((weights_only, self._signature()), tree)
            return tree
        tree = dict(self._cache[1])
        if OPTIM_KEY in tree:  # hyperparameters are plain values a scheduler replaces
            tree[OPTIM_KEY] = {
                name: {**osd, "param_groups": _fresh_groups(osd["param_groups"], opt)}
                for (name, osd), opt in zip(
                    tree[OPTIM_KEY].items(), self.components.optimizers.values(), strict=True
                )
            }
        return tree

    def capture(
        self,
        *,
        timestamp: dict[str, Any],
        run_name: str,
        metrics: dict[str, Any],
        extras: dict[str, Any],
        weights_only: bool,
    ) -> dict[str, Any]:
        """The state dict to save, with *live* tensor references (stage before training on)."""
        small = state_mod.Components(
            schedulers=self.components.schedulers,
            scaler=self.components.scaler,
            stateful=self.components.stateful,
        )
        data = state_mod.capture(
            small,
            timestamp=timestamp,
            run_name=run_name,
            metrics=metrics,
            extras=extras,
            weights_only=weights_only,
        )
        del data["state"]["model"]
        blob = safe_state.serialize(data, trusted=self.trusted_pickle)  # refused: nothing written
        out = self._cached_tensor_state(weights_only=weights_only)
        out[RANKS_KEY] = {str(self.rank): blob}
        return out

    def stage(self, state: dict[str, Any]) -> tuple[dict[str, Any], set[str] | None]:
        """Host copy of ``state`` in reused buffers; training may go on once this returns.

        Returns the copy and the keys it holds (None: all). Once a save of the same live
        tensors has shown which replicated tensors DCP assigns to this rank (the assignment
        is a deterministic function of the plans), only those are copied.
        """
        only_keys = None
        if self._cache is not None and self._written is not None:
            sig, keys = self._written
            if sig == self._cache[0]:
                only_keys = keys
        only = None
        if only_keys is not None:
            _, mappings = flatten_state_dict(state)
            only = {"/" + "/".join(map(str, mappings[k])) for k in only_keys if k in mappings}
        staged = self._staging_thread().submit(self._copy, state, only).result()
        return staged, only_keys

    def prepare_staging(self, *, weights_only: bool) -> Callable[[], int]:
        """Take the state's structure now (on the training thread, between steps) and return
        the work that allocates and touches its staging buffers; run that with
        ``on_staging_thread`` so it is queued ahead of any copy and never races one."""
        tree = self._cached_tensor_state(weights_only=weights_only)
        return lambda: self.stager.preallocate(tree)

    def on_staging_thread(self, fn: Callable[[], int]) -> Future[int]:
        return self._staging_thread().submit(fn)

    def save_point(self, state: dict[str, Any]) -> None:
        """Call on the training thread when an async save of ``state`` starts, before
        ``stage`` (see ``HostStager.mark_save_point``)."""
        self.stager.mark_save_point(state)

    def _copy(self, state: dict[str, Any], only: set[str] | None) -> dict[str, Any]:
        staged = self.stager.stage(state, only=only)
        self.stager.synchronize()
        return staged

    def _staging_thread(self) -> ThreadPoolExecutor:
        """The copy runs on a thread of its own, never lowered in priority.

        Save schedulers persist on a background thread and lower that thread's priority once
        its copy is done (writing and hashing should yield to training). The thread is reused
        by the next save, and an unprivileged thread cannot raise its priority back, so a copy
        made there would run at the lowered priority from the second save on, and the next
        ``optimizer.step()``, which waits for the copy, would wait behind every busy thread of
        the machine.
        """
        if self._stage_pool is None:
            self._stage_pool = ThreadPoolExecutor(1, thread_name_prefix="rtj-stage")
        return self._stage_pool

    # ------------------------------------------------------------------ save
    def write(
        self, state: dict[str, Any], folder: Path, *, staged: set[str] | None = None
    ) -> list[FileEntry]:
        """Write this rank's share of ``state`` into ``folder``; collective over all ranks.

        ``staged``: the keys ``stage`` copied (None: all, or a synchronous save). Returns this
        rank's manifest entries (its data file; on rank 0 also ``.metadata``).
        """
        writer = HashingWriter(folder, staged=staged)
        sig = None if self._cache is None else self._cache[0]
        self._written = None
        dcp.save(
            state,
            storage_writer=writer,
            planner=DefaultSavePlanner(),
            process_group=self.commit_coord.group,
            no_dist=not self.commit_coord.distributed,
        )
        if sig is not None:
            self._written = (sig, writer.tensor_keys)
        return list(writer.written)

    # ------------------------------------------------------------------ load
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

        Returns the saved small state (timestamp, metrics, extras...) like ``state.restore``.
        Raises ``CorruptCheckpointError`` on every rank when any rank read a chunk that fails
        its digest; the live state is untouched then. A version-1 manifest is a ``ConfigError``
        (its checkpoint is sound, but not this engine's format).

        The cyclic garbage collector is paused for the call, as DCP's own state-dict functions
        pause it: the metadata and the load plan are thousands of small objects, and in a
        process that just imported torch their allocation set off the first full collection
        of torch's ~270,000 objects (0.13 s of a 0.43 s load of 96 MiB), which no loaded
        object needs.
        """
        if not manifest.sharded:
            raise ConfigError(
                f"ShardedEngine.load: checkpoint {folder} has format_version "
                f"{manifest.format_version} (one rank{{r}}.pt per rank), not "
                f"{FORMAT_VERSION_SHARDED}; load it with CheckpointManager.load() or resume(), "
                "which read both versions"
            )
        started = time.monotonic()
        meta_entry = next((f for f in manifest.files if f.path == METADATA_NAME), None)
        metadata = self._agreed_metadata(folder, meta_entry)
        weights_only = weights_only or manifest.weights_only
        saved_ws = manifest.world_size
        source = self.rank if self.rank < saved_ws else 0
        patterns = [p.strip("/") for p in ignore_keys]
        live = self._tensor_state(weights_only=True)  # the model; the optimizer below
        ignored = fitting.drop_ignored(live, patterns)
        skipped: list[str] = []  # mis-shaped model keys, not loaded (strict=False)
        if MODEL_KEY in live:
            skipped = fitting.fit_model(live[MODEL_KEY], metadata, strict=strict, ignored=patterns)
        not_loaded = {*skipped, *ignored}  # their parameters keep their optimizer state too
        # An ignored optimizer is not even initialised (taking its state dict would).
        skip_optim = fitting.optimizers_ignored(patterns)
        with_optim = not weights_only and not skip_optim and bool(self.components.model)

        def make_targets(gpu_on_gpu: bool) -> tuple[dict[str, Any], Any]:
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
            if not (weights_only or skip_optim or fresh is not None or OPTIM_KEY in live):
                live.update(
                    fitting.optimizer_state(
                        self.components, metadata, skip=not_loaded, ignored=patterns
                    )
                )
            tree = self.stager.empty_like(live, gpu_on_gpu=gpu_on_gpu)
            if fresh is not None:  # read into new tensors, adopted below once verified
                tree[OPTIM_KEY] = fresh
            return tree, fresh

        target, fresh_optim = load_targets(make_targets)
        target[RANKS_KEY] = {str(source): b""}
        reader = VerifyingReader(
            folder, expected_metadata=meta_entry, trusted=self.trusted_pickle, metadata=metadata
        )
        try:
            dcp.load(
                target,
                storage_reader=reader,
                planner=_SafeLoadPlanner(
                    trusted=self.trusted_pickle, allow_partial_load=not strict or bool(patterns)
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
        # Unpickled before anything live changes: one that fails fails every rank alike.
        data = self._agreed_rank_state(folder, target[RANKS_KEY][str(source)])
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
        rng_dropped = state_mod.path_ignored(("rng",), patterns)  # restore drops it below
        rng_mode = "none" if weights_only or rng_dropped or "rng" not in data else "restored"
        if rng_mode != "none" and saved_ws != self.world_size and self.rank >= saved_ws:
            data["rng"] = rng.derived(data["rng"], self.rank)
            rng_mode = "derived"
        small = state_mod.Components(
            schedulers=self.components.schedulers,
            scaler=self.components.scaler,
            stateful=self.components.stateful,
        )
        small_patterns = [p for p in patterns if not p.startswith(("state/model", "state/optim"))]
        saved = state_mod.restore(
            small, data, weights_only=weights_only, strict=strict, ignore_keys=small_patterns
        )
        report = LoadReport(
            saved_ws,
            source,
            rng_mode,
            reader.bytes_read,
            time.monotonic() - started,
            onto_gpu=reader.ring_copies > 0,
        )
        return saved, report

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
            why = safe_state.describe_unloadable(blob, exc, trusted=self.trusted_pickle)
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


def _fresh_groups(cached: list[dict[str, Any]], opt: Any) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in live.items() if k != "params"}, "params": old["params"]}
        for old, live in zip(cached, opt.param_groups, strict=True)
    ]
