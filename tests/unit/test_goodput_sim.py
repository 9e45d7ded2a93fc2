"""The goodput simulator (pure): figures on tiny traces worked out by hand, the phase-cost file,
and the relations between policies that must hold on any trace (and one that need not).

The hand-made model: every cold start (and a new rank's join) takes 50 s, a loss is seen 10 s
after it (1 s with a notice), old pods are gone 10 s later, re-forming takes 5 s, saves commit
at once, a checkpoint every 100 s of training, a step is 2 s. One sample per node-second. The
trace's end is the job's: a training gang saves then.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import goodput_sim as gs
from benchmarks import spot_traces as st
from benchmarks.spot_traces import Trace

ZERO = gs.Phases(**dict.fromkeys(gs.PHASES, 0.0))
HAND = gs.Model(
    phases=replace(ZERO, pods_created=50.0, detected=10.0, old_pods_gone=10.0),
    image_pull_s=0.0,
    notice_detect_s=1.0,
    reform_s=5.0,
    checkpoint_gb=0.0,
    save_block_s=0.0,
    step_s=2.0,
    interval_s=100.0,
    notice_share=0.0,
    notice_s=30.0,
    min_fraction=0.5,
    shrink_after_s=0.0,
    grow_min_interval_s=0.0,
)

# 4 nodes; one lost at 1000 s, back at 1200 s; the trace ends at 2000 s.
LOSS = Trace("loss", "hand", ((0, 4), (1000, 3), (1200, 4), (2000, 4)))
IDEAL = 4 * 1000 + 3 * 200 + 4 * 800


def sim(policy: str, capacity: Trace = LOSS, **model: object) -> gs.Result:
    return gs.simulate(capacity, 4, policy, replace(HAND, **model))


def kept(result: gs.Result) -> float:
    return result.kept_node_h * 3600


def test_without_changes_goodput_is_the_committed_share_of_the_time():
    flat = Trace("flat", "hand", ((0, 4), (1050, 4)))
    r = gs.simulate(flat, 4, "fixed", replace(HAND, phases=ZERO))
    # Saves at 100, 200, ..., 1000 s, and the final save at 1050 s.
    assert r.goodput == 1.0
    stopped = Trace("stopped", "hand", ((0, 4), (1050, 0), (1100, 0)))
    # A gang that is not training at the end has nothing to save: the 50 s since 1000 s are
    # lost with the nodes.
    assert gs.simulate(stopped, 4, "fixed", replace(HAND, phases=ZERO)).goodput == 1000 / 1050
    assert r.ceiling == 1.0
    assert (r.interruptions, r.cold_starts) == (0, 1)


def test_fixed_one_loss_costs_the_work_since_the_checkpoint_and_a_restart():
    r = sim("fixed")
    # Ready at 50; checkpoints every 100 s of training, the last at 950 s (900 s of training).
    # The loss at 1000 s rolls back 50 s of 4 nodes. The gang waits for the 4th node (1200 s),
    # restarts (50 s), trains 1250..2000 s: 7 more checkpoints and the final save, 750 s.
    assert kept(r) == pytest.approx(900 * 4 + 750 * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(50 * 4)
    assert r.goodput == pytest.approx(6600 / IDEAL)
    assert r.ceiling == pytest.approx((1000 + 800) * 4 / IDEAL)
    assert (r.interruptions, r.cold_starts, r.min_replicas) == (1, 2, 4)


def test_elastic_shrinks_after_the_teardown_and_grows_through_a_checkpoint():
    r = sim("elastic")
    # Loss at 1000: back to 3600 (the 950 s checkpoint); old pods gone at 1020; restart at 3
    # nodes, training from 1070: a checkpoint at 1170 (3900), then 30 s more (3990). At 1200 the
    # node is back: the grow checkpoint commits at once with 3990; old pods gone at 1210, the
    # 4-node gang trains from 1260 to the end: 740 s.
    assert kept(r) == pytest.approx(3990 + 740 * 4)
    assert r.ceiling == 1.0
    assert (r.interruptions, r.cold_starts, r.min_replicas) == (1, 3, 2)


def test_elastic_waits_for_the_grow_interval_before_growing():
    r = sim("elastic", grow_min_interval_s=300.0)
    # The 3-node gang (from 1020) may grow only at 1320: checkpoints at 1170 and 1270, 4350 at
    # the grow; the 4-node gang trains from 1380 to the end: 620 s.
    assert kept(r) == pytest.approx(4350 + 620 * 4)


def test_elastic_waits_shrink_after_seconds_for_the_full_gang():
    quick = Trace("quick", "hand", ((0, 4), (1000, 3), (1100, 4), (2000, 4)))
    patient = sim("elastic", quick, shrink_after_s=200.0)
    # The node is back (1100 s) before the 200 s are over: a full restart, as fixed does,
    # training from 1150.
    assert kept(patient) == kept(sim("fixed", quick)) == pytest.approx(3600 + 850 * 4)
    eager = sim("elastic", quick)
    # At once: 3 nodes from 1070 to 1100 (90 samples, kept by the grow's checkpoint), then the
    # 4-node gang from 1160.
    assert kept(eager) == pytest.approx(3690 + 840 * 4)


def test_elastic_warm_loses_one_step_and_the_survivors_train_on():
    r = sim("elastic-warm")
    # The loss takes the step in flight (2 s x 4 nodes): 3792. Survivors re-form at 1015 and
    # train at 3 (checkpoints, 100 s of wall time apart, at 1050 and 1150: 4197); the new rank
    # starts at 1200 and joins at 1250 (4497, a checkpoint), the gang of 4 trains from 1255.
    assert kept(r) == pytest.approx(4497 + 745 * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(8)
    assert (r.interruptions, r.cold_starts, r.reforms) == (1, 1, 2)


def test_elastic_warm_without_replicated_state_reloads_the_checkpoint_but_skips_the_restart():
    r = sim("elastic-warm", state_replicated=False)
    # Back to 3600 at the loss; training again at 1015 (detection and re-form; the reload is
    # free in the hand model): checkpoints at 1050 (3705), 1150 (4005) and at the join, 1250
    # (4305); the gang of 4 from 1255.
    assert kept(r) == pytest.approx(4305 + 745 * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(200)


def test_fixed_warm_waits_for_the_full_gang_holding_its_state():
    r = sim("fixed-warm")
    # 3792 after the lost step; idle at 3 nodes; the new rank joins at 1250, training from 1255
    # (a checkpoint at once: the interval since the last, at 950, is over).
    assert kept(r) == pytest.approx(3792 + 745 * 4)


def test_warm_keeps_more_than_cold_here():
    # Before the final save, fixed-warm could keep less than fixed on this very trace: its last
    # checkpoint fell 95 s before the end, fixed's 50 s.
    assert kept(sim("fixed-warm")) > kept(sim("fixed"))
    assert kept(sim("elastic-warm")) > kept(sim("elastic")) > kept(sim("fixed"))


def test_losing_every_node_makes_warm_recovery_a_cold_start():
    wipe = Trace("wipe", "hand", ((0, 4), (1000, 0), (1200, 4), (2000, 4)))
    warm, cold = sim("elastic-warm", wipe), sim("fixed", wipe)
    assert kept(warm) == kept(cold) == pytest.approx(3600 + 750 * 4)
    assert warm.cold_starts == cold.cold_starts == 2


def test_a_notice_saves_the_work_up_to_it_when_the_save_commits_in_time():
    r = sim("fixed", notice_share=1.0)
    # Notice at 970: the emergency checkpoint holds (970 - 50) x 4; 30 s of work is lost.
    assert kept(r) == pytest.approx(920 * 4 + 750 * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(30 * 4)


def test_an_emergency_save_that_commits_after_the_node_went_does_not_count():
    # 160 GB written by 4 nodes at 1 GB/s: every save commits 40 s after it begins; the notice
    # comes 30 s before the loss.
    r = sim("fixed", notice_share=1.0, checkpoint_gb=160.0)
    assert kept(r) == pytest.approx(900 * 4 + 750 * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(50 * 4)


def test_notices_are_spread_evenly_over_the_losses():
    dips = Trace("dips", "hand", ((0, 4), (100, 3), (200, 4), (300, 2), (400, 4), (500, 4)))
    half = gs.events(dips, replace(HAND, notice_share=0.5))
    assert [(e[0], e[2], e[5]) for e in half] == [
        (100, "change", False),
        (200, "change", False),
        (270, "notice", True),
        (300, "change", True),
        (400, "change", False),
    ]
    assert not any(e[5] for e in gs.events(dips, HAND))
    early = gs.events(dips, replace(HAND, notice_share=1.0, notice_s=150.0))
    assert [e[0] for e in early if e[2] == "notice"] == [0.0, 150.0]


def test_the_ceiling_leaves_out_capacity_below_min_replicas():
    low = Trace("low", "hand", ((0, 4), (100, 1), (200, 4), (300, 4)))
    assert sim("elastic", low).ceiling == pytest.approx(800 / 900)
    assert sim("fixed", low).ceiling == pytest.approx(800 / 900)
    assert sim("elastic", LOSS).ceiling == 1.0


def test_the_automatic_interval_is_young_daly_over_the_losses_that_rolled_back():
    auto = replace(HAND, interval_s=None, save_block_s=5.0)
    every = gs.Interval(auto)
    assert every.seconds(5.0) == pytest.approx((2 * 5 * 3600) ** 0.5)  # the prior alone
    every.trained_s, every.counted = 14_400.0, 1  # M = (4 h + 1 h) / 2
    assert every.seconds(5.0) == pytest.approx(300.0)
    assert every.seconds(500.0) == 500  # never shorter than a commit
    every.loss(False)  # covered by survivors: not counted
    assert every.counted == 1
    every.loss(True)
    assert every.counted == 2
    assert gs.Interval(replace(auto, save_block_s=0.01)).seconds(1.0) == 60  # the runtime's min
    never = gs.Interval(auto)
    never.trained_s = 1e9
    assert never.seconds(5.0) == 4 * 3600  # the runtime's max
    old = gs.Interval(replace(auto, every_loss_interval=True))
    old.loss(False)
    assert old.counted == 1
    assert gs.Interval(HAND).seconds(1e6) == 100  # a fixed interval is kept
    with pytest.raises(ValueError, match="interval_s=0"):
        gs.Interval(replace(HAND, interval_s=0.0))


def test_each_policy_counts_its_own_rollbacks_and_training_time():
    auto = replace(HAND, interval_s=None, save_block_s=5.0)
    # fixed: trains 50..1000 and 1250..2000 (1700 s), its loss rolled back work: M = 5300 / 2.
    assert sim("fixed", interval_s=None, save_block_s=5.0).interval_s == pytest.approx(
        (2 * 5 * 2650) ** 0.5
    )
    # elastic-warm: trains 50..1000, 1015..1250 and 1255..2000 (1930 s); its survivors covered
    # the loss: M = 5530.
    warm = gs.simulate(LOSS, 4, "elastic-warm", auto)
    assert warm.interval_s == pytest.approx((2 * 5 * 5530) ** 0.5)
    # The rule before counted that loss too: M = 5530 / 2.
    before = gs.simulate(LOSS, 4, "elastic-warm", replace(auto, every_loss_interval=True))
    assert before.interval_s == pytest.approx((2 * 5 * 2765) ** 0.5)
    # Losing every node rolls a warm gang back: it trains 50..1000 and 1250..2000, M = 5300 / 2.
    wipe = Trace("wipe", "hand", ((0, 4), (1000, 0), (1200, 4), (2000, 4)))
    assert gs.simulate(wipe, 4, "elastic-warm", auto).interval_s == pytest.approx(
        (2 * 5 * 2650) ** 0.5
    )


STAY_ALONE = replace(
    HAND,
    phases=replace(HAND.phases, process_group_formed=3.0, checkpoint_fetched=4.0),
    worker_start_s=1.0,
    checkpoint_gb=40.0,
    write_gbps=1.0,
    survivor_save_split=False,
    restart_prefetch=False,
)
"""The hand model of the product's Stay, one survivor writing the whole replica, a restarted
worker fetching once its gang formed."""


def test_stay_restarts_every_worker_from_a_survivors_save():
    """The product's Stay: a loss without notice waits for one survivor's save of the whole
    replica, then every worker restarts and loads it; new ranks start in standby and join
    through the gang's save of the step it reached."""
    model = STAY_ALONE
    assert model.restart() == 1 + 3 + 4  # worker, process group, fetch (load, step: 0)
    assert model.survivor_save(3) == 40  # 40 GB by one process at 1 GB/s
    assert model.standby(False) == 50  # pods_created; no state fetched yet
    r = gs.simulate(LOSS, 4, "elastic-stay", model)
    # The cold start takes 57 s (pod 50, process group 3, fetch 4). Loss at 1000 s: 943 s x 4
    # trained, less the step in flight: 3764. Seen at 1010, the survivor's save of it (40 s)
    # and the restart (8 s): 3 ranks train from 1058, 192 s until the new pod is in standby
    # (1250): 4340. Then the gang's save of the step it reached (40 GB / 3 nodes) and the
    # restart: 4 ranks from 1271.33 to the end.
    assert kept(r) == pytest.approx(4340 + (2000 - 1250 - 40 / 3 - 8) * 4)
    assert (r.interruptions, r.cold_starts, r.reforms) == (1, 1, 2)
    # The product's default wait for the full gang: 0 with Stay, 60 s without.
    assert (gs.Model().shrink_after(stay=True), gs.Model().shrink_after(stay=False)) == (0, 60)
    # With shrinkAfterSeconds the kept pods first wait that long for the lost node (30 s x 3).
    waited = gs.simulate(LOSS, 4, "elastic-stay", replace(model, shrink_after_s=30.0))
    assert kept(waited) == pytest.approx(kept(r) - 30 * 3)
    # With grow.minIntervalSeconds the node back at 1200 gets its pod only 300 s after the
    # resume (1358): in standby at 1408, then the save and the restart.
    later = gs.simulate(LOSS, 4, "elastic-stay", replace(model, grow_min_interval_s=300.0))
    assert kept(later) == pytest.approx(3764 + 350 * 3 + (2000 - 1408 - 40 / 3 - 8) * 4)
    assert r.rolled_back_node_h * 3600 == pytest.approx(8)
    warm = gs.simulate(LOSS, 4, "elastic-warm", model)
    assert kept(r) < kept(warm)
    # The survivor's save covered the loss: the automatic interval does not count it (trained:
    # 57..1000, 1058..1250, and from the switch's save, now 5 s longer, and restart).
    auto = replace(model, interval_s=None, save_block_s=5.0)
    trained = 943 + 192 + (2000 - 1250 - (5 + 40 / 3) - 8)
    assert gs.simulate(LOSS, 4, "elastic-stay", auto).interval_s == pytest.approx(
        (2 * 5 * (trained + 3600)) ** 0.5
    )


