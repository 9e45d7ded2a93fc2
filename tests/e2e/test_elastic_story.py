"""The elastic story on the local control plane, with real training in every pod.

A 4-rank elastic ``ResumableTrainingJob`` (``manifests/elastic-job.yaml``, ``minReplicas: 2``,
one rank per node) runs on exactly 4 pod-runner nodes. Two nodes are reclaimed without notice and
there is no spare: the operator waits ``shrinkAfterSeconds`` for the full gang, then runs 2 ranks
from the last committed checkpoint. Two nodes join: the operator asks the gang to checkpoint now
(the notice path), and once that commits it resubmits 4 ranks from it. The job Succeeds.

What is asserted comes from the ranks' own records (``tools/stories/elastic.py``): every sample
of every epoch consumed exactly once over the whole story, 8 samples per step at both sizes, each
new gang resumed at the checkpoint the operator last saw committed, and the state it loaded equal
bit for bit to the state saved there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.controlplane import ControlPlane
from tools.localstack import LocalStack
from tools.stories.elastic import (
    MANIFEST,
    ElasticResult,
    ElasticStory,
    elastic_spec,
    manifest_args,
    read_ledger,
    read_transitions,
    resumed_steps,
)

from .conftest import say, stack_config

pytestmark = pytest.mark.cluster

SPEC = elastic_spec(MANIFEST)
ARGS = manifest_args(MANIFEST)
REPLICAS, MINIMUM = int(SPEC["replicas"]), int(SPEC["elastic"]["minReplicas"])
WAIT = float(SPEC["elastic"]["shrinkAfterSeconds"])
DATASET, GLOBAL_BATCH = int(ARGS["dataset-size"]), int(ARGS["global-batch-size"])
EPOCHS = int(ARGS["epochs"])


@pytest.fixture(scope="module")
def elastic_stack(
    prerequisites: None, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """The stack with exactly 4 nodes: no spare capacity once 2 go."""
    workdir = tmp_path_factory.mktemp("elastic-stack")
    cfg = stack_config(control_plane, workdir, "rtj-elastic", nodes=REPLICAS)
    with LocalStack(cfg) as running:
        yield running


@pytest.fixture(scope="module")
def story(elastic_stack: LocalStack) -> ElasticResult:
    result = ElasticStory(elastic_stack, "elastic", say=say).run()
    say(
        f"shrink: {result.shrink_running_s:.1f}s to {MINIMUM} ranks Running, "
        f"{result.shrink_resumed_s or float('nan'):.1f}s to rank 0's resume; grow: "
        f"{result.grow_running_s:.1f}s to {REPLICAS} ranks Running, "
        f"{result.grow_resumed_s or float('nan'):.1f}s to rank 0's resume; "
        f"story {result.seconds:.0f}s"
    )
    return result


def test_shrinks_within_the_wait_and_grows_back_after_a_checkpoint(story: ElasticResult) -> None:
    status = story.status
    assert status["phase"] == "Succeeded"
    assert status["attempt"] == 2, "one shrink, one grow"
    assert status["gangSize"] == REPLICAS and status["worldSize"] == REPLICAS
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    # Continued at the smaller size within the wait plus 5 s of losing the nodes.
    assert story.shrink_running_s <= WAIT + 5, story.lines
    history = [(h["size"], h["reason"], h["attempt"]) for h in status["sizeHistory"]]
    assert history == [(4, "FullSize", 0), (2, "Shrunk", 1), (4, "Grown", 2)], history
    shrink, grow = status["interruptions"]
    assert shrink["preemption"] is True and shrink["cause"] == "NodeDeleted"
    assert shrink["node"] in story.lost_nodes
    assert grow["cause"] == "Grow" and grow["preemption"] is False
    reasons = [e.get("reason") for e in story.events]
    for reason in ("Shrunk", "GrowRequested", "Growing", "Grown"):
        assert reason in reasons, reasons
    # The grow ended the shrunk gang only after it committed a checkpoint of its own (the one the
    # notice asked for, or an interval one that landed first: either is past the request's).
    assert grow["lastCommittedStep"] > shrink["lastCommittedStep"]
    assert grow["attempt"] == 1 and status["sizeHistory"][-1]["stepsLost"] == 0
    # The shrunk gang ran on the two survivors, the grown one on them and the two new nodes.
    survivors = set(story.start_nodes) - set(story.lost_nodes)
    assert len(survivors) == MINIMUM and set(story.placements[1]) == survivors, story.placements
    assert set(story.placements[2]) == survivors | set(story.added_nodes), story.placements


def test_every_sample_is_consumed_exactly_once_at_a_constant_global_batch(
    story: ElasticResult, elastic_stack: LocalStack
) -> None:
    ledger = read_ledger(elastic_stack.results_dir, story.job, REPLICAS)
    assert ledger.worlds == {0: REPLICAS, 1: MINIMUM, 2: REPLICAS}, ledger.worlds
    counts = ledger.consumption(DATASET)
    expected = {(epoch, i) for epoch in range(EPOCHS) for i in range(DATASET)}
    assert set(counts) == expected, "some sample was never consumed"
    assert set(counts.values()) == {1}, [k for k, v in counts.items() if v != 1][:10]
    assert set(ledger.samples_per_step().values()) == {GLOBAL_BATCH}
    # The steps rolled back are only those after the checkpoint resumed from: each attempt
    # resumed at the sample count of a step the previous attempts really completed.
    completed = {sample for _, _, sample, _ in ledger.steps}
    for attempt in (1, 2):
        assert ledger.resumed_at[attempt] in completed


def test_each_gang_loads_bitwise_what_the_previous_one_saved(
    story: ElasticResult, elastic_stack: LocalStack
) -> None:
    ranks_seen: dict[int, set[int]] = {}
    interruptions = story.status["interruptions"]
    resumed = resumed_steps(story)
    for item in read_transitions(elastic_stack.results_dir, story.job, REPLICAS):
        ranks_seen.setdefault(item.attempt, set()).add(item.rank)
        assert item.saved is not None, f"attempt {item.attempt} loaded an unknown save: {item}"
        assert item.saved["step"] == item.resumed_step
        assert item.loaded_digest == item.saved["digest"], item
        # No step lost beyond the last checkpoint: the resume point is the newest checkpoint any
        # earlier gang saved, at least the one the operator knew of when it ended the attempt.
        assert item.resumed_step == item.newest_saved_step, item
        assert item.resumed_step >= interruptions[item.attempt - 1]["lastCommittedStep"]
        assert resumed[item.attempt] == item.resumed_step
    assert ranks_seen == {1: set(range(MINIMUM)), 2: set(range(REPLICAS))}, ranks_seen
