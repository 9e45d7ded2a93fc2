"""Goodput on real nodes: the goodput benchmark's trace window replayed on kubelet + containerd
nodes, for one elastic job whose survivors stay.

    python benchmarks/goodput_realnodes.py [--replicas 3 --min-replicas 2 --step-sleep 0.5]
        [--trace NAME --window-start S --window SECONDS --compress F] [--json out.json] [--keep]

Root only (real nodes: network namespaces, cgroups, containerd). It builds what is missing (the
control-plane binaries, the images; tens of minutes cold), starts a control plane with
``replicas + 1`` real nodes (``tools/realnodes.py``, ``hack/cluster/nodes.sh``), installs the
chart's operator on the one node no replay loses, imports the runtime image into the others, and
replays ``goodput.plan`` (the same seeded losses, notices and adds as ``goodput.py``) on them.
The figures are ``goodput.py``'s (goodput, ceiling, time lost per cause, each interruption's
recovery and phases), computed by the same code (``goodput.Replay``).

What real nodes add to the pod-runner replay: a kubelet's pod start (sandbox, CNI, a container
from the runtime image), CoreDNS answering for the gang's rendezvous name, a new node
registering as a new Node, and the kubelet's SIGTERM and SIGKILL.

What differs from ``goodput.py``, and why:

* **One job on one pool.** A node holding the runtime image (torch, about 6 GB) takes about
  12 GB of disk; two pools of them do not fit this machine. The job is the elastic one, with
  ``recovery.survivors: Stay``; the fixed job runs in ``goodput.py``.
* **Three nodes by default.** The default window (the one ``goodput.py`` replays) capped at 3
  nodes keeps 4 of its changes: a loss without notice, a loss with notice and two returns.
* **A lost node is killed** (kubelet, containerd, shims and containers get SIGKILL; its Node is
  deleted). A noticed loss gets the termination taint ``--notice-s / compress`` seconds ahead and
  is then killed the same way: these nodes have no systemd, whose inhibitor locks a kubelet's
  graceful node shutdown relies on, so the ranks' last save comes from the notice alone.
* **A node that comes back is a new node** (new name and address) started on the image store a
  lost node left (``nodes.sh kill-node --keep-images`` then ``add-node``), as a spot node booted
  from a machine image with the runtime image baked in: no import of GiBs on the critical path.
  Node operations run one at a time, in the plan's order (a return needs a parked store).
* **Checkpoints and the ranks' ``--trace`` records go to a host folder** that every node mounts
  (hostPath), as a shared filesystem would be, not to S3.
* **A pod's runtime events are read with ``kubectl logs``** after the window: a pod whose node
  was killed has no log left, so the phases of a gang it was part of miss those marks.

``--keep`` leaves the cluster up afterwards (``RTJ_CLUSTER_NAME=<name> hack/cluster/nodes.sh
status``), its nodes put back as they started (the image stores moved back to the first nodes'
indexes), and the next run with ``--keep`` reuses it: a bring-up and its imports take minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __name__ == "__main__":  # first: Ctrl-C during the imports below ends quietly
    import interrupt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: tools/ and trainer_runtime/ from this checkout
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from benchmarks import goodput  # noqa: E402
from rtj_operator.api.names import LABEL_JOB  # noqa: E402
from tools.kubeapi import Kube  # noqa: E402
from tools.realnodes import RealCluster, RealNodes, build_all, operator_release  # noqa: E402
from tools.stories.realnodes import shared_folder  # noqa: E402
from tools.waiting import wait_for  # noqa: E402
from trainer_runtime.events import RuntimeEvent, read_events  # noqa: E402

Obj = dict[str, Any]
NAMESPACE = "rtj-goodput"
NODE_KIND = "rtj.dev/node-kind=real"


class RealPool:
    """The real nodes a replay drives, with what ``goodput.Replay`` asks of a stack: nodes that
    come and go (one operation at a time, in order), the job, its pods and their logs."""

    def __init__(self, cluster: RealCluster, shared: Path, say: goodput.Say) -> None:
        self.cluster, self.shared, self.say = cluster, shared, say
        self.kube = Kube(cluster.kubeconfig)
        self.cfg = SimpleNamespace(namespace=NAMESPACE)
        self.results_dir = shared / "results"
        self._ops = ThreadPoolExecutor(max_workers=1, thread_name_prefix="real-nodes")
        self._index: dict[str, int] = {}
        self._next = cluster.nodes + 1

    # -- nodes ----------------------------------------------------------------------------------

    def adopt(self, index: int, pool: str) -> str:
        """Node ``index`` (running, with the runtime image) joins ``pool``; its name."""
        name = self.cluster.node(index)
        self.cluster.kubectl_run(
            "label", "node", name, f"{goodput.POOL_LABEL}={pool}", "--overwrite"
        )
        self._index[name] = index
        return name

    def add_pool_node(self, pool: str) -> str:
        """Start a new node in ``pool`` (after every node operation asked for before); its name,
        not waited for (its registration is part of what the job waits for)."""
        index, self._next = self._next, self._next + 1
        name = self.cluster.node(index)
        self._index[name] = index
        self._report(self._ops.submit(self.cluster.add_node, index, {goodput.POOL_LABEL: pool}))
        return name

    def restore(self) -> None:
        """Put the nodes back as the cluster started them (the runtime nodes' indexes, on the
        image stores the replay moved around), so that a kept cluster is reused next time."""
        self._ops.shutdown(wait=True)
        first = set(self.cluster.runtime_nodes)
        up = {i for i in self._index.values() if self.kube.node_ready(self.cluster.node(i))}
        for index in sorted(up - first):
            self.cluster.kill_node(index, keep_images=True)
        for index in sorted(first - up):
            self.cluster.add_node(index)

    def reclaim_node(self, name: str) -> None:
        """Kill the node and delete its Node, its image store parked for the next new node."""
        self._ops.submit(self.cluster.kill_node, self._index[name], keep_images=True).result()

    def shut_down_node(self, name: str, timeout: float = 90) -> None:
        """A noticed node goes the same way (module docstring: no graceful node shutdown)."""
        del timeout
        self.reclaim_node(name)

    def _report(self, future: Future[str]) -> None:
        def done(f: Future[str]) -> None:
            if f.exception() is not None:
                self.say(f"  node operation failed: {f.exception()}")

        future.add_done_callback(done)

    def taint_node(self, name: str, key: str, effect: str = "NoSchedule", value: str = "") -> None:
        taint = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
        self.cluster.kubectl_run("taint", "node", name, taint, "--overwrite")

    def close(self) -> None:
        self._ops.shutdown(wait=True)

    # -- the job --------------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        return self.cluster.kubectl_run(*args, stdin=stdin, timeout=timeout).stdout

    def job(self, name: str) -> Obj:
        return self.kube.request("GET", self.kube.job_path(NAMESPACE, name))

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        return self.kube.pods(NAMESPACE, job, attempt)

    def runtime_events(self, pod: str) -> list[RuntimeEvent]:
        """The runtime's events in the pod's log; none when the log is gone with its node."""
        proc = self.cluster.kubectl_run(
            "logs", pod, "-n", NAMESPACE, "-c", "trainer", check=False, timeout=30
        )
        return read_events(proc.stdout) if proc.returncode == 0 else []

    def committed(self, job: str) -> list[Obj]:
        """The run's checkpoints whose manifest is in the shared folder (committed)."""
        found = []
        for manifest in (self.shared / "checkpoints" / job).glob("*/manifest.json"):
            with contextlib.suppress(ValueError, KeyError, OSError):
                found.append(
                    goodput.commit_record(manifest.parent.name, json.loads(manifest.read_text()))
                )
        return sorted(found, key=lambda m: m["sample"])

    def diagnostics(self, job: str | None = None) -> str:
        parts = []
        if job:
            with contextlib.suppress(Exception):
                parts.append(json.dumps(self.job(job).get("status"), indent=1))
        run = self.cluster.kubectl_run
        pods = run("get", "pods", "-A", "-o", "wide", check=False).stdout
        nodes = run("get", "nodes", "-o", "wide", check=False).stdout
        operator = run(
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/instance=rtj",
            "--tail=60",
            check=False,
        ).stdout
        return "\n".join([*parts, pods, nodes, "operator log:", operator])


