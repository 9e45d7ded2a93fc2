"""Shared fixtures of the multi-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.agentpods import Pods


@pytest.fixture(autouse=True)
def no_pod_left_behind() -> Iterator[None]:
    """A test that fails midway leaves its agent pods running (a standby pod waits for ever):
    end them, so they cannot disturb the next test."""
    yield
    Pods.kill_leftovers()
