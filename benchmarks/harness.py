"""The method both checkpoint benchmarks share: rounds, medians, a cold page cache, conditions.

``checkpoint.py`` (the ``CheckpointManager``, one process) and ``checkpoint_engines.py`` (the
sharded engine against plain DCP and torch.save, 1 and 4 ranks) must measure the same way, or
their figures cannot be compared; this module is that way, written once:

- ``Samples``: every sample of every figure; reported as median, min, max and count;
- ``round_order``: the order of the contenders in round r, so none always follows the same one;
- ``PageCache``: drops the page cache before a timed operation (root: the whole cache; else
  each benchmark file with ``posix_fadvise(DONTNEED)``), and says so when it cannot;
- ``pretouch``: fills a new tensor so the first touch of fresh memory (about 1.8 s/GiB on some
  VMs) is paid before the clock starts;
- ``conditions``: what the figures were taken under (CPUs, load average, versions), recorded in
  every JSON report, because a loaded machine moves every figure;
- ``judge``: ratios against their targets, printed and written alike.

A benchmark framework (pytest-benchmark, asv) was the alternative; they time a function in one
process and have no notion of a multi-rank collective operation or a cold page cache.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import xxhash

MiB = 1 << 20
MIN_ROUNDS = 5
RESUME_MARK = "RESUME_FIGURES "
"""Prefixes the one line of figures a ``relaunched_resume.py`` child prints."""
T = TypeVar("T")


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def round_order(items: Sequence[T], round_: int) -> list[T]:
    """The contenders' order in round ``round_``: as given in round 0, then a permutation
    seeded by the round number (reproducible from the round's printed lines). Rotating by one
    each round, as this did before, kept every contender behind the same neighbour in all but
    one round; a contender that runs right after a heavy one (a process that just freed a GiB,
    a delete still trimming the disk) then paid for it in nearly every sample."""
    order = list(items)
    if round_:
        random.Random(round_).shuffle(order)
    return order


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def pretouch(t: torch.Tensor) -> torch.Tensor:
    """Write every page of ``t`` so its first-touch cost is not charged to a timed operation."""
    if t.numel():
        t.detach().zero_()
    return t


@dataclass
class Samples:
    """Every sample of every figure, by name."""

    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.values[name].append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def summary(self) -> dict[str, dict[str, float | int]]:
        return {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for name, v in self.values.items()
        }


def drop_whole_page_cache() -> bool:
    """Write back and drop the whole page cache; False without the permission to."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class PageCache:
    """Drops the page cache before a timed operation; says once when it cannot.

    As root, the whole cache. That also evicts the code pages of torch's shared libraries,
    which a real resume has warm (it just imported torch), so ``warm`` (a tiny untimed step,
    save and load) runs right after: the checkpoint files stay cold, the code does not.
    Without root, each file under ``root`` is evicted on its own (``posix_fadvise(DONTNEED)``
    after an fsync), which drops clean pages only.
    """

    def __init__(self, root: Path, warm: Callable[[], None] | None = None) -> None:
        self.root = root
        self.warm = warm
        self.permitted = drop_whole_page_cache()
        if not self.permitted:
            print(
                "[bench] WARNING: cannot drop the whole page cache (needs root and a writable "
                "/proc/sys/vm/drop_caches); evicting the benchmark's own files one by one "
                "instead (posix_fadvise DONTNEED), which the kernel may not fully honour",
                flush=True,
            )

    def drop(self) -> None:
        if self.permitted and drop_whole_page_cache():
            if self.warm is not None:
                self.warm()
        else:
            evict_files(self.root)


def evict_files(root: Path) -> None:
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def conditions(*, page_cache_dropped: bool) -> dict[str, Any]:
    """What the figures were taken under; part of every report."""
    return {
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "load_average_1m_at_start": load_average(),
        "page_cache_dropped": page_cache_dropped,
        "torch": torch.__version__,
        "xxhash": xxhash.VERSION,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


Targets = dict[str, tuple[str, float]]


def judge(ratios: dict[str, float], targets: Targets) -> dict[str, dict[str, Any]]:
    """Each target with its measured value and whether it was met (absent ratios skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (op, bound) in targets.items():
        if name not in ratios:
            continue
        value = ratios[name]
        met = value <= bound if op == "<=" else value >= bound
        out[name] = {"value": value, "op": op, "bound": bound, "met": met}
    return out


def print_report(
    summary: dict[str, dict[str, float | int]],
    ratios: dict[str, float],
    verdicts: dict[str, dict[str, Any]],
) -> None:
    print(f"\n{'figure':40s} {'median':>10s} {'min':>10s} {'max':>10s}   n")
    for name, f in summary.items():
        scale = MiB if name.endswith("bytes") else 1
        print(
            f"{name:40s} {f['median'] / scale:10.4f} {f['min'] / scale:10.4f} "
            f"{f['max'] / scale:10.4f} {f['n']:3d}"
        )
    print()
    for name, value in ratios.items():
        if name not in verdicts:
            print(f"ratio {name:34s} {value:10.4f}")
    for name, v in verdicts.items():
        state = "met" if v["met"] else "MISSED"
        print(f"target {name} {v['op']} {v['bound']}: {v['value']:.3f} {state}")


SCRATCH_MARK = ".rtj-benchmark-scratch"
"""The file that marks a folder as a benchmark's own data folder (safe to empty)."""


@contextmanager
def scratch_folder(path: Path) -> Iterator[Path]:
    """The run's data folder, emptied first and removed at the end, also when the run is
    interrupted (Ctrl-C) or fails: its checkpoints are several times the state's size.

    Only a folder that is absent, empty or an earlier run's (it holds ``SCRATCH_MARK``) is
    emptied: ``--dir`` pointed at a folder of the user's is refused (``SystemExit`` naming it),
    with nothing deleted."""
    if path.exists():
        if not path.is_dir():
            raise SystemExit(
                f"--dir {path}: expected a folder for the benchmark's data, got a file"
            )
        if any(path.iterdir()) and not (path / SCRATCH_MARK).exists():
            raise SystemExit(
                f"--dir {path}: the folder holds files this benchmark did not write, and the "
                "benchmark empties its folder before and after the run; give a new or empty "
                "folder (nothing was deleted)"
            )
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / SCRATCH_MARK).touch()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