def test_the_kept_pods_save_a_large_replica_in_shares():
    """The product's split survivors' save: the kept pods meet, then each writes 1/K; a replica
    below RTJ_SURVIVOR_SPLIT_MIB, or one kept pod, is written by one process."""
    alone = STAY_ALONE
    split = replace(alone, survivor_save_split=True, savers_meet_s=2.0)
    assert split.survivor_save(3) == pytest.approx(2 + 40 / 3)
    assert split.survivor_save(1) == 40
    assert replace(split, checkpoint_gb=1.0).survivor_save(3) == 1.0  # under 1024 MiB
    # The loss of the hand trace (see above): 3 kept ranks train again 40 - 15.33 s sooner.
    before = gs.simulate(LOSS, 4, "elastic-stay", alone)
    after = gs.simulate(LOSS, 4, "elastic-stay", split)
    assert kept(after) == pytest.approx(kept(before) + (40 - 2 - 40 / 3) * 3)


def test_a_restarted_worker_fetches_while_its_gang_forms():
    """The download starts when node rank 0's agent says the old saves are over, as the workers
    start (1 s) and the group forms (3 s): the 4 s fetch ends with them. Both restarts of the
    hand trace (3 ranks after the loss, 4 at the switch) end 4 s sooner."""
    after = replace(STAY_ALONE, restart_prefetch=True)
    assert after.restart() == 4 and STAY_ALONE.restart() == 1 + 3 + 4
    slow = replace(after, phases=replace(after.phases, checkpoint_fetched=10.0))
    assert slow.restart() == 10  # a fetch longer than the start is all that is left
    before = gs.simulate(LOSS, 4, "elastic-stay", STAY_ALONE)
    now = gs.simulate(LOSS, 4, "elastic-stay", after)
    assert kept(now) == pytest.approx(kept(before) + 4 * 3 + 4 * 4)


