"""A local cluster with Kueue: control plane, Kueue, the operator and pod-runner nodes.

The Kueue test suite (``tests/cluster/test_kueue.py``) and ``make demo SCENARIO=kueue``
(``examples/demo_cluster.py``) need the same bed: a control plane of its own, the project's CRDs,
Kueue started as a local process (``tools/kueue.py``), the operator as a local process serving
the bed's namespaces, and pod-runner nodes (``tools/podrunner``) of one pool, which run the ranks
as real processes and honour Kueue's scheduling gate. Writing it once here keeps the demo showing
exactly what the tests check.

Why not the demo's ``LocalStack`` (``tools/localstack``): it installs the Helm chart, an S3 server
and the results volume, none of which a Kueue story needs, and takes minutes more to start. Why a
control plane apart from the test session's shared one: Kueue's pod webhook
(``failurePolicy: Fail``) sees every pod of the cluster, and its API makes the operator choose
the ``Kueue`` gang mechanism where the other suites check what happens without it.

Nothing here is product code, and nothing imports from ``tests/``: the bed's client is the one
client of tools and tests (``tools.kubeapi.Kube``), with the verbs the tests drive it with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rtj_operator.api import names
from tools import kueue as kq
from tools.controlplane import ControlPlane
from tools.kubeapi import ApiError, Kube, unique
from tools.localstack.process import Proc
from tools.ports import free_port
from tools.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
OPERATOR_DIR = REPO / "operator"
CRDS = REPO / "crds"

Say = Callable[[str], None]


def _quiet(_line: str) -> None:
    """The default narrator: says nothing."""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except OSError:
        return False


class KueueBed:
    """The bed. ``up()`` brings it up (reusing a control plane and a Kueue that already run under
    the same names), ``down()`` stops what it started; also a context manager.

    ``namespaces``: the operator's ``--namespace`` pattern. ``pool_label``: the label every node
    of the bed carries with the value ``pool`` (jobs pin their pods to the bed's nodes with a
    ``nodeSelector`` on it)."""

    def __init__(
        self,
        cluster_name: str,
        workdir: Path,
        *,
        namespaces: str,
        pool_label: str,
        pool: str = "",
        keep_cluster: bool = False,
        say: Say = _quiet,
    ) -> None:
        self.plane = ControlPlane(cluster_name, keep=keep_cluster)
        self.workdir = workdir
        self.namespaces = namespaces
        self.pool_label = pool_label
        self.pool = pool or unique("kq-pool")
        self.say = say
        self.kubeconfig = ""
        self._kube: Kube | None = None
        self.kueue: kq.Kueue | None = None
        self.operator: Proc | None = None
        self.agents: dict[str, Proc] = {}

    @property
    def kube(self) -> Kube:
        """The bed's API client (after ``up()``)."""
        if self._kube is None:
            raise RuntimeError("KueueBed.up() has not run")
        return self._kube

    def __enter__(self) -> KueueBed:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.down()

    # -- bring-up ------------------------------------------------------------------------------

    def up(self, nodes: int = 2, cpu: str = "8", timeout: float = 540) -> KueueBed:
        """Control plane, CRDs, Kueue, the operator and ``nodes`` pod-runner nodes of ``cpu``
        CPUs each. Kueue must be built (``kq.built()``; ``kq.build()`` builds it)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.say(f"control plane {self.plane.name}: starting (or reusing)")
        self.kubeconfig = self.plane.up(nodes=0, timeout=timeout)
        self._kube = Kube(self.kubeconfig)
        wait_for("the API server", lambda: self.kube.get("/readyz") is not None, 60)
        self.install_crds()
        self.say(f"Kueue {kq.version()}: starting as a local process")
        self.kueue = kq.Kueue(self.kubeconfig, Path(self.kubeconfig).parent / "kueue").up()
        self.say(f"Kueue: ready (log {self.kueue.log})")
        self.start_operator()
        for _ in range(nodes):
            self.add_node(cpu)
        return self

    def install_crds(self) -> None:
        """The project's CRDs (``crds/``), established."""
        crds = [
            self.kube.apply(doc)["metadata"]["name"]
            for path in sorted(CRDS.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc
        ]
        for name in crds:
            wait_for(f"CRD {name} established", lambda n=name: self.kube.crd_established(n), 60)

    def start_operator(self) -> Proc:
        """The operator as a local process serving ``namespaces``, once its liveness answers."""
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        argv = [
            sys.executable,
            "-m",
            "rtj_operator",
            "--liveness",
            liveness,
            "--metrics-port",
            str(free_port()),
            "--metrics-address",
            "127.0.0.1",
            "--resync-seconds",
            "30",
            "--namespace",
            self.namespaces,
            "--standalone",
        ]
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(OPERATOR_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
        }
        op = Proc.start("operator", argv, self.workdir / "operator.log", env=env)
        self.operator = op
        wait_for(
            "operator liveness",
            lambda: _answers(liveness) or not op.alive(),
            60,
            interval=0.2,
            on_timeout=op.tail,
        )
        if not op.alive():
            raise RuntimeError(f"the operator exited at start:\n{op.tail()}")
        # kopf lists the namespaces, then starts a namespace watch that ignores its own initial
        # listing: a namespace created between the two is not served until it next changes.
        time.sleep(3)
        self.say(f"operator: running (pid {op.pid}, serving namespaces {self.namespaces})")
        return op

    def add_node(self, cpu: str = "8") -> str:
        """One more pod-runner node of the bed's pool; its name once Ready."""
        name = unique("kq-node")
        workdir = self.workdir / "nodes" / name
        argv = [
            sys.executable,
            "-m",
            "tools.podrunner",
            "--kubeconfig",
            self.kubeconfig,
            "--node",
            name,
            "--workdir",
            str(workdir),
            "--state-dir",
            str(self.workdir / "podrunner-state"),
            "--image-path",
            f"/app={REPO}",
            "--label",
            f"{self.pool_label}={self.pool}",
            "--cpu",
            cpu,
            "--shutdown-grace",
            "20",
        ]
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
        }
        agent = Proc.start(name, argv, workdir / "agent.log", env=env)
        self.agents[name] = agent
        wait_for(
            f"node {name} Ready",
            lambda: not agent.alive() or self.kube.node_ready(name),
            60,
            on_timeout=agent.tail,
        )
        if not agent.alive():
            raise RuntimeError(f"pod-runner node {name} exited at start:\n{agent.tail()}")
        self.say(f"node {name}: Ready ({cpu} CPUs, pod-runner pid {agent.pid})")
        return name

    # -- use -----------------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        """A namespace with its default ServiceAccount (pods need it)."""
        self.kube.request(
            "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "metadata": {"name": name}}
        )
        wait_for(
            f"namespace {name}'s default ServiceAccount",
            lambda: self.kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            60,
        )

    def pod_log(self, ns: str, pod: str) -> str:
        """A rank's log, from whichever node ran it."""
        pattern = f"nodes/*/logs/{ns}_{pod}_*/trainer.log"
        return "".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob(pattern)))

    # -- tear-down -----------------------------------------------------------------------------

    def stop_nodes(self) -> None:
        """Stop the nodes (their pods end with them) and delete their Node objects."""
        for name, agent in self.agents.items():
            agent.signal(signal.SIGKILL)
            agent.stop(5)
            if self._kube is not None:
                with contextlib.suppress(ApiError, OSError):
                    self.kube.delete(f"/api/v1/nodes/{name}")
        self.agents.clear()

    def down(self, wait: float = 30) -> None:
        """Stop the operator, the nodes and Kueue, and the control plane if this bed started
        it (unless ``keep_cluster``)."""
        if self.operator is not None:
            self.operator.stop()
        self.stop_nodes()
        if self.kueue is not None:
            self.kueue.down()
        self.plane.down(wait=wait)


def job_body(
    name: str,
    namespace: str,
    replicas: int,
    template_spec: dict[str, Any],
    **spec: Any,
) -> dict[str, Any]:
    """A ResumableTrainingJob manifest (``spec`` adds fields: ``queueName``, ``elastic``...)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "template": {"spec": template_spec}, **spec},
    }
