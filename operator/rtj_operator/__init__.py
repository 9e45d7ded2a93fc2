"""The ResumableTrainingJob operator: runs a training gang as pods and resubmits it on preemption.

The package is split by role. Pure decisions (``classify``, ``backoff``, ``resume``, ``progress``,
``notice``, ``manifests``, ``reconcile``) never touch the network and carry the unit tests; the
thin side-effect layer (``kube``, ``executor``, ``workqueue``, ``handlers``) talks to the API
server. It never imports torch or ``trainer_runtime``: the two halves share only the contracts
in ``envvars`` and ``names``.
"""

__version__ = "0.1.0"
