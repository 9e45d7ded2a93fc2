"""Kueue on the local control plane: installed, started as a local process, and its queues.

Any test or demo that needs a running Kueue calls ``Kueue(kubeconfig, workdir).up()``: it
installs Kueue's CRDs and webhook configurations from the module version ``hack/kueue/build.sh``
built (the same version as the binary), and starts the controller on 127.0.0.1 with the admin
kubeconfig of the cluster. ``up()`` reuses a Kueue it finds running from the same ``workdir``;
``down()`` stops only one it started and removes the webhook configurations, so the cluster
accepts pods again without it.

Why a local process: the control plane's nodes are kwok's or the pod runner's, and neither runs
container images, so Kueue cannot run in the cluster as its Deployment does. The API server
reaches its webhooks by ``url: https://127.0.0.1:<port>/...`` instead of the Service of the
upstream manifests. Kueue keeps its internal certificate management on (turned off, it reads its
metrics certificate from a fixed ``/etc/kueue/metrics/certs``): the certificates are generated
here, a CA and a server certificate valid for both the Service's DNS name (what Kueue's rotator
checks) and 127.0.0.1 (what the API server checks), and stored in the Secret the rotator reads,
which then finds them valid and only writes them out and injects the CA bundle. Letting the
rotator generate its own was rejected: its certificate names only the Service, which the API
server cannot verify at 127.0.0.1.

Only the ``pod`` integration is enabled (``manageJobsWithoutQueueName: false``): the operator's
gangs are Kueue pod groups (``rtj_operator/decide/gang.py``). Nothing here is product code.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tools.kubeapi import ApiError, Kube, Obj
from tools.ports import free_port
from tools.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
BUILD_SH = REPO / "hack" / "kueue" / "build.sh"
VERSION_ENV = REPO / "hack" / "kueue" / "version.env"

API = "kueue.x-k8s.io/v1beta2"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"  # noqa: S105 - the Secret's name, not a password
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"
CA_NAME = "kueue-ca"
"""The CA's DNS name Kueue's certificate rotator checks (``cert.go``, ``caName``)."""
WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
CONVERSION_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
"""The CRDs whose conversion webhook Kueue's rotator injects a CA bundle into."""
POD_WEBHOOK_PATHS = ("/mutate--v1-pod", "/validate--v1-pod")
ADMISSION_GATE = "kueue.x-k8s.io/admission"


class KueueError(RuntimeError):
    """Kueue could not be installed or started; the message carries the end of its log."""


def version() -> str:
    """The pinned Kueue version (``hack/kueue/version.env``)."""
    for line in VERSION_ENV.read_text().splitlines():
        if line.startswith("KUEUE_VERSION="):
            return line.split("=", 1)[1].strip()
    raise KueueError(f"{VERSION_ENV}: no KUEUE_VERSION= line")


def built() -> bool:
    """Whether ``hack/kueue/build.sh`` already built (and cached) this version."""
    check = subprocess.run([str(BUILD_SH), "--check"], capture_output=True, check=False)
    return check.returncode == 0


def build(timeout: float = 1800) -> Path:
    """Build Kueue if it is not cached (minutes, once); the version's folder."""
    out = subprocess.run(
        [str(BUILD_SH)], capture_output=True, text=True, check=False, timeout=timeout
    )
    if out.returncode != 0:
        raise KueueError(f"hack/kueue/build.sh failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def kueue_dir() -> Path:
    """The cached version's folder: ``kueue`` and ``config/{crd,webhook}``."""
    out = subprocess.run([str(BUILD_SH), "--print-dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


# -- certificates ------------------------------------------------------------------------------


def make_certs() -> dict[str, bytes]:
    """A CA and a server certificate for 127.0.0.1 and the webhook Service, as the Secret's
    ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key`` (RSA keys in PKCS#1, as Kueue's rotator
    parses them)."""
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=3650)  # the rotator renews within 90 days of the end

    def key_pem(key: rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kueue"),
        ]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_DNS)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(SERVICE_DNS),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        "ca.crt": ca.public_bytes(pem),
        "ca.key": key_pem(ca_key),
        "tls.crt": cert.public_bytes(pem),
        "tls.key": key_pem(key),
    }


# -- manifests ---------------------------------------------------------------------------------


