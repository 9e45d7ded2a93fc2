"""The GPU suite runs where CUDA is: elsewhere it is deselected (never skipped), and the run
says so. ``make test-gpu`` runs it alone on a GPU machine, next to the runtime's suites."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    config.hook.pytest_deselected(items=gpu)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests/gpu: {len(gpu)} tests deselected: no CUDA device here")
