"""The sharded checkpoint engine: one checkpoint written by all ranks together, read at any size.

What is saved is a DCP state dict built with ``torch.distributed.checkpoint.state_dict``:
``model`` and ``optim/<name>`` keyed by parameter name (so DDP, FSDP2 and single-process
layouts are interchangeable), plus ``ranks/<r>``: each rank's small non-tensor state (RNG,
schedulers, scaler, stateful objects such as the sampler, timestamp, metrics, extras), pickled
in the weights-only-safe form ``rank_contents.capture`` produces. DCP's planner writes each
replicated tensor once (spread over the ranks) and each shard by its owner;
``storage.HashingWriter`` lays the bytes down with digests; the caller commits the returned file
entries in a manifest.

A load (``load.py``) reads into the same host staging buffers the async saves stage into,
verifying every chunk as it arrives, and copies into the live tensors only once every rank has
read and verified everything.

Writing per-rank ``torch.save`` files (format version 1, ``save/rank_file.py``) was the
alternative; it writes every replica in full and cannot change world size for sharded state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ..run.dist import Coordinator
from ..save import rank_contents as state_mod
from ..save import safe_unpickle
from ..save.manifest import FileEntry, Manifest
from .keys import MODEL_KEY, OPTIM_KEY, RANKS_KEY
from .live_state import small_components, tensor_state
from .load import LoadReport, ShardedLoader
from .staging import HostStager
from .storage import HashingWriter

log = logging.getLogger("trainer_runtime")


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
        """Writes run on this group: they may run in a background thread (see run/dist.py)."""
        self.rank, self.world_size = coord.rank, coord.world_size
        self.trusted_pickle = trusted_pickle
        self.stager = HostStager(pin_memory=pin_memory)
        self.loader = ShardedLoader(components, coord, self.stager, trusted_pickle=trusted_pickle)
        self._cache: tuple[tuple, dict[str, Any]] | None = None
        self._written: tuple[tuple, set[str]] | None = None
        self._stage_pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ state
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
        """``live_state.tensor_state`` for a save, reusing the tree of the previous save when
        the live tensors are the same objects: taking a state dict walks every parameter's name and
        costs tens of milliseconds, which an async save's call would otherwise stall on."""
        sig = (weights_only, self._signature())
        if self._cache is None or self._cache[0] != sig:
            tree = tensor_state(self.components, weights_only=weights_only)
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
        small, out = self.capture_unserialized(
            timestamp=timestamp,
            run_name=run_name,
            metrics=metrics,
            extras=extras,
            weights_only=weights_only,
        )
        out[RANKS_KEY] = {str(self.rank): self.serialize_small(small)}
        return out

    def capture_unserialized(
        self,
        *,
        timestamp: dict[str, Any],
        run_name: str,
        metrics: dict[str, Any],
        extras: dict[str, Any],
        weights_only: bool,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``capture``'s two parts before the small state is serialized: this rank's small state
        (fresh objects: RNG states, ``state_dict()`` results) and the tensor state with live
        references, without ``RANKS_KEY``."""
        data = state_mod.capture(
            small_components(self.components),
            timestamp=timestamp,
            run_name=run_name,
            metrics=metrics,
            extras=extras,
            weights_only=weights_only,
        )
        del data["state"]["model"]
        return data, self._cached_tensor_state(weights_only=weights_only)

    def serialize_small(self, small: dict[str, Any]) -> bytes:
        """This rank's small state as saved (``safe_unpickle.serialize``; refused: nothing
        written)."""
        return safe_unpickle.serialize(small, trusted=self.trusted_pickle)

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
    def load(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
    ) -> tuple[dict[str, Any], LoadReport]:
        """Load a version-2 checkpoint into the live components; collective over all ranks
        (``load.ShardedLoader.load``)."""
        return self.loader.load(
            folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys
        )


def _fresh_groups(cached: list[dict[str, Any]], opt: Any) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in live.items() if k != "params"}, "params": old["params"]}
        for old, live in zip(cached, opt.param_groups, strict=True)
    ]
