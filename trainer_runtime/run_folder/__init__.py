"""A run folder's life cycle after the commit: retiring checkpoints, locally and in a bucket.

``names`` holds the file names of the layout (docs/runtime.md, docs/object-store.md) without
importing torch; ``deleter`` removes a checkpoint manifest first, on a local disk or in a
bucket; ``set_aside`` moves a checkpoint resume passed over into ``rejected/``; ``retention``
decides which checkpoints go. Reading a run folder (candidates, manifests, the pointer) is
``layout.RunFolder``'s; committing one is ``commit.py``'s. (Rejected: each caller deleting in
its own order. Retention, keep_local, the remote prune and the bucket's set-aside each removed
the manifest first in their own words, and keep-newest-N was written twice.)
"""
