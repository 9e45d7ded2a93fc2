"""``interval="auto"``: the Young-Daly rule, its bounds, its inputs, and a real training process
that saves at the cadence it reports."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.multiproc.launch import Gang
from trainer_runtime import envvars, events
from trainer_runtime.errors import ConfigError
from trainer_runtime.run.config import Settings
from trainer_runtime.save import naming
from trainer_runtime.save.auto_interval import (
    DEFAULT_MTBI_S,
    DEFAULT_SAVE_COST_S,
    AutoInterval,
    AutoIntervalOptions,
    AutoSchedule,
    clamp,
    interruptions_from,
    mtbi_from,
    young_daly,
)

REPO = Path(__file__).resolve().parents[2]


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbi():
    assert young_daly(10.0, 3600.0) == pytest.approx(math.sqrt(72000.0))  # ~268 s
    assert young_daly(0.0, 3600.0) == 0.0
    # Four times the cost or four times the MTBI: twice the interval.
    assert young_daly(40.0, 3600.0) == pytest.approx(2 * young_daly(10.0, 3600.0))
    with pytest.raises(ValueError, match="mtbi_s"):
        young_daly(1.0, 0.0)


def test_clamp():
    assert clamp(5, 10, 20) == 10 and clamp(25, 10, 20) == 20 and clamp(15, 10, 20) == 15


def rule(min_s=60.0, max_s=4 * 3600.0, mtbi=3600.0) -> AutoInterval:
    return AutoInterval(AutoIntervalOptions(min_s=min_s, max_s=max_s), mtbi, "operator")


def test_before_any_save_the_prior_cost_decides():
    choice = rule().choose()
    assert choice.save_cost_s == DEFAULT_SAVE_COST_S and choice.measured_saves == 0
    assert choice.interval_s == pytest.approx(young_daly(DEFAULT_SAVE_COST_S, 3600.0))
    assert choice.clamped is None


def test_measured_saves_move_the_interval_and_the_mean_of_the_last_ones_counts():
    r = rule()
    for held in (20.0, 20.0):
        r.record(held, commit_s=25.0)
    assert r.choose().save_cost_s == 20.0
    assert r.interval_s == pytest.approx(young_daly(20.0, 3600.0))
    for _ in range(5):  # the disk got faster: the old measurements leave the window
        r.record(2.0, commit_s=3.0)
    assert r.choose().save_cost_s == 2.0
    assert r.interval_s == pytest.approx(young_daly(2.0, 3600.0))


def test_the_bounds_clamp_and_say_which_one_did():
    r = rule(min_s=300.0, max_s=600.0, mtbi=600.0)
    r.record(0.5, commit_s=0.5)  # sqrt(600) ~ 24 s: below the floor
    assert (r.interval_s, r.choose().clamped) == (300.0, "min")
    r = rule(min_s=60.0, max_s=600.0, mtbi=24 * 3600.0)
    r.record(60.0, commit_s=60.0)  # sqrt(2*60*86400) ~ 3220 s: above the ceiling
    assert (r.interval_s, r.choose().clamped) == (600.0, "max")


def test_an_async_commit_slower_than_the_interval_raises_the_floor():
    r = rule(min_s=10.0, max_s=3600.0, mtbi=600.0)
    r.record(0.1, commit_s=90.0)  # held 0.1 s (async) but the commit takes 90 s
    assert r.interval_s == 90.0 and r.choose().clamped == "commit"


def test_only_material_changes_are_reported():
    r = rule()
    assert r.to_report() is not None  # the first one always
    assert r.to_report() is None
    r.record(DEFAULT_SAVE_COST_S * 1.1, commit_s=None)  # ~5% longer interval
    assert r.to_report() is None
    r.record(DEFAULT_SAVE_COST_S * 4, commit_s=None)  # mean 9.75: ~40% longer
    assert r.to_report() is not None


def test_the_mtbi_grows_with_the_time_this_process_is_up():
    r = AutoInterval(AutoIntervalOptions(1.0, 1e6), 1800.0, "operator", interruptions=2)
    r.record(10.0, commit_s=None)
    assert not r.due(100.0)
    assert r.mtbi_now == 1800.0
    r.due(100.0 + 3 * 3600)  # three hours up: the operator would now say 1800 + 10800 / 3
    assert r.mtbi_now == 1800.0 + 3600.0
    assert r.interval_s == pytest.approx(young_daly(10.0, 5400.0))
    assert r.choose().mtbi_s == 5400.0


def test_the_clock_is_due_an_interval_after_the_last_save():
    r = rule(min_s=60.0, max_s=60.0)
    assert not r.due(1000.0)  # the first look starts the clock
    assert not r.due(1059.0) and r.due(1060.0)
    r.saved(1060.0)
    assert not r.due(1100.0) and r.due(1120.5)


def test_options_are_validated_and_name_the_argument():
    assert AutoIntervalOptions.resolve(timedelta(minutes=2), 600) == AutoIntervalOptions(120, 600)
    with pytest.raises(ConfigError, match="interval_min"):
        AutoIntervalOptions.resolve(0, None)
    with pytest.raises(ConfigError, match="interval_max"):
        AutoIntervalOptions.resolve(None, "1h")
    with pytest.raises(ConfigError, match="interval_min=600s is above interval_max=60s"):
        AutoIntervalOptions.resolve(600, 60)


def test_the_mtbi_comes_from_the_operator_or_the_prior():
    assert interruptions_from({}) == 0 and interruptions_from({envvars.INTERRUPTIONS: "4"}) == 4
    with pytest.raises(ConfigError, match=envvars.INTERRUPTIONS):
        interruptions_from({envvars.INTERRUPTIONS: "-1"})
    assert mtbi_from({}) == (DEFAULT_MTBI_S, "prior")
    assert mtbi_from({envvars.MTBI_SECONDS: "1800"}) == (1800.0, "operator")
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(ConfigError, match=envvars.MTBI_SECONDS):
            mtbi_from({envvars.MTBI_SECONDS: bad})


def resolve(**overrides):
    args = {
        "folder": None,
        "filename": naming.DEFAULT_FILENAME,
        "latest_filename": None,
        "run_name": "r",
        "interval": "auto",
        "num_checkpoints_to_keep": -1,
        "num_local_checkpoints_to_keep": None,
        "num_remote_checkpoints_to_keep": -1,
        "weights_only": False,
        "overwrite": False,
        "autoresume": True,
        "resume_from": None,
        "load_path": None,
        "load_weights_only": False,
        "load_strict": True,
        "load_ignore_keys": (),
        "async_save": False,
        "async_policy": "wait",
        "trusted_pickle": False,
        "quarantined": None,
        "data_skip_steps": 0,
        "sampler_batch_size": None,
        "has_sampler": False,
        "ignore_data_position": False,
        "elastic": False,
        "global_batch_size": None,
        "handle_sigterm": False,
        "notice_file": None,
        "grace_period_s": None,
        "preemption_exit_code": 143,
        "upload_flush_timeout_s": None,
        "final_save": True,
        "coordination_timeout": timedelta(minutes=1),
    }
    return Settings.resolve(**{**args, **overrides})


def test_the_manager_settings_accept_auto_and_its_bounds_only_with_it():
    settings = resolve(interval_min=30, interval_max=900)
    assert settings.auto_interval == AutoIntervalOptions(30.0, 900.0)
    assert resolve(interval="100ba").auto_interval is None
    with pytest.raises(ConfigError, match="interval='auto' only"):
        resolve(interval="100ba", interval_min=30)


class Agree:
    def __init__(self, others_due: bool = False) -> None:
        self.others_due = others_due

    def max_ints(self, values: list[int]) -> list[int]:
        return [max(values[0], int(self.others_due))]


def test_a_rank_that_is_due_makes_every_rank_save(capsys):
    now = [0.0]
    schedule = AutoSchedule(
        AutoIntervalOptions(60.0, 60.0),
        rank=1,
        coord=Agree(others_due=True),
        environ={},
        clock=lambda: now[0],
    )
    assert schedule.due()  # not due here, but another rank is: all save at this step
    assert not [e for e in events.read_events(capsys.readouterr().err)], "rank 1 reports nothing"


def test_rank_0_reports_the_start_and_material_changes(capsys):
    class Saved:
        def __init__(self, held: float) -> None:
            self.held_s, self.duration_s = held, held

    schedule = AutoSchedule(
        AutoIntervalOptions(1.0, 10_000.0), rank=0, coord=Agree(), environ={}, clock=lambda: 0.0
    )
    saved = [Saved(20.0)]
    schedule.observe(saved)
    schedule.observe(saved)  # nothing new: no event
    chosen = events.read_events(capsys.readouterr().err, events.INTERVAL_CHOSEN)
    assert [e["reason"] for e in chosen] == ["start", "measured"]
    assert chosen[0]["mtbi_source"] == "prior" and chosen[0]["measured_saves"] == 0
    assert chosen[1]["interval_s"] == pytest.approx(young_daly(20.0, DEFAULT_MTBI_S), abs=0.01)


JOB = """
import sys, time
import torch
from trainer_runtime import CheckpointManager

