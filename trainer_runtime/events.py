"""Structured runtime events: what the runtime did, as one JSON object per line.

Tools that watch a run (the demo's narrator, the e2e story, a user's dashboard) need facts such
as "resumed at step 16 from s3://...", "committed ep1-ba15", "saved on SIGTERM in 0.43 s". Reading
those facts out of log wording with regular expressions made every rewording of a log line a
silent break of the demo; this module gives them a contract instead. Each event is one line::

    rtj-event {"v": 1, "type": "committed", "rank": 0, "time": "2026-...Z", "checkpoint": ...}

The line goes to **stderr** always, so an event is read wherever the container's output is:
``kubectl logs`` on real nodes, the pod runner's log files, a terminal. When ``RTJ_EVENTS_FILE``
names a file, the bare JSON object (without the prefix) is also appended there, one line per
event, in one ``write`` of an ``O_APPEND`` descriptor, so several ranks may share one file without
tearing each other's lines. The alternative rejected was to extend the progress annotation
(``pod/progress.py``): it keeps only the latest state, reaches the API server only from rank 0 and
not at all outside a cluster, and a resume or an emergency save is an event, not a state.

Events are best effort: a file that cannot be written is logged once (naming the variable, the
path and the reason) and training goes on; the stderr line is still written. The event types and
their fields are the functions below (one per type), documented in docs/runtime.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import envvars

if TYPE_CHECKING:
    from .save.manifest import Manifest

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""``v`` of every event; bumped when a field changes meaning or goes away (new fields do not)."""
PREFIX = "rtj-event "
"""Start of an event line on stderr (the file holds the bare JSON objects)."""

FRESH = "fresh"
RESUMED = "resumed"
COMMITTED = "committed"
NOTICE = "notice"
SIGTERM = "sigterm"
EMERGENCY_SAVED = "emergency_saved"
UPLOADED = "uploaded"
STARTED = "started"
FETCHED = "fetched"
FIRST_STEP = "first_step"
MEMBERSHIP = "membership"
INTERVAL_CHOSEN = "interval_chosen"
SURVIVOR_SAVED = "survivor_saved"
SWITCHED = "switched"
LEFT = "left"

FIELDS: dict[str, tuple[str, ...]] = {
    FRESH: ("run", "world_size"),
    RESUMED: (
        "run",
        "checkpoint",
        "step",
        "epoch",
        "source",
        "uri",
        "fallbacks",
        "world_size",
        "saved_world_size",
    ),
    COMMITTED: (
        "checkpoint",
        "step",
        "epoch",
        "bytes",
        "seconds",
        "held_s",
        "uri",
        "world_size",
    ),
    NOTICE: ("reason", "step"),
    SIGTERM: ("step", "grace_period_s"),
    EMERGENCY_SAVED: ("checkpoint", "step", "seconds", "grace_period_s"),
    UPLOADED: ("checkpoint", "uri", "bytes", "seconds"),
    STARTED: ("process_started", "world_size", "attempt"),
    FETCHED: ("checkpoint", "uri", "bytes", "seconds", "prefetch"),
    FIRST_STEP: ("step", "seconds"),
    MEMBERSHIP: ("epoch", "nnodes", "node_rank", "stop", "stop_s"),
    INTERVAL_CHOSEN: (
        "interval_s",
        "reason",
        "save_cost_s",
        "commit_s",
        "mtbi_s",
        "mtbi_source",
        "measured_saves",
        "clamped",
    ),
    SURVIVOR_SAVED: ("checkpoint", "step", "seconds", "epoch", "why_not"),
    SWITCHED: ("epoch", "step", "world_size", "old_world_size", "seconds", "after_loss"),
    LEFT: ("epoch", "step", "seconds"),
}
"""Every event type and the fields it carries besides ``v``, ``type``, ``rank`` and ``time``."""

RESUME_SOURCES = {
    "checkpoint": "local",
    "remote": "remote",
    "load_path": "load_path",
    "peers": "peers",
}
"""``ResumeResult.source`` -> the ``source`` of a ``resumed`` event."""


