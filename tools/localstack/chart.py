"""The operator as a user installs it: the Helm chart, then the chart's Deployment run locally.

No container runtime runs here, so the chart's Deployment is scaled to 0 and the operator runs
as a local process **with the chart's ServiceAccount token and the Deployment's own arguments**:
the chart's RBAC and flags are what the story runs on, not the admin's credentials.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import yaml

from rtj_operator.api import names
from tools.kubeapi import MERGE
from tools.ports import free_port
from tools.waiting import wait_for

from .base import StackBase
from .common import (
    CHART,
    NOT_SCHEDULABLE,
    OPERATOR_DIR,
    OPERATOR_NAMESPACE,
    RELEASE,
    REPO,
    StackError,
)
from .process import Proc


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - local URL
            return bool(resp.status == 200)
    except OSError:
        return False


class ChartPart(StackBase):
    """The Helm release and the operator process."""

    def _helm(self, *args: str, timeout: float = 180) -> str:
        return self._cluster_tool("helm", args, what=" ".join(args[:2]), timeout=timeout, cwd=REPO)

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
        for crd in (names.CRD_NAME, "clusterkopfpeerings.kopf.dev"):
            wait_for(f"CRD {crd} established", lambda c=crd: self.kube.crd_established(c), 60)

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
