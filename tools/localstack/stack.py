"""``LocalStack``: the whole system on one machine, started in order and always stopped.

The parts live in their own modules (``cluster``, ``chart``, ``workspace``, ``nodes``, ``jobs``);
this class only orders their start and runs the cleanups they registered, newest first.
"""

from __future__ import annotations

import signal
import threading

from tools.controlplane import binaries_ready as cluster_binaries_ready
from tools.controlplane import bindir

from .chart import ChartPart
from .cluster import ClusterPart
from .common import StackError
from .jobs import JobsPart
from .nodes import NodesPart
from .workspace import WorkspacePart


class LocalStack(ClusterPart, ChartPart, WorkspacePart, NodesPart, JobsPart):
    """The running system. ``with LocalStack(cfg) as stack:`` starts it and always stops it."""

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
