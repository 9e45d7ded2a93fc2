"""The runtime's side of the pod contract: the preemption notice, the gang membership, and what
rank 0 tells the operator through its own pod's annotations (progress, committed checkpoints).
"""
