"""The top-level keys of a sharded checkpoint's state dict (see ``engine``)."""

RANKS_KEY = "ranks"
"""``ranks/<r>``: each rank's small non-tensor state, pickled."""
MODEL_KEY = "model"
"""``model/<fqn>``: the model's tensors, keyed by parameter name."""
OPTIM_KEY = "optim"
"""``optim/<name>/...``: each optimizer's state and param groups, keyed by parameter name."""
