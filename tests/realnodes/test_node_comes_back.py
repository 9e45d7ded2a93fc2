"""A node lost with its image store kept comes back as a new node that runs the runtime image
without importing it again (``nodes.sh kill-node --keep-images``, then ``add-node``): what the
real-node goodput replay (``benchmarks/goodput_realnodes.py``) does at each loss and return, as a
spot node booted from a machine image with the runtime image baked in.

Runs last (conftest.py): it loses node 1, the one runtime node the earlier tests leave.
"""

from __future__ import annotations

from .conftest import RealCluster, wait_for

POOL = "returned"


def test_a_node_lost_with_its_images_kept_comes_back_as_a_new_node(
    real_cluster: RealCluster, ns: str
) -> None:
    lost = real_cluster.node(1)
    real_cluster.kill_node(1, keep_images=True)
    gone = real_cluster.kubectl_run("get", "node", lost, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout

    index = real_cluster.nodes + 1
    try:
        name = real_cluster.add_node(index, {"pool": POOL})
        assert name != lost
        labels = (real_cluster.get("node", name, "") or {})["metadata"]["labels"]
        assert labels["pool"] == POOL and labels["rtj.dev/node-kind"] == "real", labels
        # imagePullPolicy Never: the pod runs only if the image is in the node's store already.
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "returned", "namespace": ns},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"pool": POOL},
                "containers": [
                    {
                        "name": "main",
                        "image": real_cluster.images["runtime"],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", "import trainer_runtime; print('image-kept')"],
                    }
                ],
            },
        }
        real_cluster.apply(pod)
        phase = real_cluster.wait_phase("returned", ns, {"Succeeded", "Failed"}, timeout=180)
        logs = real_cluster.kubectl_run("logs", "returned", "-n", ns, check=False)
        described = real_cluster.kubectl_run("describe", "pod", "returned", "-n", ns, check=False)
        assert phase == "Succeeded", described.stdout[-3000:]
        assert "image-kept" in logs.stdout, logs
        node_of = (real_cluster.get("pod", "returned", ns) or {})["spec"]["nodeName"]
        assert node_of == name
    finally:
        real_cluster.kill_node(index)
    wait_for("its Node gone", lambda: real_cluster.get("node", name, "") is None, 30)
