"""A worker restarted in place fetches the new gang's checkpoint while the gang forms, and never
an older one first (trainer_runtime/resume/warm_start.py, agent/rendezvous_store.py), with real
agents, a real S3 server and a real SIGKILL.

Three agent pods train a run in a bucket (each pod with a staging folder of its own, as each
node has its own disk) and commit once early on. They are an attempt after an earlier one: the
operator named them its checkpoint, which each agent downloaded when it started. Before, a
worker the agent forked later inherited that finished download and never fetched at import
again (its ``resume()`` fetched after the gang had formed).

Then one pod is lost without notice: pod0 (node rank 0) saves the last finished step from its
memory into the bucket, which takes a while for this state. pod1 saves nothing and its agent
starts its new workers at once, told to resume from the older commit, as the operator names it.
Before, pod1's new worker began downloading that older checkpoint right away (the survivor's
save was not committed yet), the manager waited for the download, and ``resume()`` then
downloaded the survivor's save as well. Now the download waits until node rank 0's agent says
the old gang's saves are over, and fetches the newest. The pod that replaces the lost one
starts meanwhile too, with the operator's word that it joins kept pods: its agent fetches at
once (beside its own import of torch), and its worker waits the same way for the newest.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.agentpods import Pods
from tools.ports import free_port
from tools.s3server import S3Server, ServerUnavailableError
from trainer_runtime.events import RuntimeEvent, read_events

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]
STEPS = 24
WIDTH = "3000000"
"""A state of about 230 MB (weights and momentum): its save from memory and upload take long
enough that a worker started at once would list the bucket before it is committed."""


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    workdir = tmp_path_factory.mktemp("s3")
    try:
        server = S3Server(workdir).start()
    except ServerUnavailableError as exc:
        pytest.fail(f"no S3 server: {exc}")
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)  # GBs of checkpoints: the logs are elsewhere


@pytest.fixture
def disks(tmp_path: Path) -> Iterator[Path]:
    """Where the pods' own disks go; removed after the test with the final weights (hundreds of
    MB each), while the pods' logs stay."""
    yield tmp_path / "disks"
    for big in (tmp_path / "disks", tmp_path / "run" / "out"):
        shutil.rmtree(big, ignore_errors=True)


def events(pod: str, pods: Pods, kind: str) -> list[RuntimeEvent]:
    return read_events((pods.tmp / f"{pod}.log").read_text(errors="replace"), kind)


def test_a_worker_restarted_in_place_fetches_only_the_new_gangs_checkpoint(
    tmp_path: Path, s3: S3Server, disks: Path
) -> None:
    root = f"s3://{s3.bucket}/restart-{uuid.uuid4().hex[:8]}"
    pods = Pods(tmp_path / "run", steps=STEPS, step_s=0.2, extra=("--width", WIDTH))
    pods.args[pods.args.index("--folder") + 1] = f"{root}/survivors"  # the operator's layout
    pods.args += ["--interval", "10ba"]

    def disk(r: int) -> dict[str, str]:  # each node's own disk
        return {"RTJ_LOCAL_CHECKPOINT_DIR": str(disks / f"disk{r}")}

    common = {**s3.env(), "RTJ_CHECKPOINT_DIR": root, "RTJ_RUN_NAME": "survivors"}
    earlier = Pods(tmp_path / "earlier", steps=2, step_s=0.2, extra=("--width", WIDTH))
    earlier.args[earlier.args.index("--folder") + 1] = f"{root}/survivors"
    earlier.start_gang(1, port=free_port(), each=disk, **common)
    assert set(earlier.wait_all().values()) == {0}, earlier.logs()
    (first,) = events("pod0", earlier, "committed")  # the earlier attempt's final commit
    pods.start_gang(3, port=free_port(), each=disk, RTJ_RESUME_FROM=first["uri"], **common)
    pods.wait_steps(1, 13)  # the commit at step 10 is in the bucket, step 20's is not begun
    commit = events("pod0", pods, "committed")[-1]
    named = commit["uri"]
    pods.lose("pod2")
    # The operator's part: the kept pods are told the new gang (stop: kill), resuming from the
    # newest commit it knows; pod1 first, so its new worker starts while pod0 still saves.
    port = free_port()
    for r in (1, 0):
        pods.announce(f"pod{r}", epoch=2, nnodes=3, nodeRank=r, masterPort=port, resumeFrom=named)
    pods.start(
        "pod2-new",
        node_rank=2,
        nnodes=3,
        port=port,
        epoch=2,
        RTJ_RESUME_FROM=named,
        RTJ_SURVIVOR_SAVE="0",
        RTJ_MEMBERSHIP_CHANGED="1",  # as the operator says it on a new pod joining kept ones
        **common,
        **disk(2),
    )
    assert set(pods.wait_all().values()) == {0}, pods.logs()
    (saved,) = events("pod0", pods, "survivor_saved")
    survivors = saved.fields["checkpoint"]
    assert survivors and not named.endswith(f"/{survivors}"), saved
    fetched = [(e["checkpoint"], e["prefetch"]) for e in events("pod1", pods, "fetched")]
    print(f"\nnamed {named}; saved from memory {survivors}; pod1 fetched {fetched}")
    # At its start, pod1's agent downloaded the checkpoint of the earlier attempt.
    assert fetched[0] == (first["checkpoint"], True), fetched
    # After the loss, its new worker downloaded the survivor's save while the gang formed
    # (resume() looks again and finds every file there), never the older commit first.
    assert {name for name, _ in fetched[1:]} == {survivors}, pods.logs()
    assert (survivors, True) in fetched[1:], fetched  # by the download at import
    # The new pod started while pod0 still saved. Its agent fetched at once, beside its import
    # of torch (without torch it cannot ask the store): the named commit, or the survivor's save
    # if already there. Its worker then waited for pod0's word and fetched the survivor's save
    # while the gang formed, not after it.
    joined = [(e["checkpoint"], e["prefetch"]) for e in events("pod2-new", pods, "fetched")]
    assert (survivors, True) in joined, joined
    assert {n for n, _ in joined} <= {survivors, commit["checkpoint"]}, joined
    resumed = events("pod2-new", pods, "resumed")[-1].fields
    assert resumed["checkpoint"] == survivors, resumed
    resumed = events("pod1", pods, "resumed")[-1].fields
    assert resumed["checkpoint"] == survivors and resumed["source"] == "remote", resumed
