"""ResumableSampler: DistributedSampler-compatible order, exact mid-epoch resume, re-dealing."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from trainer_runtime import ConfigError
from trainer_runtime.sampler import DataPositionError, ResumableSampler


class Ids(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("n", [20, 23])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_order_as_distributed_sampler(n, drop_last, shuffle):
    ds = Ids(n)
    for epoch in (0, 3):
        for rank in range(3):
            ref = DistributedSampler(
                ds, num_replicas=3, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
            )
            ours = ResumableSampler(
                ds, num_replicas=3, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
            )
            ref.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert list(ours) == list(ref) and len(ours) == len(ref)


def test_takes_distributed_samplers_arguments_positionally_too():
    """A drop-in: ``DistributedSampler(ds, 3, 1, False, 5, True)`` becomes ours unchanged."""
    ds = Ids(23)
    ref = DistributedSampler(ds, 3, 1, False, 5, True)
    ours = ResumableSampler(ds, 3, 1, False, 5, True)
    assert list(ours) == list(ref) and len(ours) == len(ref) == 7
    with pytest.raises(TypeError):
        ResumableSampler(ds, 3, 1, False, 5, True, 4)  # batch_size is by name only


def test_reshuffles_every_epoch_deterministically():
    s = ResumableSampler(50, num_replicas=1, rank=0, seed=1)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert first != second and sorted(first) == sorted(second) == list(range(50))
    s.set_epoch(0)
    assert list(s) == first


def deal(state, world, n=48):
    out = []
    for r in range(world):
        s = ResumableSampler(n, num_replicas=world, rank=r, seed=3)
        s.load_state_dict(state)
        out.append(list(s))
    return out


@pytest.mark.parametrize(("before", "after"), [(2, 2), (2, 1), (1, 3), (4, 3)])
def test_mid_epoch_resume_any_world_size_no_repeat_no_skip(before, after):
    n, per_rank_batch = 48, 2
    samplers = [ResumableSampler(n, num_replicas=before, rank=r, seed=3) for r in range(before)]
    iters = [iter(s) for s in samplers]
    consumed = []
    for _ in range(5):  # five steps: each rank takes a batch, then the loop reports it
        for it in iters:
            consumed += [next(it) for _ in range(per_rank_batch)]
        for s in samplers:
            s.advance(per_rank_batch * before)
    state = samplers[0].state_dict()
    assert state["offset"] == 5 * per_rank_batch * before
    rest = [i for part in deal(state, after) for i in part]
    padding = (-(n - state["offset"])) % after  # DistributedSampler semantics: pad to even out
    assert set(consumed + rest) == set(range(n)), "a sample was skipped"
    assert len(consumed + rest) == n + padding
    if padding == 0:
        assert sorted(consumed + rest) == list(range(n)), "a sample was repeated"


def test_position_is_what_the_loop_consumed_not_what_workers_prefetched():
    sampler = ResumableSampler(Ids(64), num_replicas=1, rank=0, seed=0, batch_size=4)
    loader = DataLoader(Ids(64), batch_size=4, sampler=sampler, num_workers=2, prefetch_factor=4)
    seen = []
    it = iter(loader)
    for _ in range(3):
        seen += next(it).tolist()
        sampler.advance()
    assert sampler.state_dict()["offset"] == 12  # workers have fetched far more by now
    resumed = ResumableSampler(Ids(64), num_replicas=1, rank=0, seed=0)
    resumed.load_state_dict(sampler.state_dict())
    assert seen + list(resumed) == list(ResumableSampler(Ids(64), num_replicas=1, rank=0, seed=0))
    del it


def test_changed_dataset_is_a_clear_error():
    s = ResumableSampler(10, num_replicas=1, rank=0)
    with pytest.raises(DataPositionError, match="ignore_data_position=True"):
        ResumableSampler(12, num_replicas=1, rank=0).load_state_dict(s.state_dict())


def test_bad_arguments():
    with pytest.raises(ConfigError, match="rank=2 num_replicas=2"):
        ResumableSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="batch_size"):
        ResumableSampler(10, num_replicas=1, rank=0).advance()
    with pytest.raises(ConfigError, match="at least 1"):
        ResumableSampler(0, num_replicas=1, rank=0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"seed": "x"}, "seed='x': expected an int, a random seed; got a str"),
        ({"shuffle": 1}, "shuffle=1: expected True or False, got an int"),
        ({"drop_last": "no"}, "drop_last='no': expected True or False"),
        ({"batch_size": 0}, "batch_size=0: expected None or a positive per-rank batch size"),
        ({"num_replicas": 0}, "num_replicas=0: expected None or a count >= 1"),
        ({"rank": -1}, "rank=-1: expected None or a rank >= 0"),
        ({"rank": 1.0}, "rank=1.0: expected an int"),
    ],
)
def test_a_malformed_argument_is_named(kw, message):
    args = {"num_replicas": 2, "rank": 0, **kw}
    with pytest.raises(ConfigError) as err:
        ResumableSampler(10, **args)
    assert message in str(err.value)


@pytest.mark.parametrize("variable, value", [("WORLD_SIZE", "2.5"), ("RANK", "x")])
def test_a_malformed_rank_variable_is_named(monkeypatch, variable, value):
    """Without num_replicas/rank (and torch.distributed), the sampler reads the environment."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=rf"{variable}='{value}': expected"):
        ResumableSampler(10)