def test_a_lost_node_is_a_training_rank_first_unless_idle_nodes_go_first():
    """A node back at 1100 s sits idle through the grow interval; the node lost at 1150 s is a
    training rank (the default, pessimistic) or that idle one (``idle_lost_first``)."""
    idle = Trace("idle", "hand", ((0, 4), (1000, 3), (1100, 4), (1150, 3), (2000, 3)))
    for policy in ("elastic", "elastic-stay"):
        hit = sim(policy, idle, grow_min_interval_s=300.0)
        spared = sim(policy, idle, grow_min_interval_s=300.0, idle_lost_first=True)
        assert (hit.interruptions, spared.interruptions) == (2, 1), policy
        assert kept(hit) < kept(spared), policy


def test_a_grow_that_would_not_pay_for_its_pause_is_held_back():
    """``grow.onlyWhenItPays``, the operator's rule (``GrowCost``) on the gang's own history:
    with 700 s restarts and a node back for 300 s at a time, growing into it stops the gang for
    longer than the node stays; with restarts of a second, every grow pays."""
    flap = Trace(
        "flap", "hand", ((0, 4), (1000, 3), (2000, 4), (2300, 3), (3300, 4), (3600, 3), (5000, 3))
    )
    slow = replace(HAND, worker_start_s=700.0)
    held = gs.simulate(flap, 4, "elastic-stay", slow)
    always = gs.simulate(flap, 4, "elastic-stay", replace(slow, grow_only_when_it_pays=False))
    assert kept(held) > kept(always) and held.reforms < always.reforms
    quick = replace(HAND, worker_start_s=1.0)
    assert gs.simulate(flap, 4, "elastic-stay", quick) == gs.simulate(
        flap, 4, "elastic-stay", replace(quick, grow_only_when_it_pays=False)
    )


