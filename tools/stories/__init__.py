"""Scripted stories, one module per story, shared by the e2e tests and ``make demo`` so that the
demo a user runs is what CI checks: on the local stack (``tools/localstack``) or on real nodes
(``tools/realnodes.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One claim of a story and whether it held."""

    name: str
    ok: bool
    detail: str


def print_checks(checks: Sequence[Check], say: Callable[[str], None]) -> bool:
    """One line per check, ``ok`` or ``BAD`` first; whether every check held."""
    width = max((len(c.name) for c in checks), default=0)
    for check in checks:
        say(f"  {'ok ' if check.ok else 'BAD'} {check.name:<{width}}  {check.detail}")
    return all(c.ok for c in checks)
