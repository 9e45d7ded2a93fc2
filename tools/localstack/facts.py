"""Facts about a run, read from the runtime's structured events and from the job's manifest.

The story, the narrator and the demo ask "where did rank 0 resume, from which URI, which
checkpoint did the notice's save commit". They used to find out with regular expressions over
the runtime's log wording, so rewording a log line broke the demo; now they read the
``rtj-event`` lines the runtime writes for exactly this (``trainer_runtime/events.py``, documented
in docs/runtime.md). Each helper takes a container's log text (events and ordinary log lines
mixed, as ``kubectl logs`` or the pod runner's log file shows them) and looks only at events.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from trainer_runtime import events
from trainer_runtime.events import RuntimeEvent, read_events

from .common import StackError

EMERGENCY = events.EMERGENCY_SAVED
"""The event type of a save on SIGTERM (``emergency_save`` reads it)."""


def committed_steps(log: str) -> list[tuple[str, int]]:
    """Checkpoints the log's events say were committed: (name, step), in order."""
    return [(e["checkpoint"], int(e["step"])) for e in read_events(log, events.COMMITTED)]


def last_resume(log: str) -> RuntimeEvent | None:
    """The log's last ``resumed`` event (None: not resumed, or a fresh start)."""
    found = read_events(log, events.RESUMED)
    return found[-1] if found else None


def resumed_step(log: str) -> int | None:
    """The step the log's events say the rank resumed at (None: not resumed, or fresh)."""
    event = last_resume(log)
    return None if event is None else int(event["step"])


def fetched_from(log: str) -> str | None:
    """The object-store URI the rank resumed from (None: it resumed from a local copy)."""
    event = last_resume(log)
    if event is None or event["source"] != "remote":
        return None
    return str(event["uri"])


def started_fresh(log: str) -> bool:
    """Whether the log's events say the run started from scratch."""
    return bool(read_events(log, events.FRESH))


def notice_checkpoint(log: str) -> tuple[str, int] | None:
    """The checkpoint committed right after the first preemption notice: (name, step)."""
    seen = read_events(log)
    kinds = [e.type for e in seen]
    if events.NOTICE not in kinds:
        return None
    after = seen[kinds.index(events.NOTICE) :]
    return next(
        ((e["checkpoint"], int(e["step"])) for e in after if e.type == events.COMMITTED), None
    )


def emergency_save(log: str) -> tuple[str | None, float | None] | None:
    """The save on SIGTERM: (checkpoint, seconds after the signal), or None if there was none."""
    found = read_events(log, EMERGENCY)
    if not found:
        return None
    return found[-1]["checkpoint"], found[-1]["seconds"]


def interval_steps(manifest: Path) -> int:
    """The ``--interval=Nba`` of the manifest's training command."""
    for arg in training_command(manifest):
        if arg.startswith("--interval=") and arg.endswith("ba"):
            return int(arg.removeprefix("--interval=").removesuffix("ba"))
    raise StackError(f"{manifest}: the command has no --interval=Nba")


def training_command(manifest: Path) -> list[str]:
    """The training container's command + args in the manifest's job."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    job = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")
    container = job["spec"]["template"]["spec"]["containers"][0]
    return [*(container.get("command") or []), *(container.get("args") or [])]