def test_load_phases_reads_durations_p50s_and_cumulative_offsets(tmp_path: Path):
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"detected": 1.5, "bound": {"p50": 0.2, "p95": 3}}))
    phases, named = gs.load_phases(flat)
    assert (phases.detected, phases.bound, named) == (1.5, 0.2, ["bound", "detected"])
    assert phases.loaded == gs.Phases().loaded
    nested = tmp_path / "nested.json"
    nested.write_text(
        json.dumps({"runs": 3, "cumulative": True, "phases": {"detected": 2, "bound": 5}})
    )
    phases, _ = gs.load_phases(nested, ZERO)
    assert (phases.detected, phases.bound, phases.loaded) == (2, 3, 0)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('{"detected": 1,\n "warp": 2}', r"bad\.json: unknown phase 'warp'"),
        ('{"detected": -1}', r"bad\.json: phase 'detected' is -1"),
        ('{"detected": 1,\n', r"bad\.json:2: not JSON"),
        ('{"cumulative": true, "phases": {"detected": 5, "bound": 2}}', r"'bound' at 2"),
    ],
)
def test_load_phases_errors_name_the_file(tmp_path: Path, doc: str, message: str):
    path = tmp_path / "bad.json"
    path.write_text(doc)
    with pytest.raises(ValueError, match=message):
        gs.load_phases(path)


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="elastic-warm"):
        sim("hopeful")


