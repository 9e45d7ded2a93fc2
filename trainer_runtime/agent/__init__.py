"""The in-pod agent: keeps a pod's training processes warm across membership changes.

``python -m trainer_runtime.agent -- <the container's command>`` runs the command's training
script in workers forked from a process that has already imported torch and the runtime, and
restarts them in place when the operator announces a new membership of the gang, instead of the
whole pod being replaced (docs/survivors.md). The operator puts it in front of the container's
command when ``spec.recovery.survivors`` is ``Stay``.
"""
