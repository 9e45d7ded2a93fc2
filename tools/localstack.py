"""The whole system on one machine: control plane, chart, S3, pod-runner nodes and the operator.

Shared by ``make demo`` (``examples/demo_cluster.py``) and the e2e suite (``tests/e2e``), so the
demo a user runs and the test CI runs are the same code path:

1. the cluster binaries (``hack/cluster/build.sh``) and MinIO (``hack/s3/build-minio.sh``),
   built once into the user's cache, or reused;
2. the local control plane (``hack/cluster/cluster.sh up``, its own cluster name);
3. the operator's Helm chart, installed as a user would, with the Deployment scaled to 0: no
   container runtime runs here, so the operator runs as a local process instead, **with the
   chart's ServiceAccount token and the Deployment's own arguments** (so the chart's RBAC and
   flags are what the story runs on, not the admin's credentials);
4. an S3 server on 127.0.0.1 (``tests/support/s3server.py``: MinIO, else moto);
5. one pod-runner agent process per Node (``tools/podrunner``), so a node can be lost alone.

Nothing here is product code: it is not in the wheel and must never be pointed at a cluster with
real nodes (the pod runner would run pods there as local processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.controlplane import (  # noqa: E402
    BUILD_SH,
    ControlPlane,
    ControlPlaneError,
    bindir,
)
from tools.controlplane import binaries_ready as cluster_binaries_ready  # noqa: E402
from tools.kubeapi import MERGE, ApiError, Kube  # noqa: E402
from tools.ports import free_port  # noqa: E402
from tools.waiting import wait_for  # noqa: E402

MINIO_SH = REPO / "hack" / "s3" / "build-minio.sh"
CHART = REPO / "charts" / "resumable-training-operator"
OPERATOR_DIR = REPO / "operator"
RELEASE = "rtj-operator"
OPERATOR_NAMESPACE = "rtj-system"
RTJ_API = "/apis/resumable.dev/v1alpha1"
LABEL_JOB = "resumable.dev/job-name"
LABEL_ATTEMPT = "resumable.dev/attempt"
LABEL_RANK = "resumable.dev/rank"
S3_SECRET = "rtj-s3"  # noqa: S105 - a Secret's name
RESULTS_CLAIM = "rtj-results"
NODE_PREFIX = "spot-"
NOT_SCHEDULABLE = "rtj-localstack/operator=runs-as-a-local-process"
"""nodeSelector given to the chart's Deployment: even before it is scaled to 0, its pod can
never land on a pod-runner node (which would try to run it as a process)."""

Obj = dict[str, Any]
Say = Callable[[str], None]
T = TypeVar("T")


class StackError(RuntimeError):
    """A prerequisite is missing or a component did not come up; the message says which."""


def _quiet(_line: str) -> None:
    """The default narrator: says nothing."""


def run_streaming(
    argv: list[str],
    say: Say,
    prefix: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """Run a command, passing each output line to ``say`` (progress of slow builds); its output.

    Raises StackError with the output's end when it fails.
    """
    lines: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            say(f"{prefix}{line.rstrip()}")
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                raise StackError(f"{argv[0]} ran past {timeout:.0f}s")
        code = proc.wait()
    if code != 0:
        tail = "\n".join(lines[-30:])
        raise StackError(f"{' '.join(argv)} failed with exit code {code}:\n{tail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ binaries


def build_cluster_binaries(say: Say = _quiet) -> None:
    """Build or reuse the control plane (slow only the first time), narrating its progress."""
    if cluster_binaries_ready():
        say("cluster binaries: cached")
        return
    say(
        "cluster binaries: building Kubernetes, etcd, kwok and helm from the Go module proxy "
        "(about 30 minutes the first time on 2 cores; cached afterwards)"
    )
    run_streaming([str(BUILD_SH)], say, "  build: ")


def minio_ready() -> bool:
    """Whether the pinned MinIO is built."""
    return (
        subprocess.run([str(MINIO_SH), "--path"], capture_output=True, check=False).returncode == 0
    )


def build_minio(say: Say = _quiet) -> bool:
    """Build or reuse MinIO; False (with a note) when it cannot be built here (no Go)."""
    if minio_ready():
        say("MinIO: cached")
        return True
    say("MinIO: building from source (about 20 minutes the first time; cached afterwards)")
    try:
        run_streaming([str(MINIO_SH)], say, "  minio: ")
    except StackError as err:
        say(f"MinIO: build failed, falling back to moto ({str(err).splitlines()[0]})")
        return False
    return True


# ------------------------------------------------------------------------------ processes


@dataclass
class Proc:
    """A child process in its own session (so a terminal's Ctrl-C reaches only us), with a log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> Proc:
        """Start ``argv`` with stdout and stderr appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        return cls(name, popen, log)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        """Send a signal to the process (not its group: an agent stops its pods itself)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL of its whole process group after ``timeout``."""
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - local URL
            return bool(resp.status == 200)
    except OSError:
        return False


# ------------------------------------------------------------------------------ the stack


@dataclass
class StackConfig:
    """What to start, and where."""

    workdir: Path
    """Logs, pod folders, the S3 data and the pod runner's shared state (``--state-dir``)."""
    cluster_name: str = "rtj-demo"
    """kwokctl cluster name (``RTJ_CLUSTER_NAME`` of ``cluster.sh``)."""
    namespace: str = "rtj-demo"
    """Where the jobs run."""
    nodes: int = 3
    """Pod-runner Nodes to start (one agent process each)."""
    bucket: str = "rtj-checkpoints"
    """S3 bucket created on the local server (the manifest's ``checkpoint.dir`` names it)."""
    s3_kind: str | None = None
    """``minio``, ``moto`` or None (MinIO when built, else moto)."""
    kubeconfig: Path | None = None
    """An already running local control plane to use (the test session's shared one): the
    stack then neither starts nor deletes it, and removes what it created in it instead."""
    keep_cluster: bool = False
    """Reuse a running cluster of that name and leave it up; otherwise start afresh and delete
    it at the end."""
    say: Say = _quiet
    """Narration of what the stack does (one line each)."""


@dataclass
class Timings:
    """Seconds each start-up phase took (reported by the demo and the e2e)."""

    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a block."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = time.monotonic() - start

    def line(self) -> str:
        """``name 1.2s, other 3.4s``."""
        return ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items())