@pytest.mark.parametrize("name", [n for n in st.known_traces() if n.startswith("bamboo/")])
def test_relations_that_hold_on_every_trace(name: str):
    trace = st.load(name)
    model = gs.Model()
    for result in gs.run(trace, [4, 16, 64], model):
        assert 0 <= result.goodput <= result.ceiling + 1e-12 <= 1 + 1e-12
    # minReplicas == replicas makes elastic a fixed gang and elastic-warm a fixed-warm one.
    whole = replace(model, min_fraction=1.0)
    for size in (4, 16):
        capacity = st.scaled(trace, size)
        runs = {p: gs.simulate(capacity, size, p, whole) for p in gs.POLICIES}
        assert replace(runs["elastic"], policy="fixed") == runs["fixed"]
        assert replace(runs["elastic-warm"], policy="fixed-warm") == runs["fixed-warm"]
        assert replace(runs["elastic-stay"], policy="fixed-stay") == runs["fixed-stay"]
        half = gs.simulate(capacity, size, "elastic", model)
        assert half.ceiling >= runs["fixed"].ceiling


def test_cli_prints_a_table_per_trace_and_writes_json(tmp_path: Path, capsys):
    costs = tmp_path / "phases.json"
    costs.write_text(json.dumps({"phases": {"detected": 3.0}}))
    out = tmp_path / "out.json"
    name = "bamboo/g4dn-us-east-1c-2020-11-20"
    argv = ["--trace", name, "--nodes", "4", "16", "--costs", str(costs), "--json", str(out)]
    assert gs.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"from {costs}: detected" in printed
    assert printed.count("elastic-warm") == 2
    doc = json.loads(out.read_text())
    assert doc["model"]["phases"]["detected"] == 3.0
    assert {(r["nodes"], r["policy"]) for r in doc["results"]} == {
        (n, p) for n in (4, 16) for p in gs.POLICIES
    }


