"""The local demo: a 2-rank training job is preempted twice and finishes as if it never was.

    python examples/demo_local.py [--workdir out/demo-local]

No cluster needed. It runs examples/train_deterministic.py as two real processes (gloo on
CPU), sends SIGTERM once a first checkpoint has committed (a spot node's shutdown: emergency
save, exit 143), relaunches, SIGKILLs it once it has resumed and committed again (a node lost
without notice), relaunches again, and checks at the end that the final weights equal those of
an uninterrupted run, bit for bit. It follows the ranks through their runtime events
(``RTJ_EVENTS_FILE``), not through timers, so a slow start on a busy machine changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.ports import free_port  # noqa: E402
from trainer_runtime import envvars  # noqa: E402
from trainer_runtime.events import (  # noqa: E402
    COMMITTED,
    EMERGENCY_SAVED,
    RESUMED,
    RuntimeEvent,
    read_events,
)

EXAMPLE = ROOT / "examples" / "train_deterministic.py"


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def launch(work: Path, name: str, log: Path, events: Path) -> list[subprocess.Popen]:
    """Both ranks of the job; their runtime events go to ``events``, their output to ``log``."""
    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            envvars.EVENTS_FILE: str(events),
        }
        args = [
            sys.executable,
            str(EXAMPLE),
            "--folder",
            str(work / "checkpoints"),
            "--run-name",
            name,
            "--epochs",
            "4",
            "--step-sleep",
            "0.08",
            "--out",
            str(work / f"{name}.pt"),
            "--async-save",
            # No DataLoader workers (the data is synthetic, in memory): a rank that forks
            # workers right after its resume can, under CPython 3.11, leave a worker hung
            # inside fork() (docs/runtime.md, "Data position"); the demo is about preemption.
            "--workers",
            "0",
        ]
        with open(log, "ab") as out:
            procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait(procs: list[subprocess.Popen], timeout: float = 600) -> list[int]:
    return [p.wait(timeout) for p in procs]


def wait_event(
    events: Path, kind: str, procs: list[subprocess.Popen], timeout: float = 300
) -> RuntimeEvent | None:
    """The first event of ``kind`` in ``events`` once one is there; None when the ranks exit
    first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read_events(events.read_text(), kind) if events.exists() else []
        if found:
            return found[0]
        if any(p.poll() is not None for p in procs):
            return None
        time.sleep(0.05)
    return None


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGKILL whatever still runs, and reap it."""
    for p in procs:
        p.kill()
    wait(procs, 60)


def newest(work: Path, name: str) -> str:
    latest = work / "checkpoints" / name / "latest.json"
    if not latest.exists():
        return "none yet"
    return json.loads(latest.read_text())["checkpoint"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=ROOT / "out" / "demo-local")
    args = ap.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "train.log"
    say(f"logs: {log}")

    say("1/4 reference: the same job, never interrupted")
    if wait(launch(work, "reference", log, work / "events-reference.jsonl")) != [0, 0]:
        say("reference run failed; see the log")
        return 1

    say("2/4 preemptible run: SIGTERM once its first checkpoint has committed (a spot shutdown)")
    events = work / "events-spot-1.jsonl"
    procs = launch(work, "spot", log, events)
    first = wait_event(events, COMMITTED, procs)
    if first is None:
        stop(procs)
        say("the run ended or stalled before its first checkpoint; see the log")
        return 1
    for p in procs:
        p.send_signal(signal.SIGTERM)
    codes = wait(procs, 60)
    saved = read_events(events.read_text(), EMERGENCY_SAVED)
    say(f"    exited {codes} (143: saved and stopped); newest checkpoint: {newest(work, 'spot')}")
    if codes != [143, 143] or not saved:
        say("expected both ranks to save on SIGTERM and exit 143; see the log")
        return 1

    say("3/4 relaunched with the same command; SIGKILL once it has resumed and committed again")
    events = work / "events-spot-2.jsonl"
    procs = launch(work, "spot", log, events)
    resumed = wait_event(events, RESUMED, procs)
    committed = wait_event(events, COMMITTED, procs) if resumed else None
    stop(procs)
    if committed is None:
        say("the relaunched run did not resume and commit; see the log")
        return 1
    say(
        f"    resumed at step {resumed['step']}, committed {committed['checkpoint']}, killed; "
        f"newest committed checkpoint: {newest(work, 'spot')}"
    )

    say("4/4 relaunched again: runs to the end")
    if wait(launch(work, "spot", log, work / "events-spot-3.jsonl")) != [0, 0]:
        say("the resumed run failed; see the log")
        return 1
    ref = torch.load(work / "reference.pt")
    got = torch.load(work / "spot.pt")
    same = ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    resumes = [
        line.split("trainer_runtime ")[-1].strip()
        for line in log.read_text().splitlines()
        if "resumed run spot" in line or "emergency save" in line
    ]
    for line in dict.fromkeys(resumes):
        say(f"    {line}")
    say(
        "final weights equal the uninterrupted run's, bit for bit"
        if same
        else "final weights DIFFER from the uninterrupted run"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
