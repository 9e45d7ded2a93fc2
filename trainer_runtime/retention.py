"""Retention: which committed checkpoints to delete, as one pure function.

Local retention (``CheckpointManager``, ``num_checkpoints_to_keep``) and remote retention (the
uploader's ``keep_remote``) both decide with ``select_for_deletion``; only how they list
checkpoints and delete them differs. Three deleters that each re-derived the rule (the rejected
alternative, as before) disagreed at the edges: whether the newest counts when it does not
verify, whether a pending upload is spared.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence


def select_for_deletion(
    newest_first: Sequence[str],
    *,
    keep: int,
    protected: Collection[str] = (),
    counts: Callable[[str], bool] | None = None,
) -> list[str]:
    """Names to delete, given committed checkpoints newest first and the policy.

    - ``keep``: how many to keep (-1: all); must be -1 or >= 1;
    - the newest ``keep`` that ``counts`` (default: every one) are kept; one that does not
      count (say, it fails to verify remotely) is neither counted nor deleted while the kept
      set is still filling;
    - the newest checkpoint and every name in ``protected`` (being written, uploaded, or named
      by the pointer) are never deleted.
    """
    if keep == -1:
        return []
    if keep < 1:
        raise ValueError(f"keep={keep!r}: expected -1 (keep all) or a count >= 1")
    kept = 0
    doomed: list[str] = []
    for index, name in enumerate(newest_first):
        if kept < keep:
            if counts is None or counts(name):
                kept += 1
            continue
        if index == 0 or name in protected:
            continue
        doomed.append(name)
    return doomed
