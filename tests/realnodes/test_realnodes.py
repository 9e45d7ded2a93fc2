"""The project's images on real nodes: kubelet, containerd, CNI, kube-proxy and CoreDNS.

What the fake (kwok) nodes cannot show: a container from the runtime image really starts and
its output reaches ``kubectl logs``; the kubelet's SIGTERM, grace period, exit sequence; cluster
DNS names of a headless Service reach a pod on another node (how ranks find ``MASTER_ADDR``);
the operator, installed by the chart, runs with the securityContext the chart promises; and a
lost node takes its containers with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from .conftest import RealCluster, operator_release, wait_for


def _pod(name: str, image: str, command: list[str], node: str, **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    container = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [container],
            **spec,
        },
    }


def test_runtime_image_runs_on_a_real_node_and_logs_reach_kubectl(
    real_cluster: RealCluster, ns: str
) -> None:
    code = (
        "import os, boto3, torch, trainer_runtime\n"
        "print('runtime-image-ok', torch.__version__, 'uid', os.getuid(), flush=True)\n"
    )
    pod = _pod(
        "train", real_cluster.images["runtime"], ["python", "-c", code], real_cluster.node(1)
    )
    real_cluster.apply({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
    phase = real_cluster.wait_phase("train", ns, {"Succeeded", "Failed"}, timeout=300)
    logs = real_cluster.logs("train", ns)
    assert phase == "Succeeded", logs
    assert "runtime-image-ok 2." in logs and "uid 1000" in logs, logs


SIGTERM_SCRIPT = """
import signal, sys, time
def on_term(signum, frame):
    print("SIGTERM received", flush=True)
    time.sleep(3)
    print("clean exit after 3s of shutdown work", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_deleting_a_pod_sends_sigterm_and_waits_out_its_shutdown(
    real_cluster: RealCluster, ns: str
) -> None:
    pod = _pod(
        "graceful",
        real_cluster.images["operator"],
        ["python", "-c", SIGTERM_SCRIPT],
        real_cluster.node(2),
        terminationGracePeriodSeconds=30,
    )
    real_cluster.apply({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
    real_cluster.wait_phase("graceful", ns, {"Running"})
    wait_for("the pod to print ready", lambda: "ready" in real_cluster.logs("graceful", ns), 60)
    follow = subprocess.Popen(
        [
            *(real_cluster.kubectl, "--kubeconfig", real_cluster.kubeconfig),
            *("logs", "-f", "graceful", "-n", ns),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(1)  # the stream is attached before the signal goes out
        started = time.monotonic()
        real_cluster.kubectl_run("delete", "pod", "graceful", "-n", ns, "--wait=true", timeout=90)
        took = time.monotonic() - started
        out, _ = follow.communicate(timeout=30)
    finally:
        follow.kill()
    assert "SIGTERM received" in out and "clean exit after 3s" in out, out
    # The kubelet waited for the handler's 3 s of work, and did not need the 30 s SIGKILL.
    assert 3.0 <= took < 30.0, f"deletion took {took:.1f}s"


SERVER_SCRIPT = """
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 29500))
srv.listen()
while True:
    conn, _ = srv.accept()
    conn.sendall(socket.gethostname().encode() + b" answers")
    conn.close()
"""

CLIENT_SCRIPT = """
import json, socket, sys, time
name = sys.argv[1]
deadline = time.time() + 60
while True:
    try:
        addr = socket.getaddrinfo(name, 29500, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        with socket.create_connection((name, 29500), timeout=5) as conn:
            banner = conn.recv(100).decode()
        break
    except OSError as exc:
        if time.time() > deadline:
            raise
        print("retry:", exc, flush=True)
        time.sleep(1)
print(json.dumps({"addr": addr, "banner": banner}), flush=True)
"""


def test_cluster_dns_resolves_a_headless_service_pod_on_another_node(
    real_cluster: RealCluster, ns: str
) -> None:
    """A rank on node 1 finds rank 0 on node 2 by its DNS name, as MASTER_ADDR does."""
    server = _pod(
        "rank-0",
        real_cluster.images["operator"],
        ["python", "-c", SERVER_SCRIPT],
        real_cluster.node(2),
        labels={"gang": "g1"},
        hostname="rank-0",
        subdomain="g1",
    )
    real_cluster.apply({**server, "metadata": {**server["metadata"], "namespace": ns}})
    real_cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "g1", "namespace": ns},
            "spec": {
                "clusterIP": "None",
                "selector": {"gang": "g1"},
                "ports": [{"name": "c10d", "port": 29500}],
            },
        }
    )
    real_cluster.wait_phase("rank-0", ns, {"Running"})
    fqdn = f"rank-0.g1.{ns}.svc.cluster.local"
    client = _pod(
        "rank-1",
        real_cluster.images["operator"],
        ["python", "-c", CLIENT_SCRIPT, fqdn],
        real_cluster.node(1),
    )
    real_cluster.apply({**client, "metadata": {**client["metadata"], "namespace": ns}})
    phase = real_cluster.wait_phase("rank-1", ns, {"Succeeded", "Failed"}, timeout=120)
    logs = real_cluster.logs("rank-1", ns)
    assert phase == "Succeeded", logs
    answer = json.loads(logs.strip().splitlines()[-1])
    server_ip = real_cluster.get("pod", "rank-0", ns)["status"]["podIP"]
    assert answer == {"addr": server_ip, "banner": "rank-0 answers"}, logs


def _cap_mask(status: str, field: str) -> int:
    line = next(x for x in status.splitlines() if x.startswith(f"{field}:"))
    return int(line.split()[1], 16)


def test_operator_chart_runs_non_root_read_only_without_capabilities(
    real_cluster: RealCluster, ns: str
) -> None:
    with operator_release(real_cluster, ns) as pods:
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        pod = pods[0]["metadata"]["name"]
        uid = real_cluster.exec(pod, ns, "id", "-u")
        assert uid.stdout.strip() == "65532", uid.stderr
        write = real_cluster.exec(pod, ns, "touch", "/probe")
        assert write.returncode != 0 and "Read-only file system" in write.stderr, write
        status = real_cluster.exec(pod, ns, "cat", "/proc/1/status").stdout
        assert _cap_mask(status, "CapEff") == 0, status
        assert _cap_mask(status, "CapBnd") == 0, status
        assert "NoNewPrivs:\t1" in status, status
        # PID 1 is the operator itself, and it writes to the API server from inside the pod
        # (through the kubernetes Service, with its service-account token): kopf's peering
        # object lists it as a live peer, under its pod name (the chart's POD_ID: the identity
        # survives a container restart).
        cmdline = real_cluster.exec(pod, ns, "cat", "/proc/1/cmdline").stdout
        assert "rtj-operator" in cmdline, cmdline
        wait_for(
            f"the operator {pod} in its peering object",
            lambda: (
                pod
                in (
                    (real_cluster.get("clusterkopfpeering", f"rtj-{ns}", "") or {}).get("status")
                    or {}
                )
            ),
            60,
        )


def _processes_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_lost_node_takes_its_containers_and_its_node_object_with_it(
    real_cluster: RealCluster, ns: str
) -> None:
    """Runs last in this module: node 2 stays lost for the rest of the session."""
    marker = f"rtj-lost-node-{os.getpid()}-{time.time_ns()}"
    pod = _pod(
        "victim",
        real_cluster.images["operator"],
        ["python", "-c", f"import time  # {marker}\nwhile True: time.sleep(1)"],
        real_cluster.node(2),
    )
    real_cluster.apply({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
    real_cluster.wait_phase("victim", ns, {"Running"})
    assert _processes_with(marker), "the container's process is not visible on this machine"
    node = real_cluster.node(2)
    real_cluster.kill_node(2)
    assert not _processes_with(marker), "the container outlived its node"
    gone = real_cluster.kubectl_run("get", "node", node, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    # The pod garbage collector fails and removes pods bound to a node that no longer exists.
    wait_for(
        "pod GC to remove the lost node's pod",
        lambda: (
            (p := real_cluster.get("pod", "victim", ns)) is None
            or p["status"].get("phase") == "Failed"
        ),
        180,
        interval=2,
    )
