"""A run folder: reading it, locally or in a bucket, and its life cycle after the commit.

``layout`` is the one model of a run folder (``RunFolder``: candidates, manifests, the pointer,
verification) and ``fallback`` the one walk to its newest valid checkpoint. ``names`` holds the
file names of the layout (docs/runtime.md, docs/object-store.md) without importing torch;
``deleter`` removes a checkpoint manifest first, on a local disk or in a bucket; ``set_aside``
moves a checkpoint resume passed over into ``rejected/``; ``retention`` decides which
checkpoints go. Committing a checkpoint is ``save/commit.py``'s. (Rejected: each caller deleting
in its own order. Retention, keep_local, the remote prune and the bucket's set-aside each
removed the manifest first in their own words, and keep-newest-N was written twice.)
"""