class LocalStack:
    """The running system. ``with LocalStack(cfg) as stack:`` starts it and always stops it."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.say = cfg.say
        self.workdir = cfg.workdir.resolve()
        self.state_dir = self.workdir / "podrunner-state"
        self.timings = Timings()
        self.kubeconfig: Path | None = None
        self._kube: Kube | None = None
        self.bindir: Path | None = None
        self.s3: Any = None
        self.deployment: Obj = {}
        self.operator: Proc | None = None
        self.operator_liveness = ""
        self.agents: dict[str, Proc] = {}
        self._node_seq = 0
        self._cleanups: list[tuple[str, Callable[[], None]]] = []
        self._created_cluster = False
        self.plane = ControlPlane(cfg.cluster_name, keep=cfg.keep_cluster)

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kube(self) -> Kube:
        """API access (admin credentials of the local cluster)."""
        if self._kube is None:
            raise StackError("the stack is not started")
        return self._kube

    def _env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "RTJ_CLUSTER_NAME": self.cfg.cluster_name, **extra}
        if self.bindir is not None:
            env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', '')}"
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def start(self) -> None:
        """Bring everything up; on failure what started is stopped again by ``stop``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not cluster_binaries_ready():
            raise StackError("the cluster binaries are not built: run hack/cluster/build.sh")
        self.bindir = bindir()
        with self.timings.phase("cluster"):
            self._cluster_up()
        with self.timings.phase("chart"):
            self._install_chart()
        with self.timings.phase("s3"):
            self._start_s3()
        with self.timings.phase("operator"):
            self._start_operator()
        with self.timings.phase("nodes"):
            self._prepare_namespace()
            for _ in range(self.cfg.nodes):
                self.add_node(wait=False)
            for name in self.agents:
                self._wait_node_ready(name)
        self.say(f"stack up ({self.timings.line()})")

    def stop(self) -> None:
        """Stop everything this stack started, newest first; never raises. A second Ctrl-C
        while this runs is ignored: leaving half the stack behind would be worse."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while self._cleanups:
                what, fn = self._cleanups.pop()
                try:
                    fn()
                except Exception as err:
                    self.say(f"cleanup of {what} failed: {err}")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _on_stop(self, what: str, fn: Callable[[], None]) -> None:
        self._cleanups.append((what, fn))

    # ---------------------------------------------------------------- components

    @property
    def shared_cluster(self) -> bool:
        """Whether the cluster outlives the stack (so the stack cleans up inside it)."""
        return self.cfg.keep_cluster or self.cfg.kubeconfig is not None

    def _cluster_up(self) -> None:
        if self.cfg.kubeconfig is not None:
            self.say(f"cluster: using the running control plane of {self.cfg.kubeconfig}")
            path = str(self.cfg.kubeconfig)
        else:
            path = self._own_cluster_up()
        self.kubeconfig = Path(path)
        self._kube = Kube(path)
        wait_for("the API server", self._answers_api, 60)

    def _own_cluster_up(self) -> str:
        name = self.cfg.cluster_name
        exists = self.plane.exists()
        if exists and not self.cfg.keep_cluster:
            self.say(f"cluster {name}: a leftover from an earlier run; deleting it first")
            self.plane.delete(timeout=120)
            exists = False
        self.say(
            f"cluster {name}: {'reusing' if exists else 'starting'} the local control plane "
            "(etcd, kube-apiserver, controller-manager, scheduler on 127.0.0.1)"
        )
        try:
            path = self.plane.up(nodes=0)
        except ControlPlaneError as err:
            raise StackError(str(err)) from err
        self._created_cluster = self.plane.started and not self.cfg.keep_cluster
        if self._created_cluster:
            self._on_stop("the cluster", self._cluster_down)
        return path

    def _answers_api(self) -> bool:
        try:
            return self.kube.get("/version") is not None
        except (ApiError, OSError):
            return False

    def _cluster_down(self) -> None:
        self.say(f"cluster {self.cfg.cluster_name}: deleting")
        self.plane.down()

    def _helm(self, *args: str, timeout: float = 180) -> str:
        assert self.bindir is not None and self.kubeconfig is not None
        out = subprocess.run(
            [str(self.bindir / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=REPO,
        )
        if out.returncode != 0:
            raise StackError(f"helm {' '.join(args[:2])} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        """Run kubectl against the stack's cluster; its output (StackError when it fails)."""
        assert self.bindir is not None and self.kubeconfig is not None
        out = subprocess.run(
            [str(self.bindir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            env=self._env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise StackError(f"kubectl {' '.join(args)} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def _install_chart(self) -> None:
        key, value = NOT_SCHEDULABLE.split("=")
        self.say(
            f"helm: installing the chart ({CHART.relative_to(REPO)}) as release {RELEASE} "
            f"in {OPERATOR_NAMESPACE}"
        )
        self._helm(
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set-string",
            f"nodeSelector.{key}={value}",
        )
        if self.cfg.kubeconfig is not None:
            self._on_stop(
                f"helm release {RELEASE}",
                lambda: self._helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE),
            )
        deployments = self.kube.request(
            "GET",
            f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments",
            params={"labelSelector": f"app.kubernetes.io/instance={RELEASE}"},
        )["items"]
        if len(deployments) != 1:
            raise StackError(f"expected one operator Deployment, found {len(deployments)}")
        self.deployment = deployments[0]
        name = self.deployment["metadata"]["name"]
        self.kube.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments/{name}/scale",
            body={"spec": {"replicas": 0}},
            content_type=MERGE,
        )
        self.say(
            f"helm: Deployment {name} scaled to 0 (no container runtime here); the operator "
            "runs as a local process with its ServiceAccount and arguments"
        )
        for crd in ("resumabletrainingjobs.resumable.dev", "clusterkopfpeerings.kopf.dev"):
            wait_for(f"CRD {crd} established", lambda c=crd: self._established(c), 60)

    def _established(self, crd: str) -> bool:
        obj = self.kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    def _start_s3(self) -> None:
        from tests.support.s3server import S3Server  # noqa: PLC0415 - the repo's test server

        self.s3 = S3Server(self.workdir / "s3", kind=self.cfg.s3_kind, bucket=self.cfg.bucket)
        self.s3.start()
        self._on_stop("the S3 server", self.s3.stop)
        self.say(f"S3: {self.s3.kind} on {self.s3.url}, bucket s3://{self.cfg.bucket}")

    def _operator_kubeconfig(self, account: str) -> Path:
        """A kubeconfig with a token of the chart's ServiceAccount (what the pod would use)."""
        assert self.kubeconfig is not None
        token = self.kube.request(
            "POST",
            f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 4 * 3600},
            },
        )["status"]["token"]
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cluster = admin["clusters"][0]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {"name": account, "context": {"cluster": cluster["name"], "user": account}}
            ],
            "current-context": account,
        }
        path = self.workdir / "operator.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def operator_args(self) -> list[str]:
        """The chart Deployment's arguments, with its listen addresses moved to free local ports."""
        container = self.deployment["spec"]["template"]["spec"]["containers"][0]
        args: list[str] = []
        for given in container.get("args") or []:
            arg = given
            if given.startswith("--liveness="):
                self.operator_liveness = f"http://127.0.0.1:{free_port()}/healthz"
                arg = f"--liveness={self.operator_liveness}"
            elif given.startswith("--metrics-port="):
                arg = f"--metrics-port={free_port()}"
            elif given.startswith("--metrics-address="):
                arg = "--metrics-address=127.0.0.1"
            args.append(arg)
        return args

    def _start_operator(self) -> None:
        spec = self.deployment["spec"]["template"]["spec"]
        account = spec.get("serviceAccountName") or "default"
        kubeconfig = self._operator_kubeconfig(account)
        args = self.operator_args()
        env = self._env(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(OPERATOR_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p
        )
        self.operator = Proc.start(
            "operator",
            [sys.executable, "-m", "rtj_operator", *args],
            self.workdir / "operator.log",
            env=env,
        )
        self._on_stop("the operator", self.operator.stop)
        if self.operator_liveness:
            op = self.operator
            wait_for(
                "the operator's liveness endpoint",
                lambda: _answers(self.operator_liveness) or not op.alive(),
                60,
                on_timeout=op.tail,
            )
            if not op.alive():
                raise StackError(f"the operator exited at start:\n{op.tail()}")
        self.say(
            f"operator: pid {self.operator.pid} as ServiceAccount "
            f"{OPERATOR_NAMESPACE}/{account}: {' '.join(args)}"
        )

    def _prepare_namespace(self) -> None:
        ns = self.cfg.namespace
        old = self.kube.get(f"/api/v1/namespaces/{ns}")
        if old is not None and old["metadata"].get("deletionTimestamp"):
            self.say(f"namespace {ns}: waiting for an earlier run's copy to finish deleting")
            wait_for(
                f"namespace {ns} deleted",
                lambda: self.kube.get(f"/api/v1/namespaces/{ns}") is None,
                180,
            )
        try:
            self.kube.request(
                "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "metadata": {"name": ns}}
            )
        except ApiError as err:
            if not err.conflict:
                raise
        if self.shared_cluster:
            self._on_stop(f"namespace {ns}", lambda: self._delete(f"/api/v1/namespaces/{ns}"))
        wait_for(
            "the default ServiceAccount",
            lambda: self.kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            60,
        )
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": S3_SECRET},
            "type": "Opaque",
            "stringData": {
                k: v
                for k, v in self.s3.env().items()
                if k
                in (
                    "AWS_ENDPOINT_URL_S3",
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_DEFAULT_REGION",
                )
            },
        }
        self._create(f"/api/v1/namespaces/{ns}/secrets", secret)
        # The pod runner maps a claim to <state-dir>/pvc/<ns>/<claim>; this PV only lets the
        # scheduler bind the claim (it names the same folder, so the objects tell the truth).
        folder = self.results_dir
        folder.mkdir(parents=True, exist_ok=True)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{ns}-{RESULTS_CLAIM}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(folder)},
                "claimRef": {"namespace": ns, "name": RESULTS_CLAIM},
            },
        }
        self._create("/api/v1/persistentvolumes", pv)
        if self.shared_cluster:
            name = pv["metadata"]["name"]
            self._on_stop(
                f"PersistentVolume {name}",
                lambda: self._delete(f"/api/v1/persistentvolumes/{name}"),
            )

    def _create(self, path: str, body: Obj) -> None:
        try:
            self.kube.request("POST", path, body=body)
        except ApiError as err:
            if not err.conflict:
                raise
            name = body["metadata"]["name"]
            self.kube.request("PUT", f"{path}/{name}", body=body)

    def _delete(self, path: str) -> None:
        try:
            self.kube.request("DELETE", path)
        except ApiError as err:
            if not err.not_found:
                raise

    @property
    def results_dir(self) -> Path:
        """The shared folder behind the ``rtj-results`` claim (rank 0 writes final weights)."""
        return self.state_dir / "pvc" / self.cfg.namespace / RESULTS_CLAIM

    # ---------------------------------------------------------------- nodes

    def add_node(self, *, wait: bool = True) -> str:
        """Start one more pod-runner agent (a new spot Node); its name."""
        assert self.kubeconfig is not None
        while True:
            name = f"{NODE_PREFIX}{self._node_seq}"
            self._node_seq += 1
            if name not in self.agents and self.kube.get(f"/api/v1/nodes/{name}") is None:
                break
        workdir = self.node_workdir(name)
        argv = [
            sys.executable,
            "-m",
            "tools.podrunner",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node",
            name,
            "--workdir",
            str(workdir),
            "--state-dir",
            str(self.state_dir),
            "--image-path",
            f"/app={REPO}",
            "--shutdown-grace",
            "30",
        ]
        env = self._env(PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        agent = Proc.start(name, argv, workdir / "agent.log", env=env)
        self.agents[name] = agent
        self._on_stop(f"node {name}", lambda: self._remove_node(name))
        if wait:
            self._wait_node_ready(name)
        return name

    def node_workdir(self, name: str) -> Path:
        """The agent's ``--workdir``: pod folders and container logs of that node."""
        return self.workdir / "nodes" / name

    def _wait_node_ready(self, name: str) -> None:
        agent = self.agents[name]
        wait_for(
            f"node {name} Ready",
            lambda: not agent.alive() or self.node_ready(name),
            60,
            on_timeout=agent.tail,
        )
        if not agent.alive():
            raise StackError(f"pod-runner agent {name} exited at start:\n{agent.tail()}")
        self.say(f"node {name}: Ready (pod-runner agent pid {agent.pid})")

    def node_ready(self, name: str) -> bool:
        """Whether the Node exists and is Ready."""
        node = self.kube.get(f"/api/v1/nodes/{name}") or {}
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )

    def live_nodes(self) -> list[str]:
        """Nodes whose agent still runs."""
        return [n for n, a in self.agents.items() if a.alive()]

    def ensure_nodes(self, count: int) -> None:
        """Start agents until ``count`` of them run (each scenario wants spare capacity)."""
        while len(self.live_nodes()) < count:
            self.add_node()

    def _remove_node(self, name: str) -> None:
        agent = self.agents.get(name)
        if agent is not None and agent.alive():
            agent.signal(signal.SIGKILL)  # tear-down: its pods die with it (the watchdog)
            agent.stop(5)
        if not self._created_cluster:
            self._delete(f"/api/v1/nodes/{name}")

    def reclaim_node(self, name: str) -> None:
        """A spot reclaim without notice: the Node object is deleted and the machine is gone.

        The Node is deleted a few milliseconds before the agent is SIGKILLed (its processes die
        with it). The order matters little to the story (a cloud deletes the Node after the VM
        stops), but this way the operator sees the deletion before the surviving rank crashes on
        its broken connection, instead of racing it.
        """
        self._delete(f"/api/v1/nodes/{name}")
        agent = self.agents[name]
        agent.signal(signal.SIGKILL)
        agent.popen.wait(10)

    def taint_node(self, name: str, key: str, effect: str = "NoSchedule", value: str = "") -> None:
        """Add a taint, e.g. a spot termination notice (``Story.TAINT``)."""
        node = self.kube.request("GET", f"/api/v1/nodes/{name}")
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != key]
        taint: Obj = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"spec": {"taints": [*taints, taint]}},
            content_type=MERGE,
        )

    def shut_down_node(self, name: str, timeout: float = 60) -> None:
        """The node shuts down gracefully (SIGTERM to its agent: DisruptionTarget, SIGTERM to the
        pods, their grace period), then the machine is gone and its Node object deleted."""
        agent = self.agents[name]
        agent.signal(signal.SIGTERM)
        try:
            agent.popen.wait(timeout)
        except subprocess.TimeoutExpired as err:
            raise StackError(
                f"node {name} did not shut down in {timeout:.0f}s:\n{agent.tail()}"
            ) from err
        self._delete(f"/api/v1/nodes/{name}")

    # ---------------------------------------------------------------- jobs

    def apply(self, manifest: Path, *, name: str | None = None) -> str:
        """``kubectl apply`` a manifest into the stack's namespace (renaming its job); the job."""
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        job = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")
        if name:
            job["metadata"]["name"] = name
        self.kubectl("apply", "-n", self.cfg.namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
        return str(job["metadata"]["name"])

    def job(self, name: str) -> Obj:
        """The ResumableTrainingJob."""
        return self.kube.request(
            "GET", f"{RTJ_API}/namespaces/{self.cfg.namespace}/resumabletrainingjobs/{name}"
        )

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        """The job's pods (of one attempt), by attempt then rank."""
        selector = f"{LABEL_JOB}={job}"
        if attempt is not None:
            selector += f",{LABEL_ATTEMPT}={attempt}"
        items = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{self.cfg.namespace}/pods",
            params={"labelSelector": selector},
        )["items"]
        return sorted(
            items,
            key=lambda p: (
                int(p["metadata"]["labels"].get(LABEL_ATTEMPT, 0)),
                int(p["metadata"]["labels"].get(LABEL_RANK, 0)),
            ),
        )

    def pod(self, name: str) -> Obj | None:
        """One pod, or None."""
        return self.kube.get(f"/api/v1/namespaces/{self.cfg.namespace}/pods/{name}")

    def pod_log(self, pod: str, container: str = "trainer") -> str:
        """A container's log, from whichever node ran it (the pod runner keeps logs)."""
        pattern = f"logs/{self.cfg.namespace}_{pod}_*/{container}.log"
        texts = [
            p.read_text(errors="replace") for p in sorted(self.workdir.glob(f"nodes/*/{pattern}"))
        ]
        return "".join(texts)

    def events(self, job: str) -> list[Obj]:
        """Events about the job, oldest first."""
        items = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{self.cfg.namespace}/events",
            params={"fieldSelector": f"involvedObject.name={job}"},
        )["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def diagnostics(self, job: str | None = None) -> str:
        """What to look at when something timed out: job status, pods, operator log."""
        parts = []
        if job:
            with contextlib.suppress(Exception):
                parts.append("job status: " + json.dumps(self.job(job).get("status"), indent=1))
            with contextlib.suppress(Exception):
                parts += [
                    f"pod {p['metadata']['name']} on {p['spec'].get('nodeName')}: "
                    f"{p['status'].get('phase')}"
                    for p in self.pods(job)
                ]
        if self.operator is not None:
            parts.append(f"operator log ({self.operator.log}):\n{self.operator.tail(30)}")
        return "\n".join(parts)


# ------------------------------------------------------------------------------ job facts


COMMITTED = re.compile(r"committed checkpoint (ep(\d+)-ba(\d+))")
RESUMED = re.compile(r"resumed run \S+ from (\S+) at epoch (\d+) batch (\d+)")
FETCHED = re.compile(r"object store: fetched (\S+)")
NOTICE_SAVE = "preemption notice: saving now"
EMERGENCY = re.compile(r"emergency save (\S+) done ([\d.]+)s after SIGTERM")


def committed_steps(log: str) -> list[tuple[str, int]]:
    """Checkpoints a rank's log says it committed: (name, step), in order."""
    return [(m.group(1), int(m.group(3))) for m in COMMITTED.finditer(log)]


def resumed_step(log: str) -> int | None:
    """The step a rank's log says it resumed at (None: not resumed, or a fresh start)."""
    found = RESUMED.search(log)
    return int(found.group(3)) if found else None


def interval_steps(manifest: Path) -> int:
    """The ``--interval=Nba`` of the manifest's training command."""
    for arg in training_command(manifest):
        if arg.startswith("--interval=") and arg.endswith("ba"):
            return int(arg.removeprefix("--interval=").removesuffix("ba"))
    raise StackError(f"{manifest}: the command has no --interval=Nba")


def training_command(manifest: Path) -> list[str]:
    """The training container's command + args in the manifest's job."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    job = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")
    container = job["spec"]["template"]["spec"]["containers"][0]
    return [*(container.get("command") or []), *(container.get("args") or [])]


# ------------------------------------------------------------------------------ reference run


@dataclass
class ReferenceRun:
    """The same training, uninterrupted, as plain local processes: the weights to compare with."""

    procs: list[subprocess.Popen[bytes]]
    out: Path
    log: Path

    def wait(self, timeout: float = 300) -> Path:
        """Wait for every rank; the final weights (StackError when a rank failed)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise StackError(f"the reference run took longer than {timeout:.0f}s") from None
            if code != 0:
                self.kill()
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
                raise StackError(f"the reference run failed (exit {code}):\n{tail}")
        return self.out

    def kill(self) -> None:
        """Stop it (tear-down)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def start_reference_run(manifest: Path, workdir: Path) -> ReferenceRun:
    """Run the manifest's training command with WORLD_SIZE ranks as local processes.

    Same script and arguments, except what cannot change the weights: no ``--step-sleep``, a
    local checkpoint folder instead of the operator's environment, ``--out`` here.
    """
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    job = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")
    world = int(job["spec"]["replicas"])
    argv = training_command(manifest)
    if Path(argv[0]).name.startswith("python"):
        argv = [sys.executable, *argv[1:]]
    argv = [a.replace("/app/", f"{REPO}/") for a in argv]
    argv = [a for a in argv if not a.startswith(("--out=", "--step-sleep="))]
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "reference.pt"
    argv += ["--folder", str(workdir / "checkpoints"), "--run-name", "reference", "--out", str(out)]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTJ_", "AWS_", "KUBERNETES_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    port = str(free_port())
    log = workdir / "reference.log"
    procs = []
    with open(log, "ab") as handle:
        for rank in range(world):
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
            procs.append(
                subprocess.Popen(
                    argv,
                    env=rank_env,
                    cwd=REPO,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return ReferenceRun(procs, out, log)


def weights_equal(a: Path, b: Path) -> tuple[bool, str]:
    """Whether two saved state dicts are bitwise equal; a one-line explanation."""
    import torch  # noqa: PLC0415 - only the comparison needs it

    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    if left.keys() != right.keys():
        return False, f"different keys: {sorted(left)} vs {sorted(right)}"
    for key in left:
        x, y = left[key], right[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{key}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if not torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)):
            diff = (x.double() - y.double()).abs().max().item()
            return False, f"{key}: differs (max abs difference {diff:.3g})"
    return True, f"{len(left)} tensors, bit for bit"


def fetched_from(log: str) -> str | None:
    """The object-store URI a rank's log says it downloaded its resume checkpoint from."""
    found = FETCHED.search(log)
    return found.group(1) if found else None


def notice_checkpoint(log: str) -> tuple[str, int] | None:
    """The checkpoint rank 0 committed right after a preemption notice: (name, step)."""
    at = log.find(NOTICE_SAVE)
    if at < 0:
        return None
    after = committed_steps(log[at:])
    return after[0] if after else None


# ------------------------------------------------------------------------------ the story


class Narrator:
    """Watches a job and says, one line each, what changes: phases, attempts, where the ranks
    run, committed checkpoints, notices, interruptions (with the steps they lost), resumes.

    A daemon thread, so the caller's waits and actions stay simple; every line carries the time
    since the job was submitted. ``lines`` keeps them for summaries and test failure messages.
    """

    def __init__(self, stack: LocalStack, job: str, say: Say, *, interval: float = 0.3) -> None:
        self.stack, self.job, self.say_out, self.interval = stack, job, say, interval
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._stop = False
        self._seen: set[str] = set()
        self._phase: str | None = None
        self._attempt: int | None = None
        self._checkpoint: str | None = None
        self._interruptions = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        """Say a line, stamped with the time since submission."""
        line = f"[{time.monotonic() - self.started:6.1f}s] {text}"
        self.lines.append(line)
        self.say_out(line)

    def __enter__(self) -> Narrator:
        self._thread = threading.Thread(target=self._run, name="narrator", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(Exception):
            self.poll()  # the last word (e.g. Succeeded)

    def _run(self) -> None:
        while not self._stop:
            try:
                self.poll()
            except Exception as err:  # the narration must never break the story
                self._once(f"error:{type(err).__name__}", f"(narrator: {err})")
            time.sleep(self.interval)

    def _once(self, key: str, text: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self.say(text)

    def poll(self) -> None:
        """Compare the job with what was said already; say what is new (thread-safe)."""
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        job = self.stack.job(self.job)
        replicas = int((job.get("spec") or {}).get("replicas", 1))
        status = job.get("status") or {}
        attempt = int(status.get("attempt", 0))
        for item in (status.get("interruptions") or [])[self._interruptions :]:
            kind = "preemption" if item.get("preemption") else "failure"
            self.say(
                f"operator: attempt {item.get('attempt')} interrupted: {item.get('cause')} "
                f"of rank {item.get('rank')} on {item.get('node')} ({kind}; "
                f"{status.get('preemptions', 0)} preemption(s), "
                f"{status.get('failures', 0)} failure(s) so far); last committed step "
                f"{item.get('lastCommittedStep')}, steps lost {item.get('stepsLost')}"
            )
        self._interruptions = len(status.get("interruptions") or [])
        if attempt != self._attempt and status.get("phase"):
            if attempt > 0:
                self.say(
                    f"operator: attempt {attempt} submitted with RTJ_RESUME_FROM="
                    f"{status.get('resumeFrom') or '(empty)'}"
                )
            self._attempt = attempt
        phase = status.get("phase")
        if phase and phase != self._phase:
            self.say(f"job phase: {phase}")
            self._phase = phase
        last = status.get("lastCommittedCheckpoint") or {}
        if last.get("name") and last["name"] != self._checkpoint:
            self._checkpoint = last["name"]
            self.say(
                f"checkpoint {last['name']} committed at step {last.get('step')} "
                f"(attempt {last.get('attempt')}), in the object store"
            )
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PreemptionNotice" and cond.get("status") == "True":
                self._once(
                    f"notice:{cond.get('lastTransitionTime')}",
                    f"operator: preemption notice: {cond.get('message')}",
                )
        pods = self.stack.pods(self.job, attempt)
        placed = {p["metadata"]["labels"].get(LABEL_RANK): p["spec"].get("nodeName") for p in pods}
        if len(placed) == replicas and all(placed.values()):
            where = ", ".join(f"rank {r} on {n}" for r, n in sorted(placed.items()))
            self._once(f"placed:{attempt}", f"attempt {attempt}: {where}")
        for seen in range(max(0, attempt - 1), attempt + 1):  # an old gang may still be saving
            self._from_log(seen, self.stack.pod_log(f"{self.job}-a{seen}-r0"))

    def _from_log(self, attempt: int, log: str) -> None:
        if not log:
            return
        step = resumed_step(log)
        if step is not None:
            source = fetched_from(log)
            origin = f"fetched {source}" if source else "local copy"
            self._once(
                f"resumed:{attempt}", f"attempt {attempt}: rank 0 resumed at step {step} ({origin})"
            )
        elif "from scratch" in log:
            self._once(f"fresh:{attempt}", f"attempt {attempt}: rank 0 started from scratch")
        notice = notice_checkpoint(log)
        if notice is not None:
            self._once(
                f"noticesave:{attempt}",
                f"attempt {attempt}: rank 0 saved at once on the notice: checkpoint "
                f"{notice[0]} at step {notice[1]}, and trains on",
            )
        emergency = EMERGENCY.search(log)
        if emergency is not None:
            self._once(
                f"sigterm:{attempt}",
                f"attempt {attempt}: rank 0 saved on SIGTERM: checkpoint "
                f"{emergency.group(1)}, {emergency.group(2)}s after the signal, and exited",
            )


@dataclass
class StoryResult:
    """What happened to one job, for the demo's summary and the e2e's assertions."""

    job: str
    status: Obj
    lost_node: str
    rank_pods: dict[int, Obj]
    """Rank 0's pod of every attempt, by attempt."""
    logs: dict[int, str]
    """Rank 0's log of every attempt, by attempt."""
    committed_before_loss: int
    """lastCommittedCheckpoint.step when the node was lost."""
    weights: Path
    seconds: float
    status_at_loss: Obj = field(default_factory=dict)
    """The job's status just before the node went (after the notice's save, if any)."""
    notice: tuple[str, int] | None = None


class Story:
    """One job on the stack, from submission to Succeeded, with one node lost midway.

    ``lose`` is ``reclaim`` (the Node deleted and its processes SIGKILLed, no notice) or
    ``notice`` (a termination taint first: the runtime saves at once; then the node shuts down
    gracefully and its Node is deleted).
    """

    TAINT = "cloud.google.com/impending-node-termination"

    def __init__(
        self,
        stack: LocalStack,
        manifest: Path,
        job: str,
        *,
        say: Say = _quiet,
        lose_after_step: int = 12,
        notice_delay_s: float = 1.0,
        timeout: float = 240,
    ) -> None:
        self.stack, self.manifest, self.job = stack, manifest, job
        self.notice_delay_s = notice_delay_s
        self.say_out, self.lose_after_step, self.timeout = say, lose_after_step, timeout
        self.narrator = Narrator(stack, job, say)
        self._at_loss: Obj = {}

    def _status(self) -> Obj:
        return self.stack.job(self.job).get("status") or {}

    def _wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        return wait_for(
            what, check, timeout, interval=0.2, on_timeout=lambda: self.stack.diagnostics(self.job)
        )

    def run(self, lose: str = "reclaim") -> StoryResult:
        """Submit, lose the node of rank 1 after a few checkpoints, wait for success."""
        if lose not in ("reclaim", "notice"):
            raise ValueError(f"lose={lose!r}: expected reclaim or notice")
        start = time.monotonic()
        self.stack.apply(self.manifest, name=self.job)
        with self.narrator as n:
            n.say(f"job {self.job} submitted (kubectl apply -f {self.manifest.relative_to(REPO)})")
            self._wait(
                f"a checkpoint at step {self.lose_after_step} or later",
                lambda: (
                    (self._status().get("lastCommittedCheckpoint") or {}).get("step", -1)
                    >= self.lose_after_step
                ),
                self.timeout,
            )
            rank1 = self.stack.pod(f"{self.job}-a0-r1") or {}
            node = rank1.get("spec", {}).get("nodeName")
            if not node:
                raise StackError(f"rank 1 of attempt 0 has no node:\n{self.stack.diagnostics()}")
            n.poll()  # say what led here before saying what is done
            notice = None
            if lose == "notice":
                notice = self._notice_then_shutdown(node)
                at_loss = self._at_loss
            else:
                at_loss = self._status()
                n.say(
                    f">>> spot reclaim of {node} (rank 1): its Node is deleted and every "
                    "process on it SIGKILLed, without notice"
                )
                self.stack.reclaim_node(node)
            self._wait("attempt 1", lambda: self._status().get("attempt", 0) >= 1, 60)
            final = self._wait(
                "the job to end",
                lambda: self._status().get("phase") in ("Succeeded", "Failed") and self._status(),
                self.timeout,
            )
            if final.get("phase") != "Succeeded":
                raise StackError(
                    f"job {self.job} ended {final.get('phase')}:\n"
                    f"{self.stack.diagnostics(self.job)}"
                )
        status = self._status()
        attempts = int(status.get("attempt", 0))
        rank_pods = {a: self.stack.pod(f"{self.job}-a{a}-r0") or {} for a in range(attempts + 1)}
        logs = {a: self.stack.pod_log(f"{self.job}-a{a}-r0") for a in range(attempts + 1)}
        weights = self.stack.results_dir / f"{self.job}.pt"
        self._wait(f"the final weights {weights}", weights.exists, 10)
        committed = int(at_loss["lastCommittedCheckpoint"]["step"])
        return StoryResult(
            self.job,
            status,
            node,
            rank_pods,
            logs,
            committed,
            weights,
            time.monotonic() - start,
            at_loss,
            notice,
        )

    def _notice_then_shutdown(self, node: str) -> tuple[str, int]:
        n = self.narrator
        # Between two interval checkpoints, so the notice's own save is easy to tell apart.
        time.sleep(self.notice_delay_s)
        n.say(
            f">>> termination notice: node {node} (rank 1) is tainted {self.TAINT}:NoSchedule "
            "(what GKE's node termination handler does ~30 s before a spot VM goes)"
        )
        self.stack.taint_node(node, self.TAINT, "NoSchedule", "true")
        log = lambda: self.stack.pod_log(f"{self.job}-a0-r0")  # noqa: E731
        name, step = self._wait(
            "the runtime's save on the notice", lambda: notice_checkpoint(log()), 60
        )
        self._wait(
            f"checkpoint {name} in status",
            lambda: any(
                k.get("name") == name for k in self._status().get("knownCheckpoints") or []
            ),
            30,
        )
        self._at_loss = self._status()
        n.say(
            f">>> node {node} shuts down: its pods get SIGTERM and their grace period, then "
            "the machine is gone and its Node deleted"
        )
        self.stack.shut_down_node(node)
        return name, step


# ------------------------------------------------------------------------------ by hand


def _interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM stops the stack the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.localstack``: the stack without a job, until Ctrl-C (to look around)."""
    import argparse  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m tools.localstack", description=main.__doc__)
    ap.add_argument("--cluster-name", default="rtj-stack")
    ap.add_argument("--namespace", default="rtj-demo")
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rtj-stack-"))
    cfg = StackConfig(
        workdir=workdir,
        cluster_name=args.cluster_name,
        namespace=args.namespace,
        nodes=args.nodes,
        say=lambda line: print(line, flush=True),
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with LocalStack(cfg) as stack:
            manifest = REPO / "tests" / "e2e" / "manifests" / "spot-job.yaml"
            print(
                f"\nexport KUBECONFIG={stack.kubeconfig}\n"
                f"export PATH={stack.bindir}:$PATH\n"
                f"kubectl apply -n {args.namespace} -f {manifest}\n"
                f"kubectl get rtj -n {args.namespace} -w\n"
                f"{sys.executable} -m tools.podrunner kill-node spot-1 --delete-node "
                f"--state-dir {stack.state_dir}\n"
                f"logs: {workdir}\nCtrl-C stops everything.",
                flush=True,
            )
            signal.pause()
    except KeyboardInterrupt:
        print("stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
