"""Making a load target's memory present before a read fills it.

A relaunched process loads into memory it has never touched: the new optimizer tensors and the
staging copy of the model. A read into such memory takes one page fault per 4 KiB page inside
the copy. Linux 5.14+ can populate a whole range in one call instead
(``madvise(MADV_POPULATE_WRITE)``): the kernel allocates and maps every page in a loop, with no
trap per page, and leaves the contents alone, so it is safe on memory that already holds data.
On the 2-core VM measured (1 GiB, relaunched processes, page cache dropped, medians of 6) a
load with it took 0.71 s against 0.84 s without (``torch.load``: 0.74 s);
docs/sharded-checkpoints-history.md has the figures. Huge pages (``MADV_HUGEPAGE``) on top of it
made the same load 1.21 s (the kernel compacts memory to find 2 MiB blocks), so they are not
used.

Where the call is missing (another OS, an older kernel, a libc without ``madvise``) it does
nothing, and the read faults the pages in as before.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

_MADV_POPULATE_WRITE = 23  # linux/mman.h, since 5.14


def _load_libc(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _load_libc("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
_MINCORE = _load_libc("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
_LOW_BIT = bytes(i & 1 for i in range(256))
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_supported = _MADVISE is not None
_probed: bool | None = None


def can_populate() -> bool:
    """Whether ``populate_pages`` does anything here: the call exists and the kernel takes it
    (tried once, on one page of scratch memory, then remembered)."""
    global _probed  # noqa: PLW0603 - the kernel's answer does not change
    if _probed is None:
        _probed = False
        if _supported and _MADVISE is not None:
            scratch = mmap.mmap(-1, _PAGE)
            anchor = ctypes.c_char.from_buffer(scratch)
            try:
                _probed = populate_pages(ctypes.addressof(anchor), _PAGE)
            finally:
                del anchor  # the mmap cannot close while a view of it exists
                scratch.close()
    return _probed


def whole_pages(tensor: torch.Tensor) -> tuple[int, int]:
    """The address range ``[lo, hi)`` of the whole pages inside a CPU tensor's memory (never a
    neighbour's); ``hi <= lo`` when there are none, or the tensor is not on the CPU."""
    if tensor.device.type != "cpu":
        return 0, 0
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return -(-start // _PAGE) * _PAGE, (end // _PAGE) * _PAGE


def page_spans(tensor: torch.Tensor, most: int) -> list[tuple[int, int]]:
    """The whole pages inside ``tensor`` as ``(address, length)`` spans of at most ``most``
    bytes (rounded down to whole pages, at least one), in address order."""
    lo, hi = whole_pages(tensor)
    step = max(_PAGE, most // _PAGE * _PAGE)
    return [(at, min(step, hi - at)) for at in range(lo, hi, step)]


def populate_pages(address: int, length: int) -> bool:
    """Make the pages in ``[address, address + length)`` (page-aligned) present and writable,
    in one call; their contents are not changed. False when nothing was done."""
    global _supported  # noqa: PLW0603 - remembered once the kernel said no
    if not _supported or _MADVISE is None or length <= 0:
        return False
    if _MADVISE(address, length, _MADV_POPULATE_WRITE) != 0:
        if ctypes.get_errno() == errno.EINVAL:  # a kernel before 5.14
            _supported = False
        return False
    return True


def populate_for_write(tensor: torch.Tensor) -> bool:
    """Make the whole pages inside ``tensor``'s memory present and writable, in one call.

    Only the pages wholly inside the tensor are touched (never a neighbour's); its contents
    are not changed. Returns False when nothing was done: not a CPU tensor, too small to
    hold a whole page, or the kernel lacks the call (then it is not tried again).
    """
    lo, hi = whole_pages(tensor)
    return populate_pages(lo, hi - lo)


def all_present(tensor: torch.Tensor) -> bool:
    """Whether every whole page inside a CPU tensor's memory is present already (a buffer that
    was written before: a reused staging buffer, live state), asked of the kernel in one call
    (``mincore``). Such a target needs no mapping before a read fills it (a load into a running
    process: 0.67 s against 0.69 s with the mapping, 8 rounds on the 2-core VM, within the
    noise; docs/sharded-checkpoints.md). False where the kernel cannot say, or for a tensor
    with no whole page."""
    lo, hi = whole_pages(tensor)
    if _MINCORE is None or hi <= lo:
        return False
    vec = (ctypes.c_ubyte * ((hi - lo) // _PAGE))()
    if _MINCORE(lo, hi - lo, vec) != 0:
        return False
    return b"\0" not in bytes(vec).translate(_LOW_BIT)  # bit 0: present; others reserved
