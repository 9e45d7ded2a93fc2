"""The operator's side effects: what talks to the API server or runs the process.

Here: the Kubernetes clients (``kube_transport``, ``kube``), the reads a reconcile needs
besides the job and its pods (``discovery``, ``kueue_reads``), the loop that turns events into
read -> decide -> apply (``handlers``, ``controller``, ``workqueue``, ``watch_cache``), the
application of a plan (``executor``), and the process's own concerns (``peering``,
``metrics``).

Kept thin on purpose: every choice about a job is made in ``decide`` from what this layer read,
and this layer only carries it out. It imports ``api`` and ``decide``; neither imports it.
"""