class EventWriter:
    """Writes events of this process: stderr always, ``path`` too when given."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or None
        self._lock = threading.Lock()
        self._warned = False

    def emit(self, kind: str, *, rank: int, **fields: Any) -> dict[str, Any]:
        """Write one event; returns it. Unknown types or fields are a bug (ValueError)."""
        expected = FIELDS.get(kind)
        if expected is None:
            raise ValueError(f"event type {kind!r}: expected one of {', '.join(FIELDS)}")
        if set(fields) != set(expected):
            raise ValueError(
                f"event {kind!r}: fields {sorted(fields)}, expected {sorted(expected)}"
            )
        event = {
            "v": SCHEMA_VERSION,
            "type": kind,
            "rank": rank,
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            **fields,
        }
        body = json.dumps(event, separators=(",", ":"), default=str)
        with self._lock:
            self._to_stderr(PREFIX + body + "\n")
            if self.path is not None:
                self._to_file((body + "\n").encode())
        return event

    @staticmethod
    def _to_stderr(line: str) -> None:
        try:
            sys.stderr.flush()  # after any log line already buffered: the order stays true
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed stderr must not stop training
            pass

    def _to_file(self, data: bytes) -> None:
        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)  # one write of an O_APPEND descriptor: lines never interleave
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s=%s: cannot append runtime events there (%s); they still go to stderr "
                    "and training goes on",
                    envvars.EVENTS_FILE,
                    self.path,
                    exc.strerror or exc,
                )


_WRITERS: dict[str | None, EventWriter] = {}


def writer() -> EventWriter:
    """The process's writer for the current ``RTJ_EVENTS_FILE`` (read at every event)."""
    path = os.environ.get(envvars.EVENTS_FILE, "").strip() or None
    if path not in _WRITERS:
        _WRITERS[path] = EventWriter(path)
    return _WRITERS[path]


def emit(kind: str, *, rank: int, **fields: Any) -> dict[str, Any]:
    """Write one event with the process's writer."""
    return writer().emit(kind, rank=rank, **fields)


# ------------------------------------------------------------------ one function per type


def fresh(*, rank: int, run: str, world_size: int) -> None:
    """The run starts from scratch: no checkpoint to resume."""
    emit(FRESH, rank=rank, run=run, world_size=world_size)


def resumed(
    *,
    rank: int,
    run: str,
    source: str,
    path: str,
    uri: str,
    step: int,
    epoch: int,
    fallbacks: Sequence[str],
    world_size: int,
    saved_world_size: int | None = None,
) -> None:
    """The state was restored. ``source``: ``local`` (the run folder), ``remote`` (fetched from
    the object store, ``uri`` names it), ``load_path``, or ``peers`` (sent by the running gang's
    rank 0 in an in-process switch; ``path`` empty); ``fallbacks``: one line per newer
    checkpoint passed over, with the reason; ``saved_world_size``: the world size that saved it
    (given, or from its manifest; None for a ``load_path`` file)."""
    emit(
        RESUMED,
        rank=rank,
        run=run,
        checkpoint=os.path.basename(path.rstrip("/")),
        step=step,
        epoch=epoch,
        source=RESUME_SOURCES.get(source, source),
        uri=uri,
        fallbacks=list(fallbacks),
        world_size=world_size,
        saved_world_size=saved_world_size or _saved_world_size(path),
    )


def _saved_world_size(path: str) -> int | None:
    from .errors import ManifestError  # noqa: PLC0415
    from .save.manifest import Manifest  # noqa: PLC0415 - only a resume needs it

    if not path:
        return None  # the state came from the running gang's rank 0
    try:
        return Manifest.read(Path(path)).world_size
    except (ManifestError, OSError):  # a load_path file, or a folder without a manifest
        return None


def committed(manifest: Manifest, uri: str, *, rank: int, held_s: float) -> None:
    """A checkpoint is committed (rank 0 emits it: its manifest is the commit). ``held_s``:
    how long this save blocked rank 0's training (``SavedCheckpoint.held_s``)."""
    emit(
        COMMITTED,
        rank=rank,
        checkpoint=manifest.name,
        step=manifest.timestamp.batch,
        epoch=manifest.timestamp.epoch,
        bytes=sum(f.size for f in manifest.files),
        seconds=round(manifest.save_duration_s, 3),
        held_s=round(held_s, 3),
        uri=uri,
        world_size=manifest.world_size,
    )