def crds(folder: Path, url: str, ca_bundle: str) -> list[Obj]:
    """Kueue's CRDs, the ones with a conversion webhook pointing at ``url``/convert."""
    docs = []
    for path in sorted((folder / "config" / "crd" / "bases").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        plural = doc["spec"]["names"]["plural"]
        if plural in CONVERSION_CRDS:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        docs.append(doc)
    return docs


def webhook_configurations(folder: Path, url: str, ca_bundle: str) -> list[Obj]:
    """Kueue's webhook configurations by URL, with only the webhooks of its own API and of
    pods: the other integrations are off, and a webhook nobody serves would fail every create
    of its kind (``failurePolicy: Fail``)."""
    out = []
    for doc in yaml.safe_load_all((folder / "config" / "webhook" / "manifests.yaml").read_text()):
        if not doc or doc.get("kind") not in WEBHOOK_CONFIGS:
            continue
        doc["metadata"] = {"name": WEBHOOK_CONFIGS[doc["kind"]]}
        kept = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if "-kueue-x-k8s-io-" not in path and path not in POD_WEBHOOK_PATHS:
                continue
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if path in POD_WEBHOOK_PATHS:  # as the upstream kustomization patches them
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", NAMESPACE],
                        }
                    ]
                }
            kept.append(hook)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> Obj:
    """Kueue's Configuration: the ``pod`` integration only, everything on 127.0.0.1."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod"]},
        # The visibility API server would bind a fixed port (8082) on every address.
        "featureGates": {"VisibilityOnDemand": False},
        "clientConnection": {"qps": 50, "burst": 100},
    }


# -- the API -----------------------------------------------------------------------------------

PLURALS = {
    "CustomResourceDefinition": ("apiextensions.k8s.io/v1", "customresourcedefinitions"),
    "MutatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
    ),
    "ValidatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
    ),
    "ResourceFlavor": (API, "resourceflavors"),
    "ClusterQueue": (API, "clusterqueues"),
    "LocalQueue": (API, "localqueues"),
    "WorkloadPriorityClass": (API, "workloadpriorityclasses"),
    "Workload": (API, "workloads"),
}


def path_of(kind: str, name: str = "", namespace: str | None = None) -> str:
    """The API path of a kind (and object) this module handles."""
    group_version, plural = PLURALS[kind]
    base = f"/apis/{group_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


def apply(kube: Kube, doc: Obj) -> Obj:
    """Create, or replace keeping the resourceVersion (``Kube.apply``), a kind of this module."""
    return kube.apply(doc, path_of(doc["kind"], namespace=doc["metadata"].get("namespace")))


def delete(kube: Kube, path: str) -> None:
    """Delete, ignoring an object that is already gone (``Kube.delete``)."""
    kube.delete(path)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@dataclass
class Kueue:
    """Kueue for one cluster. ``workdir`` holds its certificates, configuration, log and
    ``state.json`` (pid and ports), by which a later ``up()`` finds it running."""

    kubeconfig: str
    workdir: Path
    started: bool = False
    """Whether ``up()`` started the process (rather than found it running)."""
    webhook_port: int = 0
    health_port: int = 0
    pid: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        """Kueue's log (stdout and stderr)."""
        return self.workdir / "kueue.log"

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    def tail(self, lines: int = 40) -> str:
        """The end of Kueue's log (for failure messages)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def ready(self) -> bool:
        """Whether the process runs and its readiness probe answers."""
        return bool(self.pid) and _alive(self.pid) and _answers(self._probe)

    @property
    def _probe(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/readyz"

    def _load_state(self) -> None:
        if not self.state_file.exists():
            return
        state = json.loads(self.state_file.read_text())
        self.pid = int(state["pid"])
        self.webhook_port = int(state["webhookPort"])
        self.health_port = int(state["healthPort"])

    def up(self, timeout: float = 180) -> Kueue:
        """Install and start Kueue, or reuse the one running from ``workdir``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._load_state()
        kube = Kube(self.kubeconfig)
        if self.ready() and kube.get(path_of("ClusterQueue")) is not None:
            return self
        if not built():
            raise KueueError(f"Kueue {version()} is not built: run hack/kueue/build.sh")
        folder = kueue_dir()
        self.webhook_port, self.health_port = free_port(), free_port()
        url = f"https://127.0.0.1:{self.webhook_port}"
        certs = make_certs()
        ca_bundle = base64.b64encode(certs["ca.crt"]).decode()
        for doc in crds(folder, url, ca_bundle):
            apply(kube, doc)
        for doc in crds(folder, url, ca_bundle):
            name = doc["metadata"]["name"]
            wait_for(f"CRD {name} established", lambda n=name: kube.crd_established(n), 60)
        self._secret(kube, certs)
        for doc in webhook_configurations(folder, url, ca_bundle):
            apply(kube, doc)
        # In a cluster the Secret is mounted there; Kueue's rotator waits for the files.
        cert_dir = self.workdir / "certs"
        cert_dir.mkdir(exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).write_bytes(certs[name])
        config = self.workdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(configuration(self.webhook_port, self.health_port, cert_dir))
        )
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(folder / "kueue"), "--config", str(config), "--zap-log-level=2"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid, self.started = self._proc.pid, True
        self.state_file.write_text(
            json.dumps(
                {"pid": self.pid, "webhookPort": self.webhook_port, "healthPort": self.health_port}
            )
        )

        def ready_or_dead() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise KueueError(f"kueue exited ({self._proc.returncode}):\n{self.tail()}")
            return _answers(self._probe) and self._webhook_answers(kube)

        wait_for("Kueue ready", ready_or_dead, timeout, interval=0.5, on_timeout=self.tail)
        return self

    def _secret(self, kube: Kube, certs: dict[str, bytes]) -> None:
        if kube.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
            kube.request(
                "POST",
                "/api/v1/namespaces",
                body={"apiVersion": "v1", "metadata": {"name": NAMESPACE}},
            )
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in certs.items()},
        }
        path = f"/api/v1/namespaces/{NAMESPACE}/secrets"
        delete(kube, f"{path}/{SECRET}")
        kube.request("POST", path, body=secret)

    def _webhook_answers(self, kube: Kube) -> bool:
        """A server-side dry run through Kueue's ResourceFlavor webhooks."""
        probe = resource_flavor("rtj-webhook-probe")
        try:
            kube.request("POST", path_of("ResourceFlavor"), body=probe, params={"dryRun": "All"})
        except ApiError:
            return False
        return True

    def down(self, uninstall_webhooks: bool = True) -> None:
        """Stop Kueue if this object started it, and remove its webhook configurations (pods
        and Kueue objects are then admitted without it); the CRDs and objects stay."""
        if not self.started:
            return
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        if uninstall_webhooks:
            with contextlib.suppress(ApiError, OSError):
                kube = Kube(self.kubeconfig)
                for kind, name in WEBHOOK_CONFIGS.items():
                    delete(kube, path_of(kind, name))
        self.state_file.unlink(missing_ok=True)
        self.started = False


