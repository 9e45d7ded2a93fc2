"""The story's narration: one line for each thing that changes, as it happens.

It reads only what a user can read too: the job's status (phases, attempts, interruptions,
checkpoints, conditions), where its pods run, and rank 0's runtime events (``rtj-event`` lines in
its log, ``facts.py``). A daemon thread polls them; the alternative, hooking the story's own
actions, would narrate what the story did rather than what the system did about it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

from rtj_operator.api import names

from .common import Say
from .facts import emergency_save, last_resume, notice_checkpoint, started_fresh

if TYPE_CHECKING:
    from .stack import LocalStack


RESTARTING = "Restarting"
"""The job's phase between two attempts, and the condition that records it."""


def _has_condition(status: dict, kind: str) -> bool:
    return any(c.get("type") == kind for c in status.get("conditions") or [])


class Narrator:
    """Watches a job and says, one line each, what changes: phases, attempts, where the ranks
    run, committed checkpoints, notices, interruptions (with the steps they lost), resumes.

    A daemon thread, so the caller's waits and actions stay simple; every line carries the time
    since the job was submitted. ``lines`` keeps them for summaries and test failure messages.
    """

    def __init__(self, stack: LocalStack, job: str, say: Say, *, interval: float = 0.3) -> None:
        self.stack, self.job, self.say_out, self.interval = stack, job, say, interval
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._stop = False
        self._seen: set[str] = set()
        self._phase: str | None = None
        self._attempt: int | None = None
        self._checkpoint: str | None = None
        self._interruptions = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        """Say a line, stamped with the time since submission."""
        line = f"[{time.monotonic() - self.started:6.1f}s] {text}"
        self.lines.append(line)
        self.say_out(line)

    def __enter__(self) -> Narrator:
        self._thread = threading.Thread(target=self._run, name="narrator", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(Exception):
            self.poll()  # the last word (e.g. Succeeded)

    def _run(self) -> None:
        while not self._stop:
            try:
                self.poll()
            except Exception as err:  # the narration must never break the story
                self._once(f"error:{type(err).__name__}", f"(narrator: {err})")
            time.sleep(self.interval)

    def _once(self, key: str, text: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self.say(text)

    def poll(self) -> None:
        """Compare the job with what was said already; say what is new (thread-safe)."""
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        job = self.stack.job(self.job)
        replicas = int((job.get("spec") or {}).get("replicas", 1))
        status = job.get("status") or {}
        attempt = int(status.get("attempt", 0))
        for item in (status.get("interruptions") or [])[self._interruptions :]:
            kind = "preemption" if item.get("preemption") else "failure"
            self.say(
                f"operator: attempt {item.get('attempt')} interrupted: {item.get('cause')} "
                f"of rank {item.get('rank')} on {item.get('node')} ({kind}; "
                f"{status.get('preemptions', 0)} preemption(s), "
                f"{status.get('failures', 0)} failure(s) so far); last committed step "
                f"{item.get('lastCommittedStep')}, steps lost {item.get('stepsLost')}"
            )
        self._interruptions = len(status.get("interruptions") or [])
        phase = status.get("phase")
        if attempt != self._attempt and phase:
            if attempt > 0:
                self.say(
                    f"operator: attempt {attempt} submitted with RTJ_RESUME_FROM="
                    f"{status.get('resumeFrom') or '(empty)'}"
                )
                if RESTARTING not in (phase, self._phase) and _has_condition(status, RESTARTING):
                    # The new gang ran before the next poll: the phase went Restarting and
                    # back between two polls, which the Restarting condition records.
                    self.say(f"job phase: {RESTARTING}")
                    self._phase = RESTARTING
            self._attempt = attempt
        if phase and phase != self._phase:
            self.say(f"job phase: {phase}")
            self._phase = phase
        last = status.get("lastCommittedCheckpoint") or {}
        if last.get("name") and last["name"] != self._checkpoint:
            self._checkpoint = last["name"]
            self.say(
                f"checkpoint {last['name']} committed at step {last.get('step')} "
                f"(attempt {last.get('attempt')}), in the object store"
            )
            progress = status.get("progress") or {}
            if progress.get("percent"):
                self.say(
                    f"kubectl get rtj: PROGRESS {progress['percent']} of "
                    f"{progress.get('totalSteps')} steps, ETA {progress.get('eta') or '-'}"
                )
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PreemptionNotice" and cond.get("status") == "True":
                self._once(
                    f"notice:{cond.get('lastTransitionTime')}",
                    f"operator: preemption notice: {cond.get('message')}",
                )
        pods = self.stack.pods(self.job, attempt)
        placed = {
            p["metadata"]["labels"].get(names.LABEL_RANK): p["spec"].get("nodeName") for p in pods
        }
        if len(placed) == replicas and all(placed.values()):
            where = ", ".join(f"rank {r} on {n}" for r, n in sorted(placed.items()))
            self._once(f"placed:{attempt}", f"attempt {attempt}: {where}")
        for seen in range(max(0, attempt - 1), attempt + 1):  # an old gang may still be saving
            self._from_log(seen, self.stack.pod_log(f"{self.job}-a{seen}-r0"))

    def _from_log(self, attempt: int, log: str) -> None:
        """What rank 0's runtime events say (its ``rtj-event`` lines, never its log wording)."""
        if not log:
            return
        resumed = last_resume(log)
        if resumed is not None:
            remote = resumed["source"] == "remote"
            origin = f"fetched {resumed['uri']}" if remote else "local copy"
            self._once(
                f"resumed:{attempt}",
                f"attempt {attempt}: rank 0 resumed at step {resumed['step']} ({origin})",
            )
            for line in resumed["fallbacks"]:
                self._once(f"fallback:{attempt}:{line}", f"attempt {attempt}: passed over {line}")
        elif started_fresh(log):
            self._once(f"fresh:{attempt}", f"attempt {attempt}: rank 0 started from scratch")
        notice = notice_checkpoint(log)
        if notice is not None:
            self._once(
                f"noticesave:{attempt}",
                f"attempt {attempt}: rank 0 saved at once on the notice: checkpoint "
                f"{notice[0]} at step {notice[1]}, and trains on",
            )
        emergency = emergency_save(log)
        if emergency is not None:
            name, seconds = emergency
            when = "" if seconds is None else f", {seconds:.2f}s after the signal"
            self._once(
                f"sigterm:{attempt}",
                f"attempt {attempt}: rank 0 saved on SIGTERM: checkpoint "
                f"{name or '(none new: the step was saved already)'}{when}, and exited",
            )
