"""The gradient-accumulation plan keeps the global batch constant across world sizes."""

from __future__ import annotations

import pytest

from trainer_runtime import batching
from trainer_runtime.errors import ConfigError
from trainer_runtime.pod.reporting import commit_record


@pytest.mark.parametrize(
    ("world", "micro", "accumulation"), [(4, 8, 2), (2, 8, 4), (1, 8, 8), (3, 8, 2)]
)
def test_each_world_size_consumes_the_same_global_batch(world, micro, accumulation):
    global_batch = 48 if world == 3 else 64
    p = batching.plan(global_batch_size=global_batch, world_size=world, micro_batch_size=8)
    assert p.accumulation_steps == accumulation
    assert p.per_rank_samples * world == global_batch
    assert p.micro_batch_size <= micro


def test_the_micro_batch_shrinks_to_a_divisor_of_the_ranks_share():
    p = batching.plan(global_batch_size=36, world_size=3, micro_batch_size=8)
    assert (p.micro_batch_size, p.accumulation_steps) == (6, 2)


def test_an_indivisible_global_batch_names_both_numbers():
    with pytest.raises(ConfigError, match="global_batch_size=10 is not divisible by world_size=4"):
        batching.plan(global_batch_size=10, world_size=4, micro_batch_size=2)
    with pytest.raises(ConfigError, match="micro_batch_size=0"):
        batching.plan(global_batch_size=8, world_size=2, micro_batch_size=0)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"global_batch_size": "64"}, "global_batch_size='64': expected an int, a count >= 1"),
        ({"micro_batch_size": 2.5}, "micro_batch_size=2.5: expected an int"),
        ({"world_size": None}, "world_size=None: expected an int"),
        ({"world_size": True}, "world_size=True: expected an int"),
    ],
)
def test_a_count_that_is_not_an_int_is_a_config_error_naming_it(kwargs, fragment):
    """A float micro-batch planned 0.5-sample micro-batches; a string raised a bare TypeError."""
    args = {"global_batch_size": 64, "world_size": 2, "micro_batch_size": 8, **kwargs}
    with pytest.raises(ConfigError) as err:
        batching.plan(**args)
    assert fragment in str(err.value)


def test_the_commit_report_carries_the_world_size():
    from trainer_runtime.save.manifest import Manifest
    from trainer_runtime.timestamp import Timestamp

    manifest = Manifest(
        name="ep0-ba10",
        run_name="r",
        world_size=3,
        timestamp=Timestamp(epoch=0, batch=10, sample=80),
        files=[],
        weights_only=False,
        created_at="2030-01-01T00:00:00.000+00:00",
        save_duration_s=0.1,
    )
    assert commit_record(manifest, "s3://b/r/ep0-ba10")["world_size"] == 3
