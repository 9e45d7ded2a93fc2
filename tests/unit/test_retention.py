"""The retention rule (pure): what to delete, given the committed checkpoints and the policy."""

from __future__ import annotations

import pytest

from trainer_runtime.run_folder.retention import select_for_deletion

NAMES = ["ep0-ba5", "ep0-ba4", "ep0-ba3", "ep0-ba2", "ep0-ba1"]


def test_keeps_the_newest_n():
    assert select_for_deletion(NAMES, keep=2) == ["ep0-ba3", "ep0-ba2", "ep0-ba1"]
    assert select_for_deletion(NAMES, keep=5) == []
    assert select_for_deletion(NAMES, keep=-1) == []


def test_protected_names_are_spared():
    got = select_for_deletion(NAMES, keep=1, protected={"ep0-ba3", "elsewhere"})
    assert got == ["ep0-ba4", "ep0-ba2", "ep0-ba1"]


def test_checkpoints_that_do_not_count_are_neither_kept_nor_deleted_while_filling():
    broken = {"ep0-ba5", "ep0-ba3"}
    got = select_for_deletion(NAMES, keep=2, counts=lambda n: n not in broken)
    # ba5 (broken) and ba4 fill nothing/one slot, ba3 (broken) is passed, ba2 fills the second
    assert got == ["ep0-ba1"]


def test_the_newest_is_never_deleted_even_if_nothing_counts():
    assert select_for_deletion(NAMES[:1], keep=1, counts=lambda n: False) == []


@pytest.mark.parametrize("keep", [0, -2])
def test_bad_policy_is_a_clear_error(keep):
    with pytest.raises(ValueError, match=r"expected -1 \(keep all\) or a count >= 1"):
        select_for_deletion(NAMES, keep=keep)
