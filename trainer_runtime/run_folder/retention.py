"""Retention as small policies: which checkpoints go, decided apart from how they are deleted.

Local retention (``CheckpointManager``, ``num_checkpoints_to_keep``), remote retention (the
uploader's ``keep_remote``), the local copies an upload leaves (``keep_local``) and the data
of folders set aside (``REJECTED_WITH_DATA``) all keep the newest N; ``beyond_newest`` is that
rule, once. ``select_for_deletion`` adds the two rules every committed checkpoint has: never
the newest, never a protected one (being written, uploaded, or named by ``latest.json``).
Deleting is ``deleter.py``'s. Deleters that each re-derived the rule (the rejected
alternative) disagreed at the edges: whether the newest counts when it does not verify,
whether a pending upload is spared.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

T = TypeVar("T")


def beyond_newest(
    newest_first: Sequence[T], keep: int, counts: Callable[[T], bool] | None = None
) -> list[T]:
    """Keep the newest ``keep`` (>= 0) items that ``counts`` (default: every one); return the
    items after them, newest first. An item that does not count (say, it fails to verify
    remotely) is neither counted nor returned while the kept set is still filling."""
    if keep < 0:
        raise ValueError(f"keep={keep!r}: expected a count >= 0")
    kept = 0
    beyond: list[T] = []
    for item in newest_first:
        if kept < keep:
            if counts is None or counts(item):
                kept += 1
            continue
        beyond.append(item)
    return beyond


def spare(doomed: Sequence[T], protected: Collection[T]) -> list[T]:
    """``doomed`` less the protected items, in order."""
    return [item for item in doomed if item not in protected]


def select_for_deletion(
    newest_first: Sequence[str],
    *,
    keep: int,
    protected: Collection[str] = (),
    counts: Callable[[str], bool] | None = None,
) -> list[str]:
    """Committed checkpoints to delete, given their names newest first and the policy.

    - ``keep``: how many to keep (-1: all); must be -1 or >= 1;
    - the newest ``keep`` that ``counts`` are kept (``beyond_newest``);
    - the newest checkpoint and every name in ``protected`` (being written, uploaded, or named
      by the pointer) are never deleted.
    """
    if keep == -1:
        return []
    if keep < 1:
        raise ValueError(f"keep={keep!r}: expected -1 (keep all) or a count >= 1")
    never = {*protected, *newest_first[:1]}
    return spare(beyond_newest(newest_first, keep, counts), never)