def test_room_at_a_loss_joins_warm_when_it_pays():
    """A node back at 1100 s waits out the grow interval; the loss at 1150 s leaves room for a
    rank. ``cold`` (the product before): the next attempt takes it with a new pod whose cold
    start (50 s) the kept ranks wait for. ``warm``: the kept ranks restart at once and the new
    rank joins warm (standby, then the join's save and restart): one re-form more, and the kept
    ranks train through the new pod's start. ``pays`` (the product) does as ``warm`` before
    any grow was measured. When the kept ranks' own save and restart outlast that start, the
    new pod is ready before they are and both come to the same."""
    room = Trace("room", "hand", ((0, 4), (1000, 3), (1100, 4), (1150, 3), (2000, 3)))
    model = replace(STAY_ALONE, grow_min_interval_s=300.0, checkpoint_gb=1.0)
    waits = gs.simulate(room, 4, "elastic-stay", replace(model, room_at_loss="cold"))
    joins = gs.simulate(room, 4, "elastic-stay", replace(model, room_at_loss="warm"))
    assert joins.reforms == waits.reforms + 1
    assert kept(joins) > kept(waits)
    assert gs.simulate(room, 4, "elastic-stay", model) == joins
    slow_save = replace(model, checkpoint_gb=100.0)  # the survivor's save alone takes 100 s
    assert gs.simulate(room, 4, "elastic-stay", replace(slow_save, room_at_loss="cold")) == (
        gs.simulate(room, 4, "elastic-stay", replace(slow_save, room_at_loss="warm"))
    )


def test_room_at_a_loss_waits_cold_where_a_measured_join_costs_more():
    """``pays`` weighs the gang's own history (``grow_payoff.survivors_first_pays``): once a
    grow's join paused it about as long as its first start took, the room at a loss is taken
    by new pods the kept ranks wait for, as ``cold`` does."""
    gang = gs.StayGang(STAY_ALONE, 4, 2, gs.Ledger(gs.Interval(STAY_ALONE), 0.0))
    gang.size = 3
    assert gang.room_joins_warm(1)  # nothing measured yet
    gang.starting_s, gang.planned_restarting_s, gang.planned_restarts = 150.0, 101.0, 1
    assert not gang.room_joins_warm(1)
    gang.planned_restarting_s = 14.0  # an in-process switch
    assert gang.room_joins_warm(1)
    fixed = gs.StayGang(STAY_ALONE, 4, 4, gs.Ledger(gs.Interval(STAY_ALONE), 0.0))
    assert not fixed.room_joins_warm(1)


def test_switched_grows_skip_the_save_and_the_restart():
    """``switch_grows`` (``recovery.inProcessSwitch``): the node back at 1200 s gets a new pod
    in standby (pod 50 s), then the gang pauses for a 5 s re-form and the state sent to the new
    rank (40 GB at 12.5 GB/s), no save or restart. A loss without notice still saves and
    restarts the workers (see above)."""
    grows = replace(STAY_ALONE, switch_grows=True)
    switched_at, pause = 1200 + 50, 5 + 40 / 12.5
    r = gs.simulate(LOSS, 4, "elastic-stay", grows)
    # The loss as the product handles it (3 ranks from 1058), then the switch at 1250.
    assert kept(r) == pytest.approx(3764 + (switched_at - 1058) * 3 + (2000 - 1250 - pause) * 4)
    assert kept(r) > kept(gs.simulate(LOSS, 4, "elastic-stay", STAY_ALONE))


SWITCH = replace(STAY_ALONE, switch_grows=True, switch_noticed=True, notice_share=1.0)
"""The hand model of Stay with ``recovery.inProcessSwitch`` at grows and notices, every loss
noticed 30 s ahead."""


