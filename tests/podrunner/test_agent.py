"""The pod runner against a real API server: pods run, report, stop, and die with their node."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tools.kubeapi import Kube
from tools.podrunner.deletion import finalize_deletion
from tools.podrunner.ports import PortRegistry

from .conftest import ROOT, AgentFactory, KillNode, node_ready, wait_for
from .test_processes import alive

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


def make_pod(
    name: str,
    node: str,
    script: str,
    out: Path,
    *,
    env: list[Obj] | None = None,
    volumes: list[Obj] | None = None,
    mounts: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    """A one-container ``python -c`` pod bound to ``node``, with ``out`` mounted at /out."""
    container: Obj = {
        "name": "main",
        "image": "python:3.11-slim",
        "command": ["python", "-c", textwrap.dedent(script)],
        "env": [{"name": "OUT", "value": "/out"}, *(env or [])],
        "volumeMounts": [{"name": "out", "mountPath": "/out"}, *(mounts or [])],
    }
    for key in ("terminationMessagePolicy",):
        if key in spec:
            container[key] = spec.pop(key)
    metadata = {"name": name, **spec.pop("metadata", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [
                {"name": "out", "hostPath": {"path": str(out), "type": "Directory"}},
                *(volumes or []),
            ],
            **spec,
        },
    }


def create(kube: Kube, ns: str, pod: Obj) -> Obj:
    """Create a pod."""
    return kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)


def get_pod(kube: Kube, ns: str, name: str) -> Obj | None:
    """The pod, or None once it is gone."""
    return kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")


def wait_phase(kube: Kube, ns: str, name: str, phase: str, timeout: float = 60) -> Obj:
    """Wait for a pod phase; the pod."""
    return wait_for(
        f"{ns}/{name} {phase}",
        lambda: (p := get_pod(kube, ns, name)) and p["status"].get("phase") == phase and p,
        timeout,
    )


def terminated(pod: Obj) -> Obj:
    """The first container's terminated state."""
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def test_pod_succeeds_with_env_paths_and_message(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    field = lambda path: {"fieldRef": {"fieldPath": path}}  # noqa: E731
    env = [
        {"name": "POD", "valueFrom": field("metadata.name")},
        {"name": "NS", "valueFrom": field("metadata.namespace")},
        {"name": "UID", "valueFrom": field("metadata.uid")},
        {"name": "APP", "valueFrom": field("metadata.labels['app']")},
        {"name": "ANN", "valueFrom": field("metadata.annotations['a']")},
        {"name": "NODE", "valueFrom": field("spec.nodeName")},
        {"name": "SA", "valueFrom": field("spec.serviceAccountName")},
        {"name": "POD_IP", "valueFrom": field("status.podIP")},
        {"name": "HOST_IP", "valueFrom": field("status.hostIP")},
        {"name": "COMBO", "value": "$(POD).$(NS)"},
        {"name": "RTJ_REPORT_FILE", "value": "/dev/termination-log"},
    ]
    script = """
        import json, os, sys, tempfile
        seen = {**os.environ, "EXE": sys.executable, "CWD": os.getcwd()}
        seen["TEMP_FOLDER"] = tempfile.gettempdir()
        json.dump(seen, open(os.environ["OUT"] + "/env.json", "w"))
        open(os.environ["RTJ_REPORT_FILE"], "w").write("report of $(POD)")
    """
    pod = make_pod(
        "ok",
        agent.node,
        script,
        tmp_path,
        env=env,
        metadata={"labels": {"app": "demo"}, "annotations": {"a": "x y"}},
    )
    uid = create(kube, ns, pod)["metadata"]["uid"]
    done = wait_phase(kube, ns, "ok", "Succeeded")
    state = terminated(done)
    assert (state["exitCode"], state["reason"]) == (0, "Completed")
    assert state["message"] == "report of ok"  # read from the file, $(POD) expanded in args
    assert done["status"]["podIP"] == "127.0.0.1"
    assert state["containerID"].startswith("podrunner://")
    seen = json.loads((tmp_path / "env.json").read_text())
    expected = {"POD": "ok", "NS": ns, "UID": uid, "APP": "demo", "ANN": "x y"}
    expected |= {"NODE": agent.node, "SA": "default", "POD_IP": "127.0.0.1"}
    expected |= {"HOST_IP": "127.0.0.1", "COMBO": f"ok.{ns}", "OUT": str(tmp_path)}
    assert {k: seen.get(k) for k in expected} == expected
    assert seen["RTJ_REPORT_FILE"].startswith(str(agent.workdir))  # mount paths rewritten
    assert str(ROOT) in seen["PYTHONPATH"].split(":") and seen["CWD"] == str(ROOT)
    assert seen["EXE"] != "python" and Path(seen["EXE"]).is_absolute()
    # The container's own temporary folder, inside its pod's folder, not the host's.
    own_tmp = agent.workdir / "pods" / uid / "containers" / "main" / "tmp"
    assert seen["TMPDIR"] == seen["TEMP_FOLDER"] == str(own_tmp)
    node = kube.request("GET", f"/api/v1/nodes/{agent.node}")
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["metadata"]["labels"]["type"] == "podrunner"
    assert kube.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{agent.node}")


def test_nonzero_exit_fails_with_code_and_log_fallback(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    script = "import sys; print('boom: bad input', flush=True); sys.exit(3)"
    pod = make_pod(
        "bad", agent.node, script, tmp_path, terminationMessagePolicy="FallbackToLogsOnError"
    )
    create(kube, ns, pod)
    state = terminated(wait_phase(kube, ns, "bad", "Failed"))
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert "boom: bad input" in state["message"]


def test_downward_api_notice_file_follows_annotation(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    notice = "metadata.annotations['resumable.dev/preemption-notice']"
    volume = {
        "name": "notice",
        "downwardAPI": {"items": [{"path": "notice", "fieldRef": {"fieldPath": notice}}]},
    }
    script = """
        import os, time
        path, out = os.environ["RTJ_NOTICE_FILE"], os.environ["OUT"]
        assert open(path).read() == ""
        open(out + "/ready", "w").close()
        while open(path).read() != "node going":
            time.sleep(0.05)
        open(out + "/seen", "w").write(str(time.time()))
    """
    env = [{"name": "RTJ_NOTICE_FILE", "value": "/etc/resumable/notice"}]
    mounts = [{"name": "notice", "mountPath": "/etc/resumable", "readOnly": True}]
    pod = make_pod("notice", agent.node, script, tmp_path, env=env, volumes=[volume], mounts=mounts)
    create(kube, ns, pod)
    wait_for("the pod to read its notice file", (tmp_path / "ready").exists, 60)
    patched_at = time.time()
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/notice",
        content_type="application/merge-patch+json",
        body={"metadata": {"annotations": {"resumable.dev/preemption-notice": "node going"}}},
    )
    wait_phase(kube, ns, "notice", "Succeeded", 20)
    latency = float((tmp_path / "seen").read_text()) - patched_at
    assert latency < 5, f"notice reached the process after {latency:.1f}s"


def test_deletion_sigterm_then_sigkill_then_gone(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    polite = """
        import os, signal, sys, time
        out = os.environ["OUT"]
        def bye(*_):
            open(out + "/polite-term", "w").write("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        open(os.environ["TMPDIR"] + "/scratch", "w").write("x")
        open(out + "/polite-tmp", "w").write(os.environ["TMPDIR"])
        open(out + "/polite-pid", "w").write(str(os.getpid()))
        time.sleep(300)
    """
    stubborn = """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.environ["OUT"] + "/stubborn-pid", "w").write(str(os.getpid()))
        time.sleep(300)
    """
    create(kube, ns, make_pod("polite", agent.node, polite, tmp_path))
    create(
        kube,
        ns,
        make_pod("stubborn", agent.node, stubborn, tmp_path, terminationGracePeriodSeconds=1),
    )
    for name in ("polite", "stubborn"):
        wait_for(f"{name} started", (tmp_path / f"{name}-pid").exists, 60)
    time.sleep(0.3)  # past the handler installation
    started = time.monotonic()
    for name in ("polite", "stubborn"):
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    for name in ("polite", "stubborn"):
        wait_for(f"{name} gone", lambda n=name: get_pod(kube, ns, n) is None, 20)
    assert time.monotonic() - started < 15
    assert (tmp_path / "polite-term").read_text() == "SIGTERM"
    own_tmp = Path((tmp_path / "polite-tmp").read_text())  # goes with the pod, as /tmp does
    wait_for("the pod's temporary folder removed", lambda: not own_tmp.exists(), 10)
    for name in ("polite", "stubborn"):
        assert not alive(int((tmp_path / f"{name}-pid").read_text()))
    log = agent.log.read_text()
    assert "killed main" in log
    for name in ("polite", "stubborn"):  # one line per pod event, the deletion included
        assert log.count(f"{ns}/{name}: deleted") == 1, log


def test_finalizing_a_deletion_says_whether_it_removed_the_pod(
    kube: Kube, ns: str, tmp_path: Path
) -> None:
    """The agent logs a removal only when its delete removed the pod: a watch event for a pod
    that its worker has just removed must not log it a second time."""
    pod = create(kube, ns, make_pod("gone-twice", "pr-no-such-node", "pass", tmp_path))
    assert finalize_deletion(kube, pod) is True
    assert get_pod(kube, ns, "gone-twice") is None
    assert finalize_deletion(kube, pod) is False


def test_a_force_deletion_still_gives_the_kubelets_two_seconds_of_grace(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    """``kubectl delete --force --grace-period=0``: SIGTERM, 2 s, then SIGKILL, as a kubelet
    (its minimumGracePeriodInSeconds), not a SIGKILL on the heels of the SIGTERM."""
    agent = start_agent()
    script = """
        import os, signal, time
        out = os.environ["OUT"]
        def note(*_):
            open(out + "/term", "w").write(repr(time.time()))
        signal.signal(signal.SIGTERM, note)
        open(out + "/pid", "w").write(str(os.getpid()))
        while True:
            time.sleep(0.01)
    """
    create(kube, ns, make_pod("forced", agent.node, script, tmp_path))
    wait_for("forced started", (tmp_path / "pid").exists, 60)
    time.sleep(0.3)  # past the handler installation
    pid = int((tmp_path / "pid").read_text())
    kube.request(
        "DELETE",
        f"/api/v1/namespaces/{ns}/pods/forced",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    wait_for("the container killed", lambda: not alive(pid), 20, interval=0.02)
    killed_at = time.time()
    termed_at = float((tmp_path / "term").read_text())
    assert killed_at - termed_at >= 1.8, f"SIGKILL {killed_at - termed_at:.2f}s after SIGTERM"
    wait_for("forced gone", lambda: get_pod(kube, ns, "forced") is None, 20)


def test_node_loss_kills_processes_and_node_goes_unknown(
    start_agent: AgentFactory, kill_node: KillNode, kube: Kube, ns: str, tmp_path: Path
) -> None:
    """SIGKILL of the agent = power loss. kube-controller-manager of the local cluster runs with
    --node-monitor-grace-period=40s, so the Ready condition turns Unknown within about 45s."""
    agent = start_agent()
    script = """
        import os, subprocess, time
        sleeper = subprocess.Popen(["sleep", "300"])
        open(os.environ["OUT"] + "/pids", "w").write(f"{os.getpid()} {sleeper.pid}")
        time.sleep(300)
    """
    create(kube, ns, make_pod("victim", agent.node, script, tmp_path))
    wait_phase(kube, ns, "victim", "Running")
    wait_for("pids", (tmp_path / "pids").exists, 60)
    time.sleep(0.2)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert all(alive(p) for p in pids)
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{agent.node}"
    kill_node(agent.node)  # SIGKILL of the agent
    agent.proc.wait(10)
    lost_at = time.monotonic()
    wait_for("the pod's processes to die with the agent", lambda: not any(map(alive, pids)), 10)
    renewed = kube.request("GET", lease_path)["spec"]["renewTime"]
    time.sleep(11)  # two heartbeat periods
    assert kube.request("GET", lease_path)["spec"]["renewTime"] == renewed
    assert node_ready(kube, agent.node) == "True"  # nobody (kwok included) heartbeats it...
    wait_for("Ready=Unknown", lambda: node_ready(kube, agent.node) == "Unknown", 70, 1)
    print(f"node Unknown {time.monotonic() - lost_at:.0f}s after the agent died")

    # The node comes back: its pod's processes are gone, so the pod is reported lost.
    start_agent(agent.node)
    pod = wait_phase(kube, ns, "victim", "Failed", 30)
    state = terminated(pod)
    assert (state["exitCode"], state["reason"]) == (137, "ContainerStatusUnknown")
    wait_for("Ready=True again", lambda: node_ready(kube, agent.node) == "True", 30)


def test_rendezvous_port_and_pvc_shared_across_agents(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path, state_dir: Path
) -> None:
    a, b = start_agent(), start_agent()
    env = [
        {"name": "MASTER_ADDR", "value": "job-a0-r0.job"},
        {"name": "MASTER_PORT", "value": "29500"},
    ]
    volumes = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared"}}]
    mounts = [{"name": "ckpt", "mountPath": "/ckpt"}]
    rank0 = """
        import os, socket
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        srv = socket.create_server((addr, port))
        srv.settimeout(60)
        conn, _ = srv.accept()
        data = conn.recv(100).decode()
        open("/ckpt/rank0", "w").write(f"{addr}:{port} {data}")
    """
    rank1 = """
        import os, socket, time
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        for _ in range(600):
            try:
                sock = socket.create_connection((addr, port), timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        sock.sendall(b"hello from rank 1")
        open("/ckpt/rank1", "w").write(f"{addr}:{port}")
    """
    kw: dict[str, Any] = {"env": env, "volumes": volumes, "mounts": mounts}
    create(kube, ns, make_pod("r0", a.node, rank0, tmp_path, **kw))
    create(kube, ns, make_pod("r1", b.node, rank1, tmp_path, **kw))
    for name in ("r0", "r1"):
        wait_phase(kube, ns, name, "Succeeded", 60)
    shared = state_dir / "pvc" / ns / "shared"
    port = PortRegistry(state_dir).port_for(f"{ns}/job-a0-r0.job:29500")
    assert (shared / "rank0").read_text() == f"127.0.0.1:{port} hello from rank 1"
    assert (shared / "rank1").read_text() == f"127.0.0.1:{port}"
    assert port != PortRegistry(state_dir).port_for(f"{ns}/job-a1-r0.job:29500")


def test_agent_sigterm_is_a_graceful_node_shutdown(
    start_agent: AgentFactory, kill_node: KillNode, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    script = """
        import os, signal, sys, time
        out = os.environ["OUT"]
        def bye(*_):
            open(out + "/term", "w").write("saved")
            sys.exit(143)
        signal.signal(signal.SIGTERM, bye)
        open(out + "/ready", "w").close()
        time.sleep(300)
    """
    create(kube, ns, make_pod("drained", agent.node, script, tmp_path))
    wait_for("started", (tmp_path / "ready").exists, 60)
    kill_node(agent.node, "--graceful")  # SIGTERM of the agent
    agent.proc.wait(30)
    pod = get_pod(kube, ns, "drained")
    assert pod is not None
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "Terminated"
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conditions["DisruptionTarget"]["status"] == "True"
    assert conditions["DisruptionTarget"]["reason"] == "TerminationByKubelet"
    assert terminated(pod)["exitCode"] == 143
    assert (tmp_path / "term").read_text() == "saved"
    assert node_ready(kube, agent.node) == "False"


def test_unsupported_init_containers_are_rejected_and_kill_node_deletes(
    start_agent: AgentFactory, kill_node: KillNode, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    pod = make_pod("init", agent.node, "pass", tmp_path)
    pod["spec"]["initContainers"] = [{"name": "i", "image": "x", "command": ["true"]}]
    create(kube, ns, pod)
    failed = wait_phase(kube, ns, "init", "Failed", 30)
    assert "initContainers" in failed["status"]["message"]
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/init")
    wait_for("rejected pod deleted", lambda: get_pod(kube, ns, "init") is None, 20)
    kill_node(agent.node, "--delete-node")
    assert agent.proc.wait(10) == -9
    assert kube.get(f"/api/v1/nodes/{agent.node}") is None


def test_two_rank_training_job_shaped_like_the_operators(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path, state_dir: Path
) -> None:
    """Real torch.distributed (gloo) ranks on two nodes, with the operator's pod shape: the
    the pod environment contract, ``<pod>.<service>`` MASTER_ADDR, a notice volume, a shared PVC."""
    nodes = [start_agent().node, start_agent().node]
    for rank, node in enumerate(nodes):
        env = [
            {"name": "RANK", "value": str(rank)},
            {"name": "WORLD_SIZE", "value": "2"},
            {"name": "LOCAL_RANK", "value": "0"},
            {"name": "MASTER_ADDR", "value": "job-a0-r0.job"},
            {"name": "MASTER_PORT", "value": "29500"},
            {"name": "RTJ_RUN_NAME", "value": "run"},
            {"name": "RTJ_CHECKPOINT_DIR", "value": "/checkpoints"},
            {"name": "RTJ_NOTICE_FILE", "value": "/etc/resumable/preemption-notice"},
            {"name": "RTJ_REPORT_FILE", "value": "/dev/termination-log"},
        ]
        notice = "metadata.annotations['resumable.dev/preemption-notice']"
        volumes = [
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}},
            {
                "name": "notice",
                "downwardAPI": {
                    "items": [{"path": "preemption-notice", "fieldRef": {"fieldPath": notice}}]
                },
            },
        ]
        mounts = [
            {"name": "ckpt", "mountPath": "/checkpoints"},
            {"name": "notice", "mountPath": "/etc/resumable", "readOnly": True},
        ]
        pod = make_pod(
            f"job-a0-r{rank}", node, "", tmp_path, env=env, volumes=volumes, mounts=mounts,
            hostname=f"job-a0-r{rank}", subdomain="job",
        )  # fmt: skip
        pod["spec"]["containers"][0]["command"] = ["python", "examples/train_deterministic.py"]
        pod["spec"]["containers"][0]["args"] = [
            "--epochs", "1", "--dataset-size", "16", "--batch-size", "2", "--workers", "0",
        ]  # fmt: skip
        create(kube, ns, pod)
    done = [wait_phase(kube, ns, f"job-a0-r{rank}", "Succeeded", 150) for rank in (0, 1)]
    report = json.loads(terminated(done[0])["message"])
    assert report["uri"].startswith("/checkpoints/run/")  # the in-pod path, as a kubelet shows
    name = report["uri"].rsplit("/", 1)[1]
    assert (state_dir / "pvc" / ns / "ckpt" / "run" / name / "manifest.json").exists()


def test_missing_configmap_waits_then_starts(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    volumes = [{"name": "cfg", "configMap": {"name": "settings"}}]
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg"}]
    env = [{"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "lr"}}}]
    script = """
        import os
        lr = open("/etc/cfg/lr").read()
        open(os.environ["OUT"] + "/lr", "w").write(f"{lr} {os.environ['LR']}")
    """
    create(kube, ns, make_pod("cfg", agent.node, script, tmp_path, env=env, volumes=volumes,
                              mounts=mounts))  # fmt: skip

    def waiting_reason() -> str | None:
        pod = get_pod(kube, ns, "cfg") or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            return (status["state"].get("waiting") or {}).get("reason")
        return None

    wait_for("CreateContainerConfigError", lambda: waiting_reason() == "CreateContainerConfigError")
    assert get_pod(kube, ns, "cfg")["status"]["phase"] == "Pending"  # type: ignore[index]
    kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        body={"apiVersion": "v1", "metadata": {"name": "settings"}, "data": {"lr": "0.5"}},
    )
    wait_phase(kube, ns, "cfg", "Succeeded", 30)
    assert (tmp_path / "lr").read_text() == "0.5 0.5"


def test_on_failure_restarts_the_container(
    start_agent: AgentFactory, kube: Kube, ns: str, tmp_path: Path
) -> None:
    agent = start_agent()
    script = """
        import os, sys
        marker = os.environ["OUT"] + "/first-run-done"
        if not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(7)
    """
    create(kube, ns, make_pod("flaky", agent.node, script, tmp_path, restartPolicy="OnFailure"))
    status = wait_phase(kube, ns, "flaky", "Succeeded", 30)["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert status["state"]["terminated"]["exitCode"] == 0