# -- queues ------------------------------------------------------------------------------------


def resource_flavor(name: str = "default-flavor") -> Obj:
    """A ResourceFlavor without node labels: any node."""
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {}}


def cluster_queue(
    name: str,
    quota: dict[str, str],
    *,
    flavor: str = "default-flavor",
    cohort: str | None = None,
    borrowing_limit: dict[str, str] | None = None,
    preemption: Obj | None = None,
    namespace: str | None = None,
) -> Obj:
    """A ClusterQueue with ``quota`` (resource -> nominal quota) of one flavor. ``namespace``:
    only that namespace's LocalQueues may use it (tests must not share quota)."""
    resources = []
    for resource, nominal in quota.items():
        entry: Obj = {"name": resource, "nominalQuota": nominal}
        if borrowing_limit and resource in borrowing_limit:
            entry["borrowingLimit"] = borrowing_limit[resource]
        resources.append(entry)
    spec: Obj = {
        "namespaceSelector": (
            {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
        ),
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {"coveredResources": list(quota), "flavors": [{"name": flavor, "resources": resources}]}
        ],
        "preemption": preemption
        or {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> Obj:
    """A LocalQueue of ``namespace`` that submits to ``cluster_queue_name``."""
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def workload_priority_class(name: str, value: int) -> Obj:
    """A WorkloadPriorityClass (pods choose it with ``kueue.x-k8s.io/priority-class``)."""
    return {
        "apiVersion": API,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": "rtj test priority",
    }


def ensure_queue(
    kube: Kube,
    namespace: str,
    quota: dict[str, str],
    *,
    name: str = "",
    flavor: str = "default-flavor",
    **cluster_queue_args: Any,
) -> tuple[str, str]:
    """A ResourceFlavor, a ClusterQueue with ``quota`` serving only ``namespace``, and a
    LocalQueue there; (cluster queue name, local queue name). The ClusterQueue is named after
    the namespace unless ``name`` is given; the LocalQueue is ``name`` or ``queue``."""
    apply(kube, resource_flavor(flavor))
    cq = name or f"{namespace}-cq"
    apply(
        kube,
        cluster_queue(cq, quota, flavor=flavor, namespace=namespace, **cluster_queue_args),
    )
    lq = name or "queue"
    apply(kube, local_queue(lq, namespace, cq))
    wait_for(
        f"ClusterQueue {cq} active",
        lambda: _active(kube.get(path_of("ClusterQueue", cq))),
        30,
    )
    return cq, lq


def _active(obj: Obj | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def workloads(kube: Kube, namespace: str) -> list[Obj]:
    """The namespace's Workloads, oldest first."""
    items = kube.request("GET", path_of("Workload", namespace=namespace))["items"]
    return sorted(items, key=lambda w: w["metadata"]["creationTimestamp"])


def condition(obj: Obj | None, kind: str) -> Obj:
    """A condition of a Kueue object's status (empty when absent)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


def admitted(workload: Obj | None) -> bool:
    """Whether a Workload is admitted (quota reserved and every admission check passed)."""
    return condition(workload, "Admitted").get("status") == "True"


def wait_ready(kueue: Kueue, timeout: float = 60) -> None:
    """Wait until a started Kueue answers again (after a restart of the API server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kueue.ready():
            return
        time.sleep(0.5)
    raise KueueError(f"Kueue not ready after {timeout:.0f}s:\n{kueue.tail()}")