def test_the_noticed_ranks_leave_at_the_notice_and_the_loss_interrupts_nothing():
    """``switch_noticed``: the notice comes at 970 s; 1 s later (``notice_detect_s``) the
    noticed rank leaves and the 3 kept ranks switch in process (a 5 s re-form; no save, no
    restart, no step lost). The noticed node is not used from the notice on, and its loss at
    1000 s interrupts nothing; the node back at 1200 s joins through the grow's switch."""
    pause = 5 + 40 / 12.5
    r = gs.simulate(LOSS, 4, "elastic-stay", SWITCH)
    assert kept(r) == pytest.approx(914 * 4 + (1250 - 976) * 3 + (2000 - 1250 - pause) * 4)
    assert r.rolled_back_node_h == 0
    assert (r.interruptions, r.cold_starts, r.reforms) == (1, 1, 2)
    # Switching at the loss instead (the model before) kept the 4th rank training until 1000 s
    # and paused at 1001..1006: the notice window costs 29 s of a rank, less the 3 x 1 s of the
    # detection paid at the loss, here.
    at_loss = 943 * 4 + (1250 - 1006) * 3 + (2000 - 1250 - pause) * 4
    assert kept(r) == pytest.approx(at_loss - 29 + 3)
    # Step by step: the leave is due 1 s after the notice; until then the gang trains whole.
    gang = gs.StayGang(SWITCH, 4, 2, gs.Ledger(gs.Interval(SWITCH), 0.0))
    gang.begin(0.0, 4)
    gang.fire(57.0)  # the cold start's join
    gang.on_notice(970.0, 4, 3)
    assert (gang.size, gang.avail, gang.timers["leave"]) == (4, 3, 971.0)
    gang.fire(971.0)
    assert (gang.size, gang.resume_at, gang.reforms) == (3, 976.0, 1)
    gang.on_change(1000.0, 4, 3, True)
    assert (gang.size, gang.avail, gang.resume_at, gang.interruptions) == (3, 3, 976.0, 1)
    # The policies without Stay, and a fixed Stay gang, are untouched by the flag.
    without = replace(SWITCH, switch_noticed=False)
    for policy in ("fixed", "elastic", "elastic-warm", "fixed-warm", "fixed-stay"):
        assert gs.simulate(LOSS, 4, policy, SWITCH) == gs.simulate(LOSS, 4, policy, without)


def test_a_notice_that_would_leave_fewer_than_min_replicas_saves_and_restarts_at_the_loss():
    """Three of four nodes noticed: one kept rank is below ``minReplicas`` (2), so the gang
    does as without the flag: it saves on the nodes' shutdown and goes on at the loss."""
    deep = Trace("deep", "hand", ((0, 4), (1000, 1), (1200, 4), (2000, 4)))
    without = replace(SWITCH, switch_noticed=False)
    r = gs.simulate(deep, 4, "elastic-stay", SWITCH)
    assert r == gs.simulate(deep, 4, "elastic-stay", without)
    assert kept(r) < kept(gs.simulate(LOSS, 4, "elastic-stay", SWITCH))


def test_room_at_a_notice_is_taken_as_after_a_loss():
    """The node back at 1100 s sits idle through the grow interval (300 s from the resume at
    976 s). The notice for the loss at 1150 s comes at 1120 s; its rank leaves at 1121 s and the
    idle node takes its place at once as after a loss (survivors first): its pod in standby
    (50 s), then the grow's switch. The 2 kept ranks train 1126..1171."""
    room = Trace("room", "hand", ((0, 4), (1000, 3), (1100, 4), (1150, 3), (2000, 3)))
    r = gs.simulate(room, 4, "elastic-stay", replace(SWITCH, grow_min_interval_s=300.0))
    pause = 5 + 40 / 12.5
    expected = 914 * 4 + (1121 - 976) * 3 + (1171 - 1126) * 2 + (2000 - 1171 - pause) * 3
    assert kept(r) == pytest.approx(expected)
    assert (r.interruptions, r.reforms) == (2, 3)


def test_in_process_switch_sets_every_switch(tmp_path: Path):
    """``--in-process-switch``: the product's flag whole, at grows, at notices and after losses;
    the separate options keep working."""
    name = "bamboo/g4dn-us-east-1c-2020-11-20"
    for flags, every in ((["--in-process-switch"], True), (["--switch-noticed"], False)):
        out = tmp_path / "out.json"
        argv = ["--trace", name, "--nodes", "4", "--policies", "elastic-stay", "--json", str(out)]
        assert gs.main(argv + flags) == 0
        model = json.loads(out.read_text())["model"]
        switches = (model["switch_grows"], model["switch_noticed"], model["switch_lost"])
        assert switches == (every, True, every)


