"""Save intervals and name templates: the construction-time checks users hit first."""

import pytest

from trainer_runtime import ConfigError, Event, SaveInterval, Timestamp
from trainer_runtime.save.naming import NameTemplates


@pytest.mark.parametrize(
    ("value", "unit", "every"),
    [(1, "ep", 1), (3, "ep", 3), ("1ep", "ep", 1), ("500ba", "ba", 500), (" 2000sp ", "sp", 2000)],
)
def test_interval_forms(value, unit, every):
    iv = SaveInterval.parse(value)
    assert (iv.unit, iv.every) == (unit, every)


@pytest.mark.parametrize("bad", ["10", "5 steps", "0ba", "-1ep", "1.5ep", "ba", 0, -2, True, 2.0])
def test_bad_interval_names_accepted_forms(bad):
    with pytest.raises(ConfigError) as err:
        SaveInterval.parse(bad)
    assert "interval=" in str(err.value)
    if not isinstance(bad, int) or isinstance(bad, bool):
        assert "'500ba'" in str(err.value) and "callable" in str(err.value)


def test_batch_interval_fires_on_multiples_only():
    iv = SaveInterval.parse("3ba")
    fired = [
        b for b in range(1, 10) if iv.should_save(Timestamp(batch=b), Timestamp(), Event.BATCH_END)
    ]
    assert fired == [3, 6, 9]
    assert not iv.should_save(Timestamp(batch=3), Timestamp(), Event.EPOCH_END)


def test_sample_interval_fires_when_a_multiple_is_crossed():
    iv = SaveInterval.parse("100sp")
    fired = []
    prev = Timestamp()
    for b in range(1, 12):
        now = Timestamp(batch=b, sample=b * 32)
        if iv.should_save(now, prev, Event.BATCH_END):
            fired.append(now.sample)
        prev = now
    assert fired == [128, 224, 320]


def test_epoch_interval_and_callable():
    iv = SaveInterval.parse(2)
    assert [
        e for e in range(1, 6) if iv.should_save(Timestamp(epoch=e), Timestamp(), Event.EPOCH_END)
    ] == [2, 4]
    seen = []
    fn = SaveInterval.parse(lambda ts, ev: seen.append((ts.batch, ev)) or ts.batch == 2)
    assert fn.should_save(Timestamp(batch=2), Timestamp(), Event.BATCH_END)
    assert seen == [(2, Event.BATCH_END)]


def test_default_templates_render():
    t = NameTemplates()
    values = dict(
        run_name="r",
        world_size=2,
        rank=1,
        local_rank=1,
        epoch=3,
        batch=1200,
        sample=9,
        batch_in_epoch=4,
        sample_in_epoch=5,
    )
    assert t.render_folder("r") == "checkpoints/r"
    assert t.render_checkpoint(values) == ("ep3-ba1200", "rank1.pt")
    assert t.render_latest(values) == "latest-rank1"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"filename": "ep{epohc}/rank{rank}.pt"}, "unknown variable(s) epohc"),
        ({"folder": "ckpt/{epoch}"}, "folder='ckpt/{epoch}' uses unknown variable(s) epoch"),
        ({"filename": "ep{epoch}-rank{rank}.pt"}, "per-checkpoint folder"),
        ({"filename": "ep{epoch}-r{rank}/x.pt"}, "cannot use {rank}"),
        ({"filename": "ep{epoch}/model.pt"}, "must use {rank}"),
        ({"filename": "fixed/rank{rank}.pt"}, "at least one progress variable"),
        ({"latest_filename": "latest"}, "latest_filename='latest' must use {rank}"),
        # Nested or hidden checkpoint folders: resume deleted the first as a leftover (with the
        # committed checkpoints inside) and never listed the second.
        ({"filename": "ep{epoch}/ba{batch}/rank{rank}.pt"}, "must be one folder name"),
        ({"filename": "ep{epoch}-ba{batch}/sub/rank{rank}.pt"}, "must be one folder name"),
        ({"filename": ".ep{epoch}-ba{batch}/rank{rank}.pt"}, "not starting with '.'"),
        ({"latest_filename": "links/latest-rank{rank}"}, "without '/'"),
        ({"filename": "ep{epoch:q}/rank{rank}.pt"}, "cannot be rendered"),
        ({"filename": "ep{epoch.real}/rank{rank}.pt"}, "not a plain variable name"),
        ({"folder": ""}, "folder must be a non-empty format string"),
    ],
)
def test_bad_templates_fail_at_construction(kwargs, fragment):
    with pytest.raises(ConfigError) as err:
        NameTemplates(**kwargs)
    assert fragment in str(err.value)


def test_format_specs_are_allowed():
    t = NameTemplates(
        filename="{run_name}-ep{epoch:03d}-ba{batch:06d}/rank{rank}-of-{world_size}.pt"
    )
    values = dict(
        run_name="r",
        world_size=2,
        rank=0,
        local_rank=0,
        epoch=3,
        batch=12,
        sample=0,
        batch_in_epoch=0,
        sample_in_epoch=0,
    )
    assert t.render_checkpoint(values) == ("r-ep003-ba000012", "rank0-of-2.pt")
