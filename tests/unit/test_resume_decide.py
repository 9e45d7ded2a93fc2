"""``choice.decide``: the choice over the ranks' merged views, walked with ``first_valid``."""

from __future__ import annotations

from trainer_runtime.resume.choice import Listed, decide, merge


def key(batch: int) -> tuple:
    return ((0, batch, batch * 8), f"2026-01-01T00:00:{batch:02d}")


def test_passes_over_faulted_and_unverified_checkpoints_and_reports_leftovers():
    rank0 = {
        "ep0-ba40": Listed(key(40), 2, None),
        "ep0-ba30": Listed(key(30), 2, "quarantined by the operator"),
        "ep0-ba20": Listed(key(20), 2, None),
        "ep0-ba10": Listed(key(10), 2, None),
        "torn": Listed(((-1,), ""), None, "no manifest"),
    }
    rank1 = {**rank0}
    del rank1["ep0-ba20"]  # this rank lacks it: no read is spent on it
    verified: list[str] = []

    def verify(name: str) -> str | None:
        verified.append(name)
        return "rank1.pt fails its checksum" if name == "ep0-ba40" else None

    d = decide(merge([rank0, rank1]), 2, verify)
    assert d.chosen == "ep0-ba10"
    assert verified == ["ep0-ba40", "ep0-ba10"], "only the candidates not already faulted"
    assert [n for n, _ in d.rejected] == ["ep0-ba40", "ep0-ba30", "ep0-ba20"]
    assert d.rejected[2][1] == "not present on rank 1"
    assert d.leftovers == [("torn", "rank 0: no manifest")]
    assert d.fallbacks[0] == "torn: rank 0: no manifest"
    assert d.world_size_conflict is None


def test_with_a_store_a_checkpoint_missing_from_some_disks_is_passed_over_not_rejected():
    """A survivor's save is on one node's disk and in the bucket: the ranks without it fetch it
    (resume asks the store next), so it must not be set aside as broken; a checkpoint that a
    rank lists as faulty still is."""
    rank0 = {
        "ep0-ba27": Listed(key(27), 1, None, any_world_size=True),
        "ep0-ba25": Listed(key(25), 2, "rank1.pt fails its checksum"),
        "ep0-ba20": Listed(key(20), 2, None),
    }
    rank1 = {"ep0-ba25": Listed(key(25), 2, None), "ep0-ba20": Listed(key(20), 2, None)}
    d = decide(merge([rank0, rank1]), 2, lambda name: None, keep_partial=True)
    assert d.chosen == "ep0-ba20"
    assert d.fallbacks[0] == "ep0-ba27: not present on rank 1"
    assert [n for n, _ in d.rejected] == ["ep0-ba25"]
    without_store = decide(merge([rank0, rank1]), 2, lambda name: None)
    assert [n for n, _ in without_store.rejected] == ["ep0-ba27", "ep0-ba25"]


def test_a_version_1_checkpoint_of_another_world_size_stops_the_walk():
    view = {
        "ep0-ba30": Listed(key(30), 4, "damaged"),
        "ep0-ba20": Listed(key(20), 4, None),  # format version 1, saved by 4 ranks
        "ep0-ba10": Listed(key(10), 2, None),
    }
    verified: list[str] = []
    d = decide(merge([view]), 2, verified.append)
    assert d.chosen is None
    assert d.world_size_conflict == ("ep0-ba20", 4)
    assert verified == [], "an older checkpoint is not silently used instead"
    assert d.rejected == [("ep0-ba30", "damaged")]
    # elastic, or a version-2 checkpoint (any world size), goes on to verify and load it.
    assert decide(merge([view]), 2, lambda n: None, elastic=True).chosen == "ep0-ba20"
    v2 = {**view, "ep0-ba20": Listed(key(20), 4, None, any_world_size=True)}
    assert decide(merge([v2]), 2, lambda n: None).chosen == "ep0-ba20"
