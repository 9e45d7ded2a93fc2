"""The product end to end on real nodes: a spot node announces its end, another is lost outright.

The story itself is the spot story every cluster runs (``tools/stories/spot.py``), set up for
real nodes by ``tools/stories/realnodes.py`` as ``make demo NODES=real`` sets it up: the operator
runs as the chart's Deployment pod (operator image), the job's rank runs from the runtime image
under a real kubelet, checkpoints go to a hostPath folder every node sees.

1. the job starts on node 1;
2. **graceful shutdown** of node 1: termination taint first (the runtime checkpoints at once),
   then the kubelet's SIGTERM and grace period; the next attempt runs on node 3 and resumes at
   exactly the step reached;
3. **node lost**: node 3's kubelet, containerd and containers are SIGKILLed and its Node
   deleted; the next attempt runs on node 1 and resumes from the last committed checkpoint.

The job Succeeds, its status counts two preemptions and no failure, ``kubectl logs`` shows the
runtime's own events, and the final weights are bitwise equal to an uninterrupted run of the
same script (same torch version: the image is built from the same ``uv.lock``).
"""

from __future__ import annotations

from pathlib import Path

from tools.stories import realnodes as story
from tools.stories.realnodes import INTERRUPTIONS, shared_folder, verdicts

from .conftest import RealCluster


def test_a_job_survives_a_graceful_shutdown_and_a_lost_node_on_real_nodes(
    real_cluster: RealCluster, ns: str, tmp_path: Path
) -> None:
    with shared_folder(ns) as shared:
        result = story.run(real_cluster, ns, shared, tmp_path, INTERRUPTIONS)
        checks = verdicts(result)
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    assert not failed, "\n".join(failed)
    # Both interruptions happened, in order, and each moved the job to the other node.
    assert [i.kind for i in result.interruptions] == ["notice", "lost"]
    nodes = [a.node for a in result.attempts]
    assert nodes == [real_cluster.node(1), real_cluster.node(3), real_cluster.node(1)]
