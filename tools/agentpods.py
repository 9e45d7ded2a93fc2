"""Pods of agents on this machine: each ``python -m trainer_runtime.agent -- python WORKER`` in its
own session, which a test or benchmark loses with SIGKILL to the whole session (a node gone),
and whose membership file it rewrites the way the operator's annotation would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "multiproc" / "survivor_worker.py"
STEPS = 40


class Pods:
    """Agent pods on this machine, each in its own session (a node)."""

    started: ClassVar[list[subprocess.Popen]] = []
    """Every pod of every ``Pods`` of this process (``kill_leftovers``)."""

    @classmethod
    def kill_leftovers(cls) -> None:
        """End every pod still running (a test that failed midway leaves a standby pod waiting
        for a membership that never comes)."""
        for proc in cls.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        cls.started.clear()

    def __init__(
        self, tmp: Path, steps: int = STEPS, step_s: float = 0.1, extra: tuple[str, ...] = ()
    ) -> None:
        self.tmp, self.folder, self.out = tmp, tmp / "ckpt", tmp / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.args = ["--folder", str(self.folder), "--out", str(self.out)]
        self.args += ["--steps", str(steps), "--step-s", str(step_s), *extra]
        self.pods: dict[str, subprocess.Popen] = {}
        self.lost: set[str] = set()

    def start(
        self,
        name: str,
        *,
        node_rank: int,
        nnodes: int,
        port: int,
        epoch: int,
        agent: bool = True,
        **env: str,
    ) -> subprocess.Popen:
        """Start pod ``name``; ``agent=False`` runs the worker alone (a cold start each time).
        Its temporary folder is its own, under the test's (a pod SIGKILLed leaves it there)."""
        scratch = self.tmp / f"tmp-{name}"
        scratch.mkdir(exist_ok=True)
        penv = {
            **os.environ,
            "RANK": str(node_rank),
            "WORLD_SIZE": str(nnodes),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "RTJ_MEMBERSHIP_EPOCH": str(epoch),
            "RTJ_MEMBERSHIP_FILE": str(self.tmp / f"membership-{name}"),
            "RTJ_REJOIN_SECONDS": "30",
            "RTJ_GRACE_PERIOD_SECONDS": "20",
            "TMPDIR": str(scratch),
            **env,
        }
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        head = [sys.executable, "-m", "trainer_runtime.agent", "--"] if agent else []
        proc = subprocess.Popen(
            [*head, sys.executable, str(WORKER), *self.args],
            env=penv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        self.pods[name] = proc
        Pods.started.append(proc)
        return proc

    def start_gang(
        self,
        nnodes: int,
        *,
        port: int,
        epoch: int = 1,
        each: Callable[[int], dict[str, str]] | None = None,
        **env: str,
    ) -> None:
        """Start pods ``pod0`` to ``pod{nnodes-1}`` of one gang; ``each(r)``: variables of pod
        ``r`` alone (its own disk, its own wait), over ``env``."""
        for r in range(nnodes):
            own = each(r) if each is not None else {}
            self.start(
                f"pod{r}", node_rank=r, nnodes=nnodes, port=port, epoch=epoch, **{**env, **own}
            )

    def announce(self, name: str, **fields: object) -> None:
        """The operator's write of a new membership into one pod's file (atomic rename)."""
        path = self.tmp / f"membership-{name}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"masterAddr": "127.0.0.1", **fields}))
        tmp.replace(path)

    def lose(self, name: str) -> float:
        """The pod's node is gone: SIGKILL to its whole session."""
        os.killpg(self.pods[name].pid, signal.SIGKILL)
        self.pods[name].wait(10)
        self.lost.add(name)
        return time.time()

    def cut_off(self, name: str) -> float:
        """The pod's node is cut off: SIGSTOP to its whole session. Its processes hold their
        connections open, so the others' collectives hang instead of failing; ``kill_leftovers``
        (or ``lose``) ends it."""
        os.killpg(self.pods[name].pid, signal.SIGSTOP)
        self.lost.add(name)
        return time.time()

    def steps(self, epoch: int, rank: int = 0) -> list[int]:
        """The steps rank ``rank`` of membership ``epoch`` trained, in order."""
        path = self.out / f"steps-{epoch}-{rank}.txt"
        if not path.exists():
            return []
        return [int(line.split()[1]) for line in path.read_text().splitlines()]

    def steps_done(self, epoch: int, rank: int = 0) -> int:
        path = self.out / f"steps-{epoch}-{rank}.txt"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_steps(self, epoch: int, n: int, timeout: float = 240) -> None:
        end = time.monotonic() + timeout
        while self.steps_done(epoch) < n:
            assert time.monotonic() < end, self.logs()
            for name, p in self.pods.items():
                assert name in self.lost or p.poll() is None, (name, self.logs())
            time.sleep(0.1)

    def wait_all(self, timeout: float = 300) -> dict[str, int]:
        end = time.monotonic() + timeout
        codes = {}
        for name, p in self.pods.items():
            if name in self.lost:
                continue
            try:
                codes[name] = p.wait(max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                raise AssertionError(self.logs()) from None
        return codes

    def first_step(self, epoch: int, rank: int) -> float:
        return float((self.out / f"first-{epoch}-{rank}").read_text())

    def kept_lines(self) -> dict[int, list[tuple[int, int, list[int]]]]:
        """step -> [(epoch, rank, ids)]: the samples each rank fed into the step in the newest
        epoch that finished it (a ``steps-`` line). The ``fed-`` lines are written before the
        backward pass, so a rank killed right after a step's all-reduce, whose samples are in
        the update the survivors keep, still has its share here."""
        finished: dict[int, int] = {}
        for path in self.out.glob("steps-*.txt"):
            for line in path.read_text().splitlines():
                epoch, step = (int(field) for field in line.split()[:2])
                finished[step] = max(epoch, finished.get(step, epoch))
        kept: dict[int, list[tuple[int, int, list[int]]]] = {step: [] for step in finished}
        for path in self.out.glob("fed-*.txt"):
            for line in path.read_text().splitlines():
                epoch, step, rank, ids = line.split()
                if finished.get(int(step)) == int(epoch):
                    batch = [int(i) for i in ids.split(",")]
                    kept[int(step)].append((int(epoch), int(rank), batch))
        return kept

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in self.tmp.glob("*.log")
        )