model = torch.nn.Linear(64, 64)
ck = CheckpointManager(
    model=model, folder=sys.argv[1], run_name="r", interval="auto",
    interval_min=0.3, interval_max=3.0, final_save=False,
)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    ck.batch_end(4)
    time.sleep(0.01)
ck.close()
"""


def test_a_real_process_reports_its_interval_and_saves_at_that_cadence(tmp_path):
    """MTBI 20 s over 9 interruptions from the environment; the prior cost (5 s) asks
    sqrt(200) = 14 s, clamped to
    interval_max 3 s; the first save measures a cost of a few ms, and sqrt(2 * C * 20) moves
    the interval down materially: a second event, and the saves follow it."""
    target = tmp_path / "events.jsonl"
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck"), "12"],
        check=False,
        cwd=REPO,
        env={
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
            envvars.EVENTS_FILE: str(target),
            envvars.MTBI_SECONDS: "20",
            envvars.INTERRUPTIONS: "9",
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = events.read_events(target.read_text().splitlines())
    chosen = [e for e in found if e.type == events.INTERVAL_CHOSEN]
    assert chosen[0]["reason"] == "start" and chosen[0]["interval_s"] == 3.0
    assert chosen[0]["clamped"] == "max" and chosen[0]["mtbi_s"] == 20.0
    assert chosen[0]["mtbi_source"] == "operator"
    assert len(chosen) >= 2 and chosen[1]["reason"] == "measured", [e.fields for e in chosen]
    for e in chosen[1:]:
        assert 20.0 <= e["mtbi_s"] <= 20.0 + 15 / 10  # grows by the time up over 9 + 1
        ideal = young_daly(e["save_cost_s"], e["mtbi_s"])
        floor = max(0.3, e["commit_s"] or 0.0)
        assert e["interval_s"] == pytest.approx(clamp(ideal, floor, 3.0), abs=0.01)
    # Each gap between commits is the interval in force when it began (plus a step or two and
    # the save itself), never the fixed schedule of anything else.
    at = {id(e): datetime.fromisoformat(e.time).timestamp() for e in found}
    saves = [e for e in found if e.type == events.COMMITTED]
    assert len(saves) >= 4, [e.fields for e in found]
    gaps = []
    for before, after in itertools.pairwise(saves):
        in_force = [c for c in chosen if at[id(c)] <= at[id(before)] + 0.05][-1]["interval_s"]
        gaps.append((at[id(after)] - at[id(before)], in_force))
    for gap, interval in gaps:
        assert interval * 0.8 <= gap <= interval + 1.0, gaps
    if any(e["interval_s"] < 3.0 for e in chosen[1:]):
        # The measured cost moved the interval down (a save costs a few ms on a quiet machine;
        # on a loaded one it may measure long enough to stay clamped at 3 s, checked above):
        # the saves then come sooner than the old interval.
        first_gap_after_change = [g for g, i in gaps if i < 3.0]
        assert first_gap_after_change and max(first_gap_after_change) < 2.9, gaps


GANG_JOB = """
import json, sys, time
import torch, torch.distributed as dist
from trainer_runtime import CheckpointManager

