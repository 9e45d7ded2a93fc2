"""Host buffers for a state dict, kept from one checkpoint to the next.

Staging is what makes an async save safe: the persisting thread writes a copy, so training may
change the live tensors as soon as the copy is done. The copy goes into buffers allocated
before the first save (``preallocate``, after the first optimizer step) or by it, and reused by
every later one (pinned for tensors that live on a GPU, so device-to-host copies run at full
bus speed, asynchronously, and need no page faults), the way DCP's ``DefaultStager`` caches
its storages. A CPU tensor gets an ordinary buffer even where CUDA is available: pinning it
would buy nothing and cost every rank process a CUDA context. The same buffers are the target
of a load: a checkpoint is read and verified into them, and only a verified, complete read is
copied into the live tensors.

DTensors (FSDP2, tensor parallel) are staged by their local shard and re-wrapped with the same
mesh and placements, so DCP plans the staged copy exactly as it would the live state.
DCP's own ``DefaultStager`` was the alternative; it deep-copies every object in the tree and
keys its cache by storage, which cannot serve as a load target with the live layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..save.rank_contents import local_tensor
from .keys import MODEL_KEY


class HostStager:
    """Copies (or allocates) a nested state dict into reused host buffers, keyed by path."""

    def __init__(self, *, pin_memory: bool | None = None) -> None:
        """``pin_memory``: None pins the buffers of CUDA tensors only; True or False all."""
        self.pin_memory = pin_memory
        self._buffers: dict[str, torch.Tensor] = {}
        self._only: set[str] | None = None
        self._gpu_on_gpu = False
        self._devices: set[torch.device] = set()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._save_points: dict[torch.device, torch.cuda.Event] = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, tree: Any, *, only: set[str] | None = None) -> Any:
        """A copy of ``tree`` whose tensors live in this stager's host buffers.

        With ``only`` (tensor paths such as ``/model/0.weight``), other tensors stay live
        references and buffers kept for them are freed: a data-parallel rank stages just the
        share of the replicated state it writes.
        """
        self._only = only
        try:
            out = self._map(tree, "", copy=True)
        finally:
            self._only = None
        if only is not None:
            self._buffers = {k: v for k, v in self._buffers.items() if k in only}
        return out

    def empty_like(self, tree: Any, *, gpu_on_gpu: bool = False) -> Any:
        """Same structure, host buffers with unspecified contents (a load target). With
        ``gpu_on_gpu``, a tensor on a GPU gets a fresh tensor on that GPU instead, not kept by
        the stager (a load then reads through ``device_ring.DeviceRing``)."""
        self._gpu_on_gpu = gpu_on_gpu
        try:
            return self._map(tree, "", copy=False)
        finally:
            self._gpu_on_gpu = False

    def preallocate(self, tree: Any) -> int:
        """Allocate the buffers ``stage(tree)`` will copy into and touch every page of the new
        ones, so a later copy does not pay the first touch of fresh memory. Returns the bytes
        newly allocated (buffers that already exist, e.g. a load's, are kept as they are)."""
        before = dict(self._buffers)
        self._map(tree, "", copy=False)
        fresh = [b for k, b in self._buffers.items() if before.get(k) is not b]
        for buf in fresh:
            buf.zero_()
        return sum(b.numel() * b.element_size() for b in fresh)

    def release(self) -> None:
        self._buffers.clear()

    def holds(self, path: str, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is this stager's unpinned buffer for ``path`` (the buffer, or a
        view of all of it, as a DTensor's local shard may be)."""
        buf = self._buffers.get(path)
        if buf is None or buf.is_pinned():
            return False
        layout = (buf.data_ptr(), buf.shape, buf.stride(), buf.dtype)
        return buf is tensor or layout == (
            tensor.data_ptr(),
            tensor.shape,
            tensor.stride(),
            tensor.dtype,
        )

    def exchange(self, path: str, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` as the buffer for ``path``: the old buffer became live state
        (``optim_target.exchange``), and ``tensor`` is what that state was."""
        self._buffers[path] = tensor

    def _buffer(self, path: str, like: torch.Tensor) -> torch.Tensor:
        if self._gpu_on_gpu and like.device.type == "cuda":
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        buf = self._buffers.get(path)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            pin = like.device.type == "cuda" if self.pin_memory is None else self.pin_memory
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
        return buf

    def _map(self, obj: Any, path: str, *, copy: bool) -> Any:
        if isinstance(obj, torch.Tensor) and self._only is not None and path not in self._only:
            return obj
        if isinstance(obj, DTensor):
            local = obj.to_local()
            buf = self._buffer(path, local)
            if copy:
                self._copy(buf, local)
            return DTensor.from_local(
                buf,
                obj.device_mesh,
                obj.placements,
                run_check=False,
                shape=obj.shape,
                stride=obj.stride(),
            )
        if isinstance(obj, torch.Tensor):
            buf = self._buffer(path, obj)
            if copy:
                self._copy(buf, obj)
            return buf
        if isinstance(obj, dict):
            return type(obj)((k, self._map(v, f"{path}/{k}", copy=copy)) for k, v in obj.items())
        if isinstance(obj, list | tuple):
            items = [self._map(v, f"{path}/{i}", copy=copy) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj

    def mark_save_point(self, tree: Any) -> None:
        """On the training thread, at the save: record where each GPU's queued work stands.

        The next ``stage`` copies from a GPU on a side stream of its own, after this point and
        after nothing queued later, so the next forward and backward run beside the copy
        (the copy engine is not the GPU's compute units) and ``synchronize`` waits for the
        copy alone, not for the training step queued behind it. Without a mark, the copies
        start after whatever is queued when the staging thread reaches them."""
        if not torch.cuda.is_initialized():
            return
        for device in _cuda_devices(tree):
            point = torch.cuda.Event()
            point.record(torch.cuda.current_stream(device))
            self._save_points[device] = point

    def _copy(self, buf: torch.Tensor, live: torch.Tensor) -> None:
        """Device-to-host into a pinned buffer runs asynchronously (``synchronize`` waits)."""
        if live.device.type == "cuda" and buf.is_pinned():
            with torch.cuda.stream(self._copy_stream(live.device)):
                buf.copy_(live.detach(), non_blocking=True)
        else:
            buf.copy_(live.detach())

    def _copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The device's staging stream, ordered after the save point at its first copy."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        if device not in self._devices:
            self._devices.add(device)
            point = self._save_points.pop(device, None)
            if point is not None:
                stream.wait_event(point)
            else:
                stream.wait_stream(torch.cuda.current_stream(device))
        return stream

    def synchronize(self) -> None:
        """Wait for non-blocking device-to-host copies (no-op without CUDA): the staging
        streams of the devices copied from, so synchronizing creates no context on a device
        the rank does not use."""
        for device in self._devices:
            self._streams[device].synchronize()
        self._devices.clear()
        self._save_points.clear()


def _cuda_devices(tree: Any) -> set[torch.device]:
    """The GPUs that hold a tensor of ``tree`` (a DTensor by its local shard)."""
    devices = set()
    for _, leaf, _ in tensor_pairs(tree, tree):
        if isinstance(leaf, torch.Tensor):
            local = leaf.to_local() if isinstance(leaf, DTensor) else leaf
            if local.device.type == "cuda":
                devices.add(local.device)
    return devices


def tensor_pairs(live: Any, staged: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, live leaf, staged leaf) for every leaf of two trees of the same structure."""
    if isinstance(live, dict):
        for k, v in live.items():
            if k in staged:
                yield from tensor_pairs(v, staged[k], f"{path}/{k}")
    elif isinstance(live, list | tuple) and not isinstance(live, torch.Size):
        for i, (a, b) in enumerate(zip(live, staged, strict=False)):
            yield from tensor_pairs(a, b, f"{path}/{i}")
    else:
        yield path, live, staged


def copy_into_live(
    live: Any,
    staged: Any,
    *,
    on_mismatch: Callable[[str, str], None],
    skip: frozenset[str] | set[str] = frozenset(),
) -> int:
    """Copy every staged tensor into its live counterpart in place, except at the paths in
    ``skip``; returns bytes copied."""
    copied = 0
    for path, dst, src in tensor_pairs(live, staged):
        if not isinstance(dst, torch.Tensor) or path in skip:
            continue
        d = dst.to_local() if isinstance(dst, DTensor) else dst
        s = src.to_local() if isinstance(src, DTensor) else src
        if not isinstance(s, torch.Tensor) or d.shape != s.shape:
            on_mismatch(path, f"live {tuple(d.shape)} vs loaded {_shape(s)}")
            continue
        with torch.no_grad():
            d.copy_(s)
        copied += d.numel() * d.element_size()
    return copied


def _shape(obj: Any) -> Any:
    return tuple(obj.shape) if isinstance(obj, torch.Tensor) else type(obj).__name__


def copy_buffers(model: torch.nn.Module | None, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the model's buffers copied now, for an async save: the forward pass
    changes them (BatchNorm statistics) before the next ``optimizer.step()``, the point where
    staging is waited for, so a reference would be staged with the next step's statistics.
    Call on the training thread, before ``ShardedEngine.save_point``."""
    if model is None or MODEL_KEY not in state:
        return state
    ptrs = {_storage(b) for b in model.buffers()}
    if not ptrs:
        return state
    tree = dict(state)
    tree[MODEL_KEY] = {
        k: v.clone() if isinstance(v, torch.Tensor) and _storage(v) in ptrs else v
        for k, v in state[MODEL_KEY].items()
    }
    return tree


def _storage(t: torch.Tensor) -> int:
    return local_tensor(t).untyped_storage().data_ptr()
