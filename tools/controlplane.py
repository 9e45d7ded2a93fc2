"""Start, reuse and stop the project's local control plane: the one bring-up every harness uses.

The demo (``tools/localstack/``), the test suites (``tests/conftest.py``'s session fixture) and
the latency benchmark (``benchmarks/operator_latency.py``) all drive ``hack/cluster/cluster.sh``
through this module, so "is it built, does it already run, bring it up, where is its
kubeconfig, take it down only if we started it" is written once. The alternative, each harness
calling ``cluster.sh`` itself, had drifted into five copies with different timeouts, node
counts and teardown rules.

Nothing here is product code: it is not in the wheel.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "hack" / "cluster" / "cluster.sh"
BUILD_SH = REPO / "hack" / "cluster" / "build.sh"


class ControlPlaneError(RuntimeError):
    """``cluster.sh`` failed; the message carries the end of its output."""


def binaries_ready() -> bool:
    """Whether ``hack/cluster/build.sh`` already built (and cached) the cluster binaries."""
    if not BUILD_SH.exists():
        return False
    check = subprocess.run([str(BUILD_SH), "--check"], capture_output=True, check=False)
    return check.returncode == 0


def bindir() -> Path:
    """The folder of the cached kubectl, helm, kube-apiserver, ... binaries."""
    out = subprocess.run(
        [str(BUILD_SH), "--print-bindir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


@dataclass
class ControlPlane:
    """One named local control plane (``RTJ_CLUSTER_NAME`` of ``cluster.sh``).

    ``up()`` starts it, or reuses it when it already runs; ``down()`` deletes it only when this
    object started it, unless ``keep`` is set (then it is always left up).
    """

    name: str
    keep: bool = False
    """Leave the cluster running after ``down()`` (to look at it, or reuse it next run)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More ``cluster.sh`` settings (for example ``RTJ_APISERVER_BIND_ADDRESS``)."""
    kubeconfig: str = ""
    """Set by ``up()``."""
    started: bool = False
    """Whether ``up()`` created the cluster (rather than found it running)."""

    @property
    def env(self) -> dict[str, str]:
        """Environment for ``cluster.sh``: this cluster's name, never a user's KUBECONFIG."""
        env = {**os.environ, **self.extra_env, "RTJ_CLUSTER_NAME": self.name}
        env.pop("KUBECONFIG", None)
        return env

    def _sh(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLUSTER_SH), *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )

    def exists(self) -> bool:
        """Whether a cluster of this name runs now."""
        return self._sh("status", timeout=60).returncode == 0

    def up(self, nodes: int = 0, timeout: float = 540) -> str:
        """Start (or reuse) the cluster with at least ``nodes`` kwok nodes; its kubeconfig."""
        self.started = not self.exists()
        up = self._sh("up", "--nodes", str(nodes), timeout=timeout)
        if up.returncode != 0:
            raise ControlPlaneError(f"hack/cluster/cluster.sh up failed:\n{up.stderr[-4000:]}")
        return self.kubeconfig_path()

    def kubeconfig_path(self) -> str:
        """The kubeconfig of a cluster that already runs (``cluster.sh env``)."""
        env = self._sh("env", timeout=60)
        if env.returncode != 0:
            raise ControlPlaneError(f"hack/cluster/cluster.sh env failed:\n{env.stderr[-2000:]}")
        self.kubeconfig = env.stdout.strip()
        return self.kubeconfig

    def down(self, wait: float | None = None) -> None:
        """Delete the cluster if this object started it and ``keep`` is off.

        ``wait``: seconds to wait for ``cluster.sh down``; None waits until it is done. Stopping
        can take minutes on a loaded machine, so a test session gives it a little while and
        lets it finish in the background rather than eat a test's time budget.
        """
        if not self.started or self.keep:
            return
        down = subprocess.Popen(
            [str(CLUSTER_SH), "down"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            down.wait(wait)
        self.started = False

    def delete(self, timeout: float = 180) -> None:
        """Delete the cluster whoever started it (a leftover from an earlier run)."""
        self._sh("down", timeout=timeout)
