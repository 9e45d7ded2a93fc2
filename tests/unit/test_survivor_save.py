"""The pure parts of the save from a survivor's memory (trainer_runtime/save/survivor.py): which
exceptions are failed collectives, which states one rank holds whole, and which worker a new
membership names. The save itself is shown with real processes in
tests/multiproc/test_survivor_save.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from trainer_runtime.errors import ConfigError
from trainer_runtime.pod import membership
from trainer_runtime.pod.peer_loss import collective_failure
from trainer_runtime.save.survivor import SurvivorSave, why_not_replicated
from trainer_runtime.save.survivor_group import split_from_bytes

GLOO_RESET = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:3973: "
    "Connection reset by peer"
)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError(GLOO_RESET),
        dist.DistBackendError("NCCL communicator was aborted"),
        dist.DistNetworkError("timed out"),
        RuntimeError("NCCL error in: ProcessGroupNCCL.cpp, remote process exited"),
    ],
)
def test_a_failed_collective_is_recognised(exc: BaseException) -> None:
    assert collective_failure(exc)


def test_a_failed_collective_raised_from_is_recognised_through_the_chain() -> None:
    try:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as inner:
            raise ValueError("the loss is not finite") from inner
    except ValueError as outer:
        assert collective_failure(outer)


@pytest.mark.parametrize(
    "exc",
    [None, ValueError("shapes do not match"), RuntimeError("CUDA out of memory"), SystemExit(1)],
)
def test_a_scripts_own_error_is_not_a_failed_collective(exc: BaseException | None) -> None:
    assert not collective_failure(exc)


def components(model: torch.nn.Module | None, **optimizers: object) -> SimpleNamespace:
    return SimpleNamespace(components=SimpleNamespace(model=model, optimizers=optimizers))


def test_a_plain_model_and_optimizer_are_held_whole_by_every_rank() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    assert why_not_replicated(components(model, optimizer=opt)) is None


def test_states_one_rank_does_not_hold_whole_are_named() -> None:
    model = torch.nn.Linear(2, 2)
    assert "no model" in why_not_replicated(components(None))
    assert "'custom' is not a torch.optim.Optimizer" in why_not_replicated(
        components(model, custom=object())
    )
    zero = type("ZeroRedundancyOptimizer", (torch.optim.SGD,), {})(model.parameters(), lr=0.1)
    assert "shards its state" in why_not_replicated(components(model, optimizer=zero))


def named(
    node_rank: int, stop: str, local_rank: int = 0, *, savers: int = 1, split_mib: int = 1024
) -> bool:
    """Whether a worker of a 3-pod gang whose model holds 4 MiB of weights is named to save."""
    model = torch.nn.Linear(1024, 1024, bias=False)  # 4 MiB of float32 weights
    guard = SurvivorSave.__new__(SurvivorSave)
    guard.ctx = SimpleNamespace(
        coord=SimpleNamespace(local_rank=local_rank),
        components=SimpleNamespace(model=model, optimizers={}),
    )
    guard.split_from = split_mib << 20
    new = membership.Membership(
        epoch=2,
        nnodes=3,
        node_rank=node_rank,
        master_addr="a",
        master_port=1,
        stop=stop,
        savers=savers,
    )
    return guard._named(new)


def test_only_the_first_worker_of_the_new_node_rank_0_is_named_and_only_after_a_loss() -> None:
    assert named(0, membership.STOP_KILL)
    assert not named(1, membership.STOP_KILL)  # another kept pod: it just ends
    assert not named(0, membership.STOP_KILL, local_rank=1)  # one writer per pod
    assert not named(0, membership.STOP_SAVE)  # every old member alive: a collective save


def test_every_saver_is_named_for_a_state_of_the_split_size_or_more() -> None:
    assert named(1, membership.STOP_KILL, savers=2, split_mib=4)  # 4 MiB: in shares
    assert not named(1, membership.STOP_KILL, savers=2, split_mib=5)  # below: node rank 0 alone
    assert named(0, membership.STOP_KILL, savers=2, split_mib=5)
    assert not named(2, membership.STOP_KILL, savers=2, split_mib=0)  # a new pod holds nothing
    assert not named(1, membership.STOP_KILL, local_rank=1, savers=2, split_mib=0)


@pytest.mark.parametrize("value", ["-1", "lots", "1.5"])
def test_a_bad_split_size_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match="RTJ_SURVIVOR_SPLIT_MIB"):
        split_from_bytes({"RTJ_SURVIVOR_SPLIT_MIB": value})
    assert split_from_bytes({}) == 1024 << 20


def test_outside_the_agent_nothing_is_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RTJ_SURVIVOR_SAVE_FILE", "RTJ_MEMBERSHIP_FILE", "RTJ_MEMBERSHIP_EPOCH"):
        monkeypatch.delenv(name, raising=False)
    assert SurvivorSave.arm(SimpleNamespace(world_size=4), lambda: False) is None
