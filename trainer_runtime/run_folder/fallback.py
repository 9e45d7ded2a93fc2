"""Newest valid checkpoint, with fallback: the one walk every reader of a run folder uses.

Resume (local and from the object store), ``load(run_folder)``, the remote resolver, the
backend's fetch, and ``export`` all pick a checkpoint the same way: take the candidates newest
first, check one, and when it does not hold up, say why and try the next older one. Each used
to write its own loop, and they drifted: one stopped at the first failure, one forgot to say
why it passed a checkpoint over, one retried the same broken checkpoint. ``first_valid`` is
that loop, once. What "valid" means stays with the caller (a checksum on every rank, a HEAD per
object, a verified download, a collective load), and so does the order (``RunFolder`` lists
newest first).

Rejected alternatives: a resolver class per storage kind (the walk is the same for all of
them; only the check differs), and checking every candidate up front (a resume would read every
checkpoint instead of one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Walk(Generic[T]):
    """What ``first_valid`` found: the chosen candidate (None: none held up) and, in order,
    every newer candidate passed over with the reason."""

    chosen: T | None
    passed_over: list[tuple[T, str]] = field(default_factory=list)

    def reasons(self, name: Callable[[T], str] = str) -> list[str]:
        """``"<name>: <reason>"`` per candidate passed over, newest first."""
        return [f"{name(c)}: {why}" for c, why in self.passed_over]


def first_valid(
    newest_first: Iterable[T],
    check: Callable[[T], str | None],
    *,
    on_reject: Callable[[T, str], None] | None = None,
) -> Walk[T]:
    """The first candidate (in the given order, newest first) that ``check`` accepts.

    ``check`` returns None for a valid candidate, else the reason it is not; it may raise to
    stop the walk (an outage, a world-size conflict: a condition an older checkpoint would
    not cure). Candidates are checked lazily, one at a time, and none after the chosen one;
    ``newest_first`` may be a generator. ``on_reject`` is called for each candidate passed
    over (a log line, setting it aside).
    """
    walk: Walk[T] = Walk(chosen=None)
    for candidate in newest_first:
        reason = check(candidate)
        if reason is None:
            walk.chosen = candidate
            return walk
        walk.passed_over.append((candidate, reason))
        if on_reject is not None:
            on_reject(candidate, reason)
    return walk
