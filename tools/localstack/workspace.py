"""Where the jobs run: the S3 server, the namespace, its S3 Secret and the results volume."""

from __future__ import annotations

from tools.kubeapi import ApiError
from tools.waiting import wait_for

from .base import StackBase
from .common import RESULTS_CLAIM, S3_SECRET


class WorkspacePart(StackBase):
    """The S3 server and the jobs' namespace."""

    def _start_s3(self) -> None:
        from tools.s3server import S3Server  # noqa: PLC0415 - the repo's test server

        self.s3 = S3Server(self.workdir / "s3", kind=self.cfg.s3_kind, bucket=self.cfg.bucket)
        self.s3.start()
        self._on_stop("the S3 server", self.s3.stop)
        self.say(f"S3: {self.s3.kind} on {self.s3.url}, bucket s3://{self.cfg.bucket}")

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
