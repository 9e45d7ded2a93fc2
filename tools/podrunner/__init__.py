"""A development stand-in for a kubelet: runs the pods bound to its Nodes as local processes.

No container runtime exists on the project's CI machines, so the local demo and the e2e suite
need something that turns a scheduled pod into a running training process. This package is that
something, and nothing more: no images, no isolation, no network namespaces, no probes, no
``kubectl logs``. It must never be imported by ``trainer_runtime`` or the operator. See
``docs/podrunner.md`` for what it does and does not imitate.
"""

from __future__ import annotations

__all__ = ["NODE_LABEL_TYPE"]

NODE_LABEL_TYPE = "podrunner"
"""Value of the ``type`` label on every Node the agent registers (kwok's own nodes say ``kwok``)."""