def test_a_loss_without_notice_rejoins_in_process_without_a_save_or_a_restart():
    """``switch_lost`` (``ckpt.rejoin``): the loss at 1000 s leaves 3 kept ranks and no room; after
    its detection they re-form in process (a ``reform_s`` pause), with no survivor's save and no
    restart, where the product before saved and restarted them until 1058 s."""
    lost = replace(STAY_ALONE, switch_lost=True)
    gang = gs.StayGang(lost, 4, 2, gs.Ledger(gs.Interval(lost), 0.0))
    gang.begin(0.0, 4)
    gang.fire(57.0)  # the cold start's join
    gang.on_change(1000.0, 4, 3, False)
    back = 1000.0 + lost.detect(False) + lost.shrink_after(stay=True) + lost.reform_s
    assert (gang.size, gang.resume_at, gang.reforms) == (3, back, 1)
    r = gs.simulate(LOSS, 4, "elastic-stay", lost)
    before = gs.simulate(LOSS, 4, "elastic-stay", STAY_ALONE)
    assert kept(r) == pytest.approx(kept(before) + (1058 - back) * 3)
    assert r.rolled_back_node_h == before.rolled_back_node_h  # the running step either way
    for policy in ("fixed", "elastic", "elastic-warm", "fixed-warm", "fixed-stay"):
        assert gs.simulate(LOSS, 4, policy, lost) == gs.simulate(LOSS, 4, policy, STAY_ALONE)


def test_a_loss_seen_after_the_kept_workers_gave_up_restarts_them_from_the_commit():
    """``RTJ_LOSS_HOLD_SECONDS``: after a failed collective the kept workers wait that long for
    the membership. Seen later (detected at 10 s, a hold of 5 s), the loss finds them ended
    unsaved: no rejoin, no survivor's save; their agents restart them from the newest commit.
    The operator's hold covers a silent node's NotReady and ``nodeNotReadySeconds``."""
    lost = replace(STAY_ALONE, switch_lost=True)
    assert lost.hold_s(stay=True) == 30 + 0 + 50 + 60
    assert replace(lost, shrink_after_s=20.0).hold_s(stay=True) == 30 + 20 + 50 + 60
    for model in (lost, STAY_ALONE):
        ended = replace(model, loss_hold_s=5.0)
        gang = gs.StayGang(ended, 4, 2, gs.Ledger(gs.Interval(ended), 0.0))
        gang.begin(0.0, 4)
        gang.fire(57.0)  # the cold start's join
        gang.on_change(1000.0, 4, 3, False)
        assert gang.resume_at == 1000.0 + ended.detect(False) + ended.restart()
        assert gang.ledger.progress == gang.ledger.committed  # back to the newest commit
        r, held = (gs.simulate(LOSS, 4, "elastic-stay", m) for m in (ended, model))
        assert r.rolled_back_node_h > held.rolled_back_node_h and kept(r) < kept(held)
        # a hold as long as the detection is enough
        assert gs.simulate(LOSS, 4, "elastic-stay", replace(model, loss_hold_s=10.0)) == held


def test_a_loss_below_min_replicas_still_restarts_from_the_commit():
    """Three of four nodes lost: one kept rank is below ``minReplicas`` (2), so there is no gang
    to rejoin; the flag changes nothing."""
    deep = Trace("deep", "hand", ((0, 4), (1000, 1), (1200, 4), (2000, 4)))
    lost = replace(STAY_ALONE, switch_lost=True)
    assert gs.simulate(deep, 4, "elastic-stay", lost) == gs.simulate(
        deep, 4, "elastic-stay", STAY_ALONE
    )


def test_the_grow_interval_defaults_to_300s_and_to_none_when_grows_switch_in_process():
    """``grow.minIntervalSeconds`` unset, as the operator reads it
    (``rtj_operator.api.spec_types.grow_min_interval_seconds``): the gang back at 4 nodes at
    1200 s grows at once when the grow switches in process, 300 s after it resumed otherwise."""
    restarting = replace(STAY_ALONE, grow_min_interval_s=None)
    switching = replace(SWITCH, grow_min_interval_s=None, notice_share=0.0)
    assert restarting.grow_interval_s() == 300.0 and switching.grow_interval_s() == 0.0
    at_once = gs.simulate(LOSS, 4, "elastic-stay", switching)
    held = gs.simulate(LOSS, 4, "elastic-stay", replace(switching, grow_min_interval_s=300.0))
    assert kept(at_once) > kept(held)
