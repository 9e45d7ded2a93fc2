"""The pod's service-account folder: what lets the runtime annotate its own pod.

``trainer_runtime.pod.progress`` PATCHes its pod over HTTPS with the pod's token and ``ca.crt``
(the progress contract); under the pod runner that only works if the runner provides
them the way a kubelet does. These tests run the runtime's own reporter in a pod.
"""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tools.kubeapi import Kube
from tools.podrunner.serviceaccount import (
    MOUNT_PATH,
    ServiceAccountFolder,
    check_server_certificate,
)
from tools.podrunner.translate import ConfigError

from .conftest import AgentFactory
from .test_agent import create, get_pod, make_pod, wait_phase

Obj = dict[str, Any]
PROGRESS = "resumable.dev/progress"

REPORTER = """
    import json, logging, os
    logging.basicConfig(level=logging.INFO)
    from trainer_runtime.pod.progress import ProgressReporter
    out = os.environ["OUT"]
    reporter = ProgressReporter()
    reporter.committed({"checkpoint": "ep0-ba4", "uri": "s3://b/run/ep0-ba4", "step": 4,
                        "epoch": 0, "sample": 32})
    reporter.close()
    sa = os.environ.get("RTJ_SERVICEACCOUNT_DIR", "")
    same = bool(sa) and open(os.environ["SA_TOKEN"]).read() == open(sa + "/token").read()
    json.dump({"enabled": reporter.enabled, "warned": reporter._warned, "sa_dir": sa,
               "host": os.environ.get("KUBERNETES_SERVICE_HOST"),
               "standard_path_is_the_folder": same}, open(os.path.join(out, "result.json"), "w"))
"""

POD_ENV = [
    {"name": "RTJ_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "RTJ_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "SA_TOKEN", "value": f"{MOUNT_PATH}/token"},
]


def allow_pod_patch(kube: Kube, ns: str, account: str = "default") -> None:
    """What the operator grants a job's ranks: get and patch on pods (here: all of them)."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    kube.request("POST", f"{rbac}/roles", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "progress"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
    })  # fmt: skip
    kube.request("POST", f"{rbac}/rolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "progress"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "progress"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    })  # fmt: skip


def jwt_claims(token: str) -> Obj:
    """The (unverified) payload of a JWT: enough to see what the token is bound to."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@pytest.mark.cluster
def test_runtime_reporter_annotates_its_own_pod(
    kube: Kube, ns: str, start_agent: AgentFactory, tmp_path: Path
) -> None:
    agent = start_agent()
    allow_pod_patch(kube, ns)
    pod = create(kube, ns, make_pod("reporter", agent.node, REPORTER, tmp_path, env=POD_ENV))
    done = wait_phase(kube, ns, "reporter", "Succeeded", 90)

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["enabled"] and not result["warned"], (result, agent.tail())
    assert result["host"] == "127.0.0.1"
    assert result["standard_path_is_the_folder"], result
    progress = json.loads(done["metadata"]["annotations"][PROGRESS])
    assert progress["checkpoint"] == "ep0-ba4" and progress["step"] == 4
    assert progress["current_step"] == 4 and "reported_at" in progress

    # The folder is the pod's own, and holds what a kubelet's would, with the kubeconfig's CA.
    folder = Path(result["sa_dir"])
    assert folder.is_relative_to(agent.workdir / "pods" / pod["metadata"]["uid"])
    assert (folder / "namespace").read_text() == ns
    assert (folder / "ca.crt").read_bytes() == kube.ca_pem
    claims = jwt_claims((folder / "token").read_text())
    bound = claims["kubernetes.io"]
    assert bound["namespace"] == ns and bound["serviceaccount"]["name"] == "default"
    assert bound["pod"] == {"name": "reporter", "uid": pod["metadata"]["uid"]}


@pytest.mark.cluster
def test_no_token_when_the_pod_opts_out(
    kube: Kube, ns: str, start_agent: AgentFactory, tmp_path: Path
) -> None:
    agent = start_agent()
    allow_pod_patch(kube, ns)
    spec = make_pod("opted-out", agent.node, REPORTER.replace(
        'open(os.environ["SA_TOKEN"]).read() == ', "False and "), tmp_path, env=POD_ENV,
        automountServiceAccountToken=False)  # fmt: skip
    create(kube, ns, spec)
    done = wait_phase(kube, ns, "opted-out", "Succeeded", 90)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["sa_dir"] == "" and not result["enabled"], result
    assert PROGRESS not in (done["metadata"].get("annotations") or {})
    assert get_pod(kube, ns, "opted-out") is not None


@pytest.mark.cluster
def test_server_certificate_matches_the_kubeconfig_ca(kube: Kube) -> None:
    """Pods verify 127.0.0.1 against ca.crt: the serving certificate must carry that IP."""
    host, port = kube.server_address
    assert host == "127.0.0.1"
    assert check_server_certificate(host, port, kube.ca_pem) is None
    certifi = pytest.importorskip("certifi")
    wrong = Path(certifi.where()).read_bytes()
    assert "fails" in (check_server_certificate(host, port, wrong) or "")
    assert "no certificate authority" in (check_server_certificate(host, port, None) or "")


def test_token_renewed_at_eighty_percent(tmp_path: Path) -> None:
    now = [100.0]
    answers: list[Obj | None] = [{"token": "t1"}, {"token": "t2"}, None]
    asked: list[int] = []

    def request(pod: Obj, seconds: int) -> Obj | None:
        asked.append(seconds)
        return answers.pop(0)

    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    folder = ServiceAccountFolder(tmp_path / "sa", request, b"CA", clock=lambda: now[0])
    folder.write(pod)
    assert (tmp_path / "sa" / "token").read_text() == "t1"
    assert (tmp_path / "sa" / "ca.crt").read_bytes() == b"CA"
    assert (tmp_path / "sa" / "namespace").read_text() == "ns"
    assert asked == [3607] and not folder.refresh_due()
    now[0] += 0.8 * 3607
    assert folder.refresh_due() and folder.refresh(pod)
    assert (tmp_path / "sa" / "token").read_text() == "t2"
    now[0] += 0.8 * 3607
    assert not folder.refresh(pod)  # refused: the old token stays, retried 30 s later
    assert (tmp_path / "sa" / "token").read_text() == "t2"
    assert not folder.refresh_due()
    now[0] += 30
    assert folder.refresh_due()


def test_refused_token_keeps_the_pod_waiting(tmp_path: Path) -> None:
    folder = ServiceAccountFolder(tmp_path / "sa", lambda pod, s: None, None)
    with pytest.raises(ConfigError, match="no service-account token"):
        folder.write({"metadata": {"name": "p", "namespace": "ns"}})


def test_script_is_valid_python() -> None:
    compile(textwrap.dedent(REPORTER), "reporter", "exec")
