"""The ResumableTrainingJob operator: runs a training gang as pods and resubmits it on preemption.

The package is split by role, in three layers that import only downwards:

- ``api``: the custom resource's types, names and environment contract, and the generators of
  the CRD and the deploy manifests from them;
- ``decide``: the pure decisions (``reconcile`` and the state machine around it, ``classify``,
  the elastic and gang policies, the conditions) that never touch the network and carry the
  unit tests;
- ``act``: the thin side-effect layer (``kube``, ``controller``, ``executor``, ``workqueue``,
  ``handlers``) that talks to the API server and runs the process.

``decide`` never imports ``act`` (tests/operator/test_layers.py). The package never imports
torch or ``trainer_runtime``: the two halves share only the contracts in ``api.envvars`` and
``api.names``. ``python -m rtj_operator`` (``__main__``) starts the operator.
"""

__version__ = "0.1.0"
