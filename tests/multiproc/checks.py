"""Assertions about a run folder after a crash, shared by the multi-process tests."""

from __future__ import annotations

import json
from pathlib import Path

from tools.waiting import wait_for
from trainer_runtime.run_folder.layout import RunFolder


def committed_and_valid(run_dir: Path, *, settled: bool = True) -> list[str]:
    """Names of committed checkpoints, newest first; fails if any committed one is broken.

    Safe to call while the gang is still saving: the pointer is read before the listing
    (rank 0 writes the manifest, then the pointer, so whatever the pointer names is listed
    after it), and a checkpoint that retention removes while it is being checked is skipped.
    ``settled``: no save was under way when the gang stopped, so committed checkpoints must
    have a pointer. Pass ``False`` while the gang runs or after it was killed at a random
    moment: a first checkpoint is committed a moment before its pointer is written.
    """
    folder = RunFolder(run_dir)
    pointer = folder.read_pointer()
    names = []
    for m in folder.committed():
        reason = folder.verify(m, list(range(m.world_size)))
        if reason is not None and not (run_dir / m.name).exists():
            continue  # pruned by retention between the listing and the check
        assert reason is None, f"committed checkpoint {m.name} does not verify: {reason}"
        names.append(m.name)
    if pointer is not None and (run_dir / pointer["checkpoint"]).exists():
        assert pointer["checkpoint"] in names, f"latest.json names uncommitted {pointer}"
    if names and settled:
        assert folder.read_pointer() is not None, "checkpoints committed but latest.json is missing"
    return names


def read_events(path_prefix: Path, rank: int) -> list[dict]:
    p = Path(f"{path_prefix}.rank{rank}")
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def wait_for_gang(predicate, timeout: float, what: str, gang=None) -> None:
    """``tools.waiting.wait_for`` that also stops early when a rank of ``gang`` failed.

    A rank that exited with an error, or every rank exited, ends the wait at once. On any failure
    the gang is killed (so it cannot disturb the next test) and the error carries every rank's
    log tail; after a timeout, with every thread's stack of the ranks that hung.
    """

    def check() -> bool:
        if predicate():
            return True
        if gang is None:
            return False
        codes = [p.poll() for p in gang.procs]
        if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
            raise AssertionError(
                f"processes exited (codes {codes}) while waiting for {what}\n{gang.log_tails()}"
            )
        return False

    try:
        wait_for(what, check, timeout, interval=0.05, on_timeout=gang and gang.stacks_and_log_tails)
    except AssertionError:
        if gang is not None:
            gang.kill()
        raise
