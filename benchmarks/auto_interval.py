"""Does ``interval="auto"`` beat a fixed interval across preemption rates? A simulation.

    python benchmarks/auto_interval.py [--save-cost 30 --restart 90 --work-hours 12]
        [--mtbi 600,3600,21600 --fixed 300,1800 --seeds 21] [--markdown OUT.md]

A job needs ``--work-hours`` of training. Interruptions come as a Poisson process of mean
``--mtbi`` seconds of wall time (during training, saves and restarts alike). Each save holds
training ``--save-cost`` seconds (a synchronous save: the cost Young-Daly counts); each
interruption throws away the work since the last commit and costs ``--restart`` seconds (new
gang, start, load) before training goes on. Goodput is the work over the wall time to finish it;
the figure per policy is the median over ``--seeds`` runs.

The fixed policies save every ``--fixed`` seconds of training. The automatic one is the
runtime's own code (``trainer_runtime.save.auto_interval.AutoInterval``) with the operator's own
MTBI rule (``rtj_operator.decide.mtbi``, reimplemented here in two lines so the benchmark needs no
operator install): every attempt starts a fresh process, with the prior save cost until its
first save is measured and the job's mean time between interruptions as the operator computes
it at that attempt (time trained plus a one-hour prior, over the interruptions that rolled work
back plus one: here every loss while a gang trained, none during a restart), grown by the
process's own time up as the runtime does, default bounds (1 min to 4 h). Its interval is
counted from the start of the last save, as the runtime does.

What it does not model: saves whose cost varies, asynchronous saves (they hold training for
less than they take to commit), interruptions that come in bursts (real spot reclaims do:
``goodput_sim.py`` replays real traces), waits for capacity (no gang is up to lose work then).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rtj_operator.decide.mtbi import smoothed_mean_seconds
from trainer_runtime.save.auto_interval import AutoInterval, AutoIntervalOptions


@dataclass(frozen=True)
class Job:
    work_s: float
    save_cost_s: float
    restart_s: float


@dataclass
class Outcome:
    wall_s: float
    interruptions: int
    saves: int
    intervals: list[float]

    def goodput(self, job: Job) -> float:
        return job.work_s / self.wall_s


def operator_mtbi(trained_s: float, rollbacks: int) -> float:
    """rtj_operator.decide.mtbi.mtbi_seconds: the time gangs trained and the interruptions
    that rolled work back."""
    return smoothed_mean_seconds(trained_s, rollbacks)


def simulate(job: Job, mtbi_s: float, fixed_s: float | None, seed: int) -> Outcome:
    """One run to completion: ``fixed_s`` seconds of training between saves, or None for the
    automatic interval."""
    rng = random.Random(seed)
    now, committed, interruptions, saves = 0.0, 0.0, 0, 0
    trained_s, rollbacks = 0.0, 0
    intervals: list[float] = []
    next_loss = rng.expovariate(1 / mtbi_s)
    first = True
    while committed < job.work_s:
        if not first:  # restart: new gang, start, load the checkpoint
            if next_loss < now + job.restart_s:
                now, interruptions = next_loss, interruptions + 1
                next_loss = now + rng.expovariate(1 / mtbi_s)
                continue
            now += job.restart_s
        first = False
        auto = None
        if fixed_s is None:
            auto = AutoInterval(
                AutoIntervalOptions(),
                operator_mtbi(trained_s, rollbacks),
                "operator",
                interruptions=rollbacks,
            )
            auto.look(now)
            intervals.append(auto.interval_s)
        done = committed
        last_save_at = now
        lost = False
        while done < job.work_s:
            if auto is None:
                train = min(fixed_s or 0.0, job.work_s - done)
            else:
                due = last_save_at + auto.interval_s
                for _ in range(5):  # the interval grows with the time up: its fixed point
                    auto.look(due)
                    due = last_save_at + auto.interval_s
                train = min(max(due - now, 0.0), job.work_s - done)
            end = now + train + job.save_cost_s
            if next_loss < end:
                trained_s += next_loss - now
                now, interruptions, lost = next_loss, interruptions + 1, True
                rollbacks += 1
                next_loss = now + rng.expovariate(1 / mtbi_s)
                break
            trained_s += end - now
            last_save_at = now + train
            now, done, saves = end, done + train, saves + 1
            committed = done
            if auto is not None:
                auto.record(job.save_cost_s, job.save_cost_s)
                intervals.append(auto.interval_s)
        if not lost:
            break
    return Outcome(now, interruptions, saves, intervals)


def human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def table(job: Job, mtbis: list[float], fixed: list[float], seeds: int) -> list[str]:
    head = ["MTBI", *[f"fixed {human(f)}" for f in fixed], "auto", "auto's interval (median)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mtbi in mtbis:
        row = [human(mtbi)]
        for policy in [*fixed, None]:
            runs = [simulate(job, mtbi, policy, seed) for seed in range(seeds)]
            row.append(f"{statistics.median(r.goodput(job) for r in runs) * 100:.1f}%")
            if policy is None:
                chosen = [i for r in runs for i in r.intervals[1:] or r.intervals]
                row.append(f"{statistics.median(chosen) / 60:.1f} min")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-cost", type=float, default=30.0, help="seconds a save holds")
    parser.add_argument("--restart", type=float, default=90.0, help="seconds per restart")
    parser.add_argument("--work-hours", type=float, default=12.0)
    parser.add_argument("--mtbi", default="600,3600,21600", help="seconds, comma-separated")
    parser.add_argument("--fixed", default="300,1800", help="seconds, comma-separated")
    parser.add_argument("--seeds", type=int, default=21)
    parser.add_argument("--markdown", type=Path, help="also write the table there")
    args = parser.parse_args(argv)
    job = Job(args.work_hours * 3600, args.save_cost, args.restart)
    mtbis = [float(x) for x in args.mtbi.split(",")]
    fixed = [float(x) for x in args.fixed.split(",")]
    lines = table(job, mtbis, fixed, args.seeds)
    setting = (
        f"{args.work_hours:g} h of training, saves holding {args.save_cost:g} s, "
        f"{args.restart:g} s per restart, Poisson interruptions, goodput = work / wall time, "
        f"median of {args.seeds} seeds"
    )
    print(setting)
    print("\n".join(lines))
    if args.markdown is not None:
        args.markdown.write_text(
            '# interval="auto" against fixed intervals (simulated)\n\n'
            "Generated by `python benchmarks/auto_interval.py "
            + " ".join(argv if argv is not None else sys.argv[1:])
            + "`.\n\n"
            + setting
            + ".\n\n"
            + "\n".join(lines)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
