"""The in-process switch's protocol between the agent and a worker (trainer_runtime/switch.py);
the switch itself runs with real processes in tests/multiproc/test_inprocess_switch.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer_runtime import CheckpointManager, ConfigError, envvars
from trainer_runtime.switch import (
    SwitchRequest,
    SwitchWatch,
    agent_files,
    can_switch,
    expects_peer_state,
    write_request,
)


def test_a_worker_says_it_can_switch_and_reads_a_newer_request(tmp_path: Path):
    path = tmp_path / "switch-0"
    env = {envvars.SWITCH_FILE: str(path), envvars.MEMBERSHIP_EPOCH: "3"}
    assert SwitchWatch.from_environment(env, enabled=False) is None
    assert SwitchWatch.from_environment({}, enabled=True) is None  # not under the agent
    watch = SwitchWatch.from_environment(env, enabled=True)
    assert watch is not None and can_switch(path)
    assert watch.pending() is None and watch.agreement() == [0, 0]
    write_request(path, SwitchRequest(3, {"RANK": "1"}))
    assert watch.pending() is None  # not newer than its own epoch
    write_request(path, SwitchRequest(4, {"RANK": "1", "WORLD_SIZE": "3"}))
    assert watch.agreement() == [4, -4]
    assert watch.pending() == SwitchRequest(4, {"RANK": "1", "WORLD_SIZE": "3"})
    assert not list(tmp_path.glob("*.part"))  # written whole, by a rename


def test_a_request_to_leave_reads_back_and_a_bad_flag_is_refused(tmp_path: Path):
    watch = SwitchWatch(tmp_path / "switch-0", 1)
    write_request(watch.path, SwitchRequest(2, {}, leave=True))
    assert watch.pending() == SwitchRequest(2, {}, leave=True)
    with pytest.raises(ConfigError, match="leave"):
        SwitchRequest.parse('{"epoch": 2, "environment": {}, "leave": "yes"}', "f")
    assert not SwitchRequest.parse('{"epoch": 2, "environment": {}}', "f").leave  # older agents


def test_every_rank_must_hold_the_same_epoch_before_it_switches(tmp_path: Path):
    watch = SwitchWatch(tmp_path / "switch-0", 1)
    write_request(watch.path, SwitchRequest(2, {}))
    watch.agreement()
    assert watch.agreed([2, -2]) == SwitchRequest(2, {})  # everyone holds epoch 2
    assert watch.agreed([2, 0]) is None  # a rank has none yet: train on
    assert watch.agreed([3, -2]) is None  # ranks hold different epochs: wait for the newest
    assert watch.agreed([0, 0]) is None


def test_a_request_that_does_not_parse_is_ignored_and_said_once(tmp_path: Path, caplog):
    watch = SwitchWatch(tmp_path / "switch-0", 1)
    texts = ("{not json", '{"epoch": "2", "environment": {}}', '{"epoch": 2}', "[2]")
    for text in texts:
        watch.path.write_text(text)
        os.utime(watch.path, ns=(len(text), len(text)))  # a new stamp each time
        assert watch.pending() is None
    said = [r.getMessage() for r in caplog.records if "is not a request" in r.getMessage()]
    assert len(said) == 4
    assert "epoch='2': expected an integer >= 0" in said[1]
    assert "environment: expected an object of strings" in said[2]
    assert "expected a JSON object, got list" in said[3]
    watch.pending()  # unchanged: not said again
    assert len([r for r in caplog.records if "is not a request" in r.getMessage()]) == 4


def test_the_agent_clears_the_files_and_marks_new_ranks(tmp_path: Path):
    path = tmp_path / "switch-1"
    assert agent_files(path) == (path, tmp_path / "switch-1.ready", tmp_path / "switch-1.claimed")
    assert expects_peer_state({envvars.PEER_STATE: "1"})
    assert not expects_peer_state({}) and not expects_peer_state({envvars.PEER_STATE: "0"})


class _Backend:
    """An object-store backend of the script's own (the six calls; never called here)."""

    def submit(self, *args: object) -> None: ...
    def pending(self) -> set[str]: ...
    def find_newest(self, **kwargs: object) -> None: ...
    def fetch(self, *args: object) -> None: ...
    def uri_for(self, checkpoint: str) -> str: ...
    def close(self, timeout_s: float | None = None) -> None: ...


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_wrapped_model_or_a_remote_of_the_script_is_refused_naming_the_argument(
    tmp_path: Path, one_rank_group
):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=r"in_process_switch=True: pass the module"):
        CheckpointManager(
            model=DistributedDataParallel(model),
            folder=tmp_path,
            run_name="r",
            in_process_switch=True,
        )
    with pytest.raises(ConfigError, match=r"in_process_switch=True with remote="):
        CheckpointManager(
            model=model, remote=_Backend(), folder=tmp_path, run_name="r", in_process_switch=True
        )
    ckpt = CheckpointManager(model=model, folder=tmp_path, run_name="r", in_process_switch=True)
    assert ckpt.switch_watch is None  # not under the agent: nothing to watch
    ckpt.close()
