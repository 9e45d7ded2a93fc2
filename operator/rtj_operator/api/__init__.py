"""The ResumableTrainingJob API: what the API server holds, and what is generated from it.

Here: the typed job (``spec_types``, ``status_types``, ``api_types``), the names, labels and
environment variables shared with the pods and the runtime (``names``, ``envvars``), the RFC
3339 times of the API (``timeutil``), and the generators of everything derived from the models
(``crdgen`` with ``schema``, ``podschema``, ``reference``, and the deploy manifests ``rbac`` and
``admission``).

This is the bottom layer: it imports neither ``decide`` nor ``act``, so the contract of the
custom resource reads on its own and the CRD is generated without loading the controller. The
one exception is ``podschema``'s maintainer command that refetches the stored pod schema from a
cluster (tests/operator/test_layers.py lists it).
"""
