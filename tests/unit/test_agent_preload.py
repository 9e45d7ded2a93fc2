"""The agent's preload (trainer_runtime/agent/preload.py): what it reads from the environment, and
that importing its default modules before a fork touches no CUDA and starts no thread."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from trainer_runtime.agent.preload import DEFAULT_MODULES, modules_from, preload
from trainer_runtime.errors import ConfigError


def test_the_environment_names_the_modules():
    assert modules_from({}) == DEFAULT_MODULES == ("torch._inductor.config",)
    assert modules_from({"RTJ_AGENT_PRELOAD": ""}) == ()
    assert modules_from({"RTJ_AGENT_PRELOAD": " numpy , torch._dynamo,"}) == (
        "numpy",
        "torch._dynamo",
    )
    with pytest.raises(ConfigError, match=r"RTJ_AGENT_PRELOAD=.*'my-model' is not a module name"):
        modules_from({"RTJ_AGENT_PRELOAD": "json, my-model"})


def test_a_module_that_fails_to_import_is_reported_and_skipped(caplog):
    with caplog.at_level(logging.WARNING, logger="trainer_runtime.agent"):
        seconds = preload(("no_such_module_for_the_agent", "json"))
    assert seconds >= 0
    assert "could not preload no_such_module_for_the_agent (ModuleNotFoundError" in caplog.text


CHECK = """
import json, os, threading, traceback
import torch, torch.distributed, torch.distributed.checkpoint
import trainer_runtime
calls = []
def spy(owner, name):
    real = getattr(owner, name)
    def wrapper(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    setattr(owner, name, wrapper)
for name in ("_cuda_getDeviceCount", "_cuda_init", "_cuda_getDevice"):
    if hasattr(torch._C, name):
        spy(torch._C, name)
for name in ("is_available", "device_count", "_lazy_init", "init", "current_device",
             "get_device_properties", "get_device_capability"):
    spy(torch.cuda, name)
threads = len(os.listdir("/proc/self/task"))
from trainer_runtime.agent.preload import DEFAULT_MODULES, preload
preload(DEFAULT_MODULES)
print(json.dumps({
    "calls": calls,
    "initialized": torch.cuda.is_initialized(),
    "threads": [threads, len(os.listdir("/proc/self/task"))],
    "python_threads": threading.active_count(),
    "loaded": all(m in __import__("sys").modules for m in ("torch._inductor", "torch._dynamo")),
}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/task")
def test_the_default_preload_touches_no_cuda_and_starts_no_thread():
    """What makes a fork after it safe: no CUDA call (a CUDA runtime initialised before a fork
    is unusable in the child) and no thread (a fork copies only the forking thread)."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["loaded"], seen
    assert seen["calls"] == [] and seen["initialized"] is False, seen
    assert seen["threads"][0] == seen["threads"][1] and seen["python_threads"] == 1, seen