class RealReplay(goodput.Replay):
    """``goodput.Replay`` for the elastic job alone, on real nodes."""

    kinds = ("elastic",)

    def __init__(self, stack: RealPool, cfg: goodput.Config, say: goodput.Say, image: str) -> None:
        super().__init__(stack, cfg, 0, say)  # type: ignore[arg-type]
        self.image = image

    def _nodes_up(self) -> None:
        """The nodes holding the runtime image start the window, one per slot."""
        start = self.capacity.available(0)
        indexes = self.stack.cluster.runtime_nodes
        if start != self.cfg.replicas or len(indexes) < start:
            raise SystemExit(
                f"the window starts at {start} of {self.cfg.replicas} nodes and the cluster has "
                f"{len(indexes)} with the runtime image: choose a window that starts at full size"
            )
        pool = self.pools["elastic"]
        for slot, index in zip(range(start), indexes, strict=False):
            pool.slots[slot] = self.stack.adopt(index, pool.name)

    def _apply(self) -> None:
        manifest = job_manifest(self.jobs["elastic"], self.cfg, self.image, self.stack.shared)
        self.stack.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))

    def _committed(self, job: str) -> list[Obj]:
        return self.stack.committed(job)

    def cleanup(self) -> None:
        """Delete the job and wait for its pods to go (the nodes stay: the cluster goes next)."""
        with contextlib.suppress(Exception):
            self.stack.kubectl(
                "delete", "rtj", self.jobs["elastic"], "-n", NAMESPACE, "--wait=false"
            )
        with contextlib.suppress(Exception):
            wait_for(
                "the replay's pods gone", lambda: not self.stack.pods(self.jobs["elastic"]), 120
            )
        self.stack.close()


