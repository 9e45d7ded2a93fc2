"""Fixtures shared by every suite: small deterministic models and training steps."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip locally when a prerequisite is missing, but fail loudly in CI (CI=true)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {reason}")
    pytest.skip(reason)
