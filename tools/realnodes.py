"""Real nodes (kubelet + containerd) joined to a local control plane, with the project's images.

One bring-up for everything that runs on real nodes: the real-node test suite
(``tests/realnodes/conftest.py``) and ``make demo NODES=real`` (``examples/demo_cluster.py``).
It drives the scripts a person would run by hand, in this order:

1. ``hack/cluster/build.sh``: the control-plane binaries (cached);
2. ``hack/images/build.sh pause operator runtime`` and ``hack/cluster/build-coredns.sh``: the
   images, built by buildah without a registry (cached by their inputs);
3. ``hack/cluster/cluster.sh up`` with the API server bound to every address, so kubelets and
   pods in other network namespaces reach it (``tools/controlplane.py``);
4. ``hack/cluster/nodes.sh up N``: N kubelets, each with its own containerd and network
   namespace, plus CNI bridge networking, kube-proxy and CoreDNS;
5. ``nodes.sh import-image``: the operator image into every node, the runtime image (torch,
   several GiB) only into the nodes that run training.

The cluster is driven with ``kubectl`` and ``helm``, as a user drives one: what is checked is
what a user sees. Nothing here is product code: it is not in the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.controlplane import (
    BUILD_SH,
    ControlPlane,
    ControlPlaneError,
    binaries_ready,
    bindir,
)
from tools.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
NODES_SH = REPO / "hack" / "cluster" / "nodes.sh"
COREDNS_SH = REPO / "hack" / "cluster" / "build-coredns.sh"
IMAGES_SH = REPO / "hack" / "images" / "build.sh"
DEPS_SH = REPO / "hack" / "images" / "deps.sh"
CHART = REPO / "charts" / "resumable-training-operator"
TOOLS = ("mmdebstrap", "buildah", "containerd", "runc", "iptables", "nsenter")
"""Commands of Debian packages the nodes and the image builds need (``hack/images/deps.sh``)."""
IMAGES = ("pause", "operator", "runtime")
NODES_DIR = Path(os.environ.get("RTJ_NODES_DIR", "/var/lib/rtj-nodes"))
"""Where ``nodes.sh`` keeps the nodes' state; a hostPath under it is seen alike by every node."""

Say = Callable[[str], None]


class RealNodesError(RuntimeError):
    """A step of the bring-up failed, or a prerequisite is missing; the message says which."""


def _quiet(_line: str) -> None:
    return None