def job_manifest(name: str, cfg: goodput.Config, image: str, shared: Path) -> Obj:
    """``goodput.job_manifest``'s elastic job on real nodes: the runtime image (never pulled),
    checkpoints and records in the shared host folder, a pool label as the node selector, one
    rank per node by anti-affinity (a node here has the machine's CPUs: a CPU request cannot
    keep two ranks apart, as ``goodput.py``'s 20 of a pod-runner node's 32 do)."""
    doc = goodput.job_manifest(name, "elastic", cfg, elastic=True)
    spec = doc["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    host = {"type": "Directory"}
    spec["checkpoint"] = {
        "dir": "/checkpoints",
        "volumeSource": {"hostPath": {"path": str(shared / "checkpoints"), **host}},
    }
    pod["nodeSelector"] = {goodput.POOL_LABEL: "elastic"}
    container["image"] = image
    container["imagePullPolicy"] = "Never"
    container["env"] = [e for e in container["env"] if "valueFrom" not in e]
    container["resources"] = {"requests": {"cpu": "100m", "memory": "512Mi"}}
    pod["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {LABEL_JOB: name}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    pod["volumes"] = [
        {"name": "results", "hostPath": {"path": str(shared / "results"), **host}},
        {"name": "scratch", "emptyDir": {}},
    ]
    return doc


def parse_args(argv: list[str] | None) -> tuple[goodput.Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = dataclasses.replace(goodput.Config(), replicas=3, min_replicas=2)
    goodput.add_replay_args(p, defaults)
    p.add_argument("--json", help="write the run, its summary and phase costs here")
    p.add_argument("--cluster-name", default="rtj-goodput-real")
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    args = p.parse_args(argv)
    return goodput.replay_config(p, args, defaults, survivors="Stay"), args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    capacity = cfg.capacity()
    say(
        f"trace {cfg.trace} [{cfg.window_start:g} s + {cfg.window:g} s] capped at "
        f"{cfg.replicas} /{cfg.compress:g}: {len(capacity.changes())} changes in "
        f"{capacity.duration:.0f} s: "
        + ", ".join(f"{t:.0f}s {a}->{b}" for t, a, b in capacity.changes())
    )
    archives = build_all(say=say)
    steady = 2 if cfg.replicas >= 2 else 1
    nodes = RealNodes(
        name=args.cluster_name,
        nodes=cfg.replicas + 1,
        runtime_nodes=tuple(i for i in range(1, cfg.replicas + 2) if i != steady),
        keep=args.keep,
        say=say,
    )
    with nodes.up(archives) as cluster:
        cluster.kubectl_run("create", "namespace", NAMESPACE, check=False)
        with (
            shared_folder(NAMESPACE) as shared,
            operator_release(cluster, NAMESPACE, node=cluster.steady_node),
        ):
            replay = RealReplay(RealPool(cluster, shared, say), cfg, say, cluster.images["runtime"])
            try:
                run = replay.run()
            except Exception:
                say(replay.stack.diagnostics(replay.jobs["elastic"]))
                raise
            finally:
                replay.cleanup()
                if args.keep:
                    replay.stack.restore()
    goodput.print_run(run, say)
    doc = goodput.document(cfg, [run])
    doc["benchmark"] = "goodput-realnodes"
    goodput.report(doc, say, args.json)
    return 0


if __name__ == "__main__":
    interrupt.run(main)