def notice(*, rank: int, content: str | None, step: int) -> None:
    """A preemption notice arrived; a save follows at once. ``reason`` is the notice's
    ``reason`` when it is JSON (the operator's notice), else its text."""
    reason: Any = content or ""
    try:
        parsed = json.loads(reason)
        if isinstance(parsed, dict) and "reason" in parsed:
            reason = parsed["reason"]
    except ValueError:
        pass
    emit(NOTICE, rank=rank, reason=reason, step=step)


def sigterm(*, rank: int, step: int, grace_period_s: float) -> None:
    """SIGTERM reached every rank: an emergency save, then exit."""
    emit(SIGTERM, rank=rank, step=step, grace_period_s=grace_period_s)


def emergency_saved(
    *, rank: int, checkpoint: str | None, step: int, seconds: float | None, grace_period_s: float
) -> None:
    """The SIGTERM save is committed, ``seconds`` after the signal (None: nothing new to save)."""
    emit(
        EMERGENCY_SAVED,
        rank=rank,
        checkpoint=checkpoint,
        step=step,
        seconds=None if seconds is None else round(seconds, 3),
        grace_period_s=grace_period_s,
    )


def survivor_saved(
    *, rank: int, checkpoint: str | None, step: int, seconds: float, epoch: int, why_not: str | None
) -> None:
    """A rank was lost without notice and this survivor, named rank 0 of the new gang (membership
    ``epoch``), saved the last finished step from its memory ``seconds`` after it was named
    (``save/survivor.py``); ``checkpoint`` None: nothing saved, ``why_not`` says why."""
    emit(
        SURVIVOR_SAVED,
        rank=rank,
        checkpoint=checkpoint,
        step=step,
        seconds=round(seconds, 3),
        epoch=epoch,
        why_not=why_not,
    )