def _run(
    cmd: Sequence[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd), env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


def _must(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    if proc.returncode != 0:
        raise RealNodesError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip()


def missing_prerequisites() -> list[str]:
    """What this machine lacks for real nodes, in words; empty when nothing is missing."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces, cgroups, mounts)"]
    missing += [f"{t} (hack/images/deps.sh)" for t in TOOLS if shutil.which(t) is None]
    return missing


def install_tools() -> None:
    """Install the missing Debian packages (``hack/images/deps.sh``, as root)."""
    _must("hack/images/deps.sh", _run([str(DEPS_SH)], dict(os.environ), 1200))


@dataclass
class Artifacts:
    """What the nodes run: the image archives by target, and whether everything is built."""

    archives: dict[str, str]
    missing: list[str]
    """``build.sh``-style names of what is not built yet (empty when all is cached)."""


def artifacts(env: dict[str, str] | None = None) -> Artifacts:
    """Where the images are (or will be), and which of them, CoreDNS and the binaries are
    missing. Builds nothing."""
    env = env or dict(os.environ)
    archives = {
        t: _must(f"{IMAGES_SH} --path {t}", _run([str(IMAGES_SH), "--path", t], env, 60))
        for t in IMAGES
    }
    missing = [f"image {t}" for t, path in archives.items() if not Path(path).exists()]
    if _run([str(COREDNS_SH), "--check"], env, 60).returncode != 0:
        missing.append("CoreDNS")
    if not binaries_ready():
        missing.append("control-plane binaries")
    return Artifacts(archives=archives, missing=missing)


def build_all(env: dict[str, str] | None = None, say: Say = _quiet) -> dict[str, str]:
    """Build whatever is missing (tens of minutes cold, seconds when cached); the archives."""
    env = env or dict(os.environ)
    have = artifacts(env)
    if "control-plane binaries" in have.missing:
        say("building the control-plane binaries (hack/cluster/build.sh; cold: about 30 min)")
        _must("hack/cluster/build.sh", _run([str(BUILD_SH)], env, 5400))
    for target in IMAGES:
        if f"image {target}" in have.missing:
            say(f"building the {target} image (hack/images/build.sh {target})")
            _must(f"hack/images/build.sh {target}", _run([str(IMAGES_SH), target], env, 3600))
    if "CoreDNS" in have.missing:
        say("building CoreDNS (hack/cluster/build-coredns.sh)")
        _must("hack/cluster/build-coredns.sh", _run([str(COREDNS_SH)], env, 3600))
    return have.archives


@dataclass
class RealCluster:
    """The control plane and its real nodes, driven with kubectl."""

    kubeconfig: str
    kubectl: str
    env: dict[str, str]
    images: dict[str, str]
    """Image references by target: operator, runtime."""
    runtime_nodes: tuple[int, ...] = (1, 3)
    """Nodes (1-based) that hold the runtime image; training pods may run there only."""
    nodes: int = 3

    @property
    def steady_node(self) -> str:
        """The name of a node without the runtime image: no training runs there and no story
        loses it, so the operator runs there, as it would on on-demand capacity."""
        index = next(i for i in range(1, self.nodes + 1) if i not in self.runtime_nodes)
        return self.node(index)

    @property
    def helm(self) -> str:
        return str(Path(self.kubectl).parent / "helm")

    def node(self, index: int) -> str:
        """The Node name (and IP) of node ``index`` (1-based)."""
        return _run([str(NODES_SH), "name", str(index)], self.env, 30).stdout.strip()

    def kill_node(self, index: int, *, keep_images: bool = False) -> None:
        """Lose node ``index``: SIGKILL its kubelet, containerd and containers, delete its Node.
        ``keep_images``: park its image store for the next ``add_node`` (as a machine image
        with the images baked in would bring them)."""
        keep = ["--keep-images"] if keep_images else []
        _must(
            f"nodes.sh kill-node {index}",
            _run([str(NODES_SH), "kill-node", str(index), *keep], self.env, 120),
        )

    def add_node(self, index: int, labels: dict[str, str] | None = None) -> str:
        """Start node ``index`` (one not running) with these Node labels, on a parked image store
        when there is one; its Node name once it is Ready."""
        pairs = [f"{k}={v}" for k, v in (labels or {}).items()]
        _must(
            f"nodes.sh add-node {index}",
            _run([str(NODES_SH), "add-node", str(index), *pairs], self.env, 180),
        )
        return self.node(index)

    def kubectl_run(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` against this cluster; raises RealNodesError when ``check`` and it
        fails."""
        proc = subprocess.run(
            [self.kubectl, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check:
            _must(f"kubectl {' '.join(args)}", proc)
        return proc

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl_run("apply", "-f", "-", stdin=json.dumps(manifest))

    def get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        """The object as JSON, or None when it does not exist; ns "" for cluster-scoped kinds."""
        where = ["-n", ns] if ns else []
        proc = self.kubectl_run("get", kind, name, *where, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def pod_phase(self, name: str, ns: str) -> str:
        pod = self.get("pod", name, ns)
        return pod["status"].get("phase", "") if pod else ""

    def wait_phase(self, name: str, ns: str, phases: set[str], timeout: float = 120) -> str:
        return wait_for(
            f"pod {ns}/{name} in {sorted(phases)}",
            lambda: (p := self.pod_phase(name, ns)) in phases and p,
            timeout,
        )

    def logs(self, name: str, ns: str) -> str:
        return self.kubectl_run("logs", name, "-n", ns).stdout

    def exec(self, name: str, ns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl_run("exec", name, "-n", ns, "--", *cmd, check=False)

    def create_namespace(self, name: str) -> None:
        """Create ``name`` and wait for its default ServiceAccount (pods need it)."""
        self.kubectl_run("create", "namespace", name)
        wait_for(
            f"serviceaccount default in {name}",
            lambda: self.get("serviceaccount", "default", name),
            30,
        )


@dataclass
class RealNodes:
    """Brings up (or reuses) a control plane with real nodes; a context manager.

    ``keep``: leave the cluster and its nodes up afterwards, and reuse them next time (images
    already imported are not imported again).
    """

    name: str = "rtj-realnodes"
    nodes: int = 3
    runtime_nodes: tuple[int, ...] = (1, 3)
    keep: bool = False
    say: Say = _quiet
    env: dict[str, str] = field(init=False)
    plane: ControlPlane = field(init=False)

    def __post_init__(self) -> None:
        # Kubelets and pods in other network namespaces must reach the API server.
        bind = {"RTJ_APISERVER_BIND_ADDRESS": "0.0.0.0"}  # noqa: S104
        self.env = {**os.environ, "RTJ_CLUSTER_NAME": self.name, **bind}
        self.env.pop("KUBECONFIG", None)
        self.plane = ControlPlane(self.name, keep=self.keep, extra_env=bind)

    def _nodes_up(self) -> bool:
        status = _run([str(NODES_SH), "status"], self.env, 60).stdout
        return status.count("kubelet=up") == self.nodes and "=down" not in status

    def down(self) -> None:
        """Stop the nodes, then the control plane (whoever started them)."""
        _run([str(NODES_SH), "down"], self.env, 300)
        self.plane.delete(timeout=300)

    @contextmanager
    def up(self, archives: dict[str, str]) -> Iterator[RealCluster]:
        """The running cluster with the images of ``archives`` imported; torn down afterwards
        unless ``keep``."""
        if not (self.keep and self._nodes_up()):
            # A cluster left by an interrupted run may have its API server bound to 127.0.0.1
            # only: start over.
            self.down()
            self.say(f"starting the control plane {self.name} (API server on every address)")
            try:
                self.plane.up(nodes=0, timeout=600)
            except ControlPlaneError as err:
                raise RealNodesError(str(err)) from err
            self.say(
                f"starting {self.nodes} real nodes: kubelet, containerd, CNI, kube-proxy, "
                "CoreDNS (hack/cluster/nodes.sh)"
            )
            started = _run([str(NODES_SH), "up", str(self.nodes)], self.env, 600)
            if started.returncode != 0:
                self.down()
                _must("hack/cluster/nodes.sh up", started)
        try:
            self.say("importing the operator image into every node")
            # The pause image again too (each node got it when it started): a kept cluster's
            # kubelets delete unused images when the machine's disk runs full, and without the
            # sandbox image no pod starts. An image still there is not imported again.
            for target in ("pause", "operator"):
                _must(
                    f"import of the {target} image",
                    _run([str(NODES_SH), "import-image", archives[target]], self.env, 600),
                )
            self.say(f"importing the runtime image into nodes {self.runtime_nodes} (several GiB)")
            _must(
                "import of the runtime image",
                _run(
                    [
                        str(NODES_SH),
                        "import-image",
                        archives["runtime"],
                        *map(str, self.runtime_nodes),
                    ],
                    self.env,
                    1800,
                ),
            )
            refs = {
                t: _must(f"{IMAGES_SH} --ref {t}", _run([str(IMAGES_SH), "--ref", t], self.env, 60))
                for t in ("operator", "runtime")
            }
            bin_dir = bindir()
            yield RealCluster(
                kubeconfig=self.plane.kubeconfig_path(),
                kubectl=f"{bin_dir}/kubectl",
                env=self.env,
                images=refs,
                runtime_nodes=self.runtime_nodes,
                nodes=self.nodes,
            )
        finally:
            if not self.keep:
                self.down()


@contextmanager
def operator_release(
    cluster: RealCluster, ns: str, release: str = "rtj", node: str | None = None
) -> Iterator[list[dict[str, Any]]]:
    """The chart installed in ``ns`` from the built operator image, as a user installs it.

    ``node``: pin the operator's pod there (the chart's ``nodeSelector``). Yields the release's
    pods once ``helm install --wait`` says the Deployment is ready (an install that fails raises
    RealNodesError with the operator's last log lines); uninstalls afterwards.
    """
    repo, _, tag = cluster.images["operator"].rpartition(":")
    base = [cluster.helm, "--kubeconfig", cluster.kubeconfig]
    pin = ["--set-string", f"nodeSelector.kubernetes\\.io/hostname={node}"] if node else []
    try:
        install = _run(
            [
                *base,
                *("install", release, str(CHART), "-n", ns),
                *("--set", f"image.repository={repo}", "--set", f"image.tag={tag}"),
                *("--set", "image.pullPolicy=Never", "--set", f"peering.name=rtj-{ns}"),
                *pin,
                *("--wait", "--timeout", "180s"),
            ],
            cluster.env,
            240,
        )
        selector = f"app.kubernetes.io/instance={release}"
        listed = cluster.kubectl_run("get", "pods", "-n", ns, "-l", selector, "-o", "json")
        pods = json.loads(listed.stdout)["items"]
        if install.returncode != 0:
            tails = "".join(
                cluster.kubectl_run(
                    "logs", p["metadata"]["name"], "-n", ns, "--tail=30", check=False
                ).stdout
                for p in pods
            )
            raise RealNodesError(f"helm install failed:\n{install.stderr[-3000:]}\n{tails}")
        yield pods
    finally:
        _run([*base, "uninstall", release, "-n", ns], cluster.env, 120)
