"""The operator's decisions: from what was observed to the plan of what to do, no side effects.

Here: the state machine (``reconcile`` with ``reconcile_context``, ``gang_create``,
``gang_watch``, ``transitions``), the reading of pods and nodes (``podstate``, ``nodes``,
``classify``, ``progress``, ``notice``), the policies (``exit_policy``, ``backoff``, ``resume``,
``elastic``, ``sizing``, ``capacity``, ``kueue_quota``, ``kueue_workload``, ``survivors``,
``spares``, ``gang``), the bookkeeping kept in status (``conditions``, ``goodput``,
``job_progress``, ``mtbi``, ``invalid_spec``), the objects a job owns (``manifests``,
``support``) and the plan the executor applies (``plan_types``).

Every function here is a function of its arguments: no request, no clock read behind the
caller's back, no process state. That is what lets the whole state machine run in unit tests,
and a restarted operator decide the same from the same observation. So this package imports
``api`` and never ``act`` (tests/operator/test_layers.py).
"""