def uploaded(*, rank: int, checkpoint: str, uri: str, sent: int, seconds: float) -> None:
    """This rank's files of a checkpoint are in the object store (``bytes``: sent now)."""
    emit(UPLOADED, rank=rank, checkpoint=checkpoint, uri=uri, bytes=sent, seconds=round(seconds, 3))


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class RuntimeEvent:
    """One parsed event."""

    type: str
    rank: int
    time: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A field, or ``default``."""
        return self.fields.get(key, default)


def parse_line(line: str) -> RuntimeEvent | None:
    """The event on one line (stderr form with ``rtj-event``, or a bare file line), else None.

    A line of another schema version, or that is not an event at all, is None: readers skip it.
    """
    text = line.strip()
    if text.startswith(PREFIX):
        text = text[len(PREFIX) :]
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != SCHEMA_VERSION or "type" not in data:
        return None
    meta = {k: data.pop(k) for k in ("v", "type", "rank", "time") if k in data}
    return RuntimeEvent(str(meta["type"]), int(meta.get("rank", -1)), str(meta.get("time")), data)


def read_events(text: str | Iterable[str], kind: str | None = None) -> list[RuntimeEvent]:
    """Every event in a log or events file, in order (of one ``kind`` when given)."""
    lines = text.splitlines() if isinstance(text, str) else text
    found = [e for e in (parse_line(line) for line in lines) if e is not None]
    return [e for e in found if kind is None or e.type == kind]


def started(*, rank: int, world_size: int, attempt: str | None) -> None:
    """The manager is built (the process group formed before it); ``process_started``: when
    the interpreter started (Linux; ``None`` elsewhere). With the container's start (the
    kubelet's) and ``resumed``, it splits a recovery's start-up into its phases."""
    emit(
        STARTED,
        rank=rank,
        process_started=process_start_time(),
        world_size=world_size,
        attempt=attempt,
    )


def fetched(
    *, rank: int, checkpoint: str, uri: str, sent: int, seconds: float, prefetch: bool = False
) -> None:
    """This rank fetched a checkpoint from the object store: ``bytes``, the size of its files
    now on the local disk; ``seconds``, the fetch's wall time; ``prefetch``: by the download at
    import, while the gang forms (``resume/warm_start.py``), not by ``resume()``."""
    emit(
        FETCHED,
        rank=rank,
        checkpoint=checkpoint,
        uri=uri,
        bytes=sent,
        seconds=round(seconds, 3),
        prefetch=prefetch,
    )


def first_step(*, rank: int, step: int, seconds: float) -> None:
    """The first step after ``resume()`` is done (rank 0): training goes on from here.
    ``seconds``: since the resume ended."""
    emit(FIRST_STEP, rank=rank, step=step, seconds=round(seconds, 3))


def membership(
    *, rank: int, epoch: int, nnodes: int, node_rank: int, stop: str, stop_s: float
) -> None:
    """The pod's agent re-formed its workers in place for membership ``epoch`` (the agent, once
    per pod): ``stop``: how the old workers ended (``save`` or ``kill``; ``standby``: there were
    none, a standby pod was named into the gang), ``stop_s``: how long that took."""
    emit(
        MEMBERSHIP,
        rank=rank,
        epoch=epoch,
        nnodes=nnodes,
        node_rank=node_rank,
        stop=stop,
        stop_s=round(stop_s, 3),
    )


def switched(
    *,
    rank: int,
    epoch: int,
    step: int,
    world_size: int,
    old_world_size: int,
    seconds: float,
    after_loss: bool = False,
) -> None:
    """This running process switched to membership ``epoch`` at ``step`` without ending (an
    in-process switch, ``switch.py``): from ``old_world_size`` ranks to ``world_size``;
    ``seconds``: from the agreed step boundary (``after_loss``: from the failed collective,
    ``run/rejoin.py``) to the new gang holding the state."""
    emit(
        SWITCHED,
        rank=rank,
        epoch=epoch,
        step=step,
        world_size=world_size,
        old_world_size=old_world_size,
        seconds=round(seconds, 3),
        after_loss=after_loss,
    )


def left(*, rank: int, epoch: int, step: int, seconds: float) -> None:
    """This process left the gang at ``step`` because membership ``epoch`` does not include its
    pod (``stop: leave``: its node is announced for termination); ``seconds``: from the agreed
    boundary to the old group's end. The process ends with exit code 0 right after."""
    emit(LEFT, rank=rank, epoch=epoch, step=step, seconds=round(seconds, 3))


def process_start_time() -> str | None:
    """When this process started, as UTC ISO 8601 (from ``/proc``: boot time plus the process's
    start in clock ticks); ``None`` where ``/proc`` does not say."""
    try:
        stat = Path("/proc/self/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        at = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def interval_chosen(
    *,
    rank: int,
    interval_s: float,
    reason: str,
    save_cost_s: float,
    commit_s: float | None,
    mtbi_s: float,
    mtbi_source: str,
    measured_saves: int,
    clamped: str | None,
) -> None:
    """``interval="auto"`` chose the seconds between saves (rank 0): ``reason`` ``start`` (at
    construction, from the prior save cost) or ``measured`` (the measured save cost moved it by
    more than a fifth); ``save_cost_s``: the mean time the last saves held training;
    ``commit_s``: the longest recent commit's wall time; ``mtbi_source``: ``operator``
    (RTJ_MTBI_SECONDS) or ``prior``; ``clamped``: ``min``, ``max``, ``commit`` or None."""
    emit(
        INTERVAL_CHOSEN,
        rank=rank,
        interval_s=round(interval_s, 3),
        reason=reason,
        # microseconds, as a manifest's save_duration_s: a save of a few milliseconds rounded
        # to the millisecond would not reproduce the interval chosen from it
        save_cost_s=round(save_cost_s, 6),
        commit_s=None if commit_s is None else round(commit_s, 6),
        mtbi_s=round(mtbi_s, 3),
        mtbi_source=mtbi_source,
        measured_saves=measured_saves,
        clamped=clamped,
    )
