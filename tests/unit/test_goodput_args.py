"""The goodput replays' command lines: what they run with, and bad values refused by name."""

from __future__ import annotations

import pytest

from benchmarks import goodput, goodput_realnodes


def test_the_defaults_replay_the_window_of_record():
    cfg, _ = goodput.parse_args([])
    assert (cfg.replicas, cfg.min_replicas, cfg.survivors) == (4, 2, "Replace")
    assert cfg.capacity().changes(), "the default window has capacity changes"
    real, _ = goodput_realnodes.parse_args(["--shrink-after", "0"])
    assert (real.replicas, real.min_replicas, real.survivors) == (3, 2, "Stay")
    assert real.shrink_after_s == 0 and real.trace == cfg.trace


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--compress", "0"], "--compress"),
        (["--min-replicas", "5"], "--min-replicas"),
        (["--notice-share", "1.5"], "--notice-share"),
        (["--trace", "no/such-trace"], "no/such-trace"),
        (["--window-start", "1e9"], "outside the trace"),
        (["--repeat", "0"], "--repeat"),
        (["--in-process-switch"], "--in-process-switch needs --survivors Stay"),
    ],
)
def test_a_bad_value_ends_the_command_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as ended:
        goodput.parse_args(argv)
    assert ended.value.code == 2
    assert named in capsys.readouterr().err


def test_the_in_process_switch_is_the_elastic_jobs_and_its_trainers():
    cfg, _ = goodput.parse_args(["--survivors", "Stay", "--in-process-switch"])
    elastic = goodput.job_manifest("elastic", "pool-b", cfg, elastic=True)["spec"]
    fixed = goodput.job_manifest("fixed", "pool-a", cfg, elastic=False)["spec"]
    assert elastic["recovery"] == {"survivors": "Stay", "inProcessSwitch": True}
    assert "--in-process-switch" in elastic["template"]["spec"]["containers"][0]["command"]
    assert fixed["recovery"] == {"survivors": "Stay"}
    assert "--in-process-switch" not in fixed["template"]["spec"]["containers"][0]["command"]


def test_the_real_node_replay_refuses_the_same_way(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        goodput_realnodes.parse_args(["--replicas", "2", "--min-replicas", "3"])
    assert "--min-replicas" in capsys.readouterr().err


def test_the_recorder_counts_a_warm_joins_wait_as_training():
    """The operator sets ``trainingSince`` once the re-formed gang trains; before its switch a
    warm join's kept pods train on (``membershipPendingSince``): time trained, not lost."""
    recorder = goodput.Recorder(None, ["j"], 1.0, print)  # type: ignore[arg-type]
    running = {"attempt": 3, "phase": "Running", "gangSize": 4}
    recorder._job("j", 10.0, {**running, "membershipPendingSince": "2026-12-05T00:00:00Z"})
    recorder._job("j", 20.0, running)  # switched: every worker restarts
    recorder._job("j", 25.0, {**running, "trainingSince": "2026-12-05T00:00:25Z"})
    assert [tick[4] for tick in recorder.records["j"].ticks] == [True, False, True]
