"""The stack's control plane: the test session's running one, or its own, started and deleted.

Kept apart from the rest because it is the one part that differs between the demo (its own
cluster, deleted at the end) and the e2e suite (the session's shared control plane, left up).
"""

from __future__ import annotations

from pathlib import Path

from tools.controlplane import ControlPlaneError
from tools.kubeapi import ApiError, Kube
from tools.waiting import wait_for

from .base import StackBase
from .common import StackError


class ClusterPart(StackBase):
    """Bringing the control plane up and down."""

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