dist.init_process_group("gloo")
rank = dist.get_rank()
ck = CheckpointManager(
    model=torch.nn.Linear(64, 64), folder=sys.argv[1], run_name="r", interval="auto",
    interval_min=0.3, interval_max=1.5, final_save=False,
)
for _ in range(300):
    ck.batch_end(4)
    time.sleep(0.01 * (1 + 2 * rank))  # rank 1 is slower: each rank's clock says another thing
ck.close()
print("SAVED", json.dumps([s.name for s in ck.saved]), flush=True)
dist.destroy_process_group()
"""


def test_two_ranks_agree_on_every_automatic_save(tmp_path):
    """Each rank times its own saves; a save is due on every rank at the same step (a rank
    that saved alone would hang the collective save)."""
    script = tmp_path / "gang.py"
    script.write_text(GANG_JOB)
    target = tmp_path / "events.jsonl"
    env = {envvars.EVENTS_FILE: str(target), envvars.MTBI_SECONDS: "20"}
    gang = Gang(script, [str(tmp_path / "ck")], 2, tmp_path / "logs", env)
    assert gang.wait(180) == [0, 0], [
        (tmp_path / "logs" / f"rank{r}.log").read_text()[-2000:] for r in range(2)
    ]
    saved = []
    for rank in range(2):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        saved.append(next(line for line in log.splitlines() if line.startswith("SAVED ")))
    assert saved[0] == saved[1]
    found = events.read_events(target.read_text().splitlines())
    chosen = [e for e in found if e.type == events.INTERVAL_CHOSEN]
    assert chosen and {e.rank for e in chosen} == {0}
    assert len([e for e in found if e.type == events.COMMITTED]) >= 3
